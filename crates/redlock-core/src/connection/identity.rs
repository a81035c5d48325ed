//! Which server each node is. Two nodes that reach one server (another name, address or
//! database of it) would cast two votes for one failure domain: `Coordinator::connect`
//! refuses such a configuration when it can tell ([`check_distinct`]), but it can
//! tell only for the nodes it identified then. A node it could not identify (down, or its
//! `INFO` not answered in time) casts no vote until it is: its commands are refused,
//! unsent, with [`ServerErrorKind::NotIdentified`], and it is identified as soon as it is
//! connected. Found then to be the same server as a node that votes, it casts none:
//! [`ServerErrorKind::SameServer`], and hand-overs it announces are not counted. The node
//! that votes keeps its vote.
//!
//! After each reconnection a node is identified again, without holding its commands back
//! meanwhile (a node that just came back must not lose the releases sent to it): a name
//! that reaches another node's server after a failover or a change of address stops voting
//! a round trip after it reconnected, and a node that was another's server and no longer
//! is votes again. A node that answers `INFO` with an error (an ACL user without it, a
//! server that renamed it away, a proxy without `run_id`) cannot be identified and votes,
//! with a warning, as at start-up.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fred::interfaces::ClientLike;
use fred::types::Value;
use futures::future::join_all;
use tokio::sync::watch;

use super::Connection;
use crate::error::ConfigError;
use crate::report::{NodeName, NodeOutcome};
use crate::server_error::{ServerError, ServerErrorKind};

/// Whether a node may take part in rounds.
#[derive(Debug, Default)]
pub(crate) struct Identity {
    state: AtomicU8,
    /// The node it was found to be the same server as.
    same_as: Mutex<Option<String>>,
}

impl Identity {
    /// Identified (at start-up, or since), or cannot be: its commands go.
    const CHECKED: u8 = 0;
    /// Never identified: its commands are refused.
    const PENDING: u8 = 1;
    /// The same server as a node that votes: its commands are refused.
    const SAME_SERVER: u8 = 2;

    pub(crate) fn set_pending(&self) {
        self.state.store(Self::PENDING, Ordering::SeqCst);
    }

    /// Whether the node casts votes: identified, and no other node's server.
    pub(crate) fn votes(&self) -> bool {
        self.state.load(Ordering::SeqCst) == Self::CHECKED
    }

    fn pending(&self) -> bool {
        self.state.load(Ordering::SeqCst) == Self::PENDING
    }

    fn same_server(&self) -> bool {
        self.state.load(Ordering::SeqCst) == Self::SAME_SERVER
    }

    fn set_checked(&self) {
        self.state.store(Self::CHECKED, Ordering::SeqCst);
    }

    fn set_same_as(&self, other: String) {
        *self.same_as.lock().unwrap_or_else(PoisonError::into_inner) = Some(other);
        self.state.store(Self::SAME_SERVER, Ordering::SeqCst);
    }

    /// `Err` with why the node's commands are not sent, when they are not. `down` is why
    /// the connection is down, if it is: a node not identified reports that first.
    pub(crate) fn gate(
        &self,
        down: impl FnOnce() -> Option<NodeOutcome>,
    ) -> Result<(), NodeOutcome> {
        match self.state.load(Ordering::Relaxed) {
            Self::CHECKED => Ok(()),
            Self::PENDING => Err(down().unwrap_or_else(|| {
                NodeOutcome::ServerError(ServerError::of_kind(
                    ServerErrorKind::NotIdentified,
                    "INFO",
                    "the node has not been identified since it connected",
                ))
            })),
            _ => {
                let other = self
                    .same_as
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone()
                    .unwrap_or_default();
                Err(NodeOutcome::ServerError(ServerError::of_kind(
                    ServerErrorKind::SameServer,
                    "INFO",
                    format!("the same Redis server (run_id) as node `{other}`"),
                )))
            }
        }
    }
}

/// Counts a connection's connections (its first one included), for its identification
/// task.
pub(crate) type Reconnections = watch::Sender<u64>;

impl Connection {
    /// The server's identity: the `run_id` field of `INFO server`, under the node timeout.
    /// Random per server process, and the same for every database of one server and under
    /// every name or address that reaches it; two nodes reporting the same `run_id` are one
    /// server, one failure domain.
    ///
    /// A cluster member's identity is its cluster's: `cluster ` and the smallest node ID
    /// that `CLUSTER NODES` lists (every node of a cluster lists the same nodes, the failed
    /// ones too), so that two members that reach one cluster are told apart from two
    /// clusters.
    pub(crate) async fn server_id(&self) -> Result<String, NodeOutcome> {
        // Not gated: it is how a node gets through the gate (see `identity`).
        if self.is_cluster() {
            let reply = self
                .send_custom("CLUSTER", vec![Value::from("NODES")])
                .await?;
            return reply
                .as_str()
                .and_then(|text| smallest_node_id(&text))
                .map(|id| format!("cluster {id}"))
                .ok_or_else(|| {
                    NodeOutcome::ServerError(ServerError::of_kind(
                        ServerErrorKind::Unknown,
                        "CLUSTER NODES",
                        "CLUSTER NODES listed no node",
                    ))
                });
        }
        let reply = self
            .send_custom("INFO", vec![Value::from("server")])
            .await?;
        reply
            .as_str()
            .and_then(|text| run_id(&text))
            .ok_or_else(|| {
                NodeOutcome::ServerError(ServerError::of_kind(
                    ServerErrorKind::Unknown,
                    "INFO",
                    "INFO server reported no run_id",
                ))
            })
    }
}

/// The smallest node ID of a `CLUSTER NODES` reply (each line starts with one).
fn smallest_node_id(nodes: &str) -> Option<String> {
    nodes
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .min()
        .map(str::to_string)
}

/// The `run_id` field of an `INFO` reply.
fn run_id(info: &str) -> Option<String> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("run_id:"))
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .map(str::to_string)
}

/// What identifying a node with `INFO` gave.
enum Seen {
    /// Its server's `run_id`.
    Server(String),
    /// It answered with an error (an ACL user without `INFO`, `INFO` renamed away, no
    /// `run_id` in the reply): it cannot be identified, now or later. What it answered.
    Unidentifiable(NodeOutcome),
    /// No answer (down, timed out, not ready): try again.
    Unknown,
}

async fn seen(node: &Connection) -> Seen {
    match node.server_id().await {
        Ok(id) => Seen::Server(id),
        Err(outcome) if unidentifiable(&outcome) => Seen::Unidentifiable(outcome),
        Err(_) => Seen::Unknown,
    }
}

/// Whether `outcome`, an answer to `INFO` at start-up, says the node can never be
/// identified (see [`Seen::Unidentifiable`]).
pub(crate) fn unidentifiable(outcome: &NodeOutcome) -> bool {
    matches!(outcome, NodeOutcome::ServerError(e) if e.kind != ServerErrorKind::NotReady)
}

/// Fails when two connected nodes are one server: reached under two names, addresses or
/// databases, it would cast two votes. Compares the servers' identities (`run_id`), not the
/// URLs, so two databases of one server are rejected too (one process, one failure
/// domain). Only the nodes connected now can be identified; the others (down, or refusing
/// the password or database) are identified when they connect (see [`identity`](self)), and a
/// warning names them.
pub(crate) async fn check_distinct(
    connections: &[Connection],
    connected: &[Result<(), String>],
) -> Result<Vec<usize>, ConfigError> {
    let ids = futures::future::join_all(connections.iter().zip(connected).map(
        |(connection, connected)| async move {
            match connected {
                Ok(()) => Some(connection.server_id().await),
                Err(_) => None,
            }
        },
    ))
    .await;
    let mut seen: std::collections::HashMap<&str, &NodeName> = Default::default();
    let mut unchecked = Vec::new();
    // Those that may be identified later (see `identity`): down, or `INFO` unanswered. A
    // node that answers `INFO` with an error (an ACL user without it) never can be.
    let mut later = Vec::new();
    for (i, (connection, id)) in connections.iter().zip(&ids).enumerate() {
        let id = match id {
            Some(Ok(id)) => id,
            // It answered with an error: it cannot be identified (see `identity`).
            Some(Err(outcome)) if unidentifiable(outcome) => {
                unchecked.push(connection.name.to_string());
                continue;
            }
            _ => {
                unchecked.push(connection.name.to_string());
                later.push(i);
                continue;
            }
        };
        if let Some(first) = seen.insert(id, &connection.name) {
            return Err(ConfigError::DuplicateServer {
                first: first.to_string(),
                second: connection.name.to_string(),
            });
        }
    }
    if !unchecked.is_empty() {
        tracing::warn!(
            nodes = %unchecked.join(", "),
            "nodes not identified at start-up were not checked for being the same server as another node: each that is down or did not answer INFO in time casts no vote until it is identified once it does; make sure every URL names a distinct master"
        );
    }
    Ok(later)
}

/// Starts the task that identifies node `i` of `connections`: while it is pending (not
/// identified at start-up), each time it is connected until that succeeds; then after each
/// reconnection. It ends with the connections.
pub(crate) fn watch_identity(
    connections: &Arc<[Connection]>,
    i: usize,
    turns: Arc<tokio::sync::Mutex<()>>,
) {
    let mut reconnected = connections[i].reconnections.subscribe();
    let client = connections[i].client.clone();
    let connections = Arc::downgrade(connections);
    tokio::spawn(async move {
        loop {
            let pending = match connections.upgrade() {
                Some(all) => all[i].identity.pending(),
                None => return,
            };
            if pending {
                // Not by its reconnection events: fred may announce one before it counts
                // the connection as up. Each second, whether the coordinator is gone.
                if !client.is_connected() {
                    let _ = tokio::time::timeout(WAIT_STEP, client.wait_for_connect()).await;
                    continue;
                }
            } else if reconnected.changed().await.is_err() {
                return;
            }
            // One decision at a time across the nodes: two that reach one server and
            // connect together see each other.
            let turn = turns.lock().await;
            let Some(all) = connections.upgrade() else {
                return;
            };
            let decided = identify(&all, i).await;
            drop((all, turn));
            if !decided {
                tokio::time::sleep(RETRY).await;
            }
        }
    });
}

/// How long a pending node's task waits for its connection before it looks again.
const WAIT_STEP: Duration = Duration::from_secs(1);

/// The pause before a pending node whose `INFO` went unanswered is asked again.
const RETRY: Duration = Duration::from_millis(100);

/// Identifies node `i` against every other node connected now, and lets any node that was
/// the same server as a voter and no longer is vote again. `false` when `i` is pending and
/// did not answer (it is asked again); a node that answers no longer counts as pending.
/// Other nodes that do not answer are left out: they do not vote while they do not answer
/// either.
async fn identify(all: &[Connection], i: usize) -> bool {
    let node = &all[i];
    let answers = join_all(all.iter().map(|c| async move {
        match c.client.is_connected() {
            true => seen(c).await,
            false => Seen::Unknown,
        }
    }))
    .await;
    let ids: Vec<Option<&str>> = answers
        .iter()
        .map(|seen| match seen {
            Seen::Server(id) => Some(id.as_str()),
            _ => None,
        })
        .collect();
    match &answers[i] {
        Seen::Server(_) => {}
        Seen::Unidentifiable(e) => {
            tracing::warn!(node = %node.name, error = %e, "node not checked for being the same server as another node (INFO refused, or no run_id): make sure every URL names a distinct master");
            if node.identity.pending() {
                node.identity.set_checked();
            }
            return true;
        }
        // A node that votes keeps voting (its commands would not be answered either); a
        // pending one is asked again.
        Seen::Unknown => return !node.identity.pending(),
    }
    let voter_like = |x: usize| {
        let id = ids[x]?;
        (0..all.len()).find(|&y| y != x && all[y].identity.votes() && ids[y] == Some(id))
    };
    match voter_like(i) {
        Some(voter) => {
            if !node.identity.same_server() {
                tracing::error!(
                    node = %node.name,
                    voter = %all[voter].name,
                    "two nodes are the same Redis server (same run_id): the one identified later casts no vote; list each independent master once"
                );
            }
            node.identity.set_same_as(all[voter].name.to_string());
        }
        None => node.identity.set_checked(),
    }
    // A node that was the same server as a voter, and is no longer (that voter's name
    // reaches another server now, or this one's does): it votes again. In order, so that
    // of two such twins only the first does.
    for x in (0..all.len()).filter(|&x| x != i && all[x].identity.same_server()) {
        if ids[x].is_some() && voter_like(x).is_none() {
            tracing::info!(node = %all[x].name, "node no longer the same server as a node that votes: it votes again");
            all[x].identity.set_checked();
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::ClosedReason;

    /// An error reply to `INFO` says the node can never be identified (it then votes, with a
    /// warning); no answer, or not ready, says "ask again". Every error reply counts, not
    /// only `NOPERM`: otherwise `INFO` renamed away (`ERR unknown command`) or a reply
    /// without `run_id` would leave a node down at start-up "not identified" for ever once
    /// back.
    #[test]
    fn only_an_error_reply_makes_a_node_unidentifiable() {
        let reply = |message: &str| NodeOutcome::ServerError(ServerError::new("INFO", message));
        for answered in [
            reply("NOPERM User noinfo has no permissions to run the 'info' command"),
            reply("ERR unknown command 'INFO', with args beginning with: 'server'"),
            NodeOutcome::ServerError(ServerError::of_kind(
                ServerErrorKind::Unknown,
                "INFO",
                "INFO server reported no run_id",
            )),
        ] {
            assert!(unidentifiable(&answered), "{answered}");
        }
        for unanswered in [
            reply("LOADING Redis is loading the dataset in memory"),
            reply("BUSY Redis is busy running a script"),
            NodeOutcome::TimedOut,
            NodeOutcome::ConnectionError("reset".into()),
            NodeOutcome::Closed(ClosedReason::Shutdown),
        ] {
            assert!(!unidentifiable(&unanswered), "{unanswered}");
        }
    }

    /// Every node of a cluster lists the same nodes, in its own order: the smallest ID is
    /// the cluster's, whichever node answers.
    #[test]
    fn a_cluster_is_known_by_its_smallest_node_id() {
        let seen_from_one = "e7d1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460\n\
                             3a9c 127.0.0.1:7002@17002 master - 0 0 2 connected 5461-10922\n\
                             b210 127.0.0.1:7003@17003 master,fail - 0 0 3 connected\n";
        let seen_from_two =
            "3a9c 127.0.0.1:7002@17002 myself,master - 0 0 2 connected 5461-10922\n\
                             b210 127.0.0.1:7003@17003 master,fail - 0 0 3 connected\n\
                             e7d1 127.0.0.1:7001@17001 master - 0 0 1 connected 0-5460\n";
        assert_eq!(smallest_node_id(seen_from_one).as_deref(), Some("3a9c"));
        assert_eq!(smallest_node_id(seen_from_two).as_deref(), Some("3a9c"));
        assert_eq!(smallest_node_id(""), None);
    }

    #[test]
    fn run_id_is_read_from_info_server() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:3f1c0a\r\ntcp_port:6379\r\n";
        assert_eq!(run_id(info).as_deref(), Some("3f1c0a"));
        assert_eq!(run_id("# Server\r\nrun_id:\r\n"), None);
        assert_eq!(run_id(""), None);
    }
}

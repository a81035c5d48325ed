//! Which server each node is. Two nodes that reach one server (another name, address or
//! database of it) would cast two votes for one failure domain: `Coordinator::connect`
//! refuses such a configuration when it can tell ([`super::check_distinct`]), but it can
//! tell only for the nodes it could identify then. A node it could not (down, or its
//! `INFO` unanswered) casts no vote until it is identified, and neither does a node whose
//! connection came back (a name may reach another server after a failover or a change of
//! address, or the server restarted), until it is identified again: its commands are
//! refused, unsent, with [`ServerErrorKind::NotIdentified`] (transient: releases are sent
//! again), for the round trip that takes. A node found to be the same server as a node that
//! votes casts none: [`ServerErrorKind::SameServer`], and hand-overs it announces are not
//! counted. The node that votes keeps its vote, so no round can count the old voter and the
//! new one together; a node that no longer matches a voter (its twin's name moved on) votes
//! again.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fred::interfaces::ClientLike;
use futures::future::join_all;
use tokio::sync::watch;

use super::Connection;
use crate::report::NodeOutcome;
use crate::server_error::{ServerError, ServerErrorKind};

/// Whether a node may take part in rounds.
#[derive(Debug, Default)]
pub(crate) struct Identity {
    state: AtomicU8,
    /// The node it was found to be the same server as.
    same_as: Mutex<Option<String>>,
}

impl Identity {
    /// Identified (at start-up, or since): its commands go.
    const CHECKED: u8 = 0;
    /// Not identified since it connected: its commands are refused.
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

/// What the reconnection callback does: a connection that comes back casts no vote until
/// it is identified again (its first connection is identified at start-up, or was marked
/// pending then), and its identification task is woken.
pub(crate) fn reconnected(identity: &Identity, reconnections: &Reconnections) {
    if *reconnections.borrow() > 0 {
        identity.set_pending();
    }
    reconnections.send_modify(|n| *n = n.wrapping_add(1));
}

/// Starts the task that identifies node `i` of `connections`: at once if it is pending and
/// connected, then after each reconnection. It ends with the connections.
pub(crate) fn watch_identity(
    connections: &Arc<[Connection]>,
    i: usize,
    turns: Arc<tokio::sync::Mutex<()>>,
) {
    let mut reconnected = connections[i].reconnections.subscribe();
    let pending_now = !connections[i].identity.votes() && connections[i].client.is_connected();
    let connections = Arc::downgrade(connections);
    tokio::spawn(async move {
        if !pending_now && reconnected.changed().await.is_err() {
            return;
        }
        loop {
            let mut tries = 0;
            // One decision at a time across the nodes: two that reach one server and
            // connect together see each other.
            while let Some(all) = connections.upgrade() {
                tries += 1;
                let turn = turns.lock().await;
                let decided = identify(&all, i, tries >= TRIES).await;
                drop((turn, all));
                if decided {
                    break;
                }
                tokio::time::sleep(RETRY).await;
            }
            if reconnected.changed().await.is_err() {
                return;
            }
        }
    });
}

/// The pause before an identification that could not decide is tried again.
const RETRY: Duration = Duration::from_millis(100);

/// Tries after which the other nodes that did not answer `INFO` are left out: a node that
/// does not answer cannot vote either (its twin's identification is not held up for ever by
/// a hung node).
const TRIES: u32 = 3;

/// Identifies node `i` against every node connected now, and lets any node that was the
/// same server as a voter and no longer is vote again. `false` when it must be tried again:
/// `i` is connected but did not answer `INFO`, or (unless `last`) another connected node
/// did not.
async fn identify(all: &[Connection], i: usize, last: bool) -> bool {
    let node = &all[i];
    if !node.client.is_connected() {
        // Down again: its next connection tries.
        return true;
    }
    let answers = join_all(all.iter().map(|c| async move {
        match c.client.is_connected() {
            true => Some(c.server_id().await),
            false => None,
        }
    }))
    .await;
    // Each node's server, where it said.
    let mut ids: Vec<Option<String>> = vec![None; all.len()];
    for (j, answer) in answers.into_iter().enumerate() {
        match answer {
            None => {}
            Some(Ok(id)) => ids[j] = Some(id),
            // It may not run INFO (an ACL user without it): it cannot be told apart from
            // another node, as at start-up.
            Some(Err(NodeOutcome::ServerError(e)))
                if e.kind == ServerErrorKind::Permission && j == i =>
            {
                tracing::warn!(node = %node.name, error = %e, "node not checked for being the same server as another node (INFO refused): make sure every URL names a distinct master");
            }
            Some(Err(NodeOutcome::ServerError(e))) if e.kind == ServerErrorKind::Permission => {}
            Some(Err(_)) if j == i || !last => return false,
            Some(Err(_)) => {}
        }
    }
    let voter_like = |x: usize| {
        let id = ids[x].as_deref()?;
        (0..all.len()).find(|&y| y != x && all[y].identity.votes() && ids[y].as_deref() == Some(id))
    };
    match voter_like(i) {
        Some(voter) => {
            tracing::error!(
                node = %node.name,
                voter = %all[voter].name,
                "two nodes are the same Redis server (same run_id): the one that connected later casts no vote; list each independent master once"
            );
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

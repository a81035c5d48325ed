//! Which server each node is. Two nodes that reach one server (another name, address or
//! database of it) would cast two votes for one failure domain: `Coordinator::connect`
//! refuses such a configuration when it can tell ([`super::check_distinct`]), but it can
//! tell only for the nodes connected then. A node that was not is identified when it first
//! connects, before it takes part in any round, and every node again whenever its
//! connection comes back (a name may reach another server after a failover or a change
//! of address). Of two nodes found to be one server, the later in the configuration casts
//! no vote: its commands are refused, unsent, with [`ServerErrorKind::SameServer`], and
//! hand-overs it announces are not counted.

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
    /// Not connected at start-up and not identified since: its commands are refused.
    const PENDING: u8 = 1;
    /// The same server as an earlier node: its commands are refused.
    const SAME_SERVER: u8 = 2;

    pub(crate) fn set_pending(&self) {
        self.state.store(Self::PENDING, Ordering::SeqCst);
    }

    /// Whether the node casts votes: identified, and no other node's server.
    pub(crate) fn votes(&self) -> bool {
        self.state.load(Ordering::Relaxed) == Self::CHECKED
    }

    fn set_checked(&self) {
        self.state.store(Self::CHECKED, Ordering::SeqCst);
    }

    fn set_same_as(&self, other: String) {
        *self.same_as.lock().unwrap_or_else(PoisonError::into_inner) = Some(other);
        self.state.store(Self::SAME_SERVER, Ordering::SeqCst);
    }

    /// `Err` with why the node's commands are not sent, when they are not. `down` is why
    /// the connection is down, if it is: a node not yet identified reports that first.
    pub(crate) fn gate(
        &self,
        down: impl FnOnce() -> Option<NodeOutcome>,
    ) -> Result<(), NodeOutcome> {
        match self.state.load(Ordering::Relaxed) {
            Self::CHECKED => Ok(()),
            Self::PENDING => Err(down().unwrap_or_else(|| {
                NodeOutcome::ConnectionError(
                    "not identified yet (it was not connected at start-up): it counts as \
                     failing until it is checked not to be another node's server, a moment \
                     after it connects"
                        .into(),
                )
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

/// Counts a connection's reconnections (its first connection included), for its
/// identification task.
pub(crate) type Reconnections = watch::Sender<u64>;

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
            // One decision at a time across the nodes: two that reach one server and
            // connect together see each other.
            while let Some(all) = connections.upgrade() {
                let turn = turns.lock().await;
                let decided = identify(&all, i).await;
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

/// The pause before an identification that failed is tried again.
const RETRY: Duration = Duration::from_millis(100);

/// Identifies node `i` against every other node connected now; `false` when it must be
/// tried again (its `INFO` failed while it is connected).
async fn identify(all: &[Connection], i: usize) -> bool {
    let node = &all[i];
    if !node.client.is_connected() {
        // Down again: its next connection tries.
        return true;
    }
    let own = match node.server_id().await {
        Ok(own) => own,
        Err(NodeOutcome::ServerError(e)) => {
            // Refused (an ACL without `INFO`): it cannot be told apart, as at start-up.
            tracing::warn!(node = %node.name, error = %e, "node not checked for being the same server as another node (INFO refused): make sure every URL names a distinct master");
            node.identity.set_checked();
            return true;
        }
        Err(_) => return !node.client.is_connected(),
    };
    let others = join_all(
        all.iter()
            .enumerate()
            .filter(|(j, other)| *j != i && other.client.is_connected())
            .map(|(j, other)| async move { (j, other.server_id().await.ok()) }),
    )
    .await;
    let mut same_as = None;
    for (j, id) in others {
        if id.as_deref() != Some(own.as_str()) {
            continue;
        }
        // The later of the two in the configuration casts no vote.
        let (first, later) = if j < i { (j, i) } else { (i, j) };
        tracing::error!(
            first = %all[first].name,
            later = %all[later].name,
            "two nodes are the same Redis server (same run_id): the later one casts no vote; list each independent master once"
        );
        all[later].identity.set_same_as(all[first].name.to_string());
        if later == i {
            same_as = Some(j);
        }
    }
    if same_as.is_none() {
        node.identity.set_checked();
    }
    true
}

//! Giving a node its fencing counter back after it lost it, without an operator.
//!
//! Tokens increase because every token handed out was recorded, raise-only, on a quorum of
//! nodes (its write quorum), and a write-back is acknowledged only by a node whose counter
//! it raised: a later, lower token finds at least a quorum's worth of nodes already at or
//! above it, and cannot be recorded on a quorum. A node that loses its counter (or comes
//! back with a stale one, which the stamp shows: `scripts::INCARNATION`) breaks that for
//! every token it was in the write quorum of. It is not counted meanwhile, and a read that
//! finds a quorum of the other nodes' counters still sees those tokens (the write quorum
//! less that node overlaps any quorum of the others). The repair gives it a counter at least
//! as high as every token handed out with it in the write quorum, so that the node can count
//! again. In three steps, each a script on the nodes:
//!
//! 1. **Mark** (`scripts::FENCE_MARK`): on the node, while it has no counter for its
//!    current server run, set a marker naming the repairer and that run (`SET NX` with a
//!    lease; one left by an earlier run of the server, or expired, is taken over).
//! 2. **Wait, then read**: wait [`REPAIR_WAIT`] after the marker's reply, then read every
//!    other node's counter and take the highest of a quorum of intact ones (the node being
//!    repaired is never among them; with `f` nodes without counters at once that needs
//!    `quorum <= N - f`).
//! 3. **Seed** (`scripts::FENCE_SEED`): set the node's counter to that value (raise-only),
//!    stamped with its run, only while the marker is still this repairer's of that run.
//!
//! Why each step, against the traps of a naive repair:
//! - **A late write-back seeds a stale value.** Ordinary write-backs never give a counter
//!   to a node without one (`scripts::FENCE_RECORD`); only step 3 does, under the marker.
//! - **The node loses its data again between the read and the seed.** Tokens recorded since
//!   would be gone, and a seed would hide the loss. The loss takes the marker with it (or,
//!   for a restart from a snapshot that holds the marker, changes the run the marker
//!   names), so step 3 refuses and the repair starts again.
//! - **A token acknowledged by the node just before its loss, its other acknowledgements
//!   still in flight.** The read of step 2 could miss it. Every token is handed out only if
//!   its write quorum was complete within [`WRITE_BACK_WINDOW`] of its acquisition's
//!   start, on a clock that counts a host suspend; an acknowledgement the node gave before
//!   its loss belongs to an acquisition that started before the marker was set; so by
//!   [`REPAIR_WAIT`] after the marker's reply, every such token that is ever handed out has
//!   its write quorum on the nodes, and the read sees it. The wait pads the window by a
//!   fifth for the rates of the two hosts' clocks.
//! - **The node comes back with an older counter, not an empty one.** Its stamp names
//!   another run of the server, so write-backs do not count it and step 1 marks it like an
//!   empty one. Only a `FLUSHALL`-style loss without a restart relies on the counter being
//!   missing.
//! - **Repairs race.** One marker per node: a second repairer waits for its lease. Two
//!   repairs of one node that both seed (one's lease ran out) are each sound, and seeding is
//!   raise-only.
//!
//! After the seed the node counts again, and its value may be lower than tokens handed out
//! during the repair: those were recorded on quorums of other nodes (the node acknowledged
//! none of them, having no counter), which still hold them. A repair costs nothing while
//! no counter is missing: it starts only when a fenced acquisition's read or write-back
//! finds a node without an intact counter, once per node at a time, in the background.
//!
//! What it cannot mend: more than `N - quorum` nodes without counters at once (no read
//! finds a quorum of intact counters), which `Error::FencingCountersLost` reports and an
//! operator's raise mends; a host whose clock runs more than a fifth off real time over
//! the window (a VM paused without its kernel knowing), as it would break the lock's
//! validity too.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use fred::types::Value;
use tracing::instrument::WithSubscriber;

use super::{NodeFence, Safeguard, WRITE_BACK_WINDOW};
use crate::connection::OnNoScript;
use crate::coordinator::{Coordinator, Inner};
use crate::report::NodeOutcome;
use crate::scripts::{FENCE_MARK, FENCE_SEED};
use crate::token::Token;

/// How long a repair waits after marking the node before it reads the other nodes: the
/// write-back window and a fifth of it for the clocks' rates.
pub const REPAIR_WAIT: Duration = Duration::from_millis(
    WRITE_BACK_WINDOW.as_millis() as u64 + WRITE_BACK_WINDOW.as_millis() as u64 / 5,
);

/// How many times one repair marks the node before it gives up (the next fenced
/// acquisition that finds the node without a counter starts another).
const ATTEMPTS: u32 = 3;

/// What a repair found or did, for its log line and metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// No counter.
    Missing,
    /// A counter from an earlier run of the server.
    Stale,
}

impl Found {
    fn label(self) -> &'static str {
        match self {
            Found::Missing => "missing",
            Found::Stale => "stale",
        }
    }
}

/// What the mark step answered.
enum Marked {
    /// The node has its counter: nothing to repair.
    Intact(i64),
    /// Another repairer's marker holds, for this long.
    Busy(Duration),
    /// This repairer's marker is set.
    Ours,
}

impl Coordinator {
    /// Starts the repair of node `node`'s fencing counter in the background, unless one
    /// runs; `state` is what a read or write-back found there (-1: no counter, -2: a stale
    /// one). The task holds the coordinator only while it sends: it ends at its next step
    /// once the coordinator is closed or dropped.
    pub(crate) fn repair_counter(&self, node: usize, state: i64) {
        let fencing = &self.inner.fencing;
        let Some(flag) = fencing.repairing.get(node) else {
            return;
        };
        if flag.swap(true, Ordering::SeqCst) {
            return;
        }
        let found = if state == -2 {
            Found::Stale
        } else {
            Found::Missing
        };
        let weak = Arc::downgrade(&self.inner);
        let name = self.inner.connections[node].name.clone();
        tracing::warn!(
            node = %name,
            found = found.label(),
            "the node has no intact fencing counter (it lost its data, or restarted from older \
             data): repairing it in the background; fenced locks use the other nodes meanwhile"
        );
        // Logged to the subscriber of the call that found the node so.
        let task = async move {
            repair(&weak, node, found).await;
            if let Some(inner) = weak.upgrade() {
                inner.fencing.repairing[node].store(false, Ordering::SeqCst);
            }
        };
        drop(self.inner.runtime.spawn(task.with_current_subscriber()));
    }
}

/// The coordinator, while it is open.
fn open(weak: &Weak<Inner>) -> Option<Coordinator> {
    let coordinator = Coordinator {
        inner: weak.upgrade()?,
    };
    coordinator.closed().is_none().then_some(coordinator)
}

/// Up to [`ATTEMPTS`] tries of mark, wait, read and seed on node `node`.
async fn repair(weak: &Weak<Inner>, node: usize, found: Found) {
    for _ in 0..ATTEMPTS {
        let Some(this) = open(weak) else { return };
        let id = Token::random();
        let marked = this.mark(node, &id).await;
        let connection_name = this.inner.connections[node].name.clone();
        match marked {
            Ok(Marked::Intact(counter)) => {
                tracing::debug!(node = %connection_name, counter, "fencing counter intact: no repair needed");
                return;
            }
            Ok(Marked::Busy(left)) => {
                drop(this);
                tokio::time::sleep(left + Duration::from_millis(10)).await;
                continue;
            }
            Ok(Marked::Ours) => {}
            Err(outcome) => {
                tracing::debug!(node = %connection_name, %outcome, "fencing counter repair: the node could not be marked");
                drop(this);
                tokio::time::sleep(REPAIR_WAIT).await;
                continue;
            }
        }
        let wait = !this.inner.fencing.off(Safeguard::Wait);
        drop(this);
        if wait {
            tokio::time::sleep(REPAIR_WAIT).await;
        }
        let Some(this) = open(weak) else { return };
        let (report, read) = this.read_fence().await;
        let intact: Vec<i64> = read
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != node)
            .filter_map(|(_, state)| super::usable(state.map(|s| s.counter)))
            .filter(|c| *c >= 0)
            .collect();
        if intact.len() < this.quorum() {
            tracing::warn!(
                node = %connection_name,
                intact = intact.len(),
                quorum = this.quorum(),
                nodes = %report,
                "fencing counter repair: fewer than a quorum of the other nodes have an intact \
                 counter; trying again (if more nodes lost theirs at once than the quorum \
                 allows, raise them: `redlock fence --raise-to N`)"
            );
            drop(this);
            tokio::time::sleep(REPAIR_WAIT).await;
            continue;
        }
        let value = intact.iter().copied().max().unwrap_or(0);
        match this.seed(node, &id, value).await {
            Ok(Some(counter)) => {
                tracing::info!(
                    node = %connection_name,
                    old = found.label(),
                    counter,
                    "fencing counter repaired"
                );
                crate::metrics::fencing_repair(&connection_name, found.label(), "repaired");
                return;
            }
            Ok(None) => {
                tracing::info!(
                    node = %connection_name,
                    "fencing counter repair refused at its seed: the node lost its data again \
                     (or restarted) since it was marked, or another repair took over; starting \
                     again"
                );
                crate::metrics::fencing_repair(&connection_name, found.label(), "refused");
            }
            Err(outcome) => {
                tracing::debug!(node = %connection_name, %outcome, "fencing counter repair: the seed was not answered");
            }
        }
    }
    if let Some(this) = open(weak) {
        let name = this.inner.connections[node].name.clone();
        crate::metrics::fencing_repair(&name, found.label(), "gave_up");
        tracing::warn!(
            node = %name,
            "fencing counter repair gave up after {ATTEMPTS} attempts; the next fenced \
             acquisition that finds the node without a counter starts another"
        );
    }
}

impl Coordinator {
    /// Step 1 on node `node`, as repairer `id`.
    async fn mark(&self, node: usize, id: &Token) -> Result<Marked, NodeOutcome> {
        // Long enough for the wait, the read and the seed; only liveness depends on it
        // (the seed checks the marker's id).
        let lease = REPAIR_WAIT * 2 + self.inner.config.node_timeout * 4;
        let args = [
            Value::from(id.as_str()),
            Value::from(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)),
        ];
        let keys = &self.inner.fencing.keys;
        let reply = self.inner.connections[node]
            .eval(&FENCE_MARK, keys, &args, OnNoScript::Resend)
            .await?;
        match pair(&reply) {
            Some((1, _)) => Ok(Marked::Ours),
            Some((0, counter)) if counter >= 0 => Ok(Marked::Intact(counter)),
            Some((0, busy)) if busy <= -3 => Ok(Marked::Busy(Duration::from_millis(
                u64::try_from(-3 - busy).unwrap_or(0),
            ))),
            _ => Err(unexpected("FENCE_MARK")),
        }
    }

    /// Step 3 on node `node`, as repairer `id`: the counter it now has, or `None` when the
    /// node refused (its marker is gone or another's).
    async fn seed(&self, node: usize, id: &Token, value: i64) -> Result<Option<i64>, NodeOutcome> {
        let check = if self.inner.fencing.off(Safeguard::Marker) {
            "0"
        } else {
            "1"
        };
        let args = [
            Value::from(id.as_str()),
            Value::from(value),
            Value::from(check),
        ];
        let keys = &self.inner.fencing.keys;
        let reply = self.inner.connections[node]
            .eval(&FENCE_SEED, keys, &args, OnNoScript::Resend)
            .await?;
        match pair(&reply) {
            Some((1, counter)) => Ok(Some(counter)),
            Some((0, _)) => Ok(None),
            _ => Err(unexpected("FENCE_SEED")),
        }
    }
}

/// A script's `{flag, integer}` reply.
fn pair(reply: &Value) -> Option<(i64, i64)> {
    match reply {
        Value::Array(items) => match items.as_slice() {
            [Value::Integer(flag), Value::Integer(value)] => Some((*flag, *value)),
            _ => None,
        },
        _ => None,
    }
}

fn unexpected(script: &str) -> NodeOutcome {
    use crate::server_error::{ServerError, ServerErrorKind};
    NodeOutcome::ServerError(ServerError::of_kind(
        ServerErrorKind::Unknown,
        "EVALSHA",
        format!("unexpected reply to {script}: the node may not be a Redis master"),
    ))
}

/// The fencing state every node answered, for [`Coordinator::read_fence`]'s callers.
pub(crate) type Read = Vec<Option<NodeFence>>;

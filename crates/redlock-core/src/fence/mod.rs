//! Fencing tokens across independent masters: numbers that strictly increase with every
//! fenced acquisition, for the protected resource to check (it rejects a write whose token
//! is lower than one it has already seen), so that a holder paused past its validity
//! cannot overwrite a newer holder's work.
//!
//! Each node keeps one fencing counter (one key for every lock of the node set). A fenced
//! acquisition reads the counter in the same script as its `SET NX`; once it has won, the
//! token is `max + 1` over a quorum of nodes that have a counter, and it is written back,
//! raise-only, to every node; the token is handed out only after a quorum acknowledged
//! the write-back and while the lock is still valid. A node acknowledges only a counter it
//! raised to the token: the reads ride on the acquisition, so another acquisition may
//! record the same token between them and the write-back, and a counter goes through each
//! value once, so at most one of them reaches a quorum; the other goes above the counters
//! its write-back found.
//!
//! Why it increases: the write-back quorum of every token handed out overlaps the read
//! quorum of every later acquisition, so that acquisition reads at least that token and
//! goes higher. A plain `INCR` on each node with the maximum taken is not monotonic: two
//! quorums need not share the node with the highest counter.
//!
//! A node that lost its data (a restart without persistence, `FLUSHALL`, an eviction) has no
//! counter, and a node that came back with older data (an RDB snapshot, an append-only file
//! that lost its tail, a promoted replica) has a stale one: each counter is stamped with
//! the `run_id` of the server run that wrote it, and the write-back compares the stamp with
//! the server's own (`scripts::INCARNATION`), so a restart shows as a lost counter. Such
//! a node is not counted: counting its empty counter as 0, or its stale one, could let
//! tokens go backwards, and no acquisition's write-back gives it a counter again
//! (`scripts::FENCE_RECORD` says why). A repair in the background does ([`repair`], which
//! says why it is safe), so that any number of losses of fewer than a quorum at a time,
//! spread over time, leave fencing working; meanwhile fenced acquisitions go on with the
//! other nodes. Tokens start at 1 only when every node answers without a counter: a new
//! node set, or one that lost every counter at once. When more nodes lose their counters at
//! once than `N - quorum`, no token is handed out (`Error::FencingCountersLost`) until an
//! operator raises every node's counter to at least the highest token handed out
//! (`Coordinator::raise_fencing_counters`, `redlock fence --raise-to N`). And a coordinator
//! never hands out a token at or below one it handed out itself before that acquisition
//! began (`Error::FencingTokenBehind`): the check that catches counters gone back behind
//! its back.

pub(crate) mod repair;
mod token;

pub(crate) use token::{above, new_set, next_token, usable, Shortfall};
pub use token::{FencingToken, MAX_FENCING_COUNTER};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use fred::types::{Key, Value};

use crate::report::{NodeName, NodeOutcome, NodeReport};

/// How long after its start a fenced acquisition may still hand out its token: one whose
/// write-back quorum is complete later gives it up ([`Error::NotFenced`]). A constant of
/// the protocol, the same for every client of a node set, since a repair of a node that
/// lost its counter waits it out ([`REPAIR_WAIT`](crate::REPAIR_WAIT)); it bounds only the fencing step (the round, the reads and the
/// write-backs), which takes a few round trips.
///
/// [`Error::NotFenced`]: crate::Error::NotFenced
pub const WRITE_BACK_WINDOW: Duration = Duration::from_secs(1);

/// The companions of the counter's key on each node: its stamp (the `run_id` of the server
/// run that wrote it) and a repair's marker.
pub(crate) fn stamp_key(fence_key: &str) -> String {
    format!("{fence_key}{STAMP_SUFFIX}")
}

/// See [`stamp_key`].
pub(crate) fn marker_key(fence_key: &str) -> String {
    format!("{fence_key}{MARKER_SUFFIX}")
}

/// What [`stamp_key`] and [`marker_key`] add to the counter's key.
const STAMP_SUFFIX: &str = ":run";
const MARKER_SUFFIX: &str = ":repair";

/// Whether `key` is the fencing counter `fence_key` or one of its companions
/// ([`stamp_key`], [`marker_key`]); read on every acquisition, so no name is built.
pub(crate) fn is_counter_key(fence_key: &str, key: &str) -> bool {
    key.strip_prefix(fence_key)
        .is_some_and(|rest| rest.is_empty() || rest == STAMP_SUFFIX || rest == MARKER_SUFFIX)
}

/// One safeguard of the fencing design, switched off only by tests (feature `test-util`)
/// to show that the lab's token rule catches what it prevents. Exported only with that
/// feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Safeguard {
    /// Ordinary write-backs never seed a node without a counter: switched off, every
    /// write-back seeds such a node (a late one seeds a stale value).
    NoSeedOnWriteBack,
    /// A repair seeds only while its marker holds: switched off, it seeds a node that lost
    /// its data again since it was marked.
    Marker,
    /// A repair reads the other nodes only after the write-back window: switched off, it
    /// reads at once, missing a token whose write-back quorum completes a moment later.
    Wait,
    /// The write-back compares the counter's stamp with the server's run: switched off, a
    /// node restarted from older data is counted with its stale counter.
    Incarnation,
}

/// A coordinator's fencing state: the keys as scripts take them, a repair in flight per
/// node, and the highest token it handed out.
#[derive(Debug)]
pub(crate) struct State {
    /// The counter, its stamp and the repair marker, in that order.
    pub(crate) keys: [Key; 3],
    /// By node: whether a repair of its counter is running.
    pub(crate) repairing: Box<[AtomicBool]>,
    /// The highest token handed out by this coordinator.
    pub(crate) handed_out: AtomicU64,
    /// Safeguards switched off by a test, one bit each.
    #[cfg(feature = "test-util")]
    off: std::sync::atomic::AtomicU8,
}

impl State {
    pub(crate) fn new(fence_key: &str, nodes: usize) -> Self {
        State {
            keys: [
                Key::from(fence_key),
                Key::from(stamp_key(fence_key)),
                Key::from(marker_key(fence_key)),
            ],
            repairing: (0..nodes).map(|_| AtomicBool::new(false)).collect(),
            handed_out: AtomicU64::new(0),
            #[cfg(feature = "test-util")]
            off: std::sync::atomic::AtomicU8::new(0),
        }
    }

    /// The counter and its stamp, for the write-back.
    pub(crate) fn counter_keys(&self) -> Vec<Key> {
        self.keys[..2].to_vec()
    }

    /// Whether a test switched `safeguard` off; always on without feature `test-util`.
    #[cfg(feature = "test-util")]
    pub(crate) fn off(&self, safeguard: Safeguard) -> bool {
        self.off.load(Ordering::SeqCst) & (1 << safeguard as u8) != 0
    }

    #[cfg(feature = "test-util")]
    pub(crate) fn switch_off(&self, safeguard: Safeguard) {
        self.off.fetch_or(1 << safeguard as u8, Ordering::SeqCst);
    }

    /// See the `test-util` form: every safeguard is on.
    #[cfg(not(feature = "test-util"))]
    pub(crate) fn off(&self, _safeguard: Safeguard) -> bool {
        false
    }

    /// Notes a token handed out.
    pub(crate) fn handed_out(&self, token: FencingToken) {
        self.handed_out.fetch_max(token.get(), Ordering::SeqCst);
    }
}

#[cfg(feature = "test-util")]
impl crate::Coordinator {
    /// Tests only (feature `test-util`): switches one safeguard of this coordinator's
    /// fencing off, for a demonstration that the lab's token rule catches what it prevents.
    /// Never in production: tokens can go backwards.
    pub fn switch_off_fencing_safeguard(&self, safeguard: Safeguard) {
        self.inner.fencing.switch_off(safeguard);
    }
}

/// One node's fencing state as `scripts::FENCE_READ` answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NodeFence {
    /// The counter (-1: none, -2: from another run of the server).
    pub(crate) counter: i64,
    /// The value of a stale counter, else -1.
    pub(crate) stale: i64,
    /// The milliseconds left on a repair's marker, else negative.
    pub(crate) repair_ms: i64,
}

impl NodeFence {
    /// From a node's answer to `FENCE_READ`; `None` for anything else.
    pub(crate) fn from_value(value: &Value) -> Option<NodeFence> {
        match value {
            Value::Array(items) => match items.as_slice() {
                [Value::Integer(counter), Value::Integer(stale), Value::Integer(repair_ms)] => {
                    Some(NodeFence {
                        counter: *counter,
                        stale: *stale,
                        repair_ms: *repair_ms,
                    })
                }
                _ => None,
            },
            _ => None,
        }
    }
}

/// One node's fencing counter, as [`Coordinator::fencing_counters`] read it.
///
/// [`Coordinator::fencing_counters`]: crate::Coordinator::fencing_counters
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FencingCounter {
    /// The node's counter: the highest token recorded there.
    At(u64),
    /// The node has no counter: no fenced acquisition reached it yet, or it lost its data
    /// (a restart without persistence, `FLUSHALL`, an eviction).
    Missing,
    /// The node has a counter written before the server's last restart (it came back
    /// from older data: an RDB snapshot, an append-only file that lost its tail, a promoted
    /// replica): its value. Not counted until a repair gives the node a counter again.
    Stale(u64),
    /// The node did not answer (or answered an error): what it answered.
    NoAnswer(NodeOutcome),
    /// The node's counter is above [`MAX_FENCING_COUNTER`], past where the nodes' scripts
    /// (which count in doubles) tell one number from the next: set by hand or by another
    /// program, never by this library. The node is counted as one that did not answer
    /// until an operator sets its counter to at most [`MAX_FENCING_COUNTER`] (and at
    /// least the highest token handed out) or deletes it.
    OutOfRange(u64),
}

/// Every node's fencing counter, read together, and what a fenced acquisition makes of
/// them ([`Coordinator::fencing_counters`]).
///
/// [`Coordinator::fencing_counters`]: crate::Coordinator::fencing_counters
#[derive(Debug, Clone)]
pub struct FencingCounters {
    /// Each node and its counter, in the configured order.
    pub nodes: Vec<(NodeName, FencingCounter)>,
    /// The token a fenced acquisition that read these counters would hand out; `None` when
    /// it could hand out none.
    pub next: Option<FencingToken>,
    /// Whether no fenced acquisition can get a token until an operator raises the
    /// counters: every node answered, and fewer than a quorum have a counter beside some
    /// that have one (a quorum lost its counters). One read: a new node set's first
    /// write-back on its way to the nodes can show this for a moment (an acquisition reads
    /// again for a node timeout before it gives up; read again to be sure). See
    /// [`Coordinator::raise_fencing_counters`].
    ///
    /// [`Coordinator::raise_fencing_counters`]: crate::Coordinator::raise_fencing_counters
    pub lost: bool,
    /// The nodes whose counter a repair is giving back now (see
    /// [`WRITE_BACK_WINDOW`]), each with the time left on the repair's lease.
    pub repairs: Vec<(NodeName, Duration)>,
}

impl FencingCounters {
    /// The state of a read that waited for every node (`None`: no answer; its outcome is
    /// in `nodes`).
    pub(crate) fn of(nodes: &[NodeReport], read: &[Option<NodeFence>], quorum: usize) -> Self {
        let counters: Vec<Option<i64>> = read.iter().map(|n| n.map(|n| n.counter)).collect();
        let next = next_token(&counters, quorum);
        FencingCounters {
            nodes: nodes
                .iter()
                .zip(read)
                .map(|(node, state)| {
                    let counter = match state {
                        Some(n) if n.counter >= 0 && usable(Some(n.counter)).is_none() => {
                            FencingCounter::OutOfRange(u64::try_from(n.counter).unwrap_or(u64::MAX))
                        }
                        Some(n) if n.counter >= 0 => {
                            FencingCounter::At(u64::try_from(n.counter).unwrap_or(0))
                        }
                        Some(n) if n.counter == -2 => {
                            FencingCounter::Stale(u64::try_from(n.stale).unwrap_or(0))
                        }
                        Some(_) => FencingCounter::Missing,
                        None => FencingCounter::NoAnswer(node.outcome.clone()),
                    };
                    (node.node.clone(), counter)
                })
                .collect(),
            repairs: nodes
                .iter()
                .zip(read)
                .filter_map(|(node, state)| {
                    let ms = u64::try_from(state.as_ref()?.repair_ms).ok()?;
                    Some((node.node.clone(), Duration::from_millis(ms)))
                })
                .collect(),
            lost: next.as_ref().is_err_and(Shortfall::every_node_answered),
            next: next.ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counter_and_its_companions_are_told_apart_from_other_keys() {
        let fence = "redlock:fencing-counter";
        for key in [fence.to_string(), stamp_key(fence), marker_key(fence)] {
            assert!(is_counter_key(fence, &key), "{key}");
        }
        for key in ["redlock:fencing", "redlock:fencing-counter:x", "job", ""] {
            assert!(!is_counter_key(fence, key), "{key}");
        }
    }

    #[test]
    fn a_stale_counter_is_not_counted_and_shows_with_its_value_and_repair() {
        use crate::report::{NodeName, NodeOutcome, NodeReport};
        let fence = |counter, stale, repair_ms| {
            Value::Array(vec![
                Value::Integer(counter),
                Value::Integer(stale),
                Value::Integer(repair_ms),
            ])
        };
        // Node 0 intact, node 1 restarted from older data (its counter 3 from another run,
        // a repair marked it 900 ms ago), node 2 lost its counter.
        let read: Vec<Option<NodeFence>> =
            [fence(7, -1, -2), fence(-2, 3, 1_500), fence(-1, -1, -2)]
                .iter()
                .map(NodeFence::from_value)
                .collect();
        assert!(read.iter().all(Option::is_some));
        assert_eq!(NodeFence::from_value(&Value::Integer(1)), None);
        let nodes: Vec<NodeReport> = (0..3)
            .map(|i| NodeReport {
                node: NodeName::redacted(&format!("redis://n{i}")),
                outcome: NodeOutcome::Held,
                late: false,
                latency: None,
                cleanup: None,
            })
            .collect();
        let seen = FencingCounters::of(&nodes, &read, 2);
        let counters: Vec<FencingCounter> = seen.nodes.iter().map(|(_, c)| c.clone()).collect();
        assert_eq!(
            counters,
            [
                FencingCounter::At(7),
                FencingCounter::Stale(3),
                FencingCounter::Missing
            ]
        );
        // One intact counter of three: no token, and every node answered.
        assert_eq!(seen.next, None);
        assert!(seen.lost);
        assert_eq!(
            seen.repairs,
            [(nodes[1].node.clone(), Duration::from_millis(1_500))]
        );
        // A stale counter is not a new node set's "no counter" either.
        assert!(!new_set(&[Some(-1), Some(-2), Some(-1)]));
        assert!(next_token(&[Some(-1), Some(-2), Some(-1)], 2).is_err());
    }
}

//! The metrics both crates record, through the [`metrics`] facade: every name in one place,
//! and their descriptions.
//!
//! Nothing is exported unless the application installs a recorder (for example
//! `metrics-exporter-prometheus`); without one each record is a thread-local lookup and an
//! atomic load. Labels are bounded: the round kind, an outcome, and the node's redacted
//! name ([`NodeName`], never a password). Lock keys never become labels (there can be
//! millions of them): they appear in tracing spans instead.
//!
//! The names of `redlock-client`'s metrics (acquisitions, waits, renewals, held and lost
//! locks) are here too, so that one module (and one table, in the README) lists them all;
//! the client records them.
//!
//! | name | type | labels |
//! |---|---|---|
//! | [`ACQUISITIONS`] | counter | `outcome` |
//! | [`LOCK_WAIT`] | histogram | `outcome` |
//! | [`ROUND_DURATION`] | histogram | `kind`, `outcome` |
//! | [`NODE_REPLIES`] | counter | `node`, `kind`, `outcome` |
//! | [`NODE_LATENCY`] | histogram | `node`, `kind` |
//! | [`LATE_REPLIES`] | counter | `node`, `kind` |
//! | [`ROLLBACKS`] | counter | `node`, `outcome` |
//! | [`RENEWALS`] | counter | `outcome` |
//! | [`LOCKS_LOST`] | counter | `reason` |
//! | [`LOCKS_HELD`] | gauge | |
//! | [`SUBSCRIBERS_DOWN`] | gauge | |
//! | [`FENCING_REPAIRS`] | counter | `node`, `found`, `outcome` |

use std::sync::Once;
use std::time::Duration;

use metrics::{Counter, Histogram, Key, Label, Level, Metadata, Unit};

use crate::report::{CleanupOutcome, NodeName, NodeOutcome, RoundKind};

/// Counter: acquisitions by `redlock-client` (`lock`, `try_lock`, `lock_with`, `lock_many`,
/// `lock_reentrant`, `with_lock`), each counted once when it ends. Label `outcome`:
/// `acquired`, `not_acquired` (every allowed attempt lost), `deadline_passed`,
/// `unreachable` (no node answered), `below_min_validity`, `invalid_config`, `lock_lost`
/// (no acquisition ends so; listed so that every error has a label), `round_error` (a round failed in a way
/// no retry mends), `cancelled` (the future was dropped), `closed` (the client was shut
/// down, or its runtime stopped).
pub const ACQUISITIONS: &str = "redlock_acquisitions_total";
/// Histogram, seconds: how long an acquisition took, all its attempts and waits included.
/// Label `outcome`, as for [`ACQUISITIONS`].
pub const LOCK_WAIT: &str = "redlock_lock_wait_seconds";
/// Histogram, seconds: one round, from its first send to its decision. Labels `kind`
/// (`acquire`, `extend`, `release`, `inspect`, `fence`) and `outcome` (`won`, `lost`; a
/// batched extension counts as won only if every lock in it was extended).
pub const ROUND_DURATION: &str = "redlock_round_duration_seconds";
/// Counter: one node's answers, each counted once, whether it came before or after the
/// round's decision. Labels `node`, `kind` and `outcome` (`acquired`, `held_by_other`,
/// `extended`, `released`, `held`, `recorded`, `not_held`, `timed_out`, `connection_error`,
/// `server_error`). A batched extension counts one answer per lock.
pub const NODE_REPLIES: &str = "redlock_node_replies_total";
/// Histogram, seconds: from the start of a round to one node's answer (a timeout counts at
/// the node timeout). Labels `node` and `kind`.
pub const NODE_LATENCY: &str = "redlock_node_latency_seconds";
/// Counter: answers that came after their round had been decided. Labels `node`, `kind`.
pub const LATE_REPLIES: &str = "redlock_late_replies_total";
/// Counter: rollbacks (compare-and-delete) of a lost or cancelled acquisition on one node.
/// Labels `node` and `outcome`: `removed`, `not_present`, `gave_up` (every try failed; the
/// key expires with its TTL).
pub const ROLLBACKS: &str = "redlock_rollbacks_total";
/// Counter: automatic renewals of one lock. Label `outcome`: `renewed`, `refused` (a
/// majority no longer holds the key: the lock is lost), `failed` (tried again while valid).
pub const RENEWALS: &str = "redlock_renewals_total";
/// Counter: locks lost while held. Label `reason`: `expired` (the validity ran out, seen
/// by a `lost()` watcher or at release), `refused` (a majority of nodes no longer hold it).
pub const LOCKS_LOST: &str = "redlock_locks_lost_total";
/// Gauge: lock guards alive and not yet released, dropped or lost.
pub const LOCKS_HELD: &str = "redlock_locks_held";
/// Gauge: `redlock-client`'s wake-up subscribers (one per node per client with `notify`
/// on) not subscribed now: not connected yet, disconnected, or failing to subscribe within
/// the node timeout. Waiters do not hear releases through them and wait out their backoff.
pub const SUBSCRIBERS_DOWN: &str = "redlock_subscribers_down";
/// Counter: keys handed over to one of `redlock-client`'s fair waiters by a quorum of
/// nodes' releases. Label `outcome`: `held` (the waiter holds the lock without a round),
/// `taken_on` (too little validity was left: the waiter's next round took the key on).
pub const HANDOVERS: &str = "redlock_handovers_total";

/// Counter: fair waiters of `redlock-client` that stepped back: heads that lost three rounds
/// in a row that no node refused (their answers came after the node timeout, or fewer nodes
/// than a quorum answered) left the queues and queued again behind the other waiters.
pub const FAIR_STEPS_BACK: &str = "redlock_fair_steps_back_total";

/// Counter: repairs of a node's fencing counter (see `redlock_core`'s fencing docs: a node
/// that lost its counter, or came back from older data, is given one again). Labels
/// `node`, `found` (`missing`, `stale`) and `outcome` (`repaired`; `refused`: the node lost
/// its data again, or another repair took over, during the repair; `gave_up`: no quorum of
/// the other nodes had an intact counter, or the node did not answer, three times).
pub const FENCING_REPAIRS: &str = "redlock_fencing_repairs_total";

/// Every name above, in the order of the table: for dashboards and tests that check each
/// one is exported.
pub const ALL: [&str; 14] = [
    ACQUISITIONS,
    LOCK_WAIT,
    ROUND_DURATION,
    NODE_REPLIES,
    NODE_LATENCY,
    LATE_REPLIES,
    ROLLBACKS,
    RENEWALS,
    LOCKS_LOST,
    LOCKS_HELD,
    SUBSCRIBERS_DOWN,
    HANDOVERS,
    FAIR_STEPS_BACK,
    FENCING_REPAIRS,
];

/// Describes every metric to the installed recorder (unit and help text). Called once per
/// process by the first `Coordinator::connect`; call it again after installing a recorder
/// later than that.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(ACQUISITIONS, "Lock acquisitions, by how they ended.");
    describe_histogram!(
        LOCK_WAIT,
        Unit::Seconds,
        "Time to acquire a lock or give up, retries included."
    );
    describe_histogram!(
        ROUND_DURATION,
        Unit::Seconds,
        "Time from a round's first send to its decision, by kind and outcome."
    );
    describe_counter!(
        NODE_REPLIES,
        "Answers of each node, by round kind and outcome."
    );
    describe_histogram!(
        NODE_LATENCY,
        Unit::Seconds,
        "Time from a round's start to each node's answer."
    );
    describe_counter!(
        LATE_REPLIES,
        "Node answers that came after their round was decided."
    );
    describe_counter!(
        ROLLBACKS,
        "Rollbacks of lost or cancelled acquisitions on each node, by outcome."
    );
    describe_counter!(RENEWALS, "Automatic renewals of held locks, by outcome.");
    describe_counter!(LOCKS_LOST, "Locks lost while held, by reason.");
    describe_counter!(
        HANDOVERS,
        "Keys handed over to a fair waiter by a quorum of releases, by outcome."
    );
    describe_counter!(
        FAIR_STEPS_BACK,
        "Fair queue heads that could not win and queued again behind the other waiters."
    );
    describe_counter!(
        FENCING_REPAIRS,
        "Repairs of a node's fencing counter, by what was found and how each ended."
    );
    describe_gauge!(
        LOCKS_HELD,
        "Locks held now (live guards not released or lost)."
    );
    describe_gauge!(
        SUBSCRIBERS_DOWN,
        "Wake-up subscribers not subscribed now (their releases wake nobody)."
    );
}

/// [`describe`], the first time only.
pub(crate) fn describe_once() {
    static DESCRIBED: Once = Once::new();
    DESCRIBED.call_once(describe);
}

/// The `outcome` labels of node answers, in [`node_outcome_index`] order.
const NODE_OUTCOMES: [&str; 13] = [
    "acquired",
    "held_by_other",
    "extended",
    "released",
    "held",
    "recorded",
    "not_held",
    "timed_out",
    "connection_error",
    "server_error",
    "pending",
    "closed",
    "counter_ahead",
];

/// Where a node's answer's label is in [`NODE_OUTCOMES`]. Only the variant counts, never
/// what a failure carries (messages are unbounded).
fn node_outcome_index(outcome: &NodeOutcome) -> usize {
    match outcome {
        NodeOutcome::Acquired => 0,
        // A refusal, as far as counting goes: the member voted no.
        NodeOutcome::HeldByOther | NodeOutcome::PartlyHeldByOther => 1,
        NodeOutcome::Extended => 2,
        NodeOutcome::Released => 3,
        NodeOutcome::Held => 4,
        NodeOutcome::Recorded => 5,
        NodeOutcome::NotHeld => 6,
        NodeOutcome::TimedOut => 7,
        NodeOutcome::ConnectionError(_) => 8,
        NodeOutcome::ServerError(_) => 9,
        // Never recorded: a pending node is counted when it answers.
        NodeOutcome::Pending => 10,
        NodeOutcome::Closed(_) => 11,
        NodeOutcome::CounterAhead => 12,
    }
}

/// The round kinds, in [`kind_index`] order.
const KINDS: [RoundKind; 6] = [
    RoundKind::Acquire,
    RoundKind::Extend,
    RoundKind::Release,
    RoundKind::Inspect,
    RoundKind::Fence,
    RoundKind::Leave,
];

/// The `kind` label of a round.
pub(crate) fn kind_label(kind: RoundKind) -> &'static str {
    match kind {
        RoundKind::Acquire => "acquire",
        RoundKind::Extend => "extend",
        RoundKind::Release => "release",
        RoundKind::Inspect => "inspect",
        RoundKind::Fence => "fence",
        RoundKind::Leave => "leave",
    }
}

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// `kind` and `outcome` labels for every round kind, built at compile time so that
/// recording a round allocates nothing.
static ROUND_LABELS: [[[Label; 2]; 2]; 6] = [
    kind_outcome("acquire"),
    kind_outcome("extend"),
    kind_outcome("release"),
    kind_outcome("inspect"),
    kind_outcome("fence"),
    kind_outcome("leave"),
];

const fn kind_outcome(kind: &'static str) -> [[Label; 2]; 2] {
    [
        [
            Label::from_static_parts("kind", kind),
            Label::from_static_parts("outcome", "won"),
        ],
        [
            Label::from_static_parts("kind", kind),
            Label::from_static_parts("outcome", "lost"),
        ],
    ]
}

fn kind_index(kind: RoundKind) -> usize {
    match kind {
        RoundKind::Acquire => 0,
        RoundKind::Extend => 1,
        RoundKind::Release => 2,
        RoundKind::Inspect => 3,
        RoundKind::Fence => 4,
        RoundKind::Leave => 5,
    }
}

fn histogram(key: &Key) -> Histogram {
    metrics::with_recorder(|recorder| recorder.register_histogram(key, &METADATA))
}

fn counter(key: &Key) -> Counter {
    metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA))
}

/// Records one decided round (for a batch: won only if every request won).
pub(crate) fn round_decided(kind: RoundKind, won: bool, elapsed: Duration) {
    let labels = &ROUND_LABELS[kind_index(kind)][usize::from(!won)];
    histogram(&Key::from_static_parts(ROUND_DURATION, labels)).record(elapsed);
}

/// One repair of a node's fencing counter ([`FENCING_REPAIRS`]): rare, so its key is built
/// here.
pub(crate) fn fencing_repair(node: &NodeName, found: &'static str, outcome: &'static str) {
    let labels = vec![
        Label::new("node", node.to_string()),
        Label::from_static_parts("found", found),
        Label::from_static_parts("outcome", outcome),
    ];
    let key = Key::from_parts(FENCING_REPAIRS, labels);
    counter(&key).increment(1);
}

/// The `outcome` labels of a rollback.
const ROLLBACK_OUTCOMES: [&str; 3] = ["removed", "not_present", "gave_up"];

/// One node's metric keys, built once with its connection: a node's label is not static,
/// and building its keys on every record would allocate on every round, recorder or not.
#[derive(Debug)]
pub(crate) struct NodeMetrics {
    /// By kind, then by outcome.
    replies: Vec<Key>,
    /// By kind.
    latency: Vec<Key>,
    /// By kind.
    late: Vec<Key>,
    /// By [`ROLLBACK_OUTCOMES`].
    rollbacks: Vec<Key>,
}

impl NodeMetrics {
    pub(crate) fn new(node: &NodeName) -> NodeMetrics {
        // The name is shared, not copied: each label clones the `Arc` that it holds.
        let node = || Label::new("node", node.shared());
        let kind = |kind| Label::from_static_parts("kind", kind_label(kind));
        let outcome = |outcome| Label::from_static_parts("outcome", outcome);
        let by_kind = |name: &'static str| -> Vec<Key> {
            KINDS
                .iter()
                .map(|&k| Key::from_parts(name, vec![node(), kind(k)]))
                .collect()
        };
        let mut replies = Vec::with_capacity(KINDS.len() * NODE_OUTCOMES.len());
        for k in KINDS {
            for o in NODE_OUTCOMES {
                let labels = vec![node(), kind(k), outcome(o)];
                replies.push(Key::from_parts(NODE_REPLIES, labels));
            }
        }
        NodeMetrics {
            replies,
            latency: by_kind(NODE_LATENCY),
            late: by_kind(LATE_REPLIES),
            rollbacks: ROLLBACK_OUTCOMES
                .iter()
                .map(|&o| Key::from_parts(ROLLBACKS, vec![node(), outcome(o)]))
                .collect(),
        }
    }

    /// Records the node's answers to a round: one per request, counted by outcome, and
    /// its latency once. `late`: the round had already been decided.
    pub(crate) fn answered<'a>(
        &self,
        kind: RoundKind,
        outcomes: impl Iterator<Item = &'a NodeOutcome>,
        latency: Duration,
        late: bool,
    ) {
        let k = kind_index(kind);
        // Runs of one outcome are counted together: a batch mostly answers alike.
        let mut run: Option<(usize, u64)> = None;
        for outcome in outcomes {
            let o = node_outcome_index(outcome);
            match &mut run {
                Some((current, count)) if *current == o => *count += 1,
                _ => {
                    if let Some((o, count)) = run.replace((o, 1)) {
                        self.replies(k, o, count);
                    }
                }
            }
        }
        if let Some((o, count)) = run {
            self.replies(k, o, count);
        }
        histogram(&self.latency[k]).record(latency);
        if late {
            counter(&self.late[k]).increment(1);
        }
    }

    fn replies(&self, kind: usize, outcome: usize, count: u64) {
        counter(&self.replies[kind * NODE_OUTCOMES.len() + outcome]).increment(count);
    }

    /// Records one rollback on this node.
    pub(crate) fn rolled_back(&self, cleanup: &CleanupOutcome) {
        let i = match cleanup {
            CleanupOutcome::Removed => 0,
            CleanupOutcome::NotPresent => 1,
            CleanupOutcome::Failed(_) => 2,
        };
        counter(&self.rollbacks[i]).increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_prefix_and_their_unit() {
        for name in ALL {
            assert!(name.starts_with("redlock_"), "{name}");
            let gauge = name == LOCKS_HELD || name == SUBSCRIBERS_DOWN;
            assert!(
                name.ends_with("_total") || name.ends_with("_seconds") || gauge,
                "{name} says its unit"
            );
        }
        let mut unique = ALL.to_vec();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ALL.len(), "no name listed twice");
    }

    #[test]
    fn labels_name_every_kind_and_outcome() {
        let label = |outcome| NODE_OUTCOMES[node_outcome_index(&outcome)];
        assert_eq!(label(NodeOutcome::HeldByOther), "held_by_other");
        assert_eq!(label(NodeOutcome::NotHeld), "not_held");
        assert_eq!(label(NodeOutcome::TimedOut), "timed_out");
        assert_eq!(label(NodeOutcome::Pending), "pending");
        for (i, kind) in KINDS.into_iter().enumerate() {
            assert_eq!(kind_index(kind), i);
            let labels = &ROUND_LABELS[kind_index(kind)];
            assert_eq!(labels[0][0].value(), kind_label(kind));
            assert_eq!(labels[1][0].value(), kind_label(kind));
            assert_eq!(labels[0][1].value(), "won");
            assert_eq!(labels[1][1].value(), "lost");
        }
    }
}

//! What the client records through the `metrics` facade: acquisitions and how long they
//! took, renewals, and held and lost locks. The names (and the table of every metric) are
//! in [`redlock_core::metrics`]; the rounds' own metrics are recorded by the core.
//!
//! Every label here is a `&'static str` in a label set built at compile time, so recording
//! allocates nothing: the uncontended lock and release stay as cheap with the facade as
//! without it.

use metrics::{Key, Label, Level, Metadata};
use redlock_core::metrics::{
    ACQUISITIONS, FAIR_STEPS_BACK, HANDOVERS, LOCKS_HELD, LOCKS_LOST, LOCK_WAIT, RENEWALS,
    SUBSCRIBERS_DOWN,
};
use tokio::time::Instant;

use crate::error::{Error, LostReason};

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

fn key(name: &'static str, labels: &'static [Label]) -> Key {
    Key::from_static_parts(name, labels)
}

fn count(name: &'static str, labels: &'static [Label]) {
    metrics::with_recorder(|r| r.register_counter(&key(name, labels), &METADATA)).increment(1);
}

/// The `outcome` labels of an acquisition that ended (an index into [`OUTCOMES`]).
fn acquisition_outcome<T>(result: &Result<T, Error>) -> usize {
    match result {
        Ok(_) => 0,
        Err(Error::NotAcquired { .. }) => 1,
        Err(Error::DeadlinePassed { .. }) => 2,
        Err(Error::Unreachable { .. }) => 3,
        Err(Error::InvalidConfig(_) | Error::InvalidArgument(_)) => 4,
        Err(Error::BelowMinValidity { .. }) => 5,
        // Not returned by an acquisition; named so that every error has a label.
        Err(Error::LockLost { .. }) => 6,
        Err(Error::Round(_)) => 7,
        Err(Error::Closed { .. }) => 9,
    }
}

const CANCELLED: usize = 8;

/// One label set per acquisition outcome.
static OUTCOMES: [[Label; 1]; 10] = [
    [Label::from_static_parts("outcome", "acquired")],
    [Label::from_static_parts("outcome", "not_acquired")],
    [Label::from_static_parts("outcome", "deadline_passed")],
    [Label::from_static_parts("outcome", "unreachable")],
    [Label::from_static_parts("outcome", "invalid_config")],
    [Label::from_static_parts("outcome", "below_min_validity")],
    [Label::from_static_parts("outcome", "lock_lost")],
    [Label::from_static_parts("outcome", "round_error")],
    [Label::from_static_parts("outcome", "cancelled")],
    [Label::from_static_parts("outcome", "closed")],
];

/// Times one acquisition, and counts it once: by its outcome when [`finish`](Self::finish)
/// is called, as `cancelled` when dropped before (the caller dropped the `lock` future).
#[derive(Debug)]
pub(crate) struct Acquiring {
    start: Instant,
    finished: bool,
}

impl Acquiring {
    pub(crate) fn start() -> Acquiring {
        Acquiring {
            start: Instant::now(),
            finished: false,
        }
    }

    /// Records the acquisition; returns its outcome label and how long it took.
    pub(crate) fn finish<T>(
        mut self,
        result: &Result<T, Error>,
    ) -> (&'static str, std::time::Duration) {
        self.finished = true;
        let labels = &OUTCOMES[acquisition_outcome(result)];
        (labels[0].value(), self.record(labels))
    }

    fn record(&self, labels: &'static [Label]) -> std::time::Duration {
        let waited = self.start.elapsed();
        count(ACQUISITIONS, labels);
        metrics::with_recorder(|r| r.register_histogram(&key(LOCK_WAIT, labels), &METADATA))
            .record(waited);
        waited
    }
}

impl Drop for Acquiring {
    fn drop(&mut self) {
        if !self.finished {
            self.record(&OUTCOMES[CANCELLED]);
        }
    }
}

/// The `outcome` label of one lock's automatic renewal.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Renewal {
    Renewed,
    Refused,
    Failed,
}

static RENEWAL_LABELS: [[Label; 1]; 3] = [
    [Label::from_static_parts("outcome", "renewed")],
    [Label::from_static_parts("outcome", "refused")],
    [Label::from_static_parts("outcome", "failed")],
];

pub(crate) fn renewal(outcome: Renewal) {
    count(RENEWALS, &RENEWAL_LABELS[outcome as usize]);
}

static HANDOVER_LABELS: [[Label; 1]; 2] = [
    [Label::from_static_parts("outcome", "held")],
    [Label::from_static_parts("outcome", "taken_on")],
];

/// A key a quorum of nodes handed over to a fair waiter: held without a round, or (too
/// little validity left) taken on by the waiter's next round.
pub(crate) fn handover(held: bool) {
    count(HANDOVERS, &HANDOVER_LABELS[usize::from(!held)]);
}

/// A fair head that could not win stepped back in its keys' queues.
pub(crate) fn stepped_back() {
    count(FAIR_STEPS_BACK, &[]);
}

/// The `reason` label of a lost lock.
pub(crate) fn lost_reason_label(reason: &LostReason) -> &'static str {
    match reason {
        LostReason::Expired => "expired",
        LostReason::Refused => "refused",
        LostReason::Released => "released",
    }
}

static LOST_EXPIRED: [Label; 1] = [Label::from_static_parts("reason", "expired")];
static LOST_REFUSED: [Label; 1] = [Label::from_static_parts("reason", "refused")];

/// A lock was lost while held. A release is not a loss, and is not counted.
pub(crate) fn lock_lost(reason: &LostReason) {
    match reason {
        LostReason::Expired => count(LOCKS_LOST, &LOST_EXPIRED),
        LostReason::Refused => count(LOCKS_LOST, &LOST_REFUSED),
        LostReason::Released => {}
    }
}

fn held() -> metrics::Gauge {
    static KEY: Key = Key::from_static_name(LOCKS_HELD);
    metrics::with_recorder(|r| r.register_gauge(&KEY, &METADATA))
}

/// A guard was created.
pub(crate) fn lock_taken() {
    held().increment(1.0);
}

/// A guard's lock ended: released, dropped or lost (called once per guard).
pub(crate) fn lock_ended() {
    held().decrement(1.0);
}

fn subscribers_down() -> metrics::Gauge {
    static KEY: Key = Key::from_static_name(SUBSCRIBERS_DOWN);
    metrics::with_recorder(|r| r.register_gauge(&KEY, &METADATA))
}

/// A wake-up subscriber went down (or started down); `-1.0` when it came back.
pub(crate) fn subscriber_down(change: f64) {
    subscribers_down().increment(change);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_has_its_labels() {
        let lost: Result<(), Error> = Err(Error::LockLost {
            key: "k".to_string(),
            reason: LostReason::Expired,
        });
        assert_eq!(OUTCOMES[acquisition_outcome(&lost)][0].value(), "lock_lost");
        assert_eq!(OUTCOMES[CANCELLED][0].value(), "cancelled");
        assert_eq!(
            RENEWAL_LABELS[Renewal::Failed as usize][0].value(),
            "failed"
        );
        assert_eq!(lost_reason_label(&LostReason::Refused), "refused");
    }
}

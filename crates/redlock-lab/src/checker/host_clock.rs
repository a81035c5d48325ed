//! Steps of the host's own wall clock. Redis expires keys by its wall clock, and every node
//! of both backends reads the host's: local processes directly, containers through the
//! kernel they share. A step forward of `d` makes every key on every node expire `d` early,
//! which breaks assumption H3 for the whole node set at once; a step back makes them live
//! `d` longer. The lab watches for such steps (the wall clock against the monotonic clock
//! it measures everything else by) so that a violation they cause is reported as what it
//! is, the environment breaking an assumption, and not as a fault of the library, while
//! every violation they cannot explain still counts.

use std::fmt;
use std::time::Duration;

use super::{Violation, EVENT_SLACK};
use crate::history::{At, Event, FaultKind};

/// One step of the host's wall clock against its monotonic clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostClockStep {
    /// When the lab saw it (the first sample after the step).
    pub at: At,
    /// How far the wall clock moved against the monotonic clock, in nanoseconds: positive
    /// forward (keys expire early), negative back (keys live longer).
    pub by_ns: i64,
}

impl HostClockStep {
    /// Whether the wall clock moved forward.
    pub fn forward(&self) -> bool {
        self.by_ns > 0
    }

    /// How far it moved, either way.
    pub fn size(&self) -> Duration {
        Duration::from_nanos(self.by_ns.unsigned_abs())
    }
}

impl fmt::Display for HostClockStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (sign, effect) = if self.forward() {
            ("+", "every node's keys expire that much early")
        } else {
            ("-", "every node's keys live that much longer")
        };
        write!(
            f,
            "the host's wall clock stepped {sign}{:.1}ms at {:.3}s against its monotonic clock \
             ({effect}: H3 broken by the environment, not by the library)",
            self.size().as_secs_f64() * 1000.0,
            self.at.as_secs_f64()
        )
    }
}

/// The faults that `steps` amount to on each of `nodes` nodes, for the rules that excuse
/// what an injected fault explains: a step forward is a clock step forward of its size on
/// every node (keys expire that much early, as with a node's own clock), a step back a
/// clock step back on every node.
pub fn host_clock_faults(steps: &[HostClockStep], nodes: usize) -> Vec<Event> {
    steps
        .iter()
        .flat_map(|step| {
            let kind = if step.forward() {
                FaultKind::ClockForward(step.size())
            } else {
                FaultKind::ClockBack
            };
            (0..nodes).map(move |n| Event::Fault {
                at: step.at,
                node: Some(n),
                kind,
                what: step.to_string(),
            })
        })
        .collect()
}

/// Splits `found` into the violations that `steps` cannot explain and those they can.
///
/// Only an overlap is ever explained, and only when the steps forward seen between the
/// earlier holder's acquisition and the later holder's (with [`EVENT_SLACK`] either side)
/// add up to at least how long both claimed the key: the earlier holder's keys then expired
/// that much early on every node. Every other violation stays (the token and validity rules
/// already treat a step as the key loss or clock step back it is, through
/// [`host_clock_faults`]).
pub fn explained_by_host_clock(
    found: Vec<Violation>,
    steps: &[HostClockStep],
) -> (Vec<Violation>, Vec<Violation>) {
    if steps.is_empty() {
        return (found, Vec::new());
    }
    found.into_iter().partition(|v| match v {
        Violation::Overlap {
            first,
            second,
            both_for,
        } => {
            let from = first.from.saturating_sub(EVENT_SLACK);
            let to = second.from + EVENT_SLACK;
            let forward: Duration = steps
                .iter()
                .filter(|s| s.forward() && s.at >= from && s.at <= to)
                .map(HostClockStep::size)
                .sum();
            forward < *both_for
        }
        _ => true,
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::{check, Leftover};
    use super::*;

    fn step(at_ms: u64, by_ms: i64) -> HostClockStep {
        HostClockStep {
            at: t(at_ms),
            by_ns: by_ms * 1_000_000,
        }
    }

    /// Holder a claims until 1000, b acquires at 900: 100 ms both.
    fn overlapping() -> Vec<Violation> {
        check(
            &[acquired("a", "ta", 0, 1000), acquired("b", "tb", 900, 1900)],
            &[],
            &[],
        )
    }

    #[test]
    fn a_step_forward_during_the_first_claim_explains_an_overlap_it_covers() {
        let (kept, explained) = explained_by_host_clock(overlapping(), &[step(400, 150)]);
        assert_eq!(kept, vec![]);
        assert_eq!(categories(&explained), ["overlap"]);
    }

    #[test]
    fn an_overlap_longer_than_the_steps_or_outside_them_still_counts() {
        // The negative controls: no step, a step too small, a step back, a step after the
        // second acquisition (twice).
        for steps in [
            vec![],
            vec![step(400, 50)],
            vec![step(400, -150)],
            vec![step(950, 150)],
            vec![step(2000, 150)],
        ] {
            let (kept, explained) = explained_by_host_clock(overlapping(), &steps);
            assert_eq!(categories(&kept), ["overlap"], "steps {steps:?}");
            assert_eq!(explained, vec![], "steps {steps:?}");
        }
        // Two small steps that add up do explain it.
        let (kept, _) = explained_by_host_clock(overlapping(), &[step(100, 60), step(500, 60)]);
        assert_eq!(kept, vec![]);
    }

    #[test]
    fn other_violations_are_never_explained() {
        let left = Leftover {
            node: "node-1".into(),
            key: "k".into(),
            value: Some("ta".into()),
            pttl: 400,
        };
        let found = check(&clean(), &[], &[left]);
        let (kept, explained) = explained_by_host_clock(found, &[step(10, 500)]);
        assert_eq!(categories(&kept), ["key left behind"]);
        assert_eq!(explained, vec![]);
    }

    /// A step forward brings every node's expiries forward by its size, and no more: it
    /// explains a token gone that much before its `PTTL` ran out, not earlier. A step
    /// forward must not count as a key loss of any size: a 6 ms step does not excuse a key
    /// deleted 890 ms early.
    #[test]
    fn a_step_forward_explains_a_token_gone_early_by_its_size_on_every_node() {
        // Seen at 100 with 900 ms left, gone by 111: 890 ms early.
        let observations = [obs(1, 100, Some("ta"), 900), obs(1, 110, None, -2)];
        let events = vec![acquired("a", "ta", 0, 1000)];
        assert_eq!(
            categories(&check(&events, &observations, &[])),
            ["token removed early"]
        );
        let faults = host_clock_faults(&[step(105, 900)], 3);
        assert_eq!(faults.len(), 3);
        let mut far = events.clone();
        far.extend(faults);
        assert_eq!(check(&far, &observations, &[]), vec![]);
        for small in [6, 200] {
            let mut near = events.clone();
            near.extend(host_clock_faults(&[step(105, small)], 3));
            assert_eq!(
                categories(&check(&near, &observations, &[])),
                ["token removed early"],
                "a {small} ms step"
            );
        }
        // A step back is no key loss: the removal still counts.
        let mut back = vec![acquired("a", "ta", 0, 1000)];
        back.extend(host_clock_faults(&[step(105, -200)], 3));
        assert_eq!(
            categories(&check(&back, &observations, &[])),
            ["token removed early"]
        );
    }
}

//! The safety checker: reads a scenario's history, the token observations and the keys left
//! on the nodes, and reports every violation it can prove.
//!
//! Pure functions of their inputs, so each rule is unit-tested next to it with a hand-made
//! history that contains exactly one violation (the negative controls of the checker itself).
//! One file per family of rules: [`overlaps`] (claims that intersect), [`write_violations`]
//! (lost updates and stale writes), [`token_violations`] (tokens removed or extended by a
//! non-owner, a reentrant lock's holds included), [`fencing_violations`] (fencing tokens
//! reused, or lower than one handed out before their acquisition began),
//! [`validity_violations`] (a guard reporting validity that no quorum of nodes still held,
//! after an extension or a renewal), [`semaphore_violations`] (more holders of a semaphore
//! at once than its permits), [`rwlock_violations`] (a read-write lock's writer claiming
//! while a reader or another writer does); keys left behind are reported as found. Holds of one
//! reentrant lock's owner share the key: [`overlaps`] leaves them alone. Steps of the host's
//! own wall clock ([`HostClockStep`]) break H3 on every node at once: they count as faults
//! ([`host_clock_faults`]), and [`explained_by_host_clock`] sets apart the overlaps they
//! explain.

mod fencing;
mod holders;
mod host_clock;
mod overlap;
mod rwlock;
mod semaphore;
mod tokens;
mod validity;
mod violation;
mod writes;

#[cfg(test)]
mod fixtures;

use std::time::Duration;

use crate::history::{At, Event, FaultKind};

pub use fencing::{fenced, fencing_violations, Fenced};
pub use holders::{holders, Holder};
pub use host_clock::{explained_by_host_clock, host_clock_faults, HostClockStep};
pub use overlap::overlaps;
pub use rwlock::{rwlock_counts, rwlock_violations};
pub use semaphore::{most_at_once, semaphore_violations};
pub use tokens::token_violations;
pub use validity::validity_violations;
pub use violation::Violation;
pub use writes::write_violations;

/// Slack around fault times and release starts: an observation's reply can arrive a little
/// after the event that explains it.
pub const EVENT_SLACK: Duration = Duration::from_millis(5);

/// What one sample of a key on one node showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// The node's index.
    pub node: usize,
    /// The key sampled.
    pub key: String,
    /// When the sample was sent.
    pub sent: At,
    /// When its reply arrived.
    pub received: At,
    /// The value (token) the key held, if any; for a reentrant lock's hash,
    /// `reentrant:{owner}` (never a token: its holds are in `holds`).
    pub token: Option<String>,
    /// `PTTL` in the node's milliseconds (`-2` when missing).
    pub pttl: i64,
    /// The tokens of a reentrant lock's holds (empty for a plain key).
    pub holds: Vec<String>,
}

impl Observation {
    /// Whether the node held `token`: as the key's value, or as one of a reentrant lock's
    /// holds.
    pub fn has(&self, token: &str) -> bool {
        self.token.as_deref() == Some(token) || self.holds.iter().any(|h| h == token)
    }

    /// Every token the sample shows held: the plain value, or each hold.
    pub fn tokens(&self) -> impl Iterator<Item = &str> {
        let plain = self.holds.is_empty().then_some(self.token.as_deref());
        plain
            .flatten()
            .into_iter()
            .chain(self.holds.iter().map(String::as_str))
    }

    /// The owner of a reentrant lock's hash.
    pub fn owner(&self) -> Option<&str> {
        self.token.as_deref()?.strip_prefix(REENTRANT)
    }
}

/// How the observer names a reentrant lock's hash in [`Observation::token`].
pub const REENTRANT: &str = "reentrant:";

/// A key found on a node after the scenario ended, clients shut down and faults healed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leftover {
    /// The node's name.
    pub node: String,
    /// The key.
    pub key: String,
    /// Its value.
    pub value: Option<String>,
    /// Its `PTTL`.
    pub pttl: i64,
}

/// Each injected key loss (node restarted empty, keys evicted) as an episode on one node,
/// for the rules that must not blame the library for keys a fault took (see
/// [`episodes_of`]).
fn key_losses(events: &[Event]) -> Vec<Episode> {
    episodes_of(events, FaultKind::KeyLoss)
}

/// Each step forward of a node's clock (its own, or the host's) as an episode with its
/// size: keys there expire that much early, and no more.
fn clock_steps_forward(events: &[Event]) -> Vec<(Episode, Duration)> {
    episodes_where(
        events,
        |k| matches!(k, FaultKind::ClockForward(_)),
        FaultKind::ClockForwardEnd,
    )
    .into_iter()
    .map(|(episode, kind)| match kind {
        FaultKind::ClockForward(by) => (episode, by),
        _ => (episode, Duration::ZERO),
    })
    .collect()
}

/// How far the clock of `node` stepped forward in the episodes of `steps` that reach from
/// `from` to `to` (with [`EVENT_SLACK`] either side).
fn stepped_forward(steps: &[(Episode, Duration)], node: usize, from: At, to: At) -> Duration {
    steps
        .iter()
        .filter(|&&((n, began, ended), _)| {
            n == node && began <= to + EVENT_SLACK && ended + EVENT_SLACK >= from
        })
        .map(|&(_, by)| by)
        .sum()
}

/// A fault on one node over a span of lab time: the node, from, to (equal for a fault
/// that takes no time).
type Episode = (usize, At, At);

/// Each injected fault of `kind` as an episode on its node: from a fault of `kind` to its
/// end (a fault of `kind.end()`) when that is the node's next fault of either kind, else
/// the instant itself; an end with no start before it is an instant too. Only a start
/// and its own end make an episode: any two faults on a node would let two unrelated
/// losses far apart (two steps of the host's clock) excuse every removal on that node
/// between them.
fn episodes_of(events: &[Event], kind: FaultKind) -> Vec<Episode> {
    episodes_where(events, |k| k == kind, kind.end())
        .into_iter()
        .map(|(episode, _)| episode)
        .collect()
}

/// [`episodes_of`] for the faults whose kind `starts` (each with its kind), ended by `end`.
fn episodes_where(
    events: &[Event],
    starts: impl Fn(FaultKind) -> bool,
    end: FaultKind,
) -> Vec<(Episode, FaultKind)> {
    let mut marks: Vec<(usize, At, Option<FaultKind>)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Fault {
                at,
                node: Some(n),
                kind: k,
                ..
            } if starts(*k) => Some((*n, *at, Some(*k))),
            Event::Fault {
                at,
                node: Some(n),
                kind: k,
                ..
            } if *k == end => Some((*n, *at, None)),
            _ => None,
        })
        .collect();
    marks.sort_by_key(|&(n, at, start)| (n, at, start.is_none()));
    let mut episodes = Vec::with_capacity(marks.len());
    let mut i = 0;
    while i < marks.len() {
        let (n, at, start) = marks[i];
        match (start, marks.get(i + 1)) {
            (Some(kind), Some(&(m, to, None))) if m == n => {
                episodes.push(((n, at, to), kind));
                i += 2;
            }
            (kind, _) => {
                episodes.push(((n, at, at), kind.unwrap_or(end)));
                i += 1;
            }
        }
    }
    episodes
}

fn ms(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1000.0)
}

fn short(token: &str) -> &str {
    token.get(..8).unwrap_or(token)
}

/// Runs every rule and returns the violations found, in a stable order.
pub fn check(
    events: &[Event],
    observations: &[Observation],
    leftovers: &[Leftover],
) -> Vec<Violation> {
    let holders = holders(events);
    // A read-write lock's readers share their key: the rwlock rule judges them.
    let shared = rwlock::shared_keys(events);
    let exclusive: Vec<Holder> = holders
        .iter()
        .filter(|h| !shared.contains(&h.key.as_str()))
        .cloned()
        .collect();
    let mut found = overlaps(&exclusive);
    found.extend(write_violations(events, &holders));
    found.extend(leftovers.iter().cloned().map(Violation::LeftBehind));
    found.extend(token_violations(events, observations, &holders));
    found.extend(fencing_violations(events));
    found.extend(validity_violations(events));
    found.extend(semaphore_violations(events, &holders));
    found.extend(rwlock_violations(events, &holders));
    found
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    #[test]
    fn a_clean_history_has_no_violation() {
        let observations = [
            obs(0, 5, Some("ta"), 995),
            obs(0, 22, None, -2),
            obs(0, 27, Some("tb"), 998),
            obs(0, 35, Some("tb"), 993),
        ];
        assert_eq!(check(&clean(), &observations, &[]), vec![]);
    }

    #[test]
    fn leftover_keys_are_reported() {
        let left = Leftover {
            node: "node-1".into(),
            key: "k".into(),
            value: Some("ta".into()),
            pttl: 400,
        };
        assert_eq!(
            categories(&check(&clean(), &[], &[left])),
            ["key left behind"]
        );
    }
}

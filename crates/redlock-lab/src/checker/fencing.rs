//! Fencing tokens: unique, and strictly increasing in the real-time order of acquisitions.
//!
//! The order is the one a resource can rely on: if acquisition A had completed (its token
//! handed out) before acquisition B began, B's token must be higher. Acquisitions that
//! overlap in time may get their tokens in either order; they must still differ, but for
//! two holds of one reentrant lock's owner whose acquisitions overlap: they are one
//! owner's lease on the key, won together, and may share a token (the README's promise;
//! nested holds, one taken while the other is held, must still differ). The
//! history's times make this sound: an acquisition's recorded start is never later than
//! its winning round's start and its recorded end never earlier than the hand-out, so a
//! pair that the record orders was ordered in fact.

use std::collections::BTreeMap;
use std::fmt;

use super::{ms, short, Violation};
use crate::history::{At, Event};

/// A fenced acquisition, as the rule sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fenced {
    /// The client.
    pub client: String,
    /// The lock's token.
    pub token: String,
    /// The fencing token.
    pub fencing: u64,
    /// When the acquisition began (a lower bound).
    pub started: At,
    /// When its token was handed out (an upper bound).
    pub acquired: At,
    /// The owner, for a hold of a reentrant lock.
    pub owner: Option<String>,
}

impl Fenced {
    /// Two holds of one owner whose acquisitions overlapped in time: one lease, won
    /// together, that may share a token.
    fn shares_lease_with(&self, other: &Fenced) -> bool {
        self.owner.is_some()
            && self.owner == other.owner
            && self.started <= other.acquired
            && other.started <= self.acquired
    }
}

impl fmt::Display for Fenced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (token {}) got fencing token {} in an acquisition from {} to {}",
            self.client,
            short(&self.token),
            self.fencing,
            ms(self.started),
            ms(self.acquired)
        )
    }
}

/// Every fenced acquisition in `events`, in recording order.
pub fn fenced(events: &[Event]) -> Vec<Fenced> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Acquired {
                client,
                token,
                started,
                acquired,
                fencing: Some(fencing),
                owner,
                ..
            } => Some(Fenced {
                client: client.clone(),
                token: token.clone(),
                fencing: *fencing,
                started: *started,
                acquired: *acquired,
                owner: owner.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// Fencing tokens handed out twice, and tokens lower than one handed out before their
/// acquisition began. A pair that is ordered and equal is reported once, as reused. Holds
/// of one reentrant owner whose acquisitions overlapped in time (one lease, won together)
/// may share a token.
pub fn fencing_violations(events: &[Event]) -> Vec<Violation> {
    let mut all = fenced(events);
    all.sort_by_key(|f| f.acquired);
    let mut found = Vec::new();
    let mut by_token: BTreeMap<u64, Vec<&Fenced>> = BTreeMap::new();
    for f in &all {
        by_token.entry(f.fencing).or_default().push(f);
    }
    for list in by_token.values() {
        for (i, second) in list.iter().enumerate().skip(1) {
            if let Some(first) = list[..i].iter().find(|f| !f.shares_lease_with(second)) {
                found.push(Violation::FencingReused {
                    first: (*first).clone(),
                    second: (*second).clone(),
                });
            }
        }
    }
    // highest[i]: the index of the highest token among the first i + 1 completed
    // acquisitions, so each later one is compared with the highest it must exceed.
    let mut highest: Vec<usize> = Vec::with_capacity(all.len());
    for (i, f) in all.iter().enumerate() {
        let best = match highest.last() {
            Some(&b) if all[b].fencing >= f.fencing => b,
            _ => i,
        };
        highest.push(best);
    }
    for later in &all {
        let before = all.partition_point(|a| a.acquired < later.started);
        let Some(&best) = before.checked_sub(1).and_then(|i| highest.get(i)) else {
            continue;
        };
        if all[best].fencing > later.fencing {
            found.push(Violation::FencingBackwards {
                earlier: all[best].clone(),
                later: later.clone(),
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::{check, Violation};

    #[test]
    fn tokens_that_rise_with_real_time_pass() {
        let events = vec![
            fenced_between("a", "ta", 0, 10, 1),
            fenced_between("b", "tb", 20, 30, 2),
            // Plain locks are not judged.
            acquired("c", "tc", 40, 45),
            fenced_between("a", "td", 50, 60, 7),
        ];
        assert_eq!(check(&events, &[], &[]), vec![]);
    }

    #[test]
    fn a_token_below_one_handed_out_before_its_acquisition_began_is_reported() {
        let events = vec![
            fenced_between("a", "ta", 0, 10, 5),
            fenced_between("b", "tb", 20, 30, 6),
            fenced_between("c", "tc", 40, 50, 4),
        ];
        let found = check(&events, &[], &[]);
        assert_eq!(categories(&found), ["fencing token backwards"]);
        // Compared with the highest token it had to exceed.
        let Violation::FencingBackwards { earlier, later } = &found[0] else {
            unreachable!()
        };
        assert_eq!((earlier.fencing, later.fencing), (6, 4));
        // Above the latest is not enough: c (4) is above b (3) but below a (5).
        let mut dip = events.clone();
        dip[1] = fenced_between("b", "tb", 20, 30, 3);
        let found = check(&dip, &[], &[]);
        let pairs: Vec<(u64, u64)> = found
            .iter()
            .map(|v| match v {
                Violation::FencingBackwards { earlier, later } => (earlier.fencing, later.fencing),
                other => panic!("{other}"),
            })
            .collect();
        assert_eq!(pairs, [(5, 3), (5, 4)]);
    }

    #[test]
    fn acquisitions_that_overlap_in_time_may_get_tokens_in_either_order() {
        // The control of the rule above: b began (18) before a's token was handed out (20).
        let events = vec![
            fenced_between("a", "ta", 0, 20, 5),
            fenced_between("b", "tb", 18, 30, 4),
        ];
        assert_eq!(check(&events, &[], &[]), vec![]);
        // Began exactly when the other was recorded: not ordered either.
        let touching = vec![
            fenced_between("a", "ta", 0, 20, 5),
            fenced_between("b", "tb", 20, 30, 4),
        ];
        assert_eq!(check(&touching, &[], &[]), vec![]);
    }

    #[test]
    fn a_token_handed_out_twice_is_reported_once() {
        // Overlapping in time: reused, and order says nothing.
        let concurrent = vec![
            fenced_between("a", "ta", 0, 20, 3),
            fenced_between("b", "tb", 10, 30, 3),
        ];
        assert_eq!(
            categories(&check(&concurrent, &[], &[])),
            ["fencing token reused"]
        );
        // One after the other: reused, not also reported as backwards.
        let ordered = vec![
            fenced_between("a", "ta", 0, 10, 3),
            fenced_between("b", "tb", 20, 30, 3),
        ];
        assert_eq!(
            categories(&check(&ordered, &[], &[])),
            ["fencing token reused"]
        );
    }

    #[test]
    fn concurrent_holds_of_one_owner_may_share_a_token_nested_ones_may_not() {
        let hold = |client: &str, token: &str, started, acquired, owner: &str| {
            with_owner(fenced_between(client, token, started, acquired, 3), owner)
        };
        // Acquired at the same time by one owner: one lease.
        let concurrent = vec![hold("a", "h1", 0, 20, "o"), hold("a", "h2", 5, 25, "o")];
        assert_eq!(check(&concurrent, &[], &[]), vec![]);
        // The controls: one after the other (nested), or two owners at once.
        let nested = vec![hold("a", "h1", 0, 10, "o"), hold("a", "h2", 20, 30, "o")];
        assert_eq!(
            categories(&check(&nested, &[], &[])),
            ["fencing token reused"]
        );
        let owners = vec![hold("a", "h1", 0, 20, "o"), hold("b", "h2", 5, 25, "p")];
        assert_eq!(
            categories(&check(&owners, &[], &[])),
            ["fencing token reused"]
        );
    }
}

//! Quorum arithmetic: how many nodes must agree, and when a round is decided.
//!
//! The quorum is computed from the configured number of nodes, never from the nodes that
//! happen to answer: a client that lowered its quorum when nodes go down would let two
//! clients with different views both win.

/// The number of nodes that must accept for a round to succeed: `n / 2 + 1`.
///
/// For an even `n` this is a strict majority (4 nodes need 3), so an even node set tolerates
/// no more failures than the odd set one smaller; it is allowed, but an odd `n` is the
/// better use of servers. Two contenders that split an even set evenly both lose (neither
/// reaches the quorum) and both roll back; the round never waits for a tie to resolve.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// Whether `against` nodes of `n` that will not accept leave fewer than a quorum that can:
/// more than `n - quorum(n)` of them. The one rule by which a round is lost early, an
/// inspection reads a key as free, and a client gives up on nodes that refuse (through
/// [`RoundReport::out_of_reach`](crate::RoundReport::out_of_reach)).
pub(crate) fn out_of_reach(n: usize, against: usize) -> bool {
    against > n.saturating_sub(quorum(n))
}

/// How a round ended, decided as early as the replies allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// At least a quorum of nodes accepted.
    Won,
    /// So many nodes failed that a quorum can no longer be reached.
    Lost,
}

/// Counts one request's votes as they arrive and says when it is decided.
#[derive(Debug, Clone)]
pub(crate) struct Votes {
    n: usize,
    quorum: usize,
    accepted: usize,
    failed: usize,
}

impl Votes {
    pub(crate) fn new(n: usize) -> Self {
        Votes {
            n,
            quorum: quorum(n),
            accepted: 0,
            failed: 0,
        }
    }

    /// Records one node's reply and returns the decision once there is one.
    ///
    /// Won as soon as `quorum` nodes accepted; lost as soon as `n - quorum + 1` failed,
    /// because then at most `quorum - 1` nodes are left to accept. Both can never hold at
    /// once, and one of them always holds after the last reply.
    pub(crate) fn record(&mut self, accepted: bool) -> Option<Decision> {
        if accepted {
            self.accepted += 1;
        } else {
            self.failed += 1;
        }
        self.decision()
    }

    pub(crate) fn decision(&self) -> Option<Decision> {
        if self.accepted >= self.quorum {
            Some(Decision::Won)
        } else if out_of_reach(self.n, self.failed) {
            Some(Decision::Lost)
        } else {
            None
        }
    }

    pub(crate) fn accepted(&self) -> usize {
        self.accepted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quorum_is_out_of_reach_once_more_than_n_minus_quorum_are_against() {
        for (n, most) in [(1, 0), (2, 0), (3, 1), (4, 1), (5, 2), (6, 2), (7, 3)] {
            assert!(!out_of_reach(n, most), "{n}");
            assert!(out_of_reach(n, most + 1), "{n}");
        }
        assert!(out_of_reach(0, 1));
        assert!(!out_of_reach(0, 0));
    }

    #[test]
    fn quorum_is_a_strict_majority() {
        let expected = [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)];
        for (n, q) in expected {
            assert_eq!(quorum(n), q, "quorum({n})");
        }
    }

    #[test]
    fn decides_won_at_the_quorum_th_acceptance() {
        let mut t = Votes::new(5);
        assert_eq!(t.record(true), None);
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(true), None);
        assert_eq!(t.record(true), Some(Decision::Won));
    }

    #[test]
    fn decides_lost_once_the_quorum_is_impossible() {
        let mut t = Votes::new(5);
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(true), None);
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(false), Some(Decision::Lost));
    }

    #[test]
    fn an_even_split_is_lost_not_pending() {
        let mut t = Votes::new(4);
        assert_eq!(t.record(true), None);
        assert_eq!(t.record(true), None);
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(false), Some(Decision::Lost));
    }

    #[test]
    fn every_complete_sequence_is_decided_exactly_once_and_consistently() {
        // Exhaustive over all reply patterns for n = 1..=7: the first decision agrees with
        // the final count, and it never comes later than the last reply.
        for n in 1..=7usize {
            for mask in 0u32..(1 << n) {
                let mut t = Votes::new(n);
                let mut first = None;
                for i in 0..n {
                    let d = t.record(mask & (1 << i) != 0);
                    if first.is_none() {
                        first = d;
                    }
                }
                let accepted = mask.count_ones() as usize;
                let expected = if accepted >= quorum(n) {
                    Decision::Won
                } else {
                    Decision::Lost
                };
                assert_eq!(first, Some(expected), "n={n} mask={mask:b}");
            }
        }
    }
}

//! The token arithmetic: which token a won acquisition gets from the counters a quorum of
//! nodes answered with, and why it only goes up (see the module above for the protocol).

use std::fmt;

/// The highest value a fencing counter can be raised to, 2^53: Redis scripts read numbers
/// as doubles, which hold every integer only up to there.
pub const MAX_FENCING_COUNTER: u64 = 1 << 53;

/// A fencing token: strictly greater than the token of every fenced acquisition of the same
/// node set that completed before this one began, and never the token of another one.
/// Compare tokens at the protected resource and reject writes whose token is lower than
/// the highest seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// A counter value to write back as is (an operator's raise).
    pub(crate) fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The token as a number (at least 1).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.0
    }
}

/// Why no token could be issued from what the nodes answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shortfall {
    /// Nodes that answered with a counter.
    pub(crate) seeded: usize,
    /// Nodes that answered without one.
    pub(crate) unseeded: usize,
    /// Nodes that did not answer.
    pub(crate) silent: usize,
}

impl Shortfall {
    /// Whether every node answered: fewer than a quorum have a counter beside some that
    /// have one. That stays so until an operator raises the counters (a quorum lost them),
    /// unless a new node set's first write-back is still on its way to the others.
    pub(crate) fn every_node_answered(&self) -> bool {
        self.silent == 0
    }
}

impl fmt::Display for Shortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "only {} of the nodes that answered have a fencing counter, {} have none (they \
             lost their data) and {} did not answer; a token needs the counters of a quorum",
            self.seeded, self.unseeded, self.silent
        )
    }
}

/// The token for a won acquisition from each node's counter as it answered (`None`: no
/// answer, `Some(-1)`: no counter on that node); `counters` has one entry per node.
///
/// `max + 1` over the nodes with a counter, when a quorum of nodes have one (-1: none; -2:
/// a stale one, not counted either). Tokens start at 1 only when **every** node answered
/// without a counter (a new node set, or one that lost every counter at once): a quorum
/// without counters beside a minority that has one is a quorum that lost its data, and
/// starting again there would go backwards. Anything in between cannot be trusted: a node
/// without its counter may be one of those that held the highest.
pub(crate) fn next_token(
    counters: &[Option<i64>],
    quorum: usize,
) -> Result<FencingToken, Shortfall> {
    let answered: Vec<i64> = counters.iter().filter_map(|c| usable(*c)).collect();
    let seeded: Vec<i64> = answered.iter().copied().filter(|c| *c >= 0).collect();
    let shortfall = Shortfall {
        seeded: seeded.len(),
        unseeded: answered.len() - seeded.len(),
        silent: counters.len() - answered.len(),
    };
    if seeded.len() >= quorum {
        // A counter near i64::MAX would take a billion years of acquisitions per second.
        Ok(above(seeded.iter().copied().max().unwrap_or(0)))
    } else if new_set(counters) {
        Ok(FencingToken(1))
    } else {
        Err(shortfall)
    }
}

/// Whether every node answered and none has a counter: a new node set, whose first token
/// (1) is the one write-back that seeds the nodes (see `scripts::FENCE_RECORD`).
pub(crate) fn new_set(counters: &[Option<i64>]) -> bool {
    counters.iter().all(|c| *c == Some(-1))
}

/// A counter a node answered (`Some(-1)`: none), or `None` for one above
/// [`MAX_FENCING_COUNTER`]: no token above it could be told from the next by the nodes'
/// scripts, and it was never set by this library (a raise stops at the maximum, and
/// acquisitions go up by one), so the node counts as one that did not answer.
pub(crate) fn usable(counter: Option<i64>) -> Option<i64> {
    counter.filter(|c| u64::try_from(*c).map_or(true, |c| c <= MAX_FENCING_COUNTER))
}

/// The token above `counter`, the highest counter a write-back found: the next try of an
/// acquisition whose token another one recorded first.
pub(crate) fn above(counter: i64) -> FencingToken {
    FencingToken(u64::try_from(counter).unwrap_or(0).saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_token_is_one_above_the_highest_counter_of_a_quorum() {
        let t = next_token(&[Some(4), Some(7), Some(5)], 2).unwrap();
        assert_eq!(t.get(), 8);
        // Nodes that did not answer yet do not matter once a quorum has a counter.
        assert_eq!(next_token(&[Some(4), None, Some(9)], 2).unwrap().get(), 10);
    }

    #[test]
    fn a_node_without_its_counter_is_not_counted() {
        // Node 1 lost its data; nodes 0 and 2 still make a quorum of 3.
        assert_eq!(
            next_token(&[Some(4), Some(-1), Some(6)], 2).unwrap().get(),
            7
        );
        // With only one counter among two answers, the missing one may have held more.
        assert_eq!(
            next_token(&[Some(4), Some(-1), None], 2),
            Err(Shortfall {
                seeded: 1,
                unseeded: 1,
                silent: 1
            })
        );
        assert!(next_token(&[Some(4), Some(-1), Some(-1)], 2).is_err());
    }

    #[test]
    fn a_node_set_without_counters_starts_at_one() {
        assert_eq!(
            next_token(&[Some(-1), Some(-1), Some(-1)], 2)
                .unwrap()
                .get(),
            1
        );
        // Not before every node answered: the silent one may hold the highest counter.
        assert!(next_token(&[Some(-1), Some(-1), None], 2).is_err());
    }

    #[test]
    fn a_quorum_that_lost_its_counters_does_not_start_again() {
        // Tokens 1-3 were recorded on nodes 0-2; nodes 0 and 1 restarted empty. A round
        // that hears nodes 0, 1 and 3 (never seeded) must not hand out 1 again...
        assert!(next_token(&[Some(-1), Some(-1), None, Some(-1), None], 3).is_err());
        // ...nor one that hears every node while node 2 still has its counter.
        assert!(next_token(&[Some(-1), Some(-1), Some(3), Some(-1), Some(-1)], 3).is_err());
    }

    #[test]
    fn tokens_strictly_increase_across_overlapping_quorums() {
        // Five nodes; every token is written back to a quorum before it is handed out, and
        // every later read quorum overlaps that write quorum, whichever nodes it has.
        let n = 5;
        let q = 3;
        let mut counters = vec![0i64; n];
        let mut last = 0;
        for round in 0..200usize {
            let read: Vec<usize> = (0..q).map(|k| (round * 7 + k * 2) % n).collect();
            let view: Vec<Option<i64>> = (0..n)
                .map(|i| read.contains(&i).then_some(counters[i]))
                .collect();
            let token = next_token(&view, q).unwrap().get();
            assert!(token > last, "round {round}: {token} after {last}");
            last = token;
            for k in 0..q {
                let i = (round * 3 + k) % n;
                counters[i] = counters[i].max(token as i64);
            }
        }
    }

    #[test]
    fn incr_on_each_node_and_the_max_is_not_monotonic() {
        // The negative control: each acquisition INCRs the counters of its own quorum and
        // takes the max. Two quorums that do not share the highest node go backwards.
        let mut counters = [0i64; 5];
        let mut take = |quorum: &[usize]| {
            quorum
                .iter()
                .map(|&i| {
                    counters[i] += 1;
                    counters[i]
                })
                .max()
                .unwrap()
        };
        let mut tokens = Vec::new();
        for _ in 0..3 {
            tokens.push(take(&[0, 1, 2]));
        }
        tokens.push(take(&[2, 3, 4]));
        tokens.push(take(&[3, 4, 0]));
        assert!(tokens.windows(2).any(|w| w[1] <= w[0]), "{tokens:?}");
    }
}

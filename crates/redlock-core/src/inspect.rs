//! Reading a lock's state from a quorum of nodes.

use std::time::Duration;

use fred::types::Value;

use crate::quorum::quorum;
use crate::report::{NodeName, NodeOutcome, RoundReport};

/// What the nodes say about a key, read with `PTTL` on every node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    /// The key.
    pub key: String,
    /// `Some(true)` when a quorum of nodes hold the key, `Some(false)` when so many nodes do
    /// not hold it that no quorum can, `None` when too few nodes answered to tell.
    pub held: Option<bool>,
    /// When held: the time until fewer than a quorum of nodes hold it (the quorum-th longest
    /// TTL). `None` when not held, or when the key has no expiry on a quorum of nodes.
    pub remaining: Option<Duration>,
    /// Each node: its TTL for the key (`Ok(None)` when absent) or why it did not answer.
    pub nodes: Vec<(NodeName, Result<Option<Duration>, NodeOutcome>)>,
}

impl Inspection {
    /// The inspection a `PTTL` round produced: each node's outcome from `report`, and its
    /// TTL in milliseconds from `values` (-1: no expiry).
    pub(crate) fn new(key: &str, report: &RoundReport, values: &[Option<Value>]) -> Self {
        let nodes = report
            .nodes
            .iter()
            .zip(values)
            .map(|(node, value)| {
                let ttl = match (&node.outcome, value) {
                    (NodeOutcome::Held, Some(Value::Integer(-1))) => Ok(Some(u64::MAX)),
                    (NodeOutcome::Held, Some(Value::Integer(ms))) => Ok(Some(*ms as u64)),
                    (NodeOutcome::NotHeld, _) => Ok(None),
                    (other, _) => Err(other.clone()),
                };
                (node.node.clone(), ttl)
            })
            .collect();
        Inspection::from_ttls(key, nodes)
    }

    fn from_ttls(key: &str, nodes: Vec<(NodeName, Result<Option<u64>, NodeOutcome>)>) -> Self {
        let n = nodes.len();
        let q = quorum(n);
        let mut present: Vec<u64> = nodes
            .iter()
            .filter_map(|(_, r)| r.as_ref().ok().copied().flatten())
            .collect();
        let absent = nodes.iter().filter(|(_, r)| matches!(r, Ok(None))).count();
        present.sort_unstable_by(|a, b| b.cmp(a));
        let held = if present.len() >= q {
            Some(true)
        } else if absent > n - q {
            Some(false)
        } else {
            None
        };
        let remaining = match held {
            Some(true) => Some(present[q - 1])
                .filter(|ms| *ms != u64::MAX)
                .map(Duration::from_millis),
            _ => None,
        };
        let nodes = nodes
            .into_iter()
            .map(|(name, r)| {
                let ttl = r.map(|ms| {
                    ms.map(|ms| {
                        if ms == u64::MAX {
                            Duration::MAX
                        } else {
                            Duration::from_millis(ms)
                        }
                    })
                });
                (name, ttl)
            })
            .collect();
        Inspection {
            key: key.to_string(),
            held,
            remaining,
            nodes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inspect(ttls: &[Result<Option<u64>, NodeOutcome>]) -> Inspection {
        let nodes = ttls
            .iter()
            .enumerate()
            .map(|(i, r)| (NodeName::redacted(&format!("redis://h:{i}")), r.clone()))
            .collect();
        Inspection::from_ttls("k", nodes)
    }

    #[test]
    fn held_by_a_quorum_reports_the_quorum_th_longest_ttl() {
        let i = inspect(&[
            Ok(Some(900)),
            Ok(Some(500)),
            Ok(None),
            Ok(Some(700)),
            Err(NodeOutcome::TimedOut),
        ]);
        assert_eq!(i.held, Some(true));
        assert_eq!(i.remaining, Some(Duration::from_millis(500)));
    }

    #[test]
    fn absent_on_enough_nodes_is_not_held() {
        let i = inspect(&[Ok(None), Ok(None), Ok(None), Ok(Some(700)), Ok(Some(700))]);
        assert_eq!(i.held, Some(false));
        assert_eq!(i.remaining, None);
    }

    #[test]
    fn too_few_answers_is_inconclusive() {
        let down = Err(NodeOutcome::TimedOut);
        let i = inspect(&[Ok(None), Ok(Some(1)), Ok(Some(1)), down.clone(), down]);
        assert_eq!(i.held, None);
    }
}

//! Reading a lock's state from a quorum of nodes.

use std::time::Duration;

use fred::types::Value;

use crate::quorum::{out_of_reach, quorum};
use crate::report::{NodeName, NodeOutcome, RoundReport};
use crate::server_error::{ServerError, ServerErrorKind};
use crate::token::Token;

/// What the nodes say about a key, read on every node by one read-only script (the key's
/// holder and TTL at one instant).
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
    /// Each node's holder of the key, in the order of `nodes`: `None` where the key is
    /// absent or the node did not answer. [`held_by`](Self::held_by) counts them.
    pub holders: Vec<Option<Holder>>,
}

/// Who holds a key on one node, as an inspection read it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Holder {
    /// A plain lock, or one key of a lock over several: the token stored under the key.
    Token(Token),
    /// A reentrant lock: its owner, and the token of each of its holds.
    Reentrant {
        /// The owner that holds the key.
        owner: String,
        /// The tokens of the owner's holds, in no particular order.
        holds: Vec<Token>,
    },
    /// A read-write lock's readers' set: the tokens of its live readers (an entry whose
    /// end the node's clock has passed is not a reader).
    Readers(Vec<Token>),
    /// A value this library did not write: a key of another type, a hash without an
    /// `owner` field, or bytes that are not text.
    Other,
}

impl Holder {
    /// Whether `token` holds the key here: it is the plain lock's token, or the token of
    /// one of the reentrant lock's holds ([`Lock::token`](crate::Lock::token) either way).
    pub fn has(&self, token: &Token) -> bool {
        match self {
            Holder::Token(held) => held == token,
            Holder::Reentrant { holds, .. } | Holder::Readers(holds) => holds.contains(token),
            Holder::Other => false,
        }
    }

    /// Reads the script's `{kind, ...}` after the TTL; `None` when malformed.
    fn read(kind: &[Value]) -> Option<Holder> {
        match kind {
            [kind, value] if text(kind)? == "s" => {
                Some(text(value).map_or(Holder::Other, |t| Holder::Token(Token::from_string(t))))
            }
            [kind, owner, Value::Array(holds)] if text(kind)? == "r" => Some(Holder::Reentrant {
                owner: text(owner)?,
                holds: holds
                    .iter()
                    .filter_map(text)
                    .map(Token::from_string)
                    .collect(),
            }),
            // Lua turns an empty table into an empty array; no holds is still an owner.
            [kind, owner] if text(kind)? == "r" => Some(Holder::Reentrant {
                owner: text(owner)?,
                holds: Vec::new(),
            }),
            [kind, Value::Array(readers)] if text(kind)? == "z" => Some(Holder::Readers(
                readers
                    .iter()
                    .filter_map(text)
                    .map(Token::from_string)
                    .collect(),
            )),
            [kind] if text(kind)? == "o" => Some(Holder::Other),
            _ => None,
        }
    }
}

/// A string reply as text; `None` for anything else, or bytes that are not UTF-8 (no token
/// of this library is).
fn text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.to_string()),
        Value::Bytes(b) => String::from_utf8(b.to_vec()).ok(),
        _ => None,
    }
}

/// One node's answer: absent (`Ok(None)`), or the key's TTL in milliseconds (`u64::MAX`:
/// no expiry) and holder.
type NodeState = Result<Option<(u64, Holder)>, NodeOutcome>;

impl Inspection {
    /// The inspection a round of the inspection script produced: each node's outcome from
    /// `report`, and its TTL and holder from `values`.
    pub(crate) fn new(key: &str, report: &RoundReport, values: &[Option<Value>]) -> Self {
        let nodes = report
            .nodes
            .iter()
            .zip(values)
            .map(|(node, value)| {
                let state = match (&node.outcome, value) {
                    (NodeOutcome::Held, Some(Value::Array(reply))) => read_state(reply),
                    (NodeOutcome::NotHeld, _) => Ok(None),
                    (NodeOutcome::Held, _) => Err(malformed()),
                    (other, _) => Err(other.clone()),
                };
                (node.node.clone(), state)
            })
            .collect();
        Inspection::from_nodes(key, nodes)
    }

    fn from_nodes(key: &str, nodes: Vec<(NodeName, NodeState)>) -> Self {
        let n = nodes.len();
        let q = quorum(n);
        let mut present: Vec<u64> = nodes
            .iter()
            .filter_map(|(_, r)| r.as_ref().ok()?.as_ref().map(|(ms, _)| *ms))
            .collect();
        let absent = nodes.iter().filter(|(_, r)| matches!(r, Ok(None))).count();
        present.sort_unstable_by(|a, b| b.cmp(a));
        let held = decide(present.len(), absent, n);
        let remaining = match held {
            Some(true) => Some(present[q - 1])
                .filter(|ms| *ms != u64::MAX)
                .map(Duration::from_millis),
            _ => None,
        };
        let (nodes, holders) = nodes
            .into_iter()
            .map(|(name, r)| match r {
                Ok(Some((ms, holder))) => {
                    let ttl = if ms == u64::MAX {
                        Duration::MAX
                    } else {
                        Duration::from_millis(ms)
                    };
                    ((name, Ok(Some(ttl))), Some(holder))
                }
                Ok(None) => ((name, Ok(None)), None),
                Err(outcome) => ((name, Err(outcome)), None),
            })
            .unzip();
        Inspection {
            key: key.to_string(),
            held,
            remaining,
            nodes,
            holders,
        }
    }

    /// Whether the lock with `token` holds the key, by the same quorum rule as
    /// [`held`](Self::held): `Some(true)` when a quorum of nodes hold it for `token` (a
    /// plain lock's token, or a reentrant hold's: [`Lock::token`](crate::Lock::token)),
    /// `Some(false)` when so many nodes answered otherwise (absent, or another holder) that
    /// no quorum can, `None` when too few nodes answered to tell.
    pub fn held_by(&self, token: &Token) -> Option<bool> {
        let ours = self
            .holders
            .iter()
            .filter(|h| h.as_ref().is_some_and(|h| h.has(token)))
            .count();
        let answered = self.nodes.iter().filter(|(_, r)| r.is_ok()).count();
        decide(ours, answered - ours, self.nodes.len())
    }
}

/// The quorum rule of an inspection: `yes` nodes say held, `no` nodes say not, of `n`.
fn decide(yes: usize, no: usize, n: usize) -> Option<bool> {
    let q = quorum(n);
    if yes >= q {
        Some(true)
    } else if out_of_reach(n, no) {
        Some(false)
    } else {
        None
    }
}

/// Reads the script's `{pttl, kind, ...}`.
fn read_state(reply: &[Value]) -> NodeState {
    let (ttl, kind) = match reply {
        [Value::Integer(-1), kind @ ..] => (u64::MAX, kind),
        [Value::Integer(ms), kind @ ..] if *ms >= 0 => (*ms as u64, kind),
        _ => return Err(malformed()),
    };
    match Holder::read(kind) {
        Some(holder) => Ok(Some((ttl, holder))),
        None => Err(malformed()),
    }
}

fn malformed() -> NodeOutcome {
    NodeOutcome::ServerError(ServerError::of_kind(
        ServerErrorKind::Unknown,
        "EVALSHA",
        "unexpected reply to the inspection script: the node may not be a Redis master",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(i: usize) -> NodeName {
        NodeName::redacted(&format!("redis://h:{i}"))
    }

    fn inspect(ttls: &[Result<Option<u64>, NodeOutcome>]) -> Inspection {
        let nodes = ttls
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let state = r.clone().map(|ttl| ttl.map(|ms| (ms, Holder::Other)));
                (name(i), state)
            })
            .collect();
        Inspection::from_nodes("k", nodes)
    }

    /// An inspection whose nodes hold the key for the given tokens (`Ok(None)`: absent).
    fn holders(tokens: &[Result<Option<&str>, NodeOutcome>]) -> Inspection {
        let nodes = tokens
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let state = r
                    .clone()
                    .map(|token| token.map(|t| (1000, Holder::Token(Token::from_string(t)))));
                (name(i), state)
            })
            .collect();
        Inspection::from_nodes("k", nodes)
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

    #[test]
    fn held_by_counts_only_the_token_s_nodes() {
        let me = Token::from_string("me");
        let down = Err(NodeOutcome::TimedOut);
        // Held on a quorum, but by someone else on two of the three.
        let i = holders(&[
            Ok(Some("me")),
            Ok(Some("other")),
            Ok(Some("other")),
            Ok(None),
            Ok(None),
        ]);
        assert_eq!(i.held, Some(true));
        assert_eq!(i.held_by(&me), Some(false));
        let i = holders(&[
            Ok(Some("me")),
            Ok(Some("me")),
            Ok(Some("me")),
            Ok(Some("x")),
            down.clone(),
        ]);
        assert_eq!(i.held_by(&me), Some(true));
        assert_eq!(i.held_by(&Token::from_string("x")), Some(false));
        // Two of ours, two down: a quorum may or may not be ours.
        let i = holders(&[Ok(Some("me")), Ok(Some("me")), Ok(None), down.clone(), down]);
        assert_eq!(i.held_by(&me), None);
        assert_eq!(i.holders[0], Some(Holder::Token(me.clone())));
        assert_eq!(i.holders[2], None);
    }

    #[test]
    fn script_replies_read_as_holders() {
        let s = |t: &str| Value::from(t);
        let token = read_state(&[Value::Integer(900), s("s"), s("abc")]);
        assert_eq!(
            token,
            Ok(Some((900, Holder::Token(Token::from_string("abc")))))
        );
        let reentrant = read_state(&[
            Value::Integer(-1),
            s("r"),
            s("worker-1"),
            Value::Array(vec![s("h1"), s("h2")]),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(reentrant.0, u64::MAX);
        assert!(reentrant.1.has(&Token::from_string("h2")));
        assert!(!reentrant.1.has(&Token::from_string("worker-1")));
        assert_eq!(
            read_state(&[Value::Integer(5), s("o")]),
            Ok(Some((5, Holder::Other)))
        );
        for bad in [vec![], vec![Value::Integer(5)], vec![s("s"), s("x")]] {
            assert!(read_state(&bad).is_err(), "{bad:?}");
        }
    }
}

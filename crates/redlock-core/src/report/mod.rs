//! What each node did in a round, and how the round ended.
//!
//! This file holds the round as a whole: its kind, its report and the settling that late
//! answers and rollbacks keep filling in; `node` holds one node's part (its answer and
//! cleanup).

mod node;
mod settling;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use crate::node_name::NodeName;
pub use node::{CleanupOutcome, ClosedReason, NodeOutcome, NodeReport};
pub(crate) use settling::{Settling, SettlingView, SettlingWriter};

/// Which kind of round a report describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RoundKind {
    /// `SET key token NX PX ttl` on every node.
    Acquire,
    /// Compare-and-`PEXPIRE` on every node.
    Extend,
    /// Compare-and-delete on every node.
    Release,
    /// `PTTL` on every node: who holds the key, and for how long.
    Inspect,
    /// The raise-only write-back of a fencing token to every node.
    Fence,
    /// A waiter leaves a key's fair queue on every node.
    Leave,
}

impl RoundKind {
    /// Whether a node's answer in a round of this kind counts towards a request's quorum.
    /// A release is done on a node once our key is gone from it, whether we deleted it or
    /// it had already expired.
    pub(crate) fn counts(self, outcome: &NodeOutcome) -> bool {
        match self {
            RoundKind::Acquire => *outcome == NodeOutcome::Acquired,
            RoundKind::Extend => *outcome == NodeOutcome::Extended,
            RoundKind::Release | RoundKind::Leave => {
                matches!(outcome, NodeOutcome::Released | NodeOutcome::NotHeld)
            }
            RoundKind::Inspect => *outcome == NodeOutcome::Held,
            RoundKind::Fence => *outcome == NodeOutcome::Recorded,
        }
    }
}

impl fmt::Display for RoundKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RoundKind::Acquire => "acquire",
            RoundKind::Extend => "extend",
            RoundKind::Release => "release",
            RoundKind::Inspect => "inspect",
            RoundKind::Fence => "record fencing token",
            RoundKind::Leave => "leave fair queue",
        })
    }
}

/// The report of one round: each node's outcome at the moment the round was decided.
#[derive(Debug, Clone)]
pub struct RoundReport {
    /// The kind of round.
    pub kind: RoundKind,
    /// The key (without any secret; tokens are never reported).
    pub key: Arc<str>,
    /// The number of nodes that had to accept.
    pub quorum: usize,
    /// The number of nodes that accepted before the decision.
    pub accepted: usize,
    /// Every node, in configuration order.
    pub nodes: Vec<NodeReport>,
    /// Time from the first send to the decision.
    pub elapsed: Duration,
    /// The validity left at the decision (`ttl - elapsed - drift`), for a round with a TTL
    /// that reached its quorum, when positive.
    pub validity: Option<Duration>,
    pub(crate) settling: Option<SettlingView>,
}

impl RoundReport {
    /// Whether `against` of this round's nodes that will not accept (counted however the
    /// caller counts them: refusals that need a change, "not ours" answers) leave fewer
    /// than a quorum that can: more than `nodes - quorum`.
    ///
    /// ```
    /// # use redlock_core::RoundReport;
    /// # fn check(report: &RoundReport) {
    /// // Of five nodes, three against leave two: a quorum of three is out of reach.
    /// assert_eq!(report.out_of_reach(3), report.nodes.len() == 5);
    /// # }
    /// ```
    pub fn out_of_reach(&self, against: usize) -> bool {
        crate::quorum::out_of_reach(self.nodes.len(), against)
    }

    /// Whether a quorum accepted and (for rounds with a TTL: acquisitions and extensions)
    /// validity was left.
    pub fn succeeded(&self) -> bool {
        let timed = matches!(self.kind, RoundKind::Acquire | RoundKind::Extend);
        self.accepted >= self.quorum && (!timed || self.validity.is_some())
    }

    /// Waits until every node has answered or timed out and every rollback has finished,
    /// then returns the complete report: late answers marked `late`, rollbacks in
    /// `cleanup`. Never needed for correctness (the work happens whether or not anyone
    /// waits); useful for tests, diagnostics and graceful shutdown.
    pub async fn settled(&self) -> RoundReport {
        let mut report = self.clone();
        if let Some(view) = report.settling.take() {
            report.nodes = view.settled().await;
        }
        report
    }

    /// What a caller should do about a round that failed, in one sentence.
    pub fn advice(&self) -> String {
        let n = self.nodes.len();
        let refused = self
            .nodes
            .iter()
            .filter(|r| {
                matches!(
                    r.outcome,
                    NodeOutcome::HeldByOther
                        | NodeOutcome::PartlyHeldByOther
                        | NodeOutcome::NotHeld
                )
            })
            .count();
        let unreachable = self
            .nodes
            .iter()
            .filter(|r| r.outcome.is_unreachable())
            .count();
        let server = self
            .nodes
            .iter()
            .filter(|r| matches!(r.outcome, NodeOutcome::ServerError(_)))
            .count();
        let closed = self
            .nodes
            .iter()
            .any(|r| matches!(r.outcome, NodeOutcome::Closed(_)));
        let mut advice = Vec::new();
        if closed {
            advice.push(
                "this client sends nothing any more: connect a new one in the tokio runtime that uses it",
            );
        }
        if refused > 0 {
            advice.push(match self.kind {
                RoundKind::Acquire => "the lock is held by another owner: retry after a randomized delay (redlock-client's `lock` does this)",
                _ => "the lock is no longer ours (it expired or was taken over): stop using the protected resource and acquire it again",
            });
        }
        // Nodes that timed out with their connections up may only be slow for this request
        // (a lock over many keys is one script over all of them on each node).
        let timed_out_only = !self
            .nodes
            .iter()
            .any(|r| matches!(r.outcome, NodeOutcome::ConnectionError(_)));
        if unreachable > 0 && timed_out_only {
            advice.push("some nodes did not answer in time: check that the nodes are running and reachable from this host; if they are, they were slower than the per-node timeout (`node_timeout`) for this request: raise it, or lock fewer keys at a time (each node runs a lock over many keys as one script over all of them)");
        } else if unreachable > 0 {
            advice.push("some nodes did not answer in time: check that the nodes are running and reachable from this host, or raise the per-node timeout if they are only slow");
        }
        if server > 0 {
            advice.push(
                "some nodes answered with an error: see each node's message and what it says to do",
            );
        }
        if advice.is_empty() {
            advice.push("retry");
        }
        let mut text = advice.join("; ");
        if self.kind == RoundKind::Release && n > 0 && !closed {
            text.push_str(
                "; nodes that did not answer get the release again in the background (up to three \
                 tries), and keys not deleted expire by themselves at the end of their TTL",
            );
        }
        text
    }
}

impl fmt::Display for RoundReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} \"{}\": {} of {} nodes accepted (quorum {}) in {:.1?}",
            self.kind,
            self.key,
            self.accepted,
            self.nodes.len(),
            self.quorum,
            self.elapsed
        )?;
        if let Some(validity) = self.validity {
            write!(f, ", validity {validity:.1?}")?;
        }
        f.write_str(" [")?;
        for (i, node) in self.nodes.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            node.fmt_in(f, self.kind)?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only acquisitions and extensions need validity left: a won leave, fence write-back
    /// or inspection reads as won at its quorum, as a release does, with no validity.
    #[test]
    fn a_round_without_a_ttl_succeeds_at_its_quorum() {
        let report = |kind, accepted, validity| RoundReport {
            kind,
            key: "k".into(),
            quorum: 2,
            accepted,
            nodes: Vec::new(),
            elapsed: Duration::ZERO,
            validity,
            settling: None,
        };
        for kind in [
            RoundKind::Release,
            RoundKind::Inspect,
            RoundKind::Fence,
            RoundKind::Leave,
        ] {
            assert!(report(kind, 2, None).succeeded(), "{kind}");
            assert!(!report(kind, 1, None).succeeded(), "{kind}");
        }
        for kind in [RoundKind::Acquire, RoundKind::Extend] {
            assert!(!report(kind, 2, None).succeeded(), "{kind}");
            assert!(
                report(kind, 2, Some(Duration::from_millis(1))).succeeded(),
                "{kind}"
            );
        }
    }

    #[test]
    fn a_reports_debug_shows_how_many_nodes_are_still_open_and_nothing_of_the_channel() {
        let writer = SettlingWriter::new(Settling {
            requests: vec![Vec::new()],
            open: 2,
        });
        let report = RoundReport {
            kind: RoundKind::Acquire,
            key: "k".into(),
            quorum: 2,
            accepted: 2,
            nodes: Vec::new(),
            elapsed: Duration::from_micros(800),
            validity: None,
            settling: Some(writer.view(0)),
        };
        let debug = format!("{report:?}");
        assert!(
            debug.contains("settling: Some(Settling { open: 2 })"),
            "{debug}"
        );
        assert!(!debug.contains("Mutex"), "{debug}");
    }

    /// Nodes that only timed out (their connections up) may be slow for this request, a
    /// lock over many keys among them: the advice names the node timeout and the lock's
    /// size, not only the network. A node whose connection failed keeps the short advice.
    #[test]
    fn timeouts_alone_are_advised_as_slowness_too() {
        let report = |outcome: NodeOutcome| RoundReport {
            kind: RoundKind::Acquire,
            key: "k".into(),
            quorum: 2,
            accepted: 0,
            nodes: vec![NodeReport::pending(NodeName::redacted("redis://h:1")), {
                let mut node = NodeReport::pending(NodeName::redacted("redis://h:2"));
                node.outcome = outcome;
                node
            }],
            elapsed: Duration::from_millis(5),
            validity: None,
            settling: None,
        };
        let slow = report(NodeOutcome::TimedOut).advice();
        assert!(slow.contains("(`node_timeout`)"), "{slow}");
        assert!(slow.contains("lock fewer keys at a time"), "{slow}");
        let down = report(NodeOutcome::ConnectionError("refused".into())).advice();
        assert!(!down.contains("lock fewer keys"), "{down}");
        assert!(down.contains("did not answer in time"), "{down}");
        assert!(down.contains("check that the nodes are running"), "{down}");
        assert!(slow.contains("check that the nodes are running"), "{slow}");
    }

    /// A release that a node did not answer is sent again, not rolled back: its report says
    /// so, and never reads "rollback failed" for a release.
    #[test]
    fn a_release_sent_again_is_not_called_a_rollback() {
        let node = |cleanup| NodeReport {
            node: NodeName::redacted("redis://h:1"),
            outcome: NodeOutcome::TimedOut,
            latency: Some(Duration::from_millis(5)),
            late: false,
            cleanup: Some(cleanup),
        };
        let report = |kind| RoundReport {
            kind,
            key: "k".into(),
            quorum: 1,
            accepted: 1,
            nodes: vec![
                node(CleanupOutcome::Failed("not connected".into())),
                node(CleanupOutcome::Removed),
                node(CleanupOutcome::NotPresent),
            ],
            elapsed: Duration::from_millis(5),
            validity: None,
            settling: None,
        };
        let release = report(RoundKind::Release).to_string();
        assert!(!release.contains("roll"), "{release}");
        assert!(
            release.contains(
                "sent again, and that failed too (not connected); the key expires with its TTL"
            ),
            "{release}"
        );
        assert!(release.contains("sent again: released"), "{release}");
        assert!(
            release.contains("sent again: nothing of ours was left there"),
            "{release}"
        );
        let leave = report(RoundKind::Leave).to_string();
        assert!(leave.contains("sent again: left the queue"), "{leave}");
        let acquire = report(RoundKind::Acquire).to_string();
        assert!(
            acquire.contains("rollback failed (not connected)"),
            "{acquire}"
        );
        assert!(acquire.contains("rolled back; "), "{acquire}");
    }
}

//! What a round's request became: the one place where a decision turns into a [`Lock`], a
//! deadline, the error of a lost request, a hand-over's decision, or the report of a round
//! that sent nothing.

use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;
use tokio::time::Instant;

use crate::deadline::Deadline;
use crate::drift::lease;
use crate::error::Error;
use crate::lock::Lock;
use crate::lock_spec::LockSpec;
use crate::node_name::NodeName;
use crate::quorum::quorum;
use crate::report::{ClosedReason, NodeOutcome, NodeReport, RoundKind, RoundReport};

/// How one request of a round ended.
#[derive(Debug)]
pub(crate) struct Decided {
    pub(crate) report: RoundReport,
    /// Reached its quorum (and, with a TTL, had validity left).
    pub(crate) won: bool,
    /// For a won request with a TTL: `t0 + ttl - drift` (and the host's suspend at `t0`).
    pub(crate) valid_until: Option<Deadline>,
    /// What each node returned beyond yes or no, by node, as far as known at the decision.
    pub(crate) values: Vec<Option<Value>>,
}

impl Decided {
    /// The decision of an acquisition of `key` that no round of ours sent: a lock that
    /// releases handed over to a waiter, `accepted` of the `nodes` having said so, its
    /// lease of `ttl` counted from `since` (the host's suspend then: `suspended`).
    pub(crate) fn handed_over(
        key: Arc<str>,
        nodes: Vec<NodeReport>,
        accepted: usize,
        (since, suspended): (Instant, Duration),
        (ttl, drift_factor): (Duration, f64),
    ) -> Decided {
        let quorum = quorum(nodes.len());
        let elapsed = since.elapsed();
        let lease =
            granted(ttl, drift_factor, since, elapsed, suspended).filter(|_| accepted >= quorum);
        Decided {
            report: RoundReport {
                kind: RoundKind::Acquire,
                key,
                quorum,
                accepted,
                nodes,
                elapsed,
                validity: lease.map(|(validity, _)| validity),
                settling: None,
            },
            won: lease.is_some(),
            valid_until: lease.map(|(_, deadline)| deadline),
            values: Vec::new(),
        }
    }

    /// The lock this decision of `spec`'s request for `ttl` produced, or the error of a
    /// lost one. `held_until` is the deadline an extended lock had before the round:
    /// extensions never shorten, so it stays a lower bound.
    pub(crate) fn into_lock(
        self,
        spec: LockSpec,
        ttl: Duration,
        held_until: Option<Deadline>,
    ) -> Result<Lock, Error> {
        let (true, Some(valid_until)) = (self.won, self.valid_until) else {
            return Err(lost(self.report, ttl));
        };
        Ok(Lock {
            keys: spec.keys,
            name: spec.name,
            token: spec.token,
            kind: spec.kind,
            owner: spec.arg,
            fair: spec.fair,
            ttl,
            valid_until: held_until.map_or(valid_until, |held| held.later(valid_until)),
            report: Arc::new(self.report),
            fencing_token: None,
        })
    }

    /// The instant a won request's validity ends, or the error of a lost one (for a
    /// request of `ttl`): no quorum, or a quorum too late for any validity.
    pub(crate) fn into_deadline(self, ttl: Duration) -> Result<Deadline, Error> {
        match (self.won, self.valid_until) {
            (true, Some(valid_until)) => Ok(valid_until),
            _ => Err(lost(self.report, ttl)),
        }
    }
}

/// The error of a request of `ttl` that did not win: no quorum, or a quorum too late for
/// any validity.
fn lost(report: RoundReport, ttl: Duration) -> Error {
    let report = Box::new(report);
    if report.accepted >= report.quorum {
        Error::ValidityExhausted { report, ttl }
    } else {
        Error::NoQuorum { report }
    }
}

/// The report of a round that sent nothing because the task that was to send it is gone
/// (see `group`): every one of `nodes` [`NodeOutcome::Closed`] for `reason`.
pub(crate) fn unsent(
    kind: RoundKind,
    key: Arc<str>,
    nodes: Vec<NodeName>,
    reason: ClosedReason,
) -> RoundReport {
    RoundReport {
        kind,
        key,
        quorum: quorum(nodes.len()),
        accepted: 0,
        nodes: nodes
            .into_iter()
            .map(|node| NodeReport {
                outcome: NodeOutcome::Closed(reason),
                ..NodeReport::pending(node)
            })
            .collect(),
        elapsed: Duration::ZERO,
        validity: None,
        settling: None,
    }
}

/// The validity left `elapsed` after `t0` of a lease of `ttl` (drift taken off, a host
/// suspend since `suspended` counted as time passed) and the deadline it ends at; `None`
/// when none is left.
pub(super) fn granted(
    ttl: Duration,
    drift_factor: f64,
    t0: Instant,
    elapsed: Duration,
    suspended: Duration,
) -> Option<(Duration, Deadline)> {
    let (_, until) = lease(ttl, drift_factor, t0, elapsed)?;
    let deadline = Deadline::new(until, suspended);
    Some((deadline.remaining_at(t0 + elapsed)?, deadline))
}

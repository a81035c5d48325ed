//! Reading a round's result: won with enough validity, lost (and how), or an error no
//! retry can mend; and the error a call that gives up returns.

use std::time::Duration;

use redlock_core::{Lock, NodeOutcome, RoundKind, RoundReport};

use super::Call;
use crate::error::{Error, InvalidConfig};

/// A round that did not give the caller the lock.
pub(super) struct Lost {
    pub(super) report: Box<RoundReport>,
    /// The validity of a round won with less than the minimum...
    pub(super) short: Option<Duration>,
    /// ...and its lock, until it is released again.
    pub(super) short_lock: Option<Lock>,
    /// A fenced round that won and got no token (`NotFenced`): if the call gives up now,
    /// this says why (a "gave up waiting" would send the user after a holder).
    pub(super) not_fenced: Option<redlock_core::Error>,
}

impl Lost {
    /// A round's result: the lock (`Ok(Ok)`), a lost round to retry (`Ok(Err)`), or an
    /// error that ends the call: a setting the nodes refuse, or fencing counters that only
    /// an operator can mend (see the error).
    pub(super) fn judge(
        round: Result<Lock, redlock_core::Error>,
        min_validity: Duration,
    ) -> Result<Result<Lock, Lost>, Error> {
        let lost = |report: &RoundReport| Lost {
            report: Box::new(report.clone()),
            short: None,
            short_lock: None,
            not_fenced: None,
        };
        Ok(Err(match round {
            Ok(lock) => match lock.remaining() {
                validity if long_enough(validity, min_validity) => return Ok(Ok(lock)),
                validity => {
                    let mut short = lost(lock.report());
                    short.short = Some(validity.unwrap_or(Duration::ZERO));
                    short.short_lock = Some(lock);
                    short
                }
            },
            Err(redlock_core::Error::Config(e)) => return Err(InvalidConfig::Core(e).into()),
            Err(redlock_core::Error::Argument(e)) => return Err(Error::InvalidArgument(e)),
            Err(
                e @ (redlock_core::Error::FencingCountersLost { .. }
                | redlock_core::Error::FencingTokenBehind { .. }),
            ) => return Err(Error::Round(e)),
            Err(e) => {
                let mut lost = lost(e.report().expect("a round error carries its report"));
                if matches!(e, redlock_core::Error::NotFenced { .. }) {
                    lost.not_fenced = Some(e);
                }
                lost
            }
        }))
    }

    /// Whether this was a fair head's round that found the key free wherever it got an
    /// answer: an acquisition round (not a fenced one's token write-back) that no node
    /// refused, and not won below the minimum validity. One that keeps losing so cannot
    /// win: its answers come after the node timeout, or it reaches too few nodes.
    pub(super) fn head_found_the_key_free(&self) -> bool {
        self.short.is_none()
            && self.not_fenced.is_none()
            && self.report.kind == RoundKind::Acquire
            && not_refused(&self.report)
    }
}

impl Call<'_> {
    /// The error for a call that gives up after `lost`: past its deadline, or with every
    /// allowed attempt used (or refused until a setting changes).
    pub(super) fn give_up(&self, lost: Lost, past_deadline: bool) -> Error {
        if let Some(e) = lost.not_fenced {
            return Error::Round(e);
        }
        let key = self.ids.name.to_string();
        let (attempts, report) = (self.attempts, lost.report);
        if let Some(validity) = lost.short {
            return Error::BelowMinValidity {
                key,
                attempts,
                validity,
                min_validity: self.plan.min_validity,
                report,
            };
        }
        // No node gave an answer about the key (pending ones had not answered either).
        let unreachable = report.nodes.iter().all(|n| {
            matches!(
                n.outcome,
                NodeOutcome::TimedOut | NodeOutcome::ConnectionError(_) | NodeOutcome::Pending
            )
        });
        if unreachable {
            Error::Unreachable { key, report }
        } else if past_deadline {
            Error::DeadlinePassed {
                key,
                waited: self.start.elapsed(),
                attempts,
                report,
            }
        } else {
            Error::NotAcquired {
                key,
                attempts,
                report,
            }
        }
    }
}

/// Whether more nodes than a quorum can spare refused the round with an error that
/// retrying cannot clear ([`ServerErrorKind::needs_a_change`]): credentials, ACL
/// permissions, a read-only replica. Waiting out `max_wait` would only delay the error.
///
/// [`ServerErrorKind::needs_a_change`]: redlock_core::ServerErrorKind::needs_a_change
pub(super) fn refused_until_changed(report: &RoundReport) -> bool {
    let refused = report
        .nodes
        .iter()
        .filter(|n| matches!(&n.outcome, NodeOutcome::ServerError(e) if e.kind.needs_a_change()))
        .count();
    report.out_of_reach(refused)
}

/// Whether no node refused a lost round: none held the keys for someone else, or said
/// that another waiter's turn had come (which a gated round's report counts as held).
fn not_refused(report: &RoundReport) -> bool {
    !report.nodes.iter().any(|n| {
        matches!(
            n.outcome,
            NodeOutcome::HeldByOther | NodeOutcome::PartlyHeldByOther
        )
    })
}

/// Whether a lock won with `remaining` validity (`None`: none left) may be handed to the
/// caller, who asked for at least `min_validity`. A lock with nothing left never is, even
/// at a `min_validity` of zero: it is released and the attempt counts as lost.
pub(super) fn long_enough(remaining: Option<Duration>, min_validity: Duration) -> bool {
    remaining.is_some_and(|left| left >= min_validity)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock whose validity ran out between its round's decision and the check (its
    /// answer waited in a busy runtime, a fenced write-back ended with it) must not be
    /// handed to the caller as won when `min_validity` is zero, the default: `lock()`
    /// would return a lock that is not valid, and code that does not call `is_valid()`
    /// would use the resource unprotected.
    #[test]
    fn a_lock_with_no_validity_left_is_never_long_enough() {
        assert!(!long_enough(None, Duration::ZERO));
        assert!(!long_enough(None, Duration::from_secs(1)));
        assert!(long_enough(Some(Duration::from_millis(1)), Duration::ZERO));
        assert!(long_enough(
            Some(Duration::from_secs(1)),
            Duration::from_secs(1)
        ));
        assert!(!long_enough(
            Some(Duration::from_millis(999)),
            Duration::from_secs(1)
        ));
    }
}

//! The fair queue's values: a waiter's place, the token a
//! release hands a key over under, and a lock handed over. Nothing here sends a command
//! (the protocol is in `fair/mod.rs`), so the lock's identity (`lock_spec.rs`) builds on
//! it from below.

use std::time::Duration;

use fred::types::Value;
use tokio::time::Instant;

use crate::config::MAX_TTL;
use crate::error::{ArgumentError, FairPlaceProblem};
use crate::message::HANDOVER_MARK;
use crate::token::Token;

/// A waiter's place in a key's fair queue: who it is, its ticket, and how long its entry
/// outlives its last attempt. Give the same place to every attempt of one wait.
///
/// ```
/// use std::time::Duration;
/// use redlock_core::support::FairPlace;
/// use redlock_core::Acquisition;
///
/// let keys = ["invoice:42"];
/// let place = FairPlace::now("waiter-7", Duration::from_secs(2));
/// let fair = Acquisition {
///     fair: Some(place),
///     ..Acquisition::new(&keys, Duration::from_secs(10))
/// };
/// assert_eq!(fair.fair.unwrap().waiter, "waiter-7");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairPlace<'a> {
    /// Who waits: unique among the waiters of the key (a random id per wait), without
    /// white space or `~`. An id `"<tag>:<rest>"` has the release that names it as the queue's
    /// next waiter published on `"<release channel>:<tag>"` instead of the shared release
    /// channel, so that only the waiter's own client hears it (`redlock-client` tags its
    /// waiters with a random id per client).
    pub waiter: &'a str,
    /// The order: lower goes first, then the waiter id. Normally the wall clock in ms
    /// when the wait began.
    pub ticket: u64,
    /// How long the entry stays on a node after the waiter's last attempt there. Longer
    /// than the longest pause between two attempts of the waiter, or it loses its place;
    /// short, because a waiter that crashed holds up the queue that long. At most
    /// [`MAX_TTL`](crate::MAX_TTL) (a year): the nodes keep the queue's keys that long.
    pub patience: Duration,
    /// For a fair (gated) attempt: its hand-over number, increasing from attempt to attempt
    /// of this wait (the attempt's count, say) and below 2^53 (the nodes' scripts compare
    /// numbers as doubles): `Waiters::leave_up_to` ([`Coordinator::waiters`](crate::Coordinator::waiters)) keeps the hand-overs of the
    /// attempts after the number it is given. A release that finds the waiter at the head of the
    /// queue then hands it the key under the token `"<waiter>~<number>"`, with this
    /// attempt's TTL; see `Waiters::handed_over` ([`Coordinator::waiters`](crate::Coordinator::waiters)). `None` (the default): releases only
    /// announce themselves to the waiter, which runs a round of its own. Only a plain lock
    /// of one key, not fenced, is handed over: the attempt of a reentrant or fenced lock
    /// ignores it (a hold, or a fencing token, needs the waiter's own round).
    pub handover: Option<u64>,
}

impl<'a> FairPlace<'a> {
    /// A place with a ticket from the wall clock now.
    pub fn now(waiter: &'a str, patience: Duration) -> Self {
        let ticket = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            });
        FairPlace {
            waiter,
            ticket,
            patience,
            handover: None,
        }
    }

    pub(crate) fn check(&self) -> Result<(), ArgumentError> {
        // `~` separates a waiter id from its hand-over number in a hand-over token: with
        // it, one waiter's id could begin another's token, and the first would take that
        // key on (or delete it) as its own.
        let problem = if self.waiter.is_empty() {
            FairPlaceProblem::EmptyWaiter
        } else if self.waiter.contains(char::is_whitespace) {
            FairPlaceProblem::WhiteSpace
        } else if self.waiter.contains(HANDOVER_MARK) {
            FairPlaceProblem::HandoverMark
        } else if self.patience.is_zero() {
            FairPlaceProblem::ZeroPatience
        } else if self.patience > MAX_TTL {
            // The nodes expire the queue's keys after the patience: past Redis's range, the
            // script's `PEXPIRE` fails after its writes, and keys without expiry stay.
            FairPlaceProblem::PatienceTooLong {
                patience: self.patience,
                max: MAX_TTL,
            }
        } else {
            return Ok(());
        };
        Err(ArgumentError::FairPlace { problem })
    }

    /// The script's arguments after the token and the TTL: waiter, ticket, patience in ms.
    pub(crate) fn args(&self) -> [Value; 3] {
        // Sorted-set scores are doubles: tickets are exact up to 2^53 ms (285,000 years).
        let ticket = i64::try_from(self.ticket.min(1 << 53)).unwrap_or(i64::MAX);
        let patience = i64::try_from(self.patience.as_millis().max(1)).unwrap_or(i64::MAX);
        [
            Value::from(self.waiter),
            Value::from(ticket),
            Value::from(patience),
        ]
    }
}

/// The token of the key a release hands over to `waiter` for its attempt `number`.
pub fn handover_token(waiter: &str, number: u64) -> Token {
    Token::from_string(crate::message::handover_token_text(waiter, number))
}

/// A lock handed over to a fair waiter by the nodes' release scripts (see
/// `Waiters::handed_over` ([`Coordinator::waiters`](crate::Coordinator::waiters))).
#[derive(Debug, Clone, Copy)]
pub struct Handover<'a> {
    /// The key.
    pub key: &'a str,
    /// The waiter's id, as in its [`FairPlace`].
    pub waiter: &'a str,
    /// The hand-over number of the attempt that registered the hand-over.
    pub number: u64,
    /// That attempt's TTL.
    pub ttl: Duration,
    /// An instant before that attempt's round sent its first command (its `t0`, or
    /// earlier).
    pub since: Instant,
    /// `support::host_suspended` read at `since` (or just before it): a
    /// host suspend after it shortens the validity (see [`Deadline`](crate::Deadline)). Not a default such
    /// as zero: every suspend since the host booted would count, and a laptop's hand-overs
    /// would all come too late.
    pub suspended: Duration,
    /// The nodes (by index, in configuration order) that said they handed the key over
    /// under this number.
    pub nodes: &'a [usize],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_needs_a_waiter_and_patience_and_says_what_is_wrong() {
        let ok = FairPlace {
            waiter: "w",
            ticket: 1,
            patience: Duration::from_millis(1),
            handover: None,
        };
        assert!(ok.check().is_ok());
        assert!(FairPlace {
            patience: MAX_TTL,
            ..ok
        }
        .check()
        .is_ok());
        let problem = |place: FairPlace<'_>| match place.check() {
            Err(ArgumentError::FairPlace { problem }) => problem,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            problem(FairPlace { waiter: "", ..ok }),
            FairPlaceProblem::EmptyWaiter
        );
        assert_eq!(
            problem(FairPlace {
                waiter: "a b",
                ..ok
            }),
            FairPlaceProblem::WhiteSpace
        );
        // "a" would own "a~1~2", waiter "a~1"'s hand-over token, by its prefix.
        assert_eq!(
            problem(FairPlace {
                waiter: "a~1",
                ..ok
            }),
            FairPlaceProblem::HandoverMark
        );
        assert_eq!(
            problem(FairPlace {
                patience: Duration::ZERO,
                ..ok
            }),
            FairPlaceProblem::ZeroPatience
        );
        for past in [MAX_TTL + Duration::from_millis(1), Duration::MAX] {
            assert_eq!(
                problem(FairPlace {
                    patience: past,
                    ..ok
                }),
                FairPlaceProblem::PatienceTooLong {
                    patience: past,
                    max: MAX_TTL
                }
            );
        }
        let message = ArgumentError::FairPlace {
            problem: FairPlaceProblem::WhiteSpace,
        }
        .to_string();
        assert!(message.contains("white space"), "{message}");
    }

    #[test]
    fn tickets_beyond_a_double_are_capped_and_the_clock_ticket_is_recent() {
        let far = FairPlace {
            waiter: "w",
            ticket: u64::MAX,
            patience: Duration::from_secs(1),
            handover: None,
        };
        assert_eq!(far.args()[1], Value::from(1i64 << 53));
        // After 2020-01-01 and exactly representable as a sorted-set score.
        let now = FairPlace::now("w", Duration::from_secs(1)).ticket;
        assert!(now > 1_577_836_800_000 && now < 1 << 53);
    }
}

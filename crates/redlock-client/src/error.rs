//! The client's errors: one enum for taking, holding and releasing a lock, with variants a
//! caller can act on, and [`InvalidConfig`] for values that cannot work.
//!
//! `InvalidConfig` lives here rather than next to the configuration because every policy
//! validates into it (`LockConfig`, `RetryPolicy`, per-call options): with it in this leaf
//! module, the policies depend on the error and never on each other.

use std::fmt;
use std::time::Duration;

use redlock_core::RoundReport;

/// Why a lock was lost while it was held.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The validity ran out before a renewal succeeded (renewal off, capped by `max_hold`,
    /// or every renewal attempt failed to reach a quorum in time).
    Expired,
    /// A majority of nodes answered that the key is not ours (deleted, expired or
    /// taken over); renewal stopped at once.
    Refused,
    /// The holder released the lock (or dropped its guard): it is not held.
    Released,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "its validity ran out before it could be renewed",
            LostReason::Refused => "a majority of nodes no longer hold it for us",
            LostReason::Released => "its holder released it",
        })
    }
}

/// A configuration value that cannot work. Nothing was connected; each message names the
/// value and what to change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidConfig {
    /// A value checked by redlock-core: nodes, node timeout, drift factor, TLS, node health.
    #[error(transparent)]
    Core(#[from] redlock_core::ConfigError),
    /// A TTL the nodes cannot hold, as configured or given per call (`LockOptions::ttl`).
    #[error(transparent)]
    Ttl(redlock_core::ArgumentError),
    /// The retry policy.
    #[error("invalid retry policy: {reason}")]
    Retry {
        /// What is wrong and what to change.
        reason: String,
    },
    /// The renewal policy.
    #[error("invalid renewal policy: {reason}")]
    Renewal {
        /// What is wrong and what to change.
        reason: String,
    },
    /// The key prefix.
    #[error("invalid key prefix: {reason}")]
    KeyPrefix {
        /// What is wrong and what to change.
        reason: String,
    },
    /// The minimum validity (`min_validity`, configured or per call).
    #[error("invalid minimum validity: {reason}")]
    MinValidity {
        /// What is wrong and what to change.
        reason: String,
    },
}

/// Everything that can go wrong taking, holding or releasing a lock.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Every attempt the retry policy allowed was lost. Everything the attempts set has
    /// been (or is being) rolled back.
    #[error("lock \"{key}\" not acquired after {attempts} attempt(s); last round: {report}; {}", report.advice())]
    NotAcquired {
        /// The full key (with the prefix).
        key: String,
        /// How many rounds were run.
        attempts: u32,
        /// What each node answered in the last round.
        report: Box<RoundReport>,
    },
    /// The retry policy's overall wait (`max_wait`) ran out.
    #[error("gave up waiting for lock \"{key}\" after {} and {attempts} attempt(s); last round: {report}; {}; or wait longer (retry.max_wait), or find out who holds it (inspect)", millis(*waited), report.advice())]
    DeadlinePassed {
        /// The full key.
        key: String,
        /// How long was waited.
        waited: Duration,
        /// How many rounds were run.
        attempts: u32,
        /// What each node answered in the last round.
        report: Box<RoundReport>,
    },
    /// The lock was lost while held: stop using the protected resource.
    #[error(
        "lock \"{key}\" was lost: {reason}; stop using the protected resource and acquire it again"
    )]
    LockLost {
        /// The full key.
        key: String,
        /// Why.
        reason: LostReason,
    },
    /// The configuration, or an option given per call, cannot work; nothing was sent.
    #[error("invalid lock configuration: {0}")]
    InvalidConfig(#[from] InvalidConfig),
    /// An argument of this call cannot work (an empty or reserved key, a token that
    /// cannot be stored, a fencing counter out of range); nothing was sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(#[from] redlock_core::ArgumentError),
    /// No node answered about the key before the last round was decided: each failed
    /// (timed out, connection down) or had not answered yet. A node that had not answered
    /// may still answer later (see `RoundReport::settled`).
    #[error("no Redis node answered for lock \"{key}\" before the round was decided (each failed or had not answered yet): {report}; {}", report.advice())]
    Unreachable {
        /// The full key.
        key: String,
        /// What each node answered.
        report: Box<RoundReport>,
    },
    /// The last attempt won its round, but with less validity left than the minimum
    /// (`min_validity`), or with none left at all by the time the caller would have had it
    /// (whatever the minimum): it was released at once, and the retry policy allowed no
    /// more attempts.
    #[error("lock \"{key}\" not acquired after {attempts} attempt(s): the last round won with {validity:?} of validity left, {}, and was released again; last round: {report}; use a longer TTL or a lower min_validity, and look for slow nodes in the report", short_of(*validity, *min_validity))]
    BelowMinValidity {
        /// The full key.
        key: String,
        /// How many rounds were run.
        attempts: u32,
        /// The validity the last round left.
        validity: Duration,
        /// The minimum asked for.
        min_validity: Duration,
        /// What each node answered in the last round.
        report: Box<RoundReport>,
    },
    /// A release or extension round failed, or an acquisition failed in a way that no
    /// retry mends: a fenced lock whose node set lost its fencing counters
    /// ([`redlock_core::Error::FencingCountersLost`] or
    /// [`redlock_core::Error::FencingTokenBehind`], which say what to do).
    #[error(transparent)]
    Round(redlock_core::Error),
    /// The client sends nothing any more: it was shut down, or the tokio runtime that
    /// connected it has shut down. Nothing was sent for this call (or the call stopped at
    /// the first round that found it so).
    #[error("lock \"{key}\" cannot be taken: {reason}; connect a new client in the tokio runtime that uses it")]
    Closed {
        /// The full key.
        key: String,
        /// Why the client is closed.
        reason: redlock_core::ClosedReason,
    },
}

/// A duration as people read it, to the millisecond (`2s 4ms`, not `2.004806044s`).
/// Why a won round's validity was not enough: below the minimum, or none left at all (a
/// lock with nothing left is never handed out, whatever the minimum).
fn short_of(validity: Duration, min_validity: Duration) -> String {
    if validity.is_zero() {
        "none left by the time it would have been handed out".to_string()
    } else {
        format!("less than the minimum {min_validity:?}")
    }
}

fn millis(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_millis(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    ))
}

impl Error {
    /// The per-node report of the last round, when there was one.
    pub fn report(&self) -> Option<&RoundReport> {
        match self {
            Error::NotAcquired { report, .. }
            | Error::DeadlinePassed { report, .. }
            | Error::Unreachable { report, .. }
            | Error::BelowMinValidity { report, .. } => Some(report),
            Error::Round(e) => e.report(),
            Error::LockLost { .. }
            | Error::InvalidConfig(_)
            | Error::InvalidArgument(_)
            | Error::Closed { .. } => None,
        }
    }
}

impl From<redlock_core::Error> for Error {
    fn from(e: redlock_core::Error) -> Self {
        match e {
            redlock_core::Error::Config(c) => Error::InvalidConfig(InvalidConfig::Core(c)),
            redlock_core::Error::Argument(a) => Error::InvalidArgument(a),
            other => Error::Round(other),
        }
    }
}

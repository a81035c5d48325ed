//! An acquired lock: the key, the token that proves ownership, and its validity deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::report::RoundReport;
use crate::token::Token;

/// A lock won by a round. Plain data: it does nothing when dropped (`redlock-client`'s guard
/// adds release-on-drop and renewal). The holder may use the protected resource only while
/// [`is_valid`](Lock::is_valid) is true, and must stop before
/// [`valid_until`](Lock::valid_until): no lock service can stop a holder that pauses past
/// its validity (fence the resource for that).
#[derive(Debug, Clone)]
pub struct Lock {
    pub(crate) key: Arc<str>,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    pub(crate) valid_until: Instant,
    pub(crate) report: RoundReport,
}

impl Lock {
    /// The locked key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The token stored under the key on the nodes.
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// The TTL the last acquisition or extension set.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The end of the validity: `t0 + ttl - drift`, with `t0` read before the round's first
    /// command was sent.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// The validity left now, or `None` once it has run out.
    pub fn remaining(&self) -> Option<Duration> {
        self.remaining_at(Instant::now())
    }

    /// The validity left at `now`, or `None` once it has run out.
    pub fn remaining_at(&self, now: Instant) -> Option<Duration> {
        self.valid_until
            .checked_duration_since(now)
            .filter(|d| !d.is_zero())
    }

    /// Whether the validity has not yet run out.
    pub fn is_valid(&self) -> bool {
        self.remaining().is_some()
    }

    /// The report of the round that won (or last extended) this lock.
    pub fn report(&self) -> &RoundReport {
        &self.report
    }
}

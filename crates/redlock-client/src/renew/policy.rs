//! The renewal policy: whether held locks are renewed, how often, and for how long at most.
//!
//! Plain data with no dependency on the rest of the client, so that the configuration can
//! hold it without depending on the renewal scheduler (which depends on the guards). Whether
//! an interval fits a TTL also needs the node timeout and the drift factor, so that rule is
//! checked once, by the configuration, for the configured TTL and a per-call one alike.

use std::time::Duration;

/// Automatic renewal (the watchdog) of a held lock.
///
/// Defaults: `enabled` `true`, `renew_after` `None` (a third of the TTL), `max_hold` `None`.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct RenewalPolicy {
    /// Whether a held lock is extended in the background until it is released. Defaults to
    /// `true`.
    pub enabled: bool,
    /// How long after each acquisition or renewal the next renewal starts. `None` means a
    /// third of the TTL, which leaves time for two more renewals before the lock expires.
    /// Defaults to `None`.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub renew_after: Option<Duration>,
    /// The longest a lock is held, counted from its acquisition (not from the call, so a
    /// long wait for the lock takes nothing off it), however often it is renewed: the
    /// Redlock spec asks that extensions be bounded, so that a holder stuck in a loop cannot
    /// keep a resource forever. The last renewal asks only for what is left up to the cap,
    /// so the lock is never valid past it; renewal then stops, and the guard's health says
    /// so ([`HoldHealth::RenewalFailing`](crate::HoldHealth::RenewalFailing)) until the
    /// validity ends. `None` means no cap. Defaults to `None`.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub max_hold: Option<Duration>,
}

impl Default for RenewalPolicy {
    fn default() -> Self {
        RenewalPolicy {
            enabled: true,
            renew_after: None,
            max_hold: None,
        }
    }
}

impl RenewalPolicy {
    /// The renewal interval of a lock taken with `ttl`: `renew_after`, or a third of `ttl`.
    pub(crate) fn interval(&self, ttl: Duration) -> Duration {
        self.renew_after.unwrap_or(ttl / 3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn interval_is_renew_after_or_a_third_of_the_ttl() {
        let policy = RenewalPolicy::default();
        assert_eq!(policy.interval(30_000 * MS), 10_000 * MS);
        assert_eq!(
            policy.interval(1000 * MS),
            Duration::from_nanos(333_333_333)
        );
        let fixed = RenewalPolicy {
            renew_after: Some(2000 * MS),
            ..RenewalPolicy::default()
        };
        assert_eq!(fixed.interval(30_000 * MS), 2000 * MS);
        assert_eq!(
            fixed.interval(1000 * MS),
            2000 * MS,
            "checked elsewhere, not clamped"
        );
    }
}

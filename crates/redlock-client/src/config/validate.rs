//! Checking a [`LockConfig`] without connecting anywhere: the core configuration, the TTL,
//! the retry and renewal policies, the minimum validity and the key prefix. Apart from the
//! configuration itself, whose fields and defaults read on their own.
//!
//! The rule that a renewal fits in a lock's TTL lives here once, in
//! `LockConfig::check_hold`, for the configured TTL and a per-call one alike: it needs the
//! node timeout and the drift factor as well as the renewal policy.

use std::time::Duration;

use humantime::format_duration;

use super::LockConfig;
use crate::error::InvalidConfig;

/// The longest key prefix, in bytes. The prefix is sent with every key of every round; a
/// namespace needs a few bytes, and a long one eats into redlock-core's key length limit.
const MAX_KEY_PREFIX_LEN: usize = 256;

impl LockConfig {
    /// Checks every value without connecting anywhere: the core configuration, the TTL,
    /// the retry policy, the renewal policy and the key prefix, in that order.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        self.core().validate()?;
        self.retry.validate()?;
        // An explicit interval is checked even with renewal off, so that turning it on later
        // cannot reveal a mistake made earlier.
        let renew = self.renewal.enabled || self.renewal.renew_after.is_some();
        self.check_hold(self.ttl, renew)?;
        self.check_min_validity(self.ttl, self.min_validity)?;
        if self.key_prefix.len() > MAX_KEY_PREFIX_LEN {
            return Err(InvalidConfig::KeyPrefix {
                reason: format!(
                    "the key prefix is {} bytes long, more than the maximum {MAX_KEY_PREFIX_LEN}: \
                     use a short namespace such as \"billing:\"",
                    self.key_prefix.len()
                ),
            });
        }
        Ok(())
    }

    /// Checks a minimum validity against the TTL of the locks it applies to: a round
    /// leaves at most `ttl - drift`, so a minimum at or above that could never be met and
    /// every `lock` would fail after its retries.
    pub(crate) fn check_min_validity(
        &self,
        ttl: Duration,
        min_validity: Option<Duration>,
    ) -> Result<(), InvalidConfig> {
        let Some(min) = min_validity else {
            return Ok(());
        };
        let drift = redlock_core::drift(ttl, self.drift_factor);
        let most = ttl.saturating_sub(drift);
        if min >= most {
            return Err(InvalidConfig::MinValidity {
                reason: format!(
                    "min_validity ({}) is not below the most validity a round can leave, the \
                     ttl ({}) minus the drift allowance ({}): {}; lower min_validity or use a \
                     longer ttl",
                    format_duration(min),
                    format_duration(ttl),
                    format_duration(drift),
                    format_duration(most),
                ),
            });
        }
        Ok(())
    }

    /// The checks on a lock's TTL, for the configured TTL and for a per-call one alike: the
    /// core's TTL rule, the renewal rule when the lock is renewed (`renew`), and `max_hold`.
    /// Returns the TTL truncated to whole milliseconds.
    pub(crate) fn check_hold(&self, ttl: Duration, renew: bool) -> Result<Duration, InvalidConfig> {
        let ttl = redlock_core::support::check_ttl(ttl, self.drift_factor, self.node_timeout)
            .map_err(InvalidConfig::Ttl)?;
        let invalid = |reason: String| Err(InvalidConfig::Renewal { reason });
        let renewal = &self.renewal;
        // `ttl` has passed `check_ttl`, so it exceeds `drift + node_timeout`.
        if renew {
            let every = self.renew_every_for(ttl);
            let what = match renewal.renew_after {
                Some(_) => "renew_after".to_string(),
                None => format!(
                    "the default renewal interval (ttl / 3 = {})",
                    format_duration(every)
                ),
            };
            if every.is_zero() {
                return invalid(format!(
                    "{what} is zero, so the lock would be renewed in a busy loop: use about a \
                     third of the ttl, or leave renew_after unset"
                ));
            }
            // The lock is only safe to use for `ttl - drift`, and the renewal round may wait
            // a full node timeout for its answers: it must start early enough to finish in
            // that window, or the lock could lapse while its holder still believes in it.
            let drift = redlock_core::drift(ttl, self.drift_factor);
            let latest = ttl.saturating_sub(drift).saturating_sub(self.node_timeout);
            if every >= latest {
                return invalid(format!(
                    "{what} of {} is too late for a ttl of {}: a renewal must start before the \
                     ttl minus the drift allowance ({}) minus one node_timeout ({}), that is \
                     before {}; use a shorter renew_after (about ttl / 3) or a longer ttl",
                    format_duration(every),
                    format_duration(ttl),
                    format_duration(drift),
                    format_duration(self.node_timeout),
                    format_duration(latest),
                ));
            }
        }
        if let Some(max_hold) = renewal.max_hold {
            if max_hold < ttl {
                return invalid(format!(
                    "max_hold ({}) is shorter than the ttl ({}): the first acquisition alone \
                     holds the lock for the ttl; raise max_hold to at least the ttl, or leave \
                     it unset for no cap",
                    format_duration(max_hold),
                    format_duration(ttl),
                ));
            }
        }
        Ok(ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redlock_core::{ArgumentError, ConfigError};

    const MS: Duration = Duration::from_millis(1);
    use crate::builder::tests::builder;
    use crate::builder::LockConfigBuilder;
    use crate::retry::RetryPolicy;

    fn reason(result: Result<LockConfig, InvalidConfig>) -> InvalidConfig {
        result.expect_err("the configuration should be rejected")
    }

    #[test]
    fn core_errors_pass_through() {
        assert_eq!(
            reason(builder().ttl(Duration::ZERO).build()),
            InvalidConfig::Ttl(ArgumentError::ZeroTtl)
        );
        assert!(matches!(
            reason(builder().ttl(100 * MS).build()),
            InvalidConfig::Ttl(ArgumentError::TtlTooShort { .. })
        ));
        assert!(matches!(
            reason(builder().drift_factor(1.5).build()),
            InvalidConfig::Core(ConfigError::DriftFactor { .. })
        ));
        assert!(matches!(
            reason(LockConfig::builder().node("not a url").build()),
            InvalidConfig::Core(ConfigError::InvalidUrl { .. })
        ));
        // Transparent: the core message is shown as is.
        let err = reason(builder().ttl(Duration::ZERO).build());
        assert_eq!(err.to_string(), ArgumentError::ZeroTtl.to_string());
    }

    #[test]
    fn retry_errors() {
        let err = reason(
            builder()
                .retry(RetryPolicy {
                    max_wait: None,
                    ..RetryPolicy::default()
                })
                .build(),
        );
        assert!(matches!(err, InvalidConfig::Retry { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("invalid retry policy: neither max_attempts nor max_wait"),
            "{err}"
        );
        let err = reason(builder().max_attempts(0).build());
        assert!(matches!(err, InvalidConfig::Retry { .. }), "{err}");
        let err = reason(builder().backoff(500 * MS, 100 * MS).build());
        assert!(matches!(err, InvalidConfig::Retry { .. }), "{err}");
    }

    #[test]
    fn renewal_errors() {
        let renewal = |b: LockConfigBuilder| match b.build() {
            Err(InvalidConfig::Renewal { reason }) => reason,
            other => panic!("expected a renewal error, got {other:?}"),
        };
        let r = renewal(builder().ttl(10_000 * MS).renew_after(10_000 * MS));
        assert!(
            r.starts_with("renew_after of 10s is too late for a ttl of 10s"),
            "{r}"
        );
        // The limit: 10 s - drift (100 ms + 2 ms) - node timeout (100 ms).
        assert!(r.contains("before 9s 798ms"), "{r}");
        renewal(builder().ttl(10_000 * MS).renew_after(9798 * MS));
        assert!(builder()
            .ttl(10_000 * MS)
            .renew_after(9797 * MS)
            .build()
            .is_ok());

        let r = renewal(builder().renew_after(Duration::ZERO));
        assert!(r.starts_with("renew_after is zero"), "{r}");
        // An explicit interval is checked even while renewal is off.
        renewal(builder().no_renewal().renew_after(Duration::ZERO));

        // A huge drift factor leaves no room for the default ttl / 3...
        let r = renewal(builder().ttl(1000 * MS).drift_factor(0.6));
        assert!(
            r.starts_with("the default renewal interval (ttl / 3 = 333ms 333us 333ns)"),
            "{r}"
        );
        // ...which does not matter when nothing renews.
        assert!(builder()
            .ttl(1000 * MS)
            .drift_factor(0.6)
            .no_renewal()
            .build()
            .is_ok());

        let r = renewal(builder().ttl(30_000 * MS).max_hold(29_999 * MS));
        assert!(
            r.starts_with("max_hold (29s 999ms) is shorter than the ttl (30s)"),
            "{r}"
        );
        assert!(builder()
            .ttl(30_000 * MS)
            .max_hold(30_000 * MS)
            .build()
            .is_ok());
    }

    #[test]
    fn min_validity_must_be_below_the_ttl_minus_drift() {
        // 10 s - drift (100 ms + 2 ms) = 9.898 s: the most a round can leave.
        let ttl = 10_000 * MS;
        assert!(builder().ttl(ttl).min_validity(9_897 * MS).build().is_ok());
        let err = reason(builder().ttl(ttl).min_validity(9_898 * MS).build());
        assert!(matches!(err, InvalidConfig::MinValidity { .. }), "{err}");
        assert!(err.to_string().contains("(9s 898ms) is not below"), "{err}");
        assert_eq!(LockConfig::default().min_validity, None);
    }

    #[test]
    fn key_prefix_errors() {
        assert!(builder()
            .key_prefix("p".repeat(MAX_KEY_PREFIX_LEN))
            .build()
            .is_ok());
        assert!(builder().key_prefix("").build().is_ok());
        let err = reason(
            builder()
                .key_prefix("p".repeat(MAX_KEY_PREFIX_LEN + 1))
                .build(),
        );
        assert_eq!(
            err,
            InvalidConfig::KeyPrefix {
                reason: "the key prefix is 257 bytes long, more than the maximum 256: use a \
                         short namespace such as \"billing:\""
                    .into()
            }
        );
    }
}

//! The builder of [`LockConfig`]: it starts from the defaults, each setter says its default,
//! and [`build`](LockConfigBuilder::build) validates everything at the end.

use std::time::Duration;

use redlock_core::{HealthPolicy, TlsConfig};

use crate::config::LockConfig;
use crate::error::InvalidConfig;
use crate::renew::policy::RenewalPolicy;
use crate::retry::RetryPolicy;

// Here rather than in config/, so that the configuration does not depend on its builder.
impl LockConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> LockConfigBuilder {
        LockConfigBuilder::default()
    }
}

/// Builds a [`LockConfig`], starting from its defaults and validating at the end.
///
/// ```
/// use std::time::Duration;
/// use redlock_client::LockConfig;
///
/// let config = LockConfig::builder()
///     .nodes((7101..=7103).map(|port| format!("redis://127.0.0.1:{port}")))
///     .ttl(Duration::from_secs(15))
///     .max_wait(Duration::from_secs(2))
///     .key_prefix("billing:")
///     .build()
///     .expect("a valid configuration");
/// assert_eq!(config.renew_every(), Duration::from_secs(5));
///
/// // Values are checked when building, never later.
/// assert!(LockConfig::builder().build().is_err(), "no nodes");
/// ```
#[derive(Debug, Clone, Default)]
pub struct LockConfigBuilder {
    config: LockConfig,
}

impl LockConfigBuilder {
    /// Replaces the node URLs. Defaults to none: at least one is required, 3 or 5
    /// independent masters is typical.
    #[must_use]
    pub fn nodes(mut self, nodes: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.config.nodes = nodes.into_iter().map(Into::into).collect();
        self
    }

    /// Adds one node URL to those already given. Defaults to none.
    #[must_use]
    pub fn node(mut self, node: impl Into<String>) -> Self {
        self.config.nodes.push(node.into());
        self
    }

    /// Sets the lock TTL. Defaults to 30 s.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config.ttl = ttl;
        self
    }

    /// Sets how long one node gets to answer one command. Defaults to 100 ms.
    #[must_use]
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.config.node_timeout = timeout;
        self
    }

    /// Sets the clock drift allowance, a fraction of the TTL in `[0, 1)`. Defaults to 0.01.
    #[must_use]
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.config.drift_factor = factor;
        self
    }

    /// Replaces the whole retry policy. Defaults to [`RetryPolicy::default()`].
    #[must_use]
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.config.retry = retry;
        self
    }

    /// Limits `lock` to `attempts` rounds, the first included (1 = no retry). Defaults to
    /// unlimited, bounded by the wait.
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.config.retry.max_attempts = Some(attempts);
        self
    }

    /// Sets the overall deadline of `lock`, from its first attempt. Defaults to 10 s.
    #[must_use]
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.config.retry.max_wait = Some(wait);
        self
    }

    /// Sets the first backoff cap and the largest one. Defaults to 50 ms and 1 s.
    #[must_use]
    pub fn backoff(mut self, base_delay: Duration, max_delay: Duration) -> Self {
        self.config.retry.base_delay = base_delay;
        self.config.retry.max_delay = max_delay;
        self
    }

    /// Fixes the jitter seed, for tests and reproducible runs. Defaults to none (seeded
    /// from the OS).
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.config.retry.seed = Some(seed);
        self
    }

    /// Replaces the whole renewal policy. Defaults to [`RenewalPolicy::default()`].
    #[must_use]
    pub fn renewal(mut self, renewal: RenewalPolicy) -> Self {
        self.config.renewal = renewal;
        self
    }

    /// Sets how long after each acquisition or renewal the next renewal starts. Defaults to
    /// a third of the TTL. Does not turn renewal back on after [`no_renewal`](Self::no_renewal).
    #[must_use]
    pub fn renew_after(mut self, after: Duration) -> Self {
        self.config.renewal.renew_after = Some(after);
        self
    }

    /// Caps the total time a lock is held, extensions included. Defaults to no cap.
    #[must_use]
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.config.renewal.max_hold = Some(max_hold);
        self
    }

    /// Turns automatic renewal off: a lock then lasts one TTL unless extended by hand.
    /// Renewal is on by default.
    #[must_use]
    pub fn no_renewal(mut self) -> Self {
        self.config.renewal.enabled = false;
        self
    }

    /// Sets the prefix of every key. Defaults to `"redlock:"`.
    #[must_use]
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.key_prefix = prefix.into();
        self
    }

    /// Sets whether releases are published and waiters woken by them. Defaults to `true`.
    #[must_use]
    pub fn notify(mut self, notify: bool) -> Self {
        self.config.notify = notify;
        self
    }

    /// Sets whether concurrent plain locks share rounds (group commit; see
    /// [`LockConfig::group_commit`]). Defaults to `true`.
    #[must_use]
    pub fn group_commit(mut self, group: bool) -> Self {
        self.config.group_commit = group;
        self
    }

    /// Sets how many replicas of a cluster member's master must acknowledge each
    /// acquisition and extension before the member's vote counts (see
    /// [`LockConfig::replica_acks`]). Defaults to `0`.
    #[must_use]
    pub fn replica_acks(mut self, replicas: u32) -> Self {
        self.config.replica_acks = replicas;
        self
    }

    /// Sets the key of each node's fencing counter (see [`LockConfig::fence_key`]).
    /// Defaults to `{key_prefix}fencing-counter`.
    #[must_use]
    pub fn fence_key(mut self, key: impl Into<String>) -> Self {
        self.config.fence_key = Some(key.into());
        self
    }

    /// Sets whether every lock gets a fencing token. Defaults to `false`.
    #[must_use]
    pub fn fencing(mut self, fencing: bool) -> Self {
        self.config.fencing = fencing;
        self
    }

    /// Sets whether locks go to their waiters in arrival order, across clients (see
    /// [`LockConfig::fair`]). Defaults to `false`.
    #[must_use]
    pub fn fair(mut self, fair: bool) -> Self {
        self.config.fair = fair;
        self
    }

    /// Sets the least validity an acquisition must leave: a round won with less is
    /// released and retried (see [`LockConfig::min_validity`]). Defaults to none.
    #[must_use]
    pub fn min_validity(mut self, min_validity: Duration) -> Self {
        self.config.min_validity = Some(min_validity);
        self
    }

    /// TLS settings for the `rediss://` nodes (`tls` feature): see [`TlsConfig`].
    #[must_use]
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.config.tls = Some(tls);
        self
    }

    /// What connecting does about a node that breaks the algorithm's assumptions: see
    /// [`HealthPolicy`].
    #[must_use]
    pub fn health(mut self, policy: HealthPolicy) -> Self {
        self.config.health = policy;
        self
    }

    /// Validates the configuration (see [`LockConfig::validate`]) and returns it.
    pub fn build(self) -> Result<LockConfig, InvalidConfig> {
        self.config.validate()?;
        Ok(self.config)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    /// Three node URLs (nothing listens there: these tests never connect).
    pub(crate) const NODES: [&str; 3] = [
        "redis://127.0.0.1:7101",
        "redis://127.0.0.1:7102",
        "redis://127.0.0.1:7103",
    ];

    /// A builder with [`NODES`], for tests of the configuration's checks.
    pub(crate) fn builder() -> LockConfigBuilder {
        LockConfig::builder().nodes(NODES)
    }

    #[test]
    fn builder_setters() {
        let c = LockConfig::builder()
            .node(NODES[0])
            .node(NODES[1])
            .node(NODES[2].to_string())
            .ttl(10_000 * MS)
            .node_timeout(50 * MS)
            .drift_factor(0.02)
            .max_attempts(4)
            .max_wait(2000 * MS)
            .backoff(10 * MS, 200 * MS)
            .seed(9)
            .renew_after(2000 * MS)
            .max_hold(60_000 * MS)
            .key_prefix("billing:")
            .notify(false)
            .build()
            .unwrap();
        assert_eq!(c.nodes, NODES);
        assert_eq!(c.ttl, 10_000 * MS);
        assert_eq!(c.node_timeout, 50 * MS);
        assert_eq!(c.drift_factor, 0.02);
        assert_eq!(
            c.retry,
            RetryPolicy {
                max_attempts: Some(4),
                max_wait: Some(2000 * MS),
                base_delay: 10 * MS,
                max_delay: 200 * MS,
                seed: Some(9),
            }
        );
        assert_eq!(
            c.renewal,
            RenewalPolicy {
                enabled: true,
                renew_after: Some(2000 * MS),
                max_hold: Some(60_000 * MS),
            }
        );
        assert_eq!(c.renew_every(), 2000 * MS);
        assert_eq!(c.key_prefix, "billing:");
        assert!(!c.notify);

        let core = c.core();
        assert_eq!(core.nodes, NODES);
        assert_eq!(core.node_timeout, 50 * MS);
        assert_eq!(core.drift_factor, 0.02);
        assert_eq!(
            core.reconnect_max_delay,
            redlock_core::Config::default().reconnect_max_delay
        );

        let c = builder()
            .retry(RetryPolicy::no_retry())
            .renewal(RenewalPolicy {
                max_hold: Some(60_000 * MS),
                ..RenewalPolicy::default()
            })
            .no_renewal()
            .build()
            .unwrap();
        assert_eq!(c.retry, RetryPolicy::no_retry());
        assert!(!c.renewal.enabled);
        assert_eq!(c.renewal.max_hold, Some(60_000 * MS));
        // `nodes` replaces, `node` adds.
        assert_eq!(
            builder()
                .nodes([NODES[1]])
                .node(NODES[2])
                .build()
                .unwrap()
                .nodes,
            NODES[1..]
        );
    }
}

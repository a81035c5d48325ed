//! The client's configuration: a plain struct with defaults, and the settings derived from
//! it (the core configuration, the renewal interval, a fair waiter's patience). The one
//! `validate` that checks every value before anything connects is in `validate.rs`, the
//! builder in `builder.rs`, the renewal policy next to the renewal scheduler, the error in
//! `error.rs`.

mod validate;

use std::fmt;
use std::time::Duration;

use redlock_core::{HealthPolicy, NodeName, TlsConfig};

use crate::renew::policy::RenewalPolicy;
use crate::retry::RetryPolicy;

/// Everything a client needs.
///
/// Defaults: `nodes` empty (they must be given), `ttl` 30 s, `node_timeout` 100 ms,
/// `drift_factor` 0.01, `retry` [`RetryPolicy::default()`], `renewal`
/// [`RenewalPolicy::default()`], `key_prefix` `"redlock:"`, `notify` `true`.
///
/// Build it with [`LockConfig::builder`], or fill the struct and call
/// [`validate`](Self::validate).
///
/// Its `Debug` output masks the passwords in node URLs.
#[derive(Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct LockConfig {
    /// The independent Redis masters, as URLs (`redis://host:port`); see
    /// [`redlock_core::Config::nodes`]. Defaults to none: at least one is required, and 3 or
    /// 5 is typical.
    pub nodes: Vec<String>,
    /// The lifetime of a lock on the nodes, before renewal. Defaults to 30 s.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub ttl: Duration,
    /// How long one node gets to answer one command. Defaults to 100 ms.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub node_timeout: Duration,
    /// The clock drift allowance as a fraction of the TTL, in `[0, 1)`. Defaults to 0.01.
    pub drift_factor: f64,
    /// How `lock` retries a lost round. Defaults to [`RetryPolicy::default()`].
    pub retry: RetryPolicy,
    /// How held locks are renewed. Defaults to [`RenewalPolicy::default()`].
    pub renewal: RenewalPolicy,
    /// Prepended to every key, so that several applications can share the nodes. Defaults
    /// to `"redlock:"`.
    pub key_prefix: String,
    /// Publish on release, and wake waiters through one subscriber per node instead of
    /// letting them sleep out their backoff delay. A waiter for a lock of one key (plain
    /// or fenced, not reentrant) queues on the nodes from its second attempt on, which
    /// follows the first after the backoff's first delay, at most a node timeout
    /// (ungated; a `fair` one queues from its first attempt, gated), and the release wakes
    /// the oldest queued waiter, on its client's own channel (a `fair` one is handed the
    /// key as well); with nobody queued it is announced to nobody.
    /// A waiter (not fair) whose woken attempts lost twice (the releasing holder takes the
    /// key back at once) leaves the queue and polls (see [`RetryPolicy`]).
    /// Releases of the other shapes (several keys, reentrant) are announced to
    /// every client and wake each client's oldest waiter for the key. It costs a release a
    /// read of the key's queue and one `PUBLISH` per node when someone waits, and a
    /// contended wait a script instead of `SET NX` per attempt and a leave at its end.
    /// Defaults to `true`.
    pub notify: bool,
    /// Give every lock a fencing token ([`LockGuard::fencing_token`](crate::LockGuard::fencing_token)),
    /// for resources that check tokens to reject writes from a holder that paused past its
    /// validity. It costs each acquisition one more round trip; per call, see
    /// `LockOptions::fenced`. The counter lives under `fence_key` on each node. Defaults
    /// to `false`.
    pub fencing: bool,
    /// The key of each node's fencing counter. `None`: `{key_prefix}fencing-counter`. With
    /// a member that is a whole cluster it needs a hash tag, such as
    /// `{redlock:fencing-counter}`, so that the counter and its companions share a slot
    /// (see [`redlock_core::ArgumentError::FencingOnCluster`]). Tokens increase only
    /// along one counter: change it only on a node set that has handed out no token yet,
    /// or raise the new counters past the highest token after (`redlock fence
    /// --raise-to`). Defaults to `None`.
    pub fence_key: Option<String>,
    /// Give locks (plain, reentrant, fenced or over several keys) to their waiters in the
    /// order they began waiting, across clients and processes: a waiter queue per key on
    /// every node lets only the oldest waiter try (see [`redlock_core::support::FairPlace`]), so
    /// waiters do not split the votes and a releasing holder cannot take the lock
    /// straight back while others wait. A
    /// waiter whose process died holds up the queue for at most its patience
    /// (`2 × retry.max_delay + 4 × node_timeout`), and so does, on a node, a waiter that
    /// could not leave the queue there (the link was down when its call ended): a release
    /// there within that time hands the key to its entry, where it stays for one TTL. With
    /// `notify` on, the release hands the key to the queue's head there and then, and tells
    /// its client: the head holds the lock once a quorum of nodes said so, without a round
    /// of its own, with the validity of its last attempt (see
    /// [`redlock_core::support::Waiters::handed_over`]). Told by fewer nodes than a quorum (the
    /// others lost its queue entry, or their messages do not reach it), it waits for the
    /// rest at most `node_timeout`, then takes the key on with a round. A reentrant, fenced
    /// or multi-key head is told, and its round (the only one let through) takes the key.
    /// A reentrant owner that holds the key already adds a hold at once. So while every
    /// wake-up subscriber is up, a waiter tries again between hand-overs only
    /// at `retry.max_delay` or half the TTL, whichever is shorter, which keeps its place,
    /// keeps a hand-over's validity, and finds a key whose holder expired. A head that
    /// loses three rounds in a row that no node refused (its answers come after
    /// `node_timeout`, or it reaches fewer nodes than a quorum) cannot win, and would hold
    /// every waiter behind it up for its whole wait: it leaves the queues (waking the next
    /// waiter) and queues again at the back (between such rounds it keeps its backoff's
    /// short delays). Costs each
    /// attempt a script instead of `SET NX`, and a won lock that did not hear from every
    /// node one more command per node in the background (leaving the queue). A lock over
    /// several keys waits in each key's queue, and takes its keys once it heads all of
    /// them: a key it heads stays idle meanwhile, for the waiters behind it. Defaults to
    /// `false`.
    pub fair: bool,
    /// The least validity an acquisition must leave (DistributedLock's `MinValidityTime`):
    /// a round that wins with less left is released at once and counts as a lost attempt,
    /// so `lock` retries it. For callers that need a known stretch of time under the lock
    /// before they start. Must be below the TTL minus its drift allowance (the most any
    /// round can leave); per call, see `LockOptions::min_validity`. Defaults to `None` (any
    /// positive validity is accepted).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub min_validity: Option<Duration>,
    /// TLS settings for the `rediss://` nodes: the CA to trust, a client certificate for
    /// mutual TLS, the name to check (the `tls` feature; see [`TlsConfig`]). Defaults to
    /// `None`: `rediss://` nodes are checked against the system's roots.
    pub tls: Option<TlsConfig>,
    /// What connecting does about a node whose settings break the algorithm's assumptions
    /// (replica, cluster node, evicting memory policy, persistence that can lose keys):
    /// `warn` (the default) logs each problem, `strict` refuses to connect, `off` does not
    /// check. See [`Redlock::health`](crate::Redlock::health).
    pub health: HealthPolicy,
    /// Whether concurrent plain locks of single keys share rounds (group commit): the
    /// acquisitions (and releases) started while one is in flight go out together in the
    /// next round, one script call per node instead of a command per lock, each lock still
    /// decided on its own. A lone `lock` is one `SET NX PX` either way. An attempt that
    /// joins waits for the round in flight first (at most a node timeout and 50 ms: past
    /// that, say when the future of the call that sent it is not being polled, it sends a
    /// round of its own), so one attempt may take up to two node timeouts and 50 ms instead
    /// of one (the bound of `RetryPolicy::max_wait` past its deadline).
    /// Defaults to `true`.
    pub group_commit: bool,
    /// On a member that is a whole cluster (`redis-cluster://`), how many replicas must
    /// acknowledge each acquisition and extension (`WAIT`) before that member's vote
    /// counts, so that a lock survives the failover of the master that holds it; see
    /// [`redlock_core::Config::replica_acks`]. `0`: no `WAIT`. A member's URL may set
    /// its own (`?replica_acks=N`). Defaults to `0`.
    pub replica_acks: u32,
}

impl Default for LockConfig {
    fn default() -> Self {
        LockConfig {
            nodes: Vec::new(),
            // Long enough that a holder stalled by a GC pause or a slow node keeps the lock
            // until the watchdog renews it; short enough that a crashed holder's lock is free
            // again within half a minute.
            ttl: Duration::from_secs(30),
            node_timeout: redlock_core::DEFAULT_NODE_TIMEOUT,
            drift_factor: redlock_core::DEFAULT_DRIFT_FACTOR,
            retry: RetryPolicy::default(),
            renewal: RenewalPolicy::default(),
            key_prefix: "redlock:".into(),
            notify: true,
            fencing: false,
            fence_key: None,
            fair: false,
            min_validity: None,
            tls: None,
            health: HealthPolicy::default(),
            group_commit: true,
            replica_acks: 0,
        }
    }
}

/// Shows the node URLs with their passwords masked: a configuration ends up in logs.
impl fmt::Debug for LockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<NodeName> = self.nodes.iter().map(|u| NodeName::redacted(u)).collect();
        f.debug_struct("LockConfig")
            .field("nodes", &nodes)
            .field("ttl", &self.ttl)
            .field("node_timeout", &self.node_timeout)
            .field("drift_factor", &self.drift_factor)
            .field("retry", &self.retry)
            .field("renewal", &self.renewal)
            .field("key_prefix", &self.key_prefix)
            .field("notify", &self.notify)
            .field("fencing", &self.fencing)
            .field("fence_key", &self.fence_key)
            .field("fair", &self.fair)
            .field("min_validity", &self.min_validity)
            .field("tls", &self.tls)
            .field("health", &self.health)
            .field("group_commit", &self.group_commit)
            .field("replica_acks", &self.replica_acks)
            .finish()
    }
}

impl LockConfig {
    /// The core configuration derived from this one: the nodes, the node timeout and the
    /// drift factor; every other core setting keeps its default.
    pub fn core(&self) -> redlock_core::Config {
        redlock_core::Config {
            nodes: self.nodes.clone(),
            node_timeout: self.node_timeout,
            drift_factor: self.drift_factor,
            fence_key: self
                .fence_key
                .clone()
                .unwrap_or_else(|| format!("{}fencing-counter", self.key_prefix)),
            fair_prefix: format!("{}fair-", self.key_prefix),
            semaphore_prefix: format!("{}semaphore-", self.key_prefix),
            rwlock_prefix: format!("{}rwlock-", self.key_prefix),
            tls: self.tls.clone(),
            health: self.health,
            group_commit: self.group_commit,
            replica_acks: self.replica_acks,
            ..redlock_core::Config::default()
        }
    }

    /// How long a fair waiter's queue entry outlives its last attempt under the configured
    /// retry policy (see [`fair`](Self::fair)): also the longest a queue's keys stay on a
    /// node that a waiter could not reach when it left.
    pub fn fair_patience(&self) -> Duration {
        self.fair_patience_for(&self.retry)
    }

    /// How long a fair waiter's queue entry outlives its last attempt: twice the longest
    /// pause between two attempts (a backoff delay, then the release of a round won below
    /// `min_validity`, then the next round), so a live waiter never loses its place; a
    /// waiter that died holds up the queue that long at most. At most a year
    /// ([`redlock_core::MAX_TTL`], the longest patience the core takes), whatever
    /// `max_delay` is.
    pub(crate) fn fair_patience_for(&self, retry: &crate::RetryPolicy) -> Duration {
        retry
            .max_delay
            .saturating_mul(2)
            .saturating_add(self.node_timeout.saturating_mul(4))
            .min(redlock_core::MAX_TTL)
    }

    /// The renewal interval: `renewal.renew_after`, or a third of the TTL.
    pub fn renew_every(&self) -> Duration {
        self.renew_every_for(self.ttl)
    }

    /// The renewal interval of a lock taken with `ttl` (a per-call TTL, for example).
    pub(crate) fn renew_every_for(&self, ttl: Duration) -> Duration {
        self.renewal.interval(ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redlock_core::ConfigError;

    const MS: Duration = Duration::from_millis(1);
    use crate::builder::tests::{builder, NODES};

    #[test]
    fn defaults() {
        let c = LockConfig::default();
        assert!(c.nodes.is_empty());
        assert_eq!(c.ttl, 30_000 * MS);
        assert_eq!(c.node_timeout, 100 * MS);
        assert_eq!(c.drift_factor, 0.01);
        assert_eq!(c.retry, RetryPolicy::default());
        assert_eq!(c.renewal, RenewalPolicy::default());
        assert!(c.renewal.enabled);
        assert_eq!(c.renewal.renew_after, None);
        assert_eq!(c.renewal.max_hold, None);
        assert_eq!(c.key_prefix, "redlock:");
        assert!(c.notify);
        assert_eq!(c.renew_every(), 10_000 * MS);
        // The only default that cannot work: there is no sensible default node set.
        assert_eq!(c.validate(), Err(ConfigError::NoNodes.into()));
        assert_eq!(
            builder().build().unwrap(),
            LockConfig {
                nodes: NODES.map(String::from).into(),
                ..c
            }
        );
    }

    #[test]
    fn debug_masks_passwords() {
        let c = builder()
            .node("redis://:s3cret@127.0.0.1:7104")
            .build()
            .unwrap();
        for shown in [
            format!("{c:?}"),
            format!("{:?}", builder().node("redis://:s3cret@h:1")),
        ] {
            assert!(!shown.contains("s3cret"), "{shown}");
        }
        assert!(format!("{c:?}").contains("redis://:***@127.0.0.1:7104"));
    }
}

#[cfg(all(test, feature = "serde"))]
mod serde_tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const FILE: &str = r#"
nodes = ["redis://127.0.0.1:7101", "redis://127.0.0.1:7102", "redis://127.0.0.1:7103"]
ttl = "30s"
node_timeout = "50ms"
key_prefix = "billing:"
min_validity = "5s"
[retry]
max_wait = "5s"
base_delay = "20ms"
max_delay = "500ms"
[renewal]
max_hold = "10m"
"#;

    #[test]
    fn parses_a_file_and_fills_in_defaults() {
        let c: LockConfig = toml::from_str(FILE).unwrap();
        assert_eq!(
            c,
            LockConfig {
                nodes: vec![
                    "redis://127.0.0.1:7101".into(),
                    "redis://127.0.0.1:7102".into(),
                    "redis://127.0.0.1:7103".into(),
                ],
                ttl: 30_000 * MS,
                node_timeout: 50 * MS,
                key_prefix: "billing:".into(),
                min_validity: Some(5000 * MS),
                retry: RetryPolicy {
                    max_wait: Some(5000 * MS),
                    base_delay: 20 * MS,
                    max_delay: 500 * MS,
                    ..RetryPolicy::default()
                },
                renewal: RenewalPolicy {
                    max_hold: Some(600_000 * MS),
                    ..RenewalPolicy::default()
                },
                ..LockConfig::default()
            }
        );
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(
            toml::from_str::<LockConfig>("").unwrap(),
            LockConfig::default()
        );
    }

    #[test]
    fn rejects_unknown_fields_at_every_level() {
        for bad in [
            "ttl_ms = 30000",
            "[retry]\nmax_retries = 3",
            "[renewal]\nevery = \"10s\"",
        ] {
            let err = toml::from_str::<LockConfig>(bad).unwrap_err();
            assert!(err.to_string().contains("unknown field"), "{bad}: {err}");
        }
        let err = toml::from_str::<LockConfig>("ttl = \"30 parsecs\"").unwrap_err();
        assert!(err.to_string().contains("ttl"), "{err}");
    }

    #[test]
    fn round_trips() {
        let parsed: LockConfig = toml::from_str(FILE).unwrap();
        let full = LockConfig {
            retry: RetryPolicy {
                max_attempts: Some(3),
                seed: Some(42),
                ..parsed.retry.clone()
            },
            renewal: RenewalPolicy {
                enabled: false,
                renew_after: Some(1500 * MS),
                ..parsed.renewal.clone()
            },
            notify: false,
            ..parsed.clone()
        };
        for config in [LockConfig::default(), parsed, full] {
            let text = toml::to_string(&config).unwrap();
            assert_eq!(
                toml::from_str::<LockConfig>(&text).unwrap(),
                config,
                "{text}"
            );
        }
    }
}

//! The coordinator's configuration and the checks on every value a caller passes in.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

mod checks;
mod node_url;

pub use checks::{check_key, check_ttl, MAX_KEY_LEN, MAX_TTL};
pub(crate) use node_url::Endpoint;

use crate::drift::DEFAULT_DRIFT_FACTOR;
use crate::error::{ArgumentError, ConfigError};
use crate::report::NodeName;
use crate::tls::TlsConfig;
use node_url::parse_node;

/// The key of the fencing counter on each node, unless configured otherwise.
pub const DEFAULT_FENCE_KEY: &str = "redlock:fencing-counter";

/// The default prefix of the read-write locks' keys ([`Config::rwlock_prefix`]).
pub const DEFAULT_RWLOCK_PREFIX: &str = "redlock:rwlock-";

/// The default prefix of the semaphores' permit keys ([`Config::semaphore_prefix`]).
pub const DEFAULT_SEMAPHORE_PREFIX: &str = "redlock:semaphore-";

/// The default prefix of the fair queues' keys ([`Config::fair_prefix`]).
pub const DEFAULT_FAIR_PREFIX: &str = "redlock:fair-";

/// How long a node gets to answer one command, unless configured otherwise.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(100);

/// The longest per-node timeout accepted. The Redlock spec suggests 5-50 ms for a 10 s TTL;
/// a node timeout of minutes means a hung node holds every rollback, release and shutdown
/// for minutes, and a timeout near `Duration::MAX` would overflow the deadlines computed
/// from it.
pub const MAX_NODE_TIMEOUT: Duration = Duration::from_secs(60);

/// Configuration of a [`Coordinator`](crate::Coordinator).
///
/// ```
/// use std::time::Duration;
/// let config = redlock_core::Config {
///     nodes: vec!["redis://127.0.0.1:7001".into(), "redis://127.0.0.1:7002".into(),
///                 "redis://127.0.0.1:7003".into()],
///     node_timeout: Duration::from_millis(50),
///     ..Default::default()
/// };
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone, PartialEq)]
pub struct Config {
    /// The independent members, as URLs: a Redis master, `redis://[user:pass@]host:port[/db]`
    /// (`rediss://` with the `tls` feature, `redis+unix:///path` with `unix-sockets`), or a
    /// whole cluster, `redis-cluster://[user:pass@]host:port?node=host2:port2` (see
    /// `docs/cluster-members.md`). The quorum is `nodes.len() / 2 + 1`. No default: an
    /// empty list is an error.
    pub nodes: Vec<String>,
    /// How long one node gets to answer one command, and to connect. A node slower than
    /// this counts as failed for that round. Defaults to 100 ms; the Redlock spec suggests
    /// 5-50 ms for a 10 s TTL on a local network. It must be well below the TTL.
    pub node_timeout: Duration,
    /// The clock drift allowance as a fraction of the TTL, in `[0, 1)`. Defaults to 0.01;
    /// 2 ms are always added on top (see [`drift`](crate::drift())).
    pub drift_factor: f64,
    /// The longest pause between two reconnection attempts to a node that went away.
    /// Defaults to 1 s.
    pub reconnect_max_delay: Duration,
    /// When set, every release (and every last release of a reentrant lock) publishes
    /// `"<token> <key>"` on this channel, on each node where it deleted the key, so that
    /// waiting clients can try again at once (the token, dead once released, tells the
    /// copies from different nodes apart from different releases). Defaults to `None`.
    pub release_channel: Option<String>,
    /// The key of each node's fencing counter, read and raised by fenced acquisitions
    /// (one counter for every lock of the node set), beside `<fence_key>:run` (the server
    /// run that wrote it) and `<fence_key>:repair` (a repair's marker). No lock may use
    /// these keys. Defaults to `"redlock:fencing-counter"`.
    pub fence_key: String,
    /// The prefix of the keys of the fair queues (see `support::FairPlace`): the
    /// queue of lock key `k` is `<fair_prefix>queue:{k}`, its expiry
    /// `<fair_prefix>expiry:{k}` (the braces are a hash tag; see [`crate::layout`]). It may
    /// not hold a brace. No lock key may start with it. Defaults to
    /// `"redlock:fair-"`.
    pub fair_prefix: String,
    /// The prefix of the semaphores' permit keys: permit `i` of semaphore `name` is
    /// `<semaphore_prefix>{name}:<i>` (see `Coordinator::acquire_permit`). It may not hold
    /// a brace. No lock key may start with it, so that no plain lock takes a permit's key.
    /// Defaults to `"redlock:semaphore-"`.
    pub semaphore_prefix: String,
    /// The prefix of the read-write locks' keys: read-write lock `name` keeps its writer,
    /// its readers and a waiting writer's intent under `<rwlock_prefix>{name}:` (see
    /// `layout::rwlock_keys`). It may not hold a brace. No lock key may start with it.
    /// Defaults to `"redlock:rwlock-"`.
    pub rwlock_prefix: String,
    /// TLS settings for the `rediss://` nodes (CA, client certificate, name check). `None`:
    /// `rediss://` nodes are checked against the system's roots and their URL's host.
    /// Given while no node URL uses `rediss://`, it is an error (the connections would
    /// not be encrypted). Needs the `tls` feature. Defaults to `None`.
    pub tls: Option<TlsConfig>,
    /// What [`Coordinator::connect`](crate::Coordinator::connect) does about a node that
    /// breaks the algorithm's assumptions (a replica, a cluster node, an evicting memory
    /// policy, persistence that can lose keys): see [`HealthPolicy`]. Defaults to
    /// [`HealthPolicy::Warn`].
    pub health: HealthPolicy,
    /// Whether concurrent plain acquisitions (and releases) of single keys share rounds:
    /// those started while one is in flight go out together in the next round, one script
    /// call per node, each lock still decided on its own quorum (group commit). A lone
    /// acquisition is one `SET NX PX` either way. Defaults to `true`.
    pub group_commit: bool,
    /// On a member that is a whole cluster: how many replicas of the master that ran an
    /// acquisition or an extension must have acknowledged it (`WAIT`, sent right behind
    /// it) before that member's vote counts. A master that fails over promotes a replica,
    /// which forgets what it had not received: with acknowledgement, a lock the member
    /// granted survives a failover to a replica that acknowledged it. It is not
    /// durability (a replica that did not acknowledge can still be promoted). `0`: no
    /// `WAIT`. Single servers ignore it. A cluster member's URL may set its own, which
    /// this does not override: `redis-cluster://host:port?replica_acks=0` for a member
    /// without replicas beside others with them. Defaults to `0`.
    pub replica_acks: u32,
}

/// What connecting does about a node whose settings break the algorithm's assumptions
/// (see [`NodeHealth`](crate::NodeHealth)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "lowercase")
)]
#[non_exhaustive]
pub enum HealthPolicy {
    /// Do not check.
    Off,
    /// Check each node at connect and log a warning for each problem found.
    #[default]
    Warn,
    /// Check each node at connect and refuse to connect
    /// ([`ConfigError::UnhealthyNode`]) when a node that answered has a problem. A node
    /// that is down, or whose settings cannot be read, is not refused.
    Strict,
}

/// Shows the node URLs with their passwords masked: a configuration ends up in logs.
impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<NodeName> = self.nodes.iter().map(|u| NodeName::redacted(u)).collect();
        f.debug_struct("Config")
            .field("nodes", &nodes)
            .field("node_timeout", &self.node_timeout)
            .field("drift_factor", &self.drift_factor)
            .field("reconnect_max_delay", &self.reconnect_max_delay)
            .field("release_channel", &self.release_channel)
            .field("fence_key", &self.fence_key)
            .field("fair_prefix", &self.fair_prefix)
            .field("semaphore_prefix", &self.semaphore_prefix)
            .field("rwlock_prefix", &self.rwlock_prefix)
            .field("tls", &self.tls)
            .field("health", &self.health)
            .field("group_commit", &self.group_commit)
            .field("replica_acks", &self.replica_acks)
            .finish()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            nodes: Vec::new(),
            node_timeout: DEFAULT_NODE_TIMEOUT,
            drift_factor: DEFAULT_DRIFT_FACTOR,
            reconnect_max_delay: Duration::from_secs(1),
            release_channel: None,
            fence_key: DEFAULT_FENCE_KEY.into(),
            fair_prefix: DEFAULT_FAIR_PREFIX.into(),
            semaphore_prefix: DEFAULT_SEMAPHORE_PREFIX.into(),
            rwlock_prefix: DEFAULT_RWLOCK_PREFIX.into(),
            tls: None,
            health: HealthPolicy::default(),
            group_commit: true,
            replica_acks: 0,
        }
    }
}

impl Config {
    /// Whether `key` is the fencing counter's (or one of its companions: its stamp and a
    /// repair's marker) or starts with the prefix of the fair queues, the semaphores or the
    /// read-write locks: no lock
    /// may be taken, released or extended under it by its key.
    pub(crate) fn is_reserved(&self, key: &str) -> bool {
        crate::fence::is_counter_key(&self.fence_key, key)
            || key.starts_with(&self.fair_prefix)
            || key.starts_with(&self.semaphore_prefix)
            || key.starts_with(&self.rwlock_prefix)
    }

    /// Checks every value without connecting anywhere.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.endpoints().map(|_| ())
    }

    /// Validates the configuration and parses every node URL.
    pub(crate) fn endpoints(&self) -> Result<Vec<Endpoint>, ConfigError> {
        if self.nodes.is_empty() {
            return Err(ConfigError::NoNodes);
        }
        if self.node_timeout.is_zero() {
            return Err(ConfigError::ZeroNodeTimeout);
        }
        if self.node_timeout > MAX_NODE_TIMEOUT {
            return Err(ConfigError::NodeTimeoutTooLong {
                timeout: self.node_timeout,
                max: MAX_NODE_TIMEOUT,
            });
        }
        if !(0.0..1.0).contains(&self.drift_factor) {
            return Err(ConfigError::DriftFactor {
                factor: self.drift_factor,
            });
        }
        if self.reconnect_max_delay.is_zero() {
            return Err(ConfigError::ZeroReconnectDelay);
        }
        if self.release_channel.as_deref() == Some("") {
            return Err(ConfigError::EmptyChannel);
        }
        let setting = |setting| move |problem| ConfigError::Setting { setting, problem };
        check_key(&self.fence_key).map_err(setting("fence_key"))?;
        for (name, prefix) in [
            ("fair_prefix", &self.fair_prefix),
            ("semaphore_prefix", &self.semaphore_prefix),
            ("rwlock_prefix", &self.rwlock_prefix),
        ] {
            check_key(prefix).map_err(setting(name))?;
            if !crate::layout::prefix_has_no_tag(prefix) {
                return Err(ConfigError::PrefixHashTag {
                    setting: name,
                    prefix: prefix.clone(),
                });
            }
        }
        if let Some(tls) = &self.tls {
            tls.check()?;
        }
        let mut seen = HashSet::new();
        let mut endpoints = Vec::with_capacity(self.nodes.len());
        for url in &self.nodes {
            let endpoint = parse_node(url)?;
            // Two URLs naming one server would let one server cast two votes.
            let identity = format!(
                "{:?}/{}",
                endpoint.fred.server,
                endpoint.fred.database.unwrap_or(0)
            );
            if !seen.insert(identity) {
                return Err(ConfigError::DuplicateNode {
                    node: endpoint.name.to_string(),
                });
            }
            endpoints.push(endpoint);
        }
        let uses_tls = endpoints.iter().any(|e| e.fred.uses_tls());
        if self.tls.is_some() && !uses_tls {
            return Err(ConfigError::TlsUnused);
        }
        #[cfg(feature = "tls")]
        if uses_tls {
            // Built once (files read, keys parsed) and shared by every TLS node.
            let connector = crate::tls::connector(self.tls.as_ref())?;
            let server_name = self.tls.as_ref().and_then(|t| t.server_name.clone());
            for endpoint in endpoints.iter_mut().filter(|e| e.fred.uses_tls()) {
                endpoint.fred.tls = Some(connector.clone().into());
                let fred::types::config::ServerConfig::Centralized { server } =
                    &mut endpoint.fred.server
                else {
                    continue;
                };
                // The name the certificate is checked against: the configured one, else
                // the URL's host. An IPv6 address stands in brackets in a URL
                // (`rediss://[::1]:6380`), and fred passes the host on as written, which
                // rustls refuses as a name: the address itself is checked instead.
                let ipv6 = server
                    .host
                    .strip_prefix('[')
                    .and_then(|host| host.strip_suffix(']'))
                    .map(str::to_string);
                if let Some(name) = server_name.clone().or(ipv6) {
                    server.tls_server_name = Some(name.as_str().into());
                }
            }
        }
        Ok(endpoints)
    }

    /// Checks a TTL against this configuration and returns it truncated to whole
    /// milliseconds (the precision of `PX`).
    pub fn check_ttl(&self, ttl: Duration) -> Result<Duration, ArgumentError> {
        check_ttl(ttl, self.drift_factor, self.node_timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(nodes: &[&str]) -> Config {
        Config {
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_prefix_with_a_brace_is_refused_and_says_why() {
        let braced = Config {
            fair_prefix: "redlock:{fair}-".into(),
            ..config(&["redis://127.0.0.1:6379"])
        };
        let error = braced.validate().unwrap_err();
        assert!(
            matches!(&error, ConfigError::PrefixHashTag { setting: "fair_prefix", prefix } if prefix == "redlock:{fair}-"),
            "{error:?}"
        );
        assert!(error.to_string().contains("without '{' or '}'"), "{error}");
        let braced = Config {
            semaphore_prefix: "redlock:sem}-".into(),
            ..config(&["redis://127.0.0.1:6379"])
        };
        assert!(matches!(
            braced.validate(),
            Err(ConfigError::PrefixHashTag {
                setting: "semaphore_prefix",
                ..
            })
        ));
        assert!(config(&["redis://127.0.0.1:6379"]).validate().is_ok());
    }

    #[test]
    fn a_setting_with_an_unusable_key_is_named_in_its_own_words() {
        let empty = Config {
            fence_key: String::new(),
            ..config(&["redis://127.0.0.1:6379"])
        };
        let error = empty.validate().unwrap_err();
        assert!(
            matches!(
                &error,
                ConfigError::Setting {
                    setting: "fence_key",
                    problem: ArgumentError::EmptyKey
                }
            ),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(message.contains("`fence_key`"), "{message}");
        // The key checker's own words are about a lock's key, which this is not.
        assert!(!message.contains("lock key"), "{message}");
        let long = Config {
            rwlock_prefix: "r".repeat(crate::MAX_KEY_LEN + 1),
            ..config(&["redis://127.0.0.1:6379"])
        };
        let message = long.validate().unwrap_err().to_string();
        assert!(message.contains("`rwlock_prefix`"), "{message}");
        assert!(message.contains("more than the maximum"), "{message}");
        assert!(!message.contains("lock key"), "{message}");
    }

    #[test]
    fn accepts_plain_urls_with_auth_and_db() {
        let c = config(&[
            "redis://127.0.0.1:7001",
            "redis://user:secret@127.0.0.1:7002/3",
            "redis://localhost",
        ]);
        let endpoints = c.endpoints().unwrap();
        assert_eq!(endpoints.len(), 3);
        assert_eq!(
            endpoints[1].name.to_string(),
            "redis://user:***@127.0.0.1:7002/3"
        );
    }

    #[test]
    fn debug_masks_passwords() {
        let c = config(&[
            "redis://user:s3cret@127.0.0.1:7001",
            "redis://127.0.0.1:7002",
        ]);
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("redis://user:***@127.0.0.1:7001"), "{shown}");
        // A checked endpoint too: it carries fred's configuration, whose Debug prints the
        // password as given.
        let endpoints = c.endpoints().unwrap();
        let shown = format!("{endpoints:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn rejects_an_empty_node_list() {
        assert!(matches!(config(&[]).validate(), Err(ConfigError::NoNodes)));
    }

    #[test]
    fn rejects_unparsable_and_unsupported_urls() {
        for bad in [
            "",
            "not a url",
            "http://127.0.0.1:80",
            "redis-sentinel://127.0.0.1:26379",
            "127.0.0.1:7001",
        ] {
            let err = config(&[bad]).validate().unwrap_err();
            assert!(
                matches!(err, ConfigError::InvalidUrl { .. }),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn takes_a_cluster_url_as_one_member_beside_single_servers() {
        let c = config(&[
            "redis-cluster://:pw@127.0.0.1:7000?node=127.0.0.1:7001",
            "redis://127.0.0.1:7002",
            "valkey-cluster://127.0.0.1:7003",
        ]);
        let endpoints = c.endpoints().unwrap();
        let clusters: Vec<bool> = endpoints
            .iter()
            .map(|e| e.fred.server.is_clustered())
            .collect();
        assert_eq!(clusters, [true, false, true]);
        assert!(!format!("{endpoints:?}").contains("pw@"));
    }

    #[test]
    fn a_cluster_member_may_set_its_own_replica_acks_and_a_single_server_may_not() {
        let c = config(&[
            "redis-cluster://127.0.0.1:7000?node=127.0.0.1:7001&replica_acks=2",
            "redis-cluster://127.0.0.1:7003?replica_acks=0",
            "redis-cluster://127.0.0.1:7006",
        ]);
        let own: Vec<Option<u32>> = c
            .endpoints()
            .unwrap()
            .iter()
            .map(|e| e.replica_acks)
            .collect();
        assert_eq!(own, [Some(2), Some(0), None]);
        for (bad, why) in [
            ("redis://:pw@127.0.0.1:7001?replica_acks=1", "single server"),
            (
                "redis-cluster://:pw@127.0.0.1:7000?replica_acks=one",
                "not a number",
            ),
            (
                "redis-cluster://:pw@127.0.0.1:7000?replica_acks=-1",
                "not a number",
            ),
            (
                "redis-cluster://:pw@127.0.0.1:7000?replica_acks=1&replica_acks=2",
                "more than once",
            ),
        ] {
            let err = config(&[bad]).validate().unwrap_err();
            let ConfigError::InvalidUrl { reason, .. } = &err else {
                panic!("{bad}: {err}");
            };
            assert!(reason.contains(why), "{bad}: {reason}");
            assert!(reason.contains("replica_acks"), "{bad}: {reason}");
            assert!(!err.to_string().contains("pw@"), "{err}");
        }
    }

    #[test]
    fn rejects_duplicates_and_keeps_the_password_out_of_the_message() {
        let err = config(&["redis://:pw@127.0.0.1:7001", "redis://:pw@127.0.0.1:7001/0"])
            .validate()
            .unwrap_err();
        assert!(matches!(err, ConfigError::DuplicateNode { .. }));
        assert!(!err.to_string().contains("pw@"), "{err}");
    }

    #[test]
    fn rejects_port_zero_and_keeps_the_password_out_of_the_message() {
        for bad in ["redis://127.0.0.1:0", "redis://:pw@127.0.0.1:0/1"] {
            let err = config(&["redis://127.0.0.1:7001", bad])
                .validate()
                .unwrap_err();
            let ConfigError::InvalidUrl { url, reason } = &err else {
                panic!("{bad}: {err}");
            };
            assert!(url.ends_with("@127.0.0.1:0/1") || url == bad, "{url}");
            assert!(reason.contains("port 0"), "{reason}");
            assert!(!err.to_string().contains("pw@"), "{err}");
            assert!(!format!("{err:?}").contains("pw@"), "{err:?}");
        }
    }

    #[test]
    fn other_databases_of_one_server_pass_the_url_check_but_ports_matter() {
        // Two databases of one server are one server, one failure domain: the URL check
        // lets them through, and `Coordinator::connect` rejects them by the server's run_id
        // (ConfigError::DuplicateServer; see the core_connect integration tests).
        assert!(
            config(&["redis://127.0.0.1:7001/0", "redis://127.0.0.1:7001/1"])
                .validate()
                .is_ok()
        );
        assert!(
            config(&["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"])
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn rejects_bad_drift_factors_and_timeouts() {
        for f in [-0.1, 1.0, f64::NAN, f64::INFINITY] {
            let c = Config {
                drift_factor: f,
                ..config(&["redis://127.0.0.1:7001"])
            };
            assert!(
                matches!(c.validate(), Err(ConfigError::DriftFactor { .. })),
                "{f}"
            );
        }
        // The message shows a huge factor short, not as 300 digits.
        let c = Config {
            drift_factor: 1e300,
            ..config(&["redis://127.0.0.1:7001"])
        };
        let message = c.validate().unwrap_err().to_string();
        assert!(
            message.starts_with("drift factor 1e300 is outside"),
            "{message}"
        );
        let c = Config {
            node_timeout: Duration::ZERO,
            ..config(&["redis://127.0.0.1:7001"])
        };
        assert!(matches!(c.validate(), Err(ConfigError::ZeroNodeTimeout)));
    }
}

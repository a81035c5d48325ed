//! The node health check: does each node meet what the algorithm assumes of it (H1: an
//! independent, standalone master; H2: no key vanishes before its TTL)?
//!
//! It reads `INFO` (which server and version, its mode, `role`, `aof_enabled`,
//! `maxmemory_policy`) and `CONFIG GET appendfsync`, asks `COMMAND INFO` which commands the
//! server offers, and tries the script commands the lock needs (without running anything)
//! to learn whether the node's user may run them. Managed services often refuse `CONFIG`
//! and `COMMAND`: what cannot be read is reported as unknown (`None`), never as a failure.
//!
//! Valkey and Redis name themselves in different fields: Valkey reports `server_name:valkey`,
//! its own `valkey_version` and `server_mode`, and keeps `redis_version` at a fixed
//! compatible value (7.2.4) with no `redis_mode`; Redis reports `redis_version` and
//! `redis_mode` only. Each is read from the fields it has.

use std::fmt;
use std::time::Duration;

use crate::error::ConfigError;
use crate::report::{NodeName, NodeOutcome};

mod problem;

pub use problem::HealthProblem;

/// What one node's settings say about the algorithm's assumptions.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeHealth {
    /// The node.
    pub node: NodeName,
    /// How long the node took to answer `INFO`, or why it did not.
    pub reachable: Result<Duration, NodeOutcome>,
    /// The server software: `server_name` (`valkey`), or `redis` for a server that reports
    /// only `redis_version`.
    pub server: Option<String>,
    /// The server's own version: `<server_name>_version` (`valkey_version`) where the server
    /// names itself, else `redis_version` (Valkey keeps that one at a fixed compatible value).
    pub version: Option<String>,
    /// `role`: `master`, or `slave` for a replica.
    pub role: Option<String>,
    /// `server_mode` (Valkey) or `redis_mode` (Redis): `standalone`, `cluster` or `sentinel`.
    pub mode: Option<String>,
    /// For a member that is a whole cluster (a `redis-cluster://` URL), what `CLUSTER INFO`
    /// says: `cluster_state` and `cluster_slots_ok`. `None` for a single server. (The other
    /// fields are one master's, the one that answered `INFO`.)
    pub cluster: Option<ClusterState>,
    /// Whether the append-only file is on (`aof_enabled`).
    pub appendonly: Option<bool>,
    /// `appendfsync` (`always`, `everysec`, `no`); `None` when `CONFIG GET` is not allowed.
    pub appendfsync: Option<String>,
    /// `maxmemory_policy`.
    pub maxmemory_policy: Option<String>,
    /// Whether the server offers a native compare-and-delete (`DELIFEQ`, Valkey 9), as
    /// `COMMAND INFO` says (never guessed from the version); `None` when `COMMAND` is not
    /// answered (an ACL user without it).
    pub compare_and_delete: Option<bool>,
    /// What breaks an assumption. Empty for a healthy node, and for one that did not
    /// answer (see `reachable`).
    pub problems: Vec<HealthProblem>,
}

/// What `CLUSTER INFO` and `INFO replication` say of a cluster member.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterState {
    /// `cluster_state`: `ok`, or `fail` when some slot is not served.
    pub state: Option<String>,
    /// `cluster_slots_ok`: how many of the 16384 slots a reachable master serves.
    pub slots_ok: Option<u32>,
    /// The fewest replicas connected to one of its masters (`connected_slaves`), when
    /// every master answered.
    pub fewest_replicas: Option<u32>,
    /// `Config::replica_acks`: how many replicas must acknowledge a write there.
    pub replica_acks: u32,
}

impl ClusterState {
    /// The number of hash slots of a cluster.
    pub const SLOTS: u32 = 16384;

    /// Reads a `CLUSTER INFO` reply (the rest unknown).
    pub(crate) fn of(info: &str) -> ClusterState {
        ClusterState {
            state: info_field(info, "cluster_state"),
            slots_ok: info_field(info, "cluster_slots_ok").and_then(|n| n.parse().ok()),
            fewest_replicas: None,
            replica_acks: 0,
        }
    }

    /// The number of replicas connected to a master, from its `INFO replication`.
    pub(crate) fn replicas_of(replication: &str) -> Option<u32> {
        info_field(replication, "connected_slaves").and_then(|n| n.parse().ok())
    }

    /// Whether the cluster is known not to serve every slot: a state other than `ok`, or
    /// fewer slots ok than there are. What could not be read is unknown, not a problem.
    pub fn is_degraded(&self) -> bool {
        self.state.as_deref().is_some_and(|state| state != "ok")
            || self.slots_ok.is_some_and(|ok| ok < Self::SLOTS)
    }
}

impl NodeHealth {
    /// Whether the node answered and no problem was found.
    pub fn is_healthy(&self) -> bool {
        self.reachable.is_ok() && self.problems.is_empty()
    }

    /// The server as people name it: `valkey 9.1.2, standalone` (each part that could not
    /// be read shown as `?`).
    pub fn server_label(&self) -> String {
        let unknown = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".into());
        format!(
            "{} {}, {}",
            unknown(&self.server),
            unknown(&self.version),
            unknown(&self.mode)
        )
    }

    /// Reads the health of a node from its `INFO` text, `appendfsync` setting and what
    /// [`Capabilities`] says.
    pub(crate) fn from_info(
        node: NodeName,
        latency: Duration,
        info: &str,
        appendfsync: Option<String>,
        capabilities: Capabilities,
        cluster: Option<ClusterState>,
    ) -> NodeHealth {
        let identity = ServerIdentity::of(info);
        let field = |name: &str| info_field(info, name);
        let mut health = NodeHealth {
            node,
            reachable: Ok(latency),
            server: identity.name,
            version: identity.version,
            role: field("role"),
            mode: identity.mode,
            cluster,
            appendonly: field("aof_enabled").map(|v| v == "1"),
            appendfsync,
            maxmemory_policy: field("maxmemory_policy"),
            compare_and_delete: capabilities.compare_and_delete,
            problems: Vec::new(),
        };
        // First the one that stops the lock working at all there.
        if !capabilities.refused.is_empty() {
            health.problems.push(HealthProblem::CommandsRefused {
                commands: capabilities.refused,
                reply: capabilities.refusal,
            });
        }
        health.problems.extend(health.find_problems());
        health
    }

    /// A node that did not answer `INFO`.
    pub(crate) fn unreachable(node: NodeName, why: NodeOutcome) -> NodeHealth {
        NodeHealth {
            node,
            reachable: Err(why),
            server: None,
            version: None,
            role: None,
            mode: None,
            cluster: None,
            appendonly: None,
            appendfsync: None,
            maxmemory_policy: None,
            compare_and_delete: None,
            problems: Vec::new(),
        }
    }

    fn find_problems(&self) -> Vec<HealthProblem> {
        let mut problems = Vec::new();
        if let Some(role) = self.role.as_deref().filter(|r| *r != "master") {
            problems.push(HealthProblem::NotMaster(role.to_string()));
        }
        // A cluster member's masters run in cluster mode; a single server must not.
        let expected = if self.cluster.is_some() {
            "cluster"
        } else {
            "standalone"
        };
        if let Some(mode) = self.mode.as_deref().filter(|m| *m != expected) {
            problems.push(HealthProblem::NotStandalone(mode.to_string()));
        }
        if let Some(cluster) = self.cluster.as_ref().filter(|c| c.is_degraded()) {
            problems.push(HealthProblem::ClusterDegraded {
                state: cluster.state.clone().unwrap_or_else(|| "unknown".into()),
                slots_ok: cluster.slots_ok,
            });
        }
        if let Some(cluster) = &self.cluster {
            if let Some(fewest) = cluster
                .fewest_replicas
                .filter(|&n| n < cluster.replica_acks)
            {
                problems.push(HealthProblem::TooFewReplicas {
                    fewest,
                    replica_acks: cluster.replica_acks,
                });
            }
        }
        if let Some(policy) = self
            .maxmemory_policy
            .as_deref()
            .filter(|p| *p != "noeviction")
        {
            problems.push(HealthProblem::Evicting(policy.to_string()));
        }
        match (self.appendonly, self.appendfsync.as_deref()) {
            (Some(false), _) => problems.push(HealthProblem::NoAppendOnly),
            (Some(true), Some(fsync)) if fsync != "always" => {
                problems.push(HealthProblem::FsyncNotAlways(fsync.to_string()))
            }
            _ => {}
        }
        problems
    }
}

impl fmt::Display for NodeHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unknown = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".into());
        match &self.reachable {
            Err(why) => write!(f, "{}: not reachable ({why})", self.node),
            Ok(latency) => {
                write!(
                    f,
                    "{}: answered in {latency:.1?}; server {}, version {}, role {}, mode {}, appendonly {}, appendfsync {}, maxmemory-policy {}",
                    self.node,
                    unknown(&self.server),
                    unknown(&self.version),
                    unknown(&self.role),
                    unknown(&self.mode),
                    match self.appendonly {
                        Some(true) => "yes",
                        Some(false) => "no",
                        None => "unknown",
                    },
                    unknown(&self.appendfsync),
                    unknown(&self.maxmemory_policy),
                )?;
                for problem in &self.problems {
                    write!(f, "; {problem}")?;
                }
                Ok(())
            }
        }
    }
}

/// Refuses a configuration in which the nodes whose user may not run the lock's scripts
/// ([`HealthProblem::CommandsRefused`]) leave fewer than a quorum of `n` nodes: no lock
/// could be released there. Fewer such nodes are a problem of each (warned about, or
/// refused by the strict policy).
pub(crate) fn check_commands(health: &[NodeHealth], n: usize) -> Result<(), ConfigError> {
    let refusing: Vec<(&NodeHealth, &Vec<String>, &String)> = health
        .iter()
        .filter_map(|h| {
            h.problems.iter().find_map(|p| match p {
                HealthProblem::CommandsRefused { commands, reply } => Some((h, commands, reply)),
                _ => None,
            })
        })
        .collect();
    if !crate::quorum::out_of_reach(n, refusing.len()) {
        return Ok(());
    }
    let mut commands: Vec<String> = Vec::new();
    for (_, refused, _) in &refusing {
        for command in *refused {
            if !commands.contains(command) {
                commands.push(command.clone());
            }
        }
    }
    Err(ConfigError::CommandsRefused {
        nodes: refusing
            .iter()
            .map(|(h, _, _)| h.node.to_string())
            .collect(),
        commands,
        reply: refusing[0].2.clone(),
    })
}

/// The value of field `name` in an `INFO` reply, if present and not empty.
fn info_field(info: &str, name: &str) -> Option<String> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
        .map(|value| value.trim().to_string())
        .filter(|value| !value.is_empty())
}

/// Which server a node runs, from the fields of `INFO server` it really has.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ServerIdentity {
    /// `server_name` (`valkey`), or `redis` when only `redis_version` is there.
    pub(crate) name: Option<String>,
    /// `<server_name>_version`, else `redis_version`.
    pub(crate) version: Option<String>,
    /// `server_mode`, else `redis_mode`.
    pub(crate) mode: Option<String>,
}

impl ServerIdentity {
    pub(crate) fn of(info: &str) -> ServerIdentity {
        let field = |name: &str| info_field(info, name);
        let named = field("server_name");
        let own_version = named
            .as_deref()
            .and_then(|name| field(&format!("{name}_version")));
        let redis_version = field("redis_version");
        ServerIdentity {
            name: named.or_else(|| redis_version.as_ref().map(|_| "redis".to_string())),
            version: own_version.or(redis_version),
            mode: field("server_mode").or_else(|| field("redis_mode")),
        }
    }
}

/// What the health check learned of the commands a node offers and lets its user run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// `DELIFEQ`, from `COMMAND INFO`; `None` when that was not answered.
    pub(crate) compare_and_delete: Option<bool>,
    /// The commands the lock needs that the node refused (`NOPERM`) or does not know.
    pub(crate) refused: Vec<String>,
    /// The node's own words for the first refusal.
    pub(crate) refusal: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n\
        # Memory\r\nmaxmemory_policy:noeviction\r\n# Persistence\r\naof_enabled:1\r\n\
        # Replication\r\nrole:master\r\n";

    fn node() -> NodeName {
        NodeName::redacted("redis://127.0.0.1:7001")
    }

    /// The whole `INFO` of each server the suite runs against, as it answers it (started
    /// with `--appendonly yes --appendfsync always`; paths and host name neutral).
    const VALKEY_9: &str = include_str!("../../testdata/info/valkey-9.1.2.txt");
    const REDIS_7: &str = include_str!("../../testdata/info/redis-7.0.15.txt");
    /// `INFO server` of Valkey 9.1.2 started with `--cluster-enabled yes`.
    const VALKEY_9_CLUSTER: &str =
        include_str!("../../testdata/info/valkey-9.1.2-cluster-server.txt");

    fn read(info: &str, capabilities: Capabilities) -> NodeHealth {
        NodeHealth::from_info(
            node(),
            Duration::ZERO,
            info,
            Some("always".into()),
            capabilities,
            None,
        )
    }

    #[test]
    fn each_server_is_named_from_the_fields_it_has() {
        let valkey = read(VALKEY_9, Capabilities::default());
        assert_eq!(valkey.server.as_deref(), Some("valkey"));
        // Not the `redis_version:7.2.4` Valkey keeps for compatibility.
        assert_eq!(valkey.version.as_deref(), Some("9.1.2"));
        // `server_mode`: Valkey has no `redis_mode`.
        assert_eq!(valkey.mode.as_deref(), Some("standalone"));
        assert_eq!(valkey.server_label(), "valkey 9.1.2, standalone");
        assert!(valkey.is_healthy(), "{valkey}");
        assert!(
            valkey.to_string().contains("server valkey, version 9.1.2"),
            "{valkey}"
        );

        let redis = read(REDIS_7, Capabilities::default());
        assert_eq!(redis.server.as_deref(), Some("redis"));
        assert_eq!(redis.version.as_deref(), Some("7.0.15"));
        assert_eq!(redis.mode.as_deref(), Some("standalone"));
        assert_eq!(redis.server_label(), "redis 7.0.15, standalone");
        assert!(redis.is_healthy(), "{redis}");
    }

    /// A Valkey node in cluster mode said `server_mode:cluster` only: read as `redis_mode`,
    /// it passed the standalone check unseen.
    #[test]
    fn a_valkey_cluster_node_is_not_standalone() {
        let h = read(VALKEY_9_CLUSTER, Capabilities::default());
        assert_eq!(h.mode.as_deref(), Some("cluster"));
        assert_eq!(
            h.problems,
            vec![HealthProblem::NotStandalone("cluster".into())]
        );
        assert_eq!(h.server_label(), "valkey 9.1.2, cluster");
    }

    #[test]
    fn a_server_that_names_nothing_is_unknown() {
        let h = read("# Server\r\nrole:master\r\n", Capabilities::default());
        assert_eq!(h.server_label(), "? ?, ?");
        assert_eq!((h.server, h.version, h.mode), (None, None, None));
    }

    #[test]
    fn refused_script_commands_are_a_problem_that_names_them() {
        let refused = Capabilities {
            compare_and_delete: Some(true),
            refused: vec!["EVALSHA".into(), "EVAL".into()],
            refusal: "NOPERM User locker has no permissions to run the 'evalsha' command".into(),
        };
        let h = read(VALKEY_9, refused);
        assert_eq!(h.compare_and_delete, Some(true));
        let [HealthProblem::CommandsRefused { commands, reply }] = &h.problems[..] else {
            panic!("{h}");
        };
        assert_eq!(commands, &["EVALSHA", "EVAL"]);
        assert!(reply.starts_with("NOPERM"), "{reply}");
        let said = h.problems[0].to_string();
        assert!(said.contains("refuses EVALSHA, EVAL (NOPERM"), "{said}");
        assert!(said.contains("`+evalsha` `+eval`"), "{said}");
    }

    /// Nodes that refuse the scripts fail the connect only when the others cannot make a
    /// quorum; fewer are each node's problem.
    #[test]
    fn refused_scripts_fail_the_check_only_without_a_quorum_left() {
        let refusing = || {
            read(
                REDIS_7,
                Capabilities {
                    refused: vec!["EVALSHA".into()],
                    refusal: "NOPERM this user has no permissions to run the 'evalsha' command"
                        .into(),
                    ..Capabilities::default()
                },
            )
        };
        let healthy = || read(REDIS_7, Capabilities::default());
        assert_eq!(
            check_commands(&[refusing(), healthy(), healthy()], 3),
            Ok(())
        );
        let error = check_commands(&[refusing(), healthy(), refusing()], 3).unwrap_err();
        let ConfigError::CommandsRefused {
            nodes,
            commands,
            reply,
        } = &error
        else {
            panic!("{error}");
        };
        assert_eq!(nodes.len(), 2);
        assert_eq!(commands, &["EVALSHA"]);
        assert!(reply.starts_with("NOPERM"));
        assert!(
            error
                .to_string()
                .contains("grant the nodes' user `+evalsha`"),
            "{error}"
        );
        // Five nodes: two refusing leave a quorum of three.
        let five = [refusing(), refusing(), healthy(), healthy(), healthy()];
        assert_eq!(check_commands(&five, 5), Ok(()));
        // A node down at connect is not checked, but counts against the quorum of all.
        assert!(check_commands(&[refusing(), refusing()], 3).is_err());
    }

    #[test]
    fn a_persistent_standalone_master_is_healthy() {
        let h = NodeHealth::from_info(
            node(),
            Duration::from_millis(1),
            INFO,
            Some("always".into()),
            Capabilities::default(),
            None,
        );
        assert!(h.is_healthy(), "{h}");
        assert_eq!(h.version.as_deref(), Some("7.0.15"));
        assert_eq!(h.appendonly, Some(true));
    }

    #[test]
    fn each_broken_assumption_is_named() {
        let info = INFO
            .replace("role:master", "role:slave")
            .replace("redis_mode:standalone", "redis_mode:cluster")
            .replace(
                "maxmemory_policy:noeviction",
                "maxmemory_policy:volatile-lru",
            );
        let h = NodeHealth::from_info(
            node(),
            Duration::ZERO,
            &info,
            Some("everysec".into()),
            Capabilities::default(),
            None,
        );
        assert_eq!(
            h.problems,
            vec![
                HealthProblem::NotMaster("slave".into()),
                HealthProblem::NotStandalone("cluster".into()),
                HealthProblem::Evicting("volatile-lru".into()),
                HealthProblem::FsyncNotAlways("everysec".into()),
            ]
        );
        let h = NodeHealth::from_info(
            node(),
            Duration::ZERO,
            &INFO.replace("aof_enabled:1", "aof_enabled:0"),
            None,
            Capabilities::default(),
            None,
        );
        assert_eq!(h.problems, vec![HealthProblem::NoAppendOnly]);
    }

    /// A cluster member's masters run in cluster mode, which is no problem there, but a
    /// cluster that does not serve every slot is; and a single server in cluster mode still
    /// is one.
    #[test]
    fn a_cluster_member_is_judged_by_its_cluster_state() {
        let info = INFO.replace("redis_mode:standalone", "redis_mode:cluster");
        let member = |cluster: &str| {
            NodeHealth::from_info(
                node(),
                Duration::ZERO,
                &info,
                Some("always".into()),
                Capabilities::default(),
                Some(ClusterState::of(cluster)),
            )
        };
        let ok = member(
            "cluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_slots_ok:16384\r\n",
        );
        assert!(ok.is_healthy(), "{ok}");
        let degraded = member("cluster_state:fail\r\ncluster_slots_ok:10923\r\n");
        assert_eq!(
            degraded.problems,
            vec![HealthProblem::ClusterDegraded {
                state: "fail".into(),
                slots_ok: Some(10923),
            }]
        );
        assert!(
            degraded.to_string().contains("10923 of 16384 slots"),
            "{degraded}"
        );
        let mut short = member("cluster_state:ok\r\ncluster_slots_ok:16384\r\n");
        if let Some(cluster) = short.cluster.as_mut() {
            cluster.fewest_replicas =
                ClusterState::replicas_of("role:master\r\nconnected_slaves:0\r\n");
            cluster.replica_acks = 1;
        }
        assert_eq!(
            short.find_problems().pop(),
            Some(HealthProblem::TooFewReplicas {
                fewest: 0,
                replica_acks: 1
            })
        );
        let single = NodeHealth::from_info(
            node(),
            Duration::ZERO,
            &info,
            Some("always".into()),
            Capabilities::default(),
            None,
        );
        assert_eq!(
            single.problems,
            vec![HealthProblem::NotStandalone("cluster".into())]
        );
    }

    #[test]
    fn what_cannot_be_read_is_unknown_not_a_problem() {
        let h = NodeHealth::from_info(
            node(),
            Duration::ZERO,
            "# Server\r\nredis_version:7.2.4\r\n",
            None,
            Capabilities::default(),
            None,
        );
        assert!(h.is_healthy(), "{h}");
        assert_eq!(h.role, None);
        assert!(h.to_string().contains("appendfsync unknown"), "{h}");
    }
}

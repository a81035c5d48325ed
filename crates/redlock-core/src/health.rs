//! The node health check: does each node meet what the algorithm assumes of it (H1: an
//! independent, standalone master; H2: no key vanishes before its TTL)?
//!
//! It reads `INFO` (version, `redis_mode`, `role`, `aof_enabled`, `maxmemory_policy`) and
//! `CONFIG GET appendfsync`. Managed services often refuse `CONFIG`: what cannot be read is
//! reported as unknown (`None`), never as a failure.

use std::fmt;
use std::time::Duration;

use crate::report::{NodeName, NodeOutcome};

/// What one node's settings say about the algorithm's assumptions.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeHealth {
    /// The node.
    pub node: NodeName,
    /// How long the node took to answer `INFO`, or why it did not.
    pub reachable: Result<Duration, NodeOutcome>,
    /// `redis_version` (Valkey reports a compatible one).
    pub version: Option<String>,
    /// `role`: `master`, or `slave` for a replica.
    pub role: Option<String>,
    /// `redis_mode`: `standalone`, `cluster` or `sentinel`.
    pub mode: Option<String>,
    /// Whether the append-only file is on (`aof_enabled`).
    pub appendonly: Option<bool>,
    /// `appendfsync` (`always`, `everysec`, `no`); `None` when `CONFIG GET` is not allowed.
    pub appendfsync: Option<String>,
    /// `maxmemory_policy`.
    pub maxmemory_policy: Option<String>,
    /// What breaks an assumption. Empty for a healthy node, and for one that did not
    /// answer (see `reachable`).
    pub problems: Vec<HealthProblem>,
}

impl NodeHealth {
    /// Whether the node answered and no problem was found.
    pub fn is_healthy(&self) -> bool {
        self.reachable.is_ok() && self.problems.is_empty()
    }

    /// Reads the health of a node from its `INFO` text and `appendfsync` setting.
    pub(crate) fn from_info(
        node: NodeName,
        latency: Duration,
        info: &str,
        appendfsync: Option<String>,
    ) -> NodeHealth {
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
                .map(|value| value.trim().to_string())
                .filter(|value| !value.is_empty())
        };
        let mut health = NodeHealth {
            node,
            reachable: Ok(latency),
            version: field("redis_version"),
            role: field("role"),
            mode: field("redis_mode"),
            appendonly: field("aof_enabled").map(|v| v == "1"),
            appendfsync,
            maxmemory_policy: field("maxmemory_policy"),
            problems: Vec::new(),
        };
        health.problems = health.find_problems();
        health
    }

    /// A node that did not answer `INFO`.
    pub(crate) fn unreachable(node: NodeName, why: NodeOutcome) -> NodeHealth {
        NodeHealth {
            node,
            reachable: Err(why),
            version: None,
            role: None,
            mode: None,
            appendonly: None,
            appendfsync: None,
            maxmemory_policy: None,
            problems: Vec::new(),
        }
    }

    fn find_problems(&self) -> Vec<HealthProblem> {
        let mut problems = Vec::new();
        if let Some(role) = self.role.as_deref().filter(|r| *r != "master") {
            problems.push(HealthProblem::NotMaster(role.to_string()));
        }
        if let Some(mode) = self.mode.as_deref().filter(|m| *m != "standalone") {
            problems.push(HealthProblem::NotStandalone(mode.to_string()));
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
                    "{}: answered in {latency:.1?}; version {}, role {}, mode {}, appendonly {}, appendfsync {}, maxmemory-policy {}",
                    self.node,
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

/// A node setting that breaks one of the algorithm's assumptions, with what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HealthProblem {
    /// The node is not a master (`role` is given): its writes fail, or, after a failover,
    /// a replica that missed a lock would grant it again (H1).
    NotMaster(String),
    /// The node runs in cluster or sentinel mode (given): Redlock needs independent,
    /// standalone masters (H1).
    NotStandalone(String),
    /// `maxmemory-policy` (given) may evict lock keys before their TTL (H2): every policy
    /// but `noeviction` can, since lock keys have an expiry.
    Evicting(String),
    /// No append-only file: a restart loses every lock the node held (H2), unless the
    /// node is kept down for longer than the longest TTL after a crash.
    NoAppendOnly,
    /// `appendfsync` (given) is not `always`: a crash can lose the last writes, locks
    /// among them (H2).
    FsyncNotAlways(String),
}

impl fmt::Display for HealthProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HealthProblem::NotMaster(role) => write!(
                f,
                "role is `{role}`, not master: list only independent masters (H1)"
            ),
            HealthProblem::NotStandalone(mode) => write!(
                f,
                "runs in {mode} mode: Redlock needs independent standalone masters, not a cluster or sentinel set (H1)"
            ),
            HealthProblem::Evicting(policy) => write!(
                f,
                "maxmemory-policy `{policy}` can evict lock keys before their TTL: set `maxmemory-policy noeviction` (H2)"
            ),
            HealthProblem::NoAppendOnly => f.write_str(
                "appendonly is off: a restart loses its locks; set `appendonly yes` and `appendfsync always`, or keep a crashed node down for longer than the longest TTL (H2)",
            ),
            HealthProblem::FsyncNotAlways(fsync) => write!(
                f,
                "appendfsync `{fsync}` can lose the last writes in a crash: set `appendfsync always`, or keep a crashed node down for longer than the longest TTL (H2)"
            ),
        }
    }
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

    #[test]
    fn a_persistent_standalone_master_is_healthy() {
        let h = NodeHealth::from_info(
            node(),
            Duration::from_millis(1),
            INFO,
            Some("always".into()),
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
        let h = NodeHealth::from_info(node(), Duration::ZERO, &info, Some("everysec".into()));
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
        );
        assert_eq!(h.problems, vec![HealthProblem::NoAppendOnly]);
    }

    #[test]
    fn what_cannot_be_read_is_unknown_not_a_problem() {
        let h = NodeHealth::from_info(
            node(),
            Duration::ZERO,
            "# Server\r\nredis_version:7.2.4\r\n",
            None,
        );
        assert!(h.is_healthy(), "{h}");
        assert_eq!(h.role, None);
        assert!(h.to_string().contains("appendfsync unknown"), "{h}");
    }
}

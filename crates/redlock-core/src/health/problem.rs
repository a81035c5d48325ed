//! What can be wrong with a node: each broken assumption, and what to do about it.

use std::fmt;

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
    /// A cluster member's cluster does not serve every slot (`CLUSTER INFO` gives its
    /// state and the slots served): locks whose keys fall in the slots not served cannot be
    /// taken or released there.
    ClusterDegraded {
        /// `cluster_state`.
        state: String,
        /// `cluster_slots_ok`, when given.
        slots_ok: Option<u32>,
    },
    /// A master of a cluster member has fewer replicas connected than `replica_acks`
    /// asks to acknowledge each write: that member's votes on its slots never count.
    TooFewReplicas {
        /// The fewest replicas connected to one of its masters.
        fewest: u32,
        /// `Config::replica_acks`.
        replica_acks: u32,
    },
    /// `maxmemory-policy` (given) may evict lock keys before their TTL (H2): every policy
    /// but `noeviction` can, since lock keys have an expiry.
    Evicting(String),
    /// No append-only file: a restart loses every lock the node held (H2), unless the
    /// node is kept down for longer than the longest TTL after a crash.
    NoAppendOnly,
    /// `appendfsync` (given) is not `always`: a crash can lose the last writes, locks
    /// among them (H2).
    FsyncNotAlways(String),
    /// The node's user may not run commands the lock needs (the ACL refuses them:
    /// `NOPERM`), or the server does not offer them (renamed away): today `EVALSHA` and
    /// `EVAL`, with which every release and most acquisitions run their scripts. A plain
    /// lock could still be taken there (`SET NX`), but never released before its TTL.
    CommandsRefused {
        /// The commands refused, as the lock sends them (`EVALSHA`, `EVAL`).
        commands: Vec<String>,
        /// What the node answered to the first of them.
        reply: String,
    },
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
            HealthProblem::ClusterDegraded { state, slots_ok } => write!(
                f,
                "cluster state `{state}`, {} of 16384 slots served: locks in the other slots fail there; bring the failed masters back or promote their replicas",
                slots_ok.map_or_else(|| "unknown".to_string(), |n| n.to_string())
            ),
            HealthProblem::TooFewReplicas { fewest, replica_acks } => write!(
                f,
                "a master has {fewest} replicas connected, fewer than `replica_acks` ({replica_acks}): the member's votes on its slots never count; add replicas, or lower `replica_acks`"
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
            HealthProblem::CommandsRefused { commands, reply } => write!(
                f,
                "refuses {} ({reply}): the lock runs its releases and most acquisitions as scripts; grant the node's user {} (and `+script|load`), or `+@scripting`",
                commands.join(", "),
                commands
                    .iter()
                    .map(|c| format!("`+{}`", c.to_ascii_lowercase()))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
        }
    }
}

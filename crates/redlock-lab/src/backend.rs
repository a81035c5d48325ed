//! The lab's two node-set backends: local redis-server processes (default, fast) and the
//! docker-compose node set of `docker-compose.yml`.
//!
//! Both implement testkit's [`Nodes`] interface, so scenarios are written once against it.
//! What is left here is lab-specific: which set to start for a scenario's [`Setup`], and
//! keeping the docker set (slow to start) from one scenario to the next.
//!
//! A scenario whose members include whole clusters ([`Setup::clusters`]) runs on local
//! processes only, as a testkit [`MemberSet`]: clusters first, then single servers.

use std::fmt;

use std::net::SocketAddr;

use redlock_testkit::{
    ClusterSet, ClusterShape, DockerOptions, DockerSet, MemberSet, NodeOptions, NodeSet, Nodes,
    RedisAt,
};

use crate::error::LabError;

/// Which node set a scenario runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendKind {
    /// redis-server processes on free loopback ports, started by the harness.
    Local,
    /// The five containers of `docker-compose.yml` on a private Docker network.
    Docker,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Local => "local",
            BackendKind::Docker => "docker",
        })
    }
}

/// How a scenario wants its nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setup {
    /// How many nodes (the docker set has five; a scenario may use the first three).
    pub nodes: usize,
    /// `appendonly yes` + `appendfsync always`: keys survive a restart.
    pub persistent: bool,
    /// Start the nodes with the clock shim, so their clocks can be skewed.
    pub fake_clock: bool,
    /// The first members are whole clusters of these shapes (the others, up to
    /// [`nodes`](Self::nodes), single servers): local processes only, each cluster reached
    /// straight by its clients (no fault proxy can stand in front of a cluster, whose
    /// replies name its processes' addresses), faulted whole or shard by shard.
    pub clusters: &'static [ClusterShape],
}

/// The docker set always has this many nodes.
pub const DOCKER_NODES: usize = 5;

/// A started node set of either kind, handed from one scenario to the next so that the docker
/// set is reused.
#[derive(Debug)]
pub enum Backend {
    /// Local processes, as many as the scenario asked for.
    Local(NodeSet),
    /// The five containers; a scenario uses the first [`Setup::nodes`] of them.
    Docker(DockerSet),
    /// Cluster members, then single servers ([`Setup::clusters`]).
    Members(MemberSet),
}

impl Backend {
    /// Starts a node set for `setup`. For docker, `reuse` is a set from an earlier scenario:
    /// it is kept (flushed, clocks reset) when its options match, else taken down first.
    pub async fn start(
        kind: BackendKind,
        setup: Setup,
        reuse: Option<Backend>,
    ) -> Result<Backend, LabError> {
        match kind {
            BackendKind::Local if !setup.clusters.is_empty() => {
                drop(reuse);
                let singles = setup.nodes.saturating_sub(setup.clusters.len());
                Ok(Backend::Members(
                    MemberSet::start(setup.clusters, singles).await?,
                ))
            }
            BackendKind::Docker if !setup.clusters.is_empty() => Err(LabError::Setup(
                "cluster members run on local processes only: the docker node set has no \
                 cluster (run this scenario on the local backend)"
                    .into(),
            )),
            BackendKind::Local => {
                drop(reuse);
                let options = NodeOptions {
                    appendonly_always: setup.persistent,
                    fake_clock: setup.fake_clock,
                    ..NodeOptions::default()
                };
                Ok(Backend::Local(
                    NodeSet::start_with(setup.nodes, options).await?,
                ))
            }
            BackendKind::Docker => {
                if setup.nodes > DOCKER_NODES {
                    return Err(LabError::Setup(format!(
                        "the docker node set has {DOCKER_NODES} nodes; the scenario needs {}",
                        setup.nodes
                    )));
                }
                let options = DockerOptions {
                    appendonly_always: setup.persistent,
                    fake_clock: setup.fake_clock,
                };
                if let Some(Backend::Docker(set)) = reuse {
                    if *set.options() == options {
                        reset_for_reuse(&set).await?;
                        return Ok(Backend::Docker(set));
                    }
                    drop(set);
                }
                Ok(Backend::Docker(DockerSet::up(options).await?))
            }
        }
    }

    /// Which backend this is.
    pub fn kind(&self) -> BackendKind {
        match self {
            Backend::Local(_) | Backend::Members(_) => BackendKind::Local,
            Backend::Docker(_) => BackendKind::Docker,
        }
    }

    /// The node set, through the interface both backends share. It is the whole set: the
    /// docker set has five nodes whatever the scenario uses.
    pub fn nodes(&self) -> &dyn Nodes {
        match self {
            Backend::Local(set) => set,
            Backend::Docker(set) => set,
            Backend::Members(set) => set,
        }
    }

    /// Node `n` when it is a cluster member.
    pub fn cluster(&self, n: usize) -> Option<&ClusterSet> {
        match self {
            Backend::Members(set) => set.cluster(n),
            _ => None,
        }
    }

    /// The URL a client uses for node `n` when it does not go through a fault proxy: a
    /// cluster member's (see [`Setup::clusters`]).
    pub fn direct_url(&self, n: usize) -> Option<String> {
        match self {
            Backend::Members(set) if set.cluster(n).is_some() => Some(set.url(n)),
            _ => None,
        }
    }

    /// Where the observer samples `key` on node `n`: a cluster member's master of the key's
    /// slot when the run starts (after a failover of that shard it samples the demoted
    /// master, which answers nothing for the key, and the samples stop), else the node.
    pub fn observed_at(&self, n: usize, key: &str) -> SocketAddr {
        match self.cluster(n) {
            Some(cluster) => cluster.master_of(key).redis().addr(),
            None => self.nodes().addr(n),
        }
    }

    /// What the leftover scan reads on node `n`: every master of a cluster member now,
    /// else the node.
    pub fn scanned(&self, n: usize) -> Vec<RedisAt> {
        match self.cluster(n) {
            Some(cluster) => cluster.masters().iter().map(|m| m.redis()).collect(),
            None => vec![self.nodes().redis(n)],
        }
    }
}

/// Brings every container back to a clean, running, connected state with real clocks.
async fn reset_for_reuse(set: &DockerSet) -> Result<(), LabError> {
    for i in 0..set.len() {
        // Each step is a no-op on a node in the right state; errors are reported by the
        // PING below, which is what matters.
        let _ = set.resume(i).await;
        let _ = set.connect(i).await;
        let _ = set.start(i).await;
        if let Some(clock) = set.clock(i) {
            clock.reset()?;
        }
        let redis = set.redis(i);
        redis.ping().await?;
        redis.flushall().await?;
    }
    Ok(())
}

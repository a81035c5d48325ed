//! The two node-set backends behind one interface: local redis-server processes (default,
//! fast) and the docker-compose node set of `docker-compose.yml`.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use redlock_testkit::{ClockControl, DockerOptions, DockerSet, NodeOptions, NodeSet, RedisAt};

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
}

/// The docker set always has this many nodes.
pub const DOCKER_NODES: usize = 5;

/// A started node set of either kind.
#[derive(Debug)]
pub enum Nodes {
    /// Local processes.
    Local(NodeSet),
    /// Containers; the scenario uses the first `used` of them.
    Docker {
        /// The containers.
        set: DockerSet,
        /// How many the scenario uses.
        used: usize,
        /// The options the set was started with.
        options: DockerOptions,
    },
}

impl Nodes {
    /// Starts a node set for `setup`. For docker, `reuse` is a set from an earlier scenario:
    /// it is kept (flushed, clocks reset) when its options match, else taken down first.
    pub async fn start(
        kind: BackendKind,
        setup: Setup,
        reuse: Option<Nodes>,
    ) -> Result<Nodes, LabError> {
        match kind {
            BackendKind::Local => {
                drop(reuse);
                let options = NodeOptions {
                    appendonly_always: setup.persistent,
                    fake_clock: setup.fake_clock,
                    ..NodeOptions::default()
                };
                Ok(Nodes::Local(
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
                if let Some(Nodes::Docker {
                    set, options: old, ..
                }) = reuse
                {
                    if old.appendonly_always == options.appendonly_always
                        && old.fake_clock == options.fake_clock
                    {
                        let nodes = Nodes::Docker {
                            set,
                            used: setup.nodes,
                            options,
                        };
                        nodes.reset_for_reuse().await?;
                        return Ok(nodes);
                    }
                    drop(set);
                }
                let set = DockerSet::up(options.clone()).await?;
                Ok(Nodes::Docker {
                    set,
                    used: setup.nodes,
                    options,
                })
            }
        }
    }

    /// Brings every container back to a clean, running, connected state with real clocks.
    async fn reset_for_reuse(&self) -> Result<(), LabError> {
        let Nodes::Docker { set, .. } = self else {
            return Ok(());
        };
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

    /// Which backend this is.
    pub fn kind(&self) -> BackendKind {
        match self {
            Nodes::Local(_) => BackendKind::Local,
            Nodes::Docker { .. } => BackendKind::Docker,
        }
    }

    /// How many nodes the scenario uses.
    pub fn len(&self) -> usize {
        match self {
            Nodes::Local(set) => set.len(),
            Nodes::Docker { used, .. } => *used,
        }
    }

    /// Whether there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Node `i`'s address as seen from this host.
    pub fn addr(&self, i: usize) -> SocketAddr {
        match self {
            Nodes::Local(set) => SocketAddr::from((Ipv4Addr::LOCALHOST, set.node(i).port())),
            Nodes::Docker { set, .. } => set.addr(i),
        }
    }

    /// Every used node's address.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        (0..self.len()).map(|i| self.addr(i)).collect()
    }

    /// Node `i`'s name in messages.
    pub fn name(&self, i: usize) -> String {
        match self {
            Nodes::Local(set) => set.node(i).name().to_owned(),
            Nodes::Docker { set, .. } => set.name(i).to_owned(),
        }
    }

    /// A direct connection handle to node `i` (inspection, key loss).
    pub fn redis(&self, i: usize) -> RedisAt {
        match self {
            Nodes::Local(set) => set.node(i).redis(),
            Nodes::Docker { set, .. } => set.redis(i),
        }
    }

    /// Node `i`'s clock control, when started with the clock shim.
    pub fn clock(&self, i: usize) -> Option<&ClockControl> {
        match self {
            Nodes::Local(set) => set.node(i).clock(),
            Nodes::Docker { set, .. } => set.clock(i),
        }
    }

    /// SIGKILL (local) or `docker kill`.
    pub async fn kill(&self, i: usize) -> Result<(), LabError> {
        match self {
            Nodes::Local(set) => set.node(i).kill()?,
            Nodes::Docker { set, .. } => set.kill(i).await?,
        }
        Ok(())
    }

    /// SIGSTOP (local) or `docker pause`.
    pub async fn pause(&self, i: usize) -> Result<(), LabError> {
        match self {
            Nodes::Local(set) => set.node(i).pause()?,
            Nodes::Docker { set, .. } => set.pause(i).await?,
        }
        Ok(())
    }

    /// SIGCONT (local) or `docker unpause`.
    pub async fn resume(&self, i: usize) -> Result<(), LabError> {
        match self {
            Nodes::Local(set) => set.node(i).resume()?,
            Nodes::Docker { set, .. } => set.resume(i).await?,
        }
        Ok(())
    }

    /// Kill and start again at once (data kept only when persistent).
    pub async fn restart(&self, i: usize) -> Result<(), LabError> {
        match self {
            Nodes::Local(set) => set.node(i).restart().await?,
            Nodes::Docker { set, .. } => set.restart(i).await?,
        }
        Ok(())
    }

    /// Kill, stay down for `delay`, start again.
    pub async fn restart_after(&self, i: usize, delay: Duration) -> Result<(), LabError> {
        match self {
            Nodes::Local(set) => set.node(i).restart_after(delay).await?,
            Nodes::Docker { set, .. } => set.restart_after(i, delay).await?,
        }
        Ok(())
    }

    /// Whether node `i` is up (not killed); paused counts as up.
    pub async fn is_up(&self, i: usize) -> bool {
        match self {
            Nodes::Local(set) => set.node(i).is_running(),
            Nodes::Docker { set, .. } => set.redis(i).ping().await.is_ok(),
        }
    }
}

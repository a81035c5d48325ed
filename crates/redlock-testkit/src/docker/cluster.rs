//! [`DockerCluster`]: the Redis Cluster of `docker-compose.cluster.yml` (three masters with a
//! replica each, in containers on a private network) as one quorum member, with the
//! container-level faults of the docker node set: kill, start, pause, resume, network
//! disconnect and connect, and the cluster's own (a shard failed over, its replication held
//! back). Opt-in like [`DockerSet`](super::DockerSet): it needs Docker Engine and
//! docker-compose v1.
//!
//! Each node listens inside its container on the port Docker publishes on the host
//! (`127.0.0.1:7201`..`7206`) and announces `127.0.0.1` as its endpoint
//! (`docker/cluster.conf`): clients on the host follow `CLUSTER SLOTS` and `MOVED` to
//! published ports, while the nodes reach each other by their addresses on the network.
//! Names, network and ports are fixed, so one cluster runs per Docker daemon.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::AtomicBool;

use futures::future::try_join_all;

use super::compose::{set_error, Compose, COMPOSE_TIMEOUT};
use super::container::{run_docker, DOCKER_TIMEOUT};
use super::image;
use crate::cluster::{Failover, Peer, Topology};
use crate::{poll, HarnessError, RedisAt};

/// Masters `cluster1`..`cluster3`, then their replicas `cluster4`..`cluster6`.
const MASTERS: usize = 3;
/// Replicas per master.
const REPLICAS: usize = 1;
/// Host (and container) port of `cluster1`; `clusterN` is on `FIRST_PORT + N - 1`.
const FIRST_PORT: u16 = 7201;
/// The bridge network named in `docker-compose.cluster.yml`.
const NETWORK: &str = "redlock-cluster";
/// How long a started container may take to answer PING.
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// Whether a cluster of this process is up (fixed names and ports: one at a time).
static UP: AtomicBool = AtomicBool::new(false);

/// The cluster of `docker-compose.cluster.yml`, formed and ready: three shards of a master
/// and a replica. Node `n` (0-based) is container `redlock-cluster{n+1}`; the masters as
/// started are nodes 0..3, their replicas 3..6. Dropping it runs `docker-compose down -v`.
#[derive(Debug)]
pub struct DockerCluster {
    compose: Compose,
    topology: Topology,
    _slot: super::Claim,
}

impl DockerCluster {
    /// Builds the image (`docker/build-image.sh`, a no-op when up to date), takes down any
    /// leftover of an earlier run, runs `docker-compose -p redlock-cluster -f
    /// <repo>/docker-compose.cluster.yml up -d --force-recreate`, waits until every node
    /// answers PING, then forms the cluster and waits until every node reports
    /// `cluster_state:ok` and every replica is linked.
    ///
    /// Fails with [`HarnessError::DockerUnavailable`] when Docker is missing or another
    /// cluster of this process is still up, and with [`HarnessError::Docker`] or
    /// [`HarnessError::InvalidOptions`] when a step fails (the containers are taken down
    /// again).
    pub async fn up() -> Result<DockerCluster, HarnessError> {
        let (slot, file) = super::claim(&UP, "DockerCluster", "docker-compose.cluster.yml").await?;
        let root = image::repo_root();
        image::build(&root).await?;
        let compose = Compose::cluster(file);
        let _ = compose.run(&["down", "-v", "--timeout", "2"]).await;
        let args = ["up", "-d", "--force-recreate"];
        // From here on a failure takes the containers down again (dropping `down` armed).
        let mut down = TakeDown {
            compose: &compose,
            armed: true,
        };
        let ran = compose
            .run(&args)
            .await
            .map_err(|e| compose.error(&args, e))?;
        if !ran.ok() {
            return Err(set_error(
                "start the cluster's containers",
                compose.shown(&args),
                ran.outcome(COMPOSE_TIMEOUT),
                "if another copy holds the names redlock-cluster1..6 or the ports 7201..7206 \
                 (`docker ps -a --filter name=redlock-cluster`), take it down with \
                 `docker-compose -p redlock-cluster -f docker-compose.cluster.yml down -v`",
                ran.output(),
            ));
        }
        let nodes = MASTERS * (1 + REPLICAS);
        try_join_all((0..nodes).map(|n| ready(n, "start"))).await?;
        let mut peers = Vec::with_capacity(nodes);
        for n in 0..nodes {
            peers.push(Peer {
                at: handle(n),
                meet_ip: address_on_network(n).await?,
            });
        }
        let topology = Topology::new(peers, MASTERS, REPLICAS);
        topology.form().await?;
        down.armed = false;
        drop(down);
        Ok(DockerCluster {
            compose,
            topology,
            _slot: slot,
        })
    }

    /// The member's URL: `redis-cluster://127.0.0.1:7201?node=127.0.0.1:7202&node=...`.
    pub fn url(&self) -> String {
        self.topology.url()
    }

    /// The number of nodes (6).
    pub fn len(&self) -> usize {
        MASTERS * (1 + REPLICAS)
    }

    /// Never: the cluster always has its six nodes.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The container of node `n`: `redlock-cluster{n+1}`.
    pub fn container(&self, n: usize) -> String {
        container(n)
    }

    /// A handle to node `n` (`127.0.0.1:{7201 + n}`).
    pub fn redis(&self, n: usize) -> RedisAt {
        handle(n)
    }

    /// The number of shards (3).
    pub fn shard_count(&self) -> usize {
        self.topology.shard_count()
    }

    /// The node that is shard `i`'s master now. Panics if `i` is out of range.
    pub fn master(&self, i: usize) -> usize {
        self.topology.master(i)
    }

    /// The node that is shard `i`'s replica now.
    pub fn replica(&self, i: usize) -> Option<usize> {
        self.topology.replica(i)
    }

    /// The shard that serves `key`'s slot.
    pub fn shard_of(&self, key: &str) -> usize {
        self.topology.shard_of(key)
    }

    /// The node that serves `key`'s slot now.
    pub fn master_of(&self, key: &str) -> usize {
        self.master(self.shard_of(key))
    }

    /// As [`ClusterSet::fail_over`](crate::ClusterSet::fail_over).
    pub async fn fail_over(&self, i: usize, how: Failover) -> Result<(), HarnessError> {
        self.topology.fail_over(i, how).await
    }

    /// As [`ClusterSet::hold_back_replication`](crate::ClusterSet::hold_back_replication).
    pub async fn hold_back_replication(&self, i: usize) -> Result<(), HarnessError> {
        self.topology.hold_back_replication(i).await
    }

    /// As [`ClusterSet::resume_replication`](crate::ClusterSet::resume_replication).
    pub async fn resume_replication(&self, i: usize) -> Result<(), HarnessError> {
        self.topology.resume_replication(i).await
    }

    /// Whether `key` exists on the master that serves it.
    pub async fn exists(&self, key: &str) -> Result<bool, HarnessError> {
        self.topology.exists(key).await
    }

    /// The number of keys over all masters.
    pub async fn dbsize(&self) -> Result<u64, HarnessError> {
        self.topology.dbsize().await
    }

    /// `docker pause` node `n`: it answers nothing, to clients and to the other nodes,
    /// until [`resume`](Self::resume).
    pub async fn pause(&self, n: usize) -> Result<(), HarnessError> {
        docker(n, "pause", &["pause"], &["is already paused"]).await
    }

    /// `docker unpause` node `n`.
    pub async fn resume(&self, n: usize) -> Result<(), HarnessError> {
        docker(n, "resume", &["unpause"], &["is not paused"]).await
    }

    /// `docker kill` node `n`. Its data and the cluster's configuration stay in the
    /// container (its append-only file is fsynced on every write): [`start`](Self::start)
    /// brings it back with them.
    pub async fn kill(&self, n: usize) -> Result<(), HarnessError> {
        docker(n, "kill", &["kill"], &["is not running"]).await
    }

    /// `docker start` node `n`, then waits until it answers PING.
    pub async fn start(&self, n: usize) -> Result<(), HarnessError> {
        docker(n, "start", &["start"], &[]).await?;
        ready(n, "start").await
    }

    /// `docker network disconnect redlock-cluster` node `n`: it is cut off from the other
    /// nodes and from every client (its published port goes too).
    pub async fn disconnect(&self, n: usize) -> Result<(), HarnessError> {
        let args = ["network", "disconnect", NETWORK];
        docker(n, "disconnect", &args, &["is not connected"]).await
    }

    /// `docker network connect redlock-cluster` node `n`, undoing
    /// [`disconnect`](Self::disconnect), then waits until it answers PING. The other nodes
    /// learn its address again from its gossip.
    pub async fn connect(&self, n: usize) -> Result<(), HarnessError> {
        let args = ["network", "connect", NETWORK];
        docker(n, "connect", &args, &["already exists in network"]).await?;
        ready(n, "connect").await
    }
}

impl Drop for DockerCluster {
    fn drop(&mut self) {
        self.compose.take_down();
    }
}

/// Takes the containers down when dropped armed: [`DockerCluster::up`]'s guard until the
/// cluster is formed.
struct TakeDown<'a> {
    compose: &'a Compose,
    armed: bool,
}

impl Drop for TakeDown<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.compose.take_down();
        }
    }
}

/// `redlock-cluster{n+1}`.
fn container(n: usize) -> String {
    format!("redlock-cluster{}", n + 1)
}

/// A handle to node `n` on its published port.
fn handle(n: usize) -> RedisAt {
    let port = FIRST_PORT + n as u16;
    RedisAt::new(
        format!("cluster{}", n + 1),
        SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
    )
}

/// `docker <args> <container of n>`; an error whose output contains one of `no_op` is a
/// success (the node already is in the requested state).
async fn docker(n: usize, action: &str, args: &[&str], no_op: &[&str]) -> Result<(), HarnessError> {
    docker_output(n, action, args, no_op).await.map(drop)
}

/// [`docker`], returning its standard output.
async fn docker_output(
    n: usize,
    action: &str,
    args: &[&str],
    no_op: &[&str],
) -> Result<String, HarnessError> {
    let name = container(n);
    let mut all = args.to_vec();
    all.push(&name);
    let error = |failure: String, output: String| HarnessError::Docker {
        name: name.clone(),
        action: action.to_owned(),
        failure: format!("`docker {}` {failure}", all.join(" ")),
        advice: format!(
            "check the container with `docker ps -a --filter name={name}` and `docker logs {name}`"
        ),
        output,
    };
    match run_docker(&all).await {
        Ok(ran) if ran.ok() => Ok(ran.stdout),
        Ok(ran) if no_op.iter().any(|s| ran.stderr.contains(s)) => Ok(ran.stdout),
        Ok(ran) => Err(error(ran.outcome(DOCKER_TIMEOUT), ran.output())),
        Err(e) => Err(error(format!("could not be run ({e})"), String::new())),
    }
}

/// Node `n`'s address on the cluster's network, where the other nodes meet it.
async fn address_on_network(n: usize) -> Result<String, HarnessError> {
    let format = format!("{{{{(index .NetworkSettings.Networks \"{NETWORK}\").IPAddress}}}}");
    let address = docker_output(n, "inspect", &["inspect", "--format", &format], &[]).await?;
    Ok(address.trim().to_string())
}

/// Waits until node `n` answers PING, for at most [`READY_WAIT`].
async fn ready(n: usize, action: &str) -> Result<(), HarnessError> {
    let at = handle(n);
    if poll::eventually(READY_WAIT, || async { at.ping().await.is_ok() }).await {
        return Ok(());
    }
    Err(HarnessError::Docker {
        name: container(n),
        action: format!("{action} it: it never answered PING"),
        failure: format!("no PONG from {} within {READY_WAIT:?}", at.addr()),
        advice: format!("check `docker logs {}`", container(n)),
        output: String::new(),
    })
}

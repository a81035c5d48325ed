//! [`Nodes`]: one interface for every node set, so that a test or a fault scenario is written
//! once and runs on local redis-server processes ([`NodeSet`](crate::NodeSet)) and on the
//! docker-compose containers ([`DockerSet`](crate::DockerSet)).
//!
//! Nodes are addressed by index and every fault is async, because a container fault is a
//! `docker` command line. The futures are boxed so that the trait is object safe: a test can
//! hold a `&dyn Nodes` chosen at run time (the fault lab picks its backend from the command
//! line), and the boxes cost nothing next to a process signal or a `docker` call.

use std::net::SocketAddr;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::{ClockControl, HarnessError, Links, RedisAt};

/// A set of independent Redis masters with inspection and faults by node index.
///
/// | method | [`NodeSet`](crate::NodeSet) (local processes) | [`DockerSet`](crate::DockerSet) (containers) |
/// |---|---|---|
/// | [`kill`](Nodes::kill) | SIGKILL | `docker kill` |
/// | [`pause`](Nodes::pause) / [`resume`](Nodes::resume) | SIGSTOP / SIGCONT | `docker pause` / `unpause` |
/// | [`restart`](Nodes::restart), [`restart_after`](Nodes::restart_after) | same port, same data directory | `docker kill`, `docker start` |
/// | [`partition`](Nodes::partition) / [`heal`](Nodes::heal) | every [`Links`] proxy to the node blackholed / passing | `docker network disconnect` / `connect` |
/// | [`clock`](Nodes::clock) | [`NodeOptions::fake_clock`](crate::NodeOptions::fake_clock) | [`DockerOptions::fake_clock`](crate::DockerOptions::fake_clock) |
/// | [`is_up`](Nodes::is_up) | the process runs (paused counts) | the node answers PING |
///
/// Without persistence (the default of both sets) a restarted node comes back empty; with
/// `appendonly_always` it replays its AOF and keeps every acknowledged write.
///
/// Faults on an index out of range fail with [`HarnessError::NoSuchNode`]; the accessors
/// ([`name`](Nodes::name), [`addr`](Nodes::addr), [`redis`](Nodes::redis)) and the key-loss
/// helpers panic instead, like slice indexing.
///
/// ```no_run
/// use redlock_testkit::{HarnessError, Links, NodeSet, Nodes};
///
/// /// Written once: runs on a `NodeSet` and on a `DockerSet`.
/// async fn minority_down(nodes: &dyn Nodes, links: &Links) -> Result<(), HarnessError> {
///     nodes.redis(0).set("k", "v", Some(10_000)).await?;
///     nodes.pause(1).await?;
///     nodes.partition(2, links).await?;
///     // ... clients connected through `links` contend here ...
///     nodes.heal(2, links).await?;
///     nodes.resume(1).await?;
///     nodes.restart(0).await?; // back empty: no persistence by default
///     assert_eq!(nodes.redis(0).dbsize().await?, 0);
///     Ok(())
/// }
///
/// async fn on_local_nodes() -> Result<(), HarnessError> {
///     let nodes = NodeSet::start(3).await?;
///     let links = Links::start(1, &nodes.addrs()).await?; // one client
///     minority_down(&nodes, &links).await
/// }
/// # fn main() {}
/// ```
pub trait Nodes: Send + Sync {
    /// Number of nodes.
    fn len(&self) -> usize;

    /// Whether the set has no nodes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Node `i`'s name in messages (`node-0`, `redis1`, ...). Panics if `i >= len()`.
    fn name(&self, i: usize) -> &str;

    /// Node `i`'s address as seen from this host. Panics if `i >= len()`.
    fn addr(&self, i: usize) -> SocketAddr;

    /// Every node's address, in index order (e.g. the upstreams of [`Links::start`]).
    fn addrs(&self) -> Vec<SocketAddr> {
        (0..self.len()).map(|i| self.addr(i)).collect()
    }

    /// `redis://HOST:PORT` of every node, in index order.
    fn urls(&self) -> Vec<String> {
        self.addrs()
            .into_iter()
            .map(|addr| format!("redis://{addr}"))
            .collect()
    }

    /// A [`RedisAt`] handle on node `i`, for inspection (keys, TTLs, `TIME`, command counts)
    /// and key loss. It does not check whether the node is up. Panics if `i >= len()`.
    fn redis(&self, i: usize) -> RedisAt;

    /// Node `i`'s fake clock ([`ClockControl::jump`], [`ClockControl::set_rate`]): `Some` when
    /// the set was started with a fake clock and `i < len()`. It stays in effect across
    /// restarts.
    fn clock(&self, i: usize) -> Option<&ClockControl>;

    /// Kills node `i` (SIGKILL); it stays down until a restart. Killing a dead node is a no-op.
    fn kill(&self, i: usize) -> BoxFuture<'_, Result<(), HarnessError>>;

    /// Freezes node `i`: it keeps its connections and data but answers nothing, so requests
    /// time out, until [`Nodes::resume`].
    fn pause(&self, i: usize) -> BoxFuture<'_, Result<(), HarnessError>>;

    /// Undoes [`Nodes::pause`]. Resuming a node that is not paused is a no-op.
    fn resume(&self, i: usize) -> BoxFuture<'_, Result<(), HarnessError>>;

    /// Kills node `i` and starts it again at once on the same address, waiting until it
    /// answers PING ("restart without persistence" unless the set keeps an AOF).
    fn restart(&self, i: usize) -> BoxFuture<'_, Result<(), HarnessError>>;

    /// Delayed restart: kills node `i` now, keeps it down for `delay`, then starts it. The
    /// node is down for the whole delay; poll the future to the end (e.g. inside
    /// `tokio::join!`) to act during the downtime.
    fn restart_after(&self, i: usize, delay: Duration) -> BoxFuture<'_, Result<(), HarnessError>>;

    /// Cuts node `i` off from every client while it keeps running and keeps its data.
    ///
    /// Local nodes share the host's loopback, so a [`NodeSet`](crate::NodeSet) cuts them in
    /// the fault proxies: every link of `links` to node `i` is blackholed (requests through
    /// them time out; clients must connect through `links`). A [`DockerSet`](crate::DockerSet)
    /// disconnects the container from its network (connections are refused), whatever
    /// `links` says.
    fn partition<'a>(
        &'a self,
        i: usize,
        links: &'a Links,
    ) -> BoxFuture<'a, Result<(), HarnessError>>;

    /// Undoes [`Nodes::partition`]: the links to node `i` pass again (every link fault on
    /// them is lifted), or the container is connected again and answers PING. Healing a node
    /// that is not partitioned is a no-op.
    fn heal<'a>(&'a self, i: usize, links: &'a Links) -> BoxFuture<'a, Result<(), HarnessError>>;

    /// Whether node `i` is up (not killed); a paused local node counts as up, a paused
    /// container does not (it is probed with PING). `false` for an index out of range.
    fn is_up(&self, i: usize) -> BoxFuture<'_, bool>;

    /// Key loss by memory pressure: evicts every key of node `i` for real and returns how
    /// many; see [`RedisAt::evict_all`]. Panics if `i >= len()`.
    fn evict_all(&self, i: usize) -> BoxFuture<'_, Result<u64, HarnessError>> {
        let redis = self.redis(i);
        Box::pin(async move { redis.evict_all().await })
    }

    /// Key loss of one key before its TTL (`DEL`); returns whether it existed. See
    /// [`RedisAt::lose_key`]. Panics if `i >= len()`.
    fn lose_key(&self, i: usize, key: &str) -> BoxFuture<'_, Result<bool, HarnessError>> {
        let redis = self.redis(i);
        let key = key.to_owned();
        Box::pin(async move { redis.lose_key(&key).await })
    }
}

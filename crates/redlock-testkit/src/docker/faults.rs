//! The docker set's faults: the [`Nodes`] interface (`docker kill`, `start`, `pause`,
//! `unpause`, network `disconnect` / `connect`) and the Docker-only steps it is made of.

use std::net::SocketAddr;
use std::time::Duration;

use futures::future::BoxFuture;

use super::DockerSet;
use crate::{ClockControl, HarnessError, Links, Nodes, RedisAt};

/// The bridge network named in `docker-compose.yml`.
const NETWORK: &str = "redlock";

impl DockerSet {
    /// `docker start` node `i`, then wait (up to 20 s) until it answers PING. Without
    /// `appendonly_always` a killed node comes back empty. Starting a running node only waits
    /// for PING.
    pub async fn start(&self, i: usize) -> Result<(), HarnessError> {
        self.docker(i, "start", &["start"], &[]).await?;
        self.wait_ready(i, "start").await
    }

    /// `docker network disconnect redlock <container>`: node `i` loses its network, which
    /// also unpublishes its host port, so connections are refused. Disconnecting a
    /// disconnected node is a no-op. This is [`Nodes::partition`] on this set.
    pub async fn disconnect(&self, i: usize) -> Result<(), HarnessError> {
        self.docker(
            i,
            "disconnect",
            &["network", "disconnect", NETWORK],
            &["is not connected"],
        )
        .await
    }

    /// `docker network connect redlock <container>`: undo [`DockerSet::disconnect`]. Docker
    /// publishes the port again; when the node runs and is not paused, this waits (up to
    /// 20 s) until it answers PING. Connecting a connected node is a no-op. This is
    /// [`Nodes::heal`] on this set.
    pub async fn connect(&self, i: usize) -> Result<(), HarnessError> {
        self.docker(
            i,
            "connect",
            &["network", "connect", NETWORK],
            &["already exists in network"],
        )
        .await?;
        let state = self
            .docker_output(
                i,
                "inspect",
                &[
                    "inspect",
                    "--format",
                    "{{.State.Running}} {{.State.Paused}}",
                ],
            )
            .await?;
        if state.trim() == "true false" {
            self.wait_ready(i, "connect").await?;
        }
        Ok(())
    }
}

/// Nodes `redis1`..`redis5` at `127.0.0.1:7101`..`7105`.
impl Nodes for DockerSet {
    /// 5.
    fn len(&self) -> usize {
        self.nodes.len()
    }

    /// `redis1`..`redis5`, the service names.
    fn name(&self, i: usize) -> &str {
        &self.at(i).service
    }

    /// `127.0.0.1:7101 + i`.
    fn addr(&self, i: usize) -> SocketAddr {
        self.at(i).addr
    }

    fn redis(&self, i: usize) -> RedisAt {
        let node = self.at(i);
        RedisAt::new(node.service.clone(), node.addr)
    }

    /// Set with [`DockerOptions::fake_clock`](super::DockerOptions::fake_clock).
    fn clock(&self, i: usize) -> Option<&ClockControl> {
        self.clocks.get(i)
    }

    /// `docker kill`; the node stays down until [`DockerSet::start`] or a restart.
    fn kill(&self, i: usize) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(self.docker(i, "kill", &["kill"], &["is not running"]))
    }

    /// `docker pause` (cgroup freezer): Docker's port forwarding still accepts connections,
    /// but nothing answers. Pausing a paused node is a no-op.
    fn pause(&self, i: usize) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(self.docker(i, "pause", &["pause"], &["is already paused"]))
    }

    /// `docker unpause`.
    fn resume(&self, i: usize) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(self.docker(i, "resume", &["unpause"], &["is not paused"]))
    }

    /// `docker kill`, then [`DockerSet::start`].
    fn restart(&self, i: usize) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(async move {
            self.kill(i).await?;
            self.start(i).await
        })
    }

    /// `docker kill`, sleep, then [`DockerSet::start`].
    fn restart_after(&self, i: usize, delay: Duration) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(async move {
            self.kill(i).await?;
            tokio::time::sleep(delay).await;
            self.start(i).await
        })
    }

    /// [`DockerSet::disconnect`]; `links` is not touched.
    fn partition<'a>(
        &'a self,
        i: usize,
        _links: &'a Links,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(self.disconnect(i))
    }

    /// [`DockerSet::connect`]; `links` is not touched.
    fn heal<'a>(&'a self, i: usize, _links: &'a Links) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(self.connect(i))
    }

    /// PING answered.
    fn is_up(&self, i: usize) -> BoxFuture<'_, bool> {
        Box::pin(async move { i < self.len() && self.redis(i).ping().await.is_ok() })
    }
}

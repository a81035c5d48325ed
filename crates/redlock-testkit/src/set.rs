//! A set of independent redis-server masters, as Redlock uses them, and its [`Nodes`]
//! interface: the synchronous per-node faults of [`Node`] by index, async.

use std::net::SocketAddr;
use std::ops::Index;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{join_all, try_join_all, BoxFuture};

use crate::{
    access, process, ClockControl, HarnessError, LinkFault, Links, Node, NodeOptions, Nodes,
    RedisAt, TestPki,
};

/// `n` independent redis-server processes, `node-0` .. `node-(n-1)`.
///
/// Each [`Node`] has its own synchronous faults (`set.node(1).pause()`); the same faults by
/// index, async, come with the [`Nodes`] interface (`set.pause(1).await`), which a
/// [`DockerSet`](crate::DockerSet) implements too.
///
/// With [`NodeOptions::tls`] the set owns one [`TestPki`] ([`NodeSet::pki`]): one CA for all
/// its nodes. URLs for each way in: [`NodeSet::urls`], [`NodeSet::tls_urls`],
/// [`NodeSet::unix_urls`], and `*_as` for an ACL user.
///
/// Dropping the set kills and reaps every process and removes their data directories (and
/// the certificates).
#[derive(Debug)]
pub struct NodeSet {
    nodes: Vec<Node>,
    pki: Option<Arc<TestPki>>,
}

impl NodeSet {
    /// Starts `n` nodes with [`NodeOptions::default`] (no persistence), concurrently.
    pub async fn start(n: usize) -> Result<NodeSet, HarnessError> {
        Self::start_with(n, NodeOptions::default()).await
    }

    /// Starts `n` nodes with `opts`, concurrently, and waits until all answer PONG.
    ///
    /// Invalid options fail with [`HarnessError::InvalidOptions`] before anything starts;
    /// with [`NodeOptions::tls`] the certificates are generated first.
    /// If one node fails, the ones already started are killed and the first error is returned.
    /// The processes are spawned from the calling thread (see the crate docs on PDEATHSIG).
    pub async fn start_with(n: usize, opts: NodeOptions) -> Result<NodeSet, HarnessError> {
        access::validate(&opts)?;
        let pki = match &opts.tls {
            Some(tls) => Some(Arc::new(TestPki::generate(&tls.server_names)?)),
            None => None,
        };
        if n == 0 {
            return Ok(NodeSet {
                nodes: Vec::new(),
                pki,
            });
        }
        let binary = process::find_redis_server()?;
        let starts = (0..n).map(|i| Node::start(format!("node-{i}"), &binary, &opts, pki.clone()));
        let nodes = try_join_all(starts).await?;
        tracing::debug!(ports = ?nodes.iter().map(Node::port).collect::<Vec<_>>(), "nodes ready");
        Ok(NodeSet { nodes, pki })
    }

    /// The certificates of the set (one CA for all nodes), if it was started with
    /// [`NodeOptions::tls`].
    pub fn pki(&self) -> Option<&TestPki> {
        self.pki.as_deref()
    }

    /// All nodes, in index order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Node `i`. Panics if `i >= len()`.
    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// Iterates over the nodes in index order.
    pub fn iter(&self) -> std::slice::Iter<'_, Node> {
        self.nodes.iter()
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the set has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Indices of the running, non-paused nodes on which `key` exists, ascending.
    ///
    /// Dead and paused nodes are skipped without being contacted; a running node that fails
    /// to answer is skipped too (with a `tracing` warning).
    pub async fn nodes_holding(&self, key: &str) -> Vec<usize> {
        let checks = self.nodes.iter().enumerate().map(|(i, node)| async move {
            if !node.is_running() || node.is_paused() {
                return None;
            }
            match node.exists(key).await {
                Ok(true) => Some(i),
                Ok(false) => None,
                Err(error) => {
                    tracing::warn!(node = node.name(), %error, "skipping unresponsive node");
                    None
                }
            }
        });
        join_all(checks).await.into_iter().flatten().collect()
    }

    /// Node `i`, or [`HarnessError::NoSuchNode`] for `action`.
    fn checked(&self, i: usize, action: &str) -> Result<&Node, HarnessError> {
        self.nodes.get(i).ok_or_else(|| HarnessError::NoSuchNode {
            set: "node set".to_owned(),
            action: action.to_owned(),
            index: i,
            len: self.nodes.len(),
        })
    }

    /// Sets `fault` on every link of `links` to node `i` (see [`Nodes::partition`]).
    fn set_links(
        &self,
        i: usize,
        links: &Links,
        action: &str,
        fault: LinkFault,
    ) -> Result<(), HarnessError> {
        self.checked(i, action)?;
        if i >= links.nodes() {
            return Err(HarnessError::NoSuchNode {
                set: "links".to_owned(),
                action: action.to_owned(),
                index: i,
                len: links.nodes(),
            });
        }
        links.set_node(i, fault);
        Ok(())
    }
}

/// The faults of [`Node`], by index. The signals and the wait for readiness run when the
/// future is polled, on the polling thread (see the crate docs on PDEATHSIG for restarts).
impl Nodes for NodeSet {
    fn len(&self) -> usize {
        self.nodes.len()
    }

    /// `node-0`, `node-1`, ...
    fn name(&self, i: usize) -> &str {
        self.node(i).name()
    }

    /// [`NodeSet::urls`]: with the password, if the set has one.
    fn urls(&self) -> Vec<String> {
        NodeSet::urls(self)
    }

    /// `127.0.0.1:PORT`; the port stays the same across restarts.
    fn addr(&self, i: usize) -> SocketAddr {
        self.node(i).redis().addr()
    }

    /// [`Node::redis`].
    fn redis(&self, i: usize) -> RedisAt {
        self.node(i).redis()
    }

    /// [`Node::clock`].
    fn clock(&self, i: usize) -> Option<&ClockControl> {
        self.nodes.get(i)?.clock()
    }

    /// [`Node::kill`].
    fn kill(&self, i: usize) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(async move { self.checked(i, "kill")?.kill() })
    }

    /// [`Node::pause`] (SIGSTOP).
    fn pause(&self, i: usize) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(async move { self.checked(i, "pause")?.pause() })
    }

    /// [`Node::resume`] (SIGCONT).
    fn resume(&self, i: usize) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(async move { self.checked(i, "resume")?.resume() })
    }

    /// [`Node::restart`].
    fn restart(&self, i: usize) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(async move { self.checked(i, "restart")?.restart().await })
    }

    /// [`Node::restart_after`].
    fn restart_after(&self, i: usize, delay: Duration) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(async move { self.checked(i, "restart")?.restart_after(delay).await })
    }

    /// [`LinkFault::Blackhole`] on every link of `links` to node `i`.
    fn partition<'a>(
        &'a self,
        i: usize,
        links: &'a Links,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move { self.set_links(i, links, "partition", LinkFault::Blackhole) })
    }

    /// [`LinkFault::Pass`] on every link of `links` to node `i`.
    fn heal<'a>(&'a self, i: usize, links: &'a Links) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move { self.set_links(i, links, "heal", LinkFault::Pass) })
    }

    /// [`Node::is_running`]: a paused process counts as up.
    fn is_up(&self, i: usize) -> BoxFuture<'_, bool> {
        Box::pin(async move { self.nodes.get(i).is_some_and(Node::is_running) })
    }
}

impl Index<usize> for NodeSet {
    type Output = Node;

    fn index(&self, i: usize) -> &Node {
        &self.nodes[i]
    }
}

impl<'a> IntoIterator for &'a NodeSet {
    type Item = &'a Node;
    type IntoIter = std::slice::Iter<'a, Node>;

    fn into_iter(self) -> Self::IntoIter {
        self.nodes.iter()
    }
}

//! A set of independent redis-server masters, as Redlock uses them.

use std::ops::Index;

use futures::future::{join_all, try_join_all};

use crate::{process, HarnessError, Node, NodeOptions};

/// `n` independent redis-server processes, `node-0` .. `node-(n-1)`.
///
/// Dropping the set kills and reaps every process and removes their data directories.
#[derive(Debug)]
pub struct NodeSet {
    nodes: Vec<Node>,
}

impl NodeSet {
    /// Starts `n` nodes with [`NodeOptions::default`] (no persistence), concurrently.
    pub async fn start(n: usize) -> Result<NodeSet, HarnessError> {
        Self::start_with(n, NodeOptions::default()).await
    }

    /// Starts `n` nodes with `opts`, concurrently, and waits until all answer PONG.
    ///
    /// If one node fails, the ones already started are killed and the first error is returned.
    /// The processes are spawned from the calling thread (see the crate docs on PDEATHSIG).
    pub async fn start_with(n: usize, opts: NodeOptions) -> Result<NodeSet, HarnessError> {
        if n == 0 {
            return Ok(NodeSet { nodes: Vec::new() });
        }
        let binary = process::find_redis_server()?;
        let starts = (0..n).map(|i| Node::start(format!("node-{i}"), &binary, &opts));
        let nodes = try_join_all(starts).await?;
        tracing::debug!(ports = ?nodes.iter().map(Node::port).collect::<Vec<_>>(), "nodes ready");
        Ok(NodeSet { nodes })
    }

    /// `redis://127.0.0.1:PORT` of every node, in index order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
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

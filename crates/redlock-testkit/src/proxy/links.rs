//! A matrix of fault proxies, one per (client, node) link, so that different clients can see
//! different partitions of the same nodes.

use std::net::SocketAddr;

use super::{FaultProxy, LinkFault};
use crate::HarnessError;

/// One [`FaultProxy`] per (client, node): `clients × nodes` links named
/// `client-C->node-N`. Client `c` connects to the nodes through [`Links::urls`]`(c)`.
///
/// Indices out of range panic, like slice indexing, in every method taking a client or node
/// index. Dropping `Links` drops every proxy.
#[derive(Debug)]
pub struct Links {
    clients: usize,
    nodes: usize,
    /// Row-major: the link of (client `c`, node `n`) is at `c * nodes + n`.
    proxies: Vec<FaultProxy>,
}

impl Links {
    /// `upstreams[j]` is node j's address. Starts `clients × upstreams.len()` proxies, all
    /// passing traffic. On error the proxies already started are dropped.
    pub async fn start(clients: usize, upstreams: &[SocketAddr]) -> Result<Links, HarnessError> {
        let mut proxies = Vec::with_capacity(clients * upstreams.len());
        for client in 0..clients {
            for (node, upstream) in upstreams.iter().enumerate() {
                let name = format!("client-{client}->node-{node}");
                proxies.push(FaultProxy::start(name, *upstream).await?);
            }
        }
        Ok(Links {
            clients,
            nodes: upstreams.len(),
            proxies,
        })
    }

    /// Number of clients.
    pub fn clients(&self) -> usize {
        self.clients
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The URLs client `client` should use, in node order.
    ///
    /// # Panics
    /// If `client >= clients()`.
    pub fn urls(&self, client: usize) -> Vec<String> {
        self.row(client).iter().map(FaultProxy::url).collect()
    }

    /// The link between `client` and `node`.
    ///
    /// # Panics
    /// If `client >= clients()` or `node >= nodes()`, like slice indexing.
    pub fn link(&self, client: usize, node: usize) -> &FaultProxy {
        assert!(
            node < self.nodes,
            "Links::link: node index {node} out of range (there are {} nodes)",
            self.nodes
        );
        &self.row(client)[node]
    }

    /// Sets `fault` on the links of every client to `node`.
    ///
    /// # Panics
    /// If `node >= nodes()`.
    pub fn set_node(&self, node: usize, fault: LinkFault) {
        assert!(
            node < self.nodes,
            "Links::set_node: node index {node} out of range (there are {} nodes)",
            self.nodes
        );
        for client in 0..self.clients {
            self.link(client, node).set(fault);
        }
    }

    /// Sets `fault` on the links of `client` to every node.
    ///
    /// # Panics
    /// If `client >= clients()`.
    pub fn set_client(&self, client: usize, fault: LinkFault) {
        for proxy in self.row(client) {
            proxy.set(fault);
        }
    }

    /// Sets [`LinkFault::Pass`] on every link.
    pub fn heal_all(&self) {
        for proxy in &self.proxies {
            proxy.heal();
        }
    }

    fn row(&self, client: usize) -> &[FaultProxy] {
        assert!(
            client < self.clients,
            "Links: client index {client} out of range (there are {} clients)",
            self.clients
        );
        &self.proxies[client * self.nodes..(client + 1) * self.nodes]
    }
}

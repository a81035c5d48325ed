//! [`MemberSet`]: the quorum members of one lock when some are whole clusters: clusters of
//! local processes first, then single servers, each member a node of [`Nodes`] so that a
//! fault scenario written for single servers runs on it.

use std::net::SocketAddr;
use std::time::Duration;

use futures::future::BoxFuture;

use super::ClusterSet;
use crate::{ClockControl, HarnessError, LinkFault, Links, NodeSet, Nodes, RedisAt};

/// The shape of one cluster member of a [`MemberSet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterShape {
    /// Its masters (shards), at least 1.
    pub masters: usize,
    /// Replicas per master.
    pub replicas: usize,
    /// The `replica_acks` its URL sets (`?replica_acks=N`): how many replicas must
    /// acknowledge an acquisition or extension before the member's vote counts. 0 sets
    /// nothing, and the lock's configuration decides.
    pub replica_acks: u32,
}

/// The members of one lock: `clusters.len()` whole clusters (members `0..k`), then single
/// servers. A client reaches a cluster member by its [`url`](Self::url), straight to its
/// processes: the fault proxies of [`Links`] cannot stand between, since the cluster's
/// `MOVED` replies and `CLUSTER SLOTS` name its processes' own addresses.
///
/// As a [`Nodes`] set, a cluster member is faulted whole: `pause`/`resume` stop and resume
/// every process of it, `partition`/`heal` do the same (its clients do not go through
/// `links`), `kill` kills every process; `restart` and `restart_after` are refused (a
/// cluster restarted whole forms again from its configuration files, which is not a fault
/// a lock meets: fail a shard over instead, [`ClusterSet::fail_over`]). Its `addr` and
/// `redis` are those of its shard 0's master now, which serves the first range of slots;
/// reach the others through [`cluster`](Self::cluster). Single servers behave as in a
/// [`NodeSet`], their links being `links`' at their index in this set.
#[derive(Debug)]
pub struct MemberSet {
    clusters: Vec<(ClusterSet, u32)>,
    singles: NodeSet,
    names: Vec<String>,
}

impl MemberSet {
    /// Starts a cluster per shape of `clusters` and `singles` single servers, all at once.
    pub async fn start(
        clusters: &[ClusterShape],
        singles: usize,
    ) -> Result<MemberSet, HarnessError> {
        let started = futures::future::join_all(
            clusters
                .iter()
                .map(|shape| ClusterSet::start_with_replicas(shape.masters, shape.replicas)),
        );
        let (started, singles) = tokio::join!(started, NodeSet::start(singles));
        let singles = singles?;
        let mut members = Vec::with_capacity(clusters.len());
        for (cluster, shape) in started.into_iter().zip(clusters) {
            members.push((cluster?, shape.replica_acks));
        }
        let names = (0..members.len())
            .map(|i| format!("cluster-{i}"))
            .chain(singles.iter().map(|node| node.name().to_owned()))
            .collect();
        Ok(MemberSet {
            clusters: members,
            singles,
            names,
        })
    }

    /// Member `i` when it is a cluster.
    pub fn cluster(&self, i: usize) -> Option<&ClusterSet> {
        self.clusters.get(i).map(|(cluster, _)| cluster)
    }

    /// The single servers, members `k..` of this set for `k` clusters.
    pub fn singles(&self) -> &NodeSet {
        &self.singles
    }

    /// Member `i`'s URL as a lock's node list takes it: a cluster's with its
    /// `replica_acks`, when it sets one, or a single server's. Panics if `i >= len()`.
    pub fn url(&self, i: usize) -> String {
        match self.clusters.get(i) {
            Some((cluster, 0)) => cluster.url(),
            Some((cluster, acks)) => with_replica_acks(&cluster.url(), *acks),
            None => self.singles.node(i - self.clusters.len()).url(),
        }
    }

    /// Member `i` as a single server: its index in [`singles`](Self::singles), or an error
    /// naming `action` for a cluster or an index out of range.
    fn single(&self, i: usize, action: &str) -> Result<usize, HarnessError> {
        let k = self.clusters.len();
        if i < k {
            return Err(HarnessError::InvalidOptions {
                reason: format!(
                    "cannot {action} cluster member {i} as one process: fail one of its \
                     shards over, or pause the whole member"
                ),
            });
        }
        if i >= self.len() {
            return Err(HarnessError::NoSuchNode {
                set: "member set".to_owned(),
                action: action.to_owned(),
                index: i,
                len: self.len(),
            });
        }
        Ok(i - k)
    }

    /// Sets `fault` on every link of `links` to single server `i` (a member index).
    fn set_links(&self, i: usize, links: &Links, fault: LinkFault) {
        for c in 0..links.clients() {
            links.link(c, i).set(fault);
        }
    }
}

/// `url` with `replica_acks=N` added to its query.
fn with_replica_acks(url: &str, acks: u32) -> String {
    let joint = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joint}replica_acks={acks}")
}

impl Nodes for MemberSet {
    fn len(&self) -> usize {
        self.clusters.len() + self.singles.len()
    }

    /// `cluster-0`, ..., then the single servers' `node-0`, ...
    fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// A cluster member's shard 0 master now; a single server's address.
    fn addr(&self, i: usize) -> SocketAddr {
        match self.cluster(i) {
            Some(cluster) => cluster.master(0).redis().addr(),
            None => self.singles.addr(i - self.clusters.len()),
        }
    }

    /// Every member's [`url`](MemberSet::url).
    fn urls(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.url(i)).collect()
    }

    /// A cluster member's shard 0 master now; a single server.
    fn redis(&self, i: usize) -> RedisAt {
        match self.cluster(i) {
            Some(cluster) => cluster.master(0).redis(),
            None => self.singles.redis(i - self.clusters.len()),
        }
    }

    /// A single server's, when started with one; never a cluster member's.
    fn clock(&self, i: usize) -> Option<&ClockControl> {
        let k = self.clusters.len();
        i.checked_sub(k).and_then(|s| self.singles.clock(s))
    }

    /// Every process of a cluster member.
    fn kill(&self, i: usize) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(async move {
            match self.cluster(i) {
                Some(cluster) => cluster.nodes().iter().try_for_each(|node| node.kill()),
                None => self.singles.kill(self.single(i, "kill")?).await,
            }
        })
    }

    /// [`ClusterSet::pause_all`] for a cluster member.
    fn pause(&self, i: usize) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(async move {
            match self.cluster(i) {
                Some(cluster) => cluster.pause_all(),
                None => self.singles.pause(self.single(i, "pause")?).await,
            }
        })
    }

    /// [`ClusterSet::resume_all`] for a cluster member.
    fn resume(&self, i: usize) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(async move {
            match self.cluster(i) {
                Some(cluster) => cluster.resume_all(),
                None => self.singles.resume(self.single(i, "resume")?).await,
            }
        })
    }

    /// Refused for a cluster member.
    fn restart(&self, i: usize) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(async move { self.singles.restart(self.single(i, "restart")?).await })
    }

    /// Refused for a cluster member.
    fn restart_after(&self, i: usize, delay: Duration) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(async move {
            let s = self.single(i, "restart")?;
            self.singles.restart_after(s, delay).await
        })
    }

    /// A cluster member: every process paused. A single server: its links blackholed.
    fn partition<'a>(
        &'a self,
        i: usize,
        links: &'a Links,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            match self.cluster(i) {
                Some(cluster) => cluster.pause_all(),
                None => {
                    self.single(i, "partition")?;
                    self.set_links(i, links, LinkFault::Blackhole);
                    Ok(())
                }
            }
        })
    }

    /// Undoes [`partition`](Nodes::partition).
    fn heal<'a>(&'a self, i: usize, links: &'a Links) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            match self.cluster(i) {
                Some(cluster) => cluster.resume_all(),
                None => {
                    self.single(i, "heal")?;
                    self.set_links(i, links, LinkFault::Pass);
                    Ok(())
                }
            }
        })
    }

    /// A cluster member: every master's process runs (paused counts).
    fn is_up(&self, i: usize) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            match self.cluster(i) {
                Some(cluster) => cluster.masters().iter().all(|node| node.is_running()),
                None => {
                    let k = self.clusters.len();
                    i >= k && self.singles.is_up(i - k).await
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_acks_join_the_urls_query() {
        assert_eq!(
            with_replica_acks("redis-cluster://h:1?node=h:2", 1),
            "redis-cluster://h:1?node=h:2&replica_acks=1"
        );
        assert_eq!(
            with_replica_acks("redis-cluster://h:1", 2),
            "redis-cluster://h:1?replica_acks=2"
        );
    }
}

//! [`ClusterSet`]: a Redis Cluster of local `redis-server` processes, started on free loopback
//! ports, for a lock whose quorum member is a whole cluster.
//!
//! Its processes are started as a [`NodeSet`] with `--cluster-enabled yes`, so every fault of a
//! node (kill, pause, restart) works on one master or replica. The slots are split evenly, in
//! order: shard 0 serves the first range, and so on. The cluster is formed by hand (`CLUSTER
//! ADDSLOTSRANGE` on each master, `CLUSTER MEET` from the first node, `CLUSTER REPLICATE` on
//! each replica), so no `redis-cli` is needed, and the set waits until every node reports
//! `cluster_state:ok` and every replica is linked. A slot can be moved to another shard
//! ([`ClusterSet::move_slot`]) and a shard failed over to its replica
//! ([`ClusterSet::fail_over`]).

mod members;
mod topology;

pub use members::{ClusterShape, MemberSet};

pub(crate) use topology::{Peer, Topology};

use crate::{HarnessError, Node, NodeOptions, NodeSet};

/// The number of hash slots of a Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16384;

/// A Redis Cluster of local processes: `masters` shards, each a master and, when asked
/// for, replicas.
///
/// Shard `i` serves the `i`-th range of slots ([`slots`](Self::slots)); its master is
/// [`master(i)`](Self::master), which a failover ([`fail_over`](Self::fail_over)) changes.
/// Every process is a [`Node`] of [`nodes`](Self::nodes): the masters first, then the
/// replicas shard by shard. Dropping the set kills and reaps every process, as a
/// [`NodeSet`] does.
#[derive(Debug)]
pub struct ClusterSet {
    nodes: NodeSet,
    /// Which of `nodes` serves what.
    topology: Topology,
}

/// How a replica takes its master's place ([`ClusterSet::fail_over`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failover {
    /// `CLUSTER FAILOVER`: the master stops taking writes, the replica catches up with it,
    /// then takes over. Nothing is lost.
    Coordinated,
    /// `CLUSTER FAILOVER FORCE`: the replica takes over at once, with what it had
    /// received: writes the master had not sent it yet are lost (an election still runs).
    Force,
    /// `CLUSTER FAILOVER TAKEOVER`: as `Force`, without an election.
    Takeover,
}

impl ClusterSet {
    /// Starts a cluster of `masters` masters with no replicas (see
    /// [`start_with_replicas`](Self::start_with_replicas)).
    pub async fn start(masters: usize) -> Result<ClusterSet, HarnessError> {
        Self::start_with_replicas(masters, 0).await
    }

    /// Starts a cluster of `masters` masters, each serving an equal share of the slots, with
    /// `replicas` replicas each, and waits until every node reports `cluster_state:ok` and
    /// every replica is linked.
    ///
    /// `masters` must be at least 1. Fails with [`HarnessError::InvalidOptions`] otherwise.
    pub async fn start_with_replicas(
        masters: usize,
        replicas: usize,
    ) -> Result<ClusterSet, HarnessError> {
        Topology::check(masters)?;
        let opts = NodeOptions {
            extra_args: [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
                // What `CLUSTER SLOTS` names each node by: a node that met no other (a
                // cluster of one) would name itself by an empty address.
                "--cluster-announce-ip",
                "127.0.0.1",
                // A replica synchronises from a snapshot on disk, at once and streaming
                // from then on: a diskless one waits 5 s to start, and its master streams
                // the writes that follow only after the replica's first acknowledgement,
                // up to a second later, during which a `WAIT` finds no replica.
                "--repl-diskless-sync",
                "no",
                // A lock member's data lives on the master that serves its slot: a master
                // lost with no replica leaves its slots uncovered, and the others must not
                // answer for the whole cluster as if all was well.
                "--cluster-require-full-coverage",
                "yes",
            ]
            .map(String::from)
            .to_vec(),
            ..NodeOptions::default()
        };
        let nodes = NodeSet::start_with(masters * (1 + replicas), opts).await?;
        let peers = nodes
            .iter()
            .map(|node| Peer {
                at: node.redis(),
                meet_ip: "127.0.0.1".to_string(),
            })
            .collect();
        let topology = Topology::new(peers, masters, replicas);
        topology.form().await?;
        Ok(ClusterSet { nodes, topology })
    }

    /// The cluster's URL, as a lock's node list takes it:
    /// `redis-cluster://127.0.0.1:P0?node=127.0.0.1:P1&...`, every master a seed.
    pub fn url(&self) -> String {
        self.topology.url()
    }

    /// Every process: the masters as started first, then the replicas shard by shard.
    pub fn nodes(&self) -> &NodeSet {
        &self.nodes
    }

    /// The number of shards (masters).
    pub fn shard_count(&self) -> usize {
        self.topology.shard_count()
    }

    /// The master of shard `i` now. Panics if `i` is out of range.
    pub fn master(&self, i: usize) -> &Node {
        self.nodes.node(self.topology.master(i))
    }

    /// The masters now, shard by shard.
    pub fn masters(&self) -> Vec<&Node> {
        let masters = self.topology.masters();
        masters.into_iter().map(|n| self.nodes.node(n)).collect()
    }

    /// The first replica of shard `i` now, if it has one.
    pub fn replica(&self, i: usize) -> Option<&Node> {
        self.topology.replica(i).map(|n| self.nodes.node(n))
    }

    /// The first and last slot shard `i` was given.
    pub fn slots(&self, i: usize) -> (u16, u16) {
        topology::slot_range(i, self.shard_count())
    }

    /// The shard that serves `key`'s slot: as the cluster was formed, or as
    /// [`move_slot`](Self::move_slot) moved it.
    pub fn shard_of(&self, key: &str) -> usize {
        self.topology.shard_of(key)
    }

    /// The master that serves `key`'s slot now.
    pub fn master_of(&self, key: &str) -> &Node {
        self.master(self.shard_of(key))
    }

    /// Moves `key`'s slot, with its keys, to shard `to`, as a resharding does (`CLUSTER
    /// SETSLOT .. IMPORTING`/`MIGRATING`, `MIGRATE`, then `SETSLOT .. NODE` on every
    /// master, the new one first) and waits until every master agrees: a client that
    /// routed the slot to its old master is answered `MOVED` there.
    pub async fn move_slot(&self, key: &str, to: usize) -> Result<(), HarnessError> {
        self.topology.move_slot(key, to).await
    }

    /// Promotes shard `i`'s first replica to its master, as `how` says, and waits until it
    /// reports itself master and the cluster `cluster_state:ok` again; the old master
    /// becomes its replica (when it is up). Fails with [`HarnessError::InvalidOptions`]
    /// for a shard without a replica.
    pub async fn fail_over(&self, i: usize, how: Failover) -> Result<(), HarnessError> {
        self.topology.fail_over(i, how).await
    }

    /// Holds back shard `i`'s replication: its master refuses the replicas' `PSYNC` and
    /// `SYNC` (an ACL rule on the `default` user, which replicas authenticate as; clients'
    /// commands are untouched), then drops its replicas' links. Writes from then on stay on
    /// the master, so a forced failover loses them, as when a master fails before it sent
    /// them; a `WAIT` there finds no replica. [`resume_replication`](Self::resume_replication)
    /// undoes it. (A plain `CLUSTER FAILOVER` waits for the replica to catch up, and a
    /// `FORCE` one on loopback almost never finds it behind: this is how a test makes the
    /// loss happen on demand.)
    pub async fn hold_back_replication(&self, i: usize) -> Result<(), HarnessError> {
        self.topology.hold_back_replication(i).await
    }

    /// Lets shard `i`'s master (now, or the node it was before a failover: pass the same
    /// `i`) serve its replicas again, undoing
    /// [`hold_back_replication`](Self::hold_back_replication) on every node of the shard.
    pub async fn resume_replication(&self, i: usize) -> Result<(), HarnessError> {
        self.topology.resume_replication(i).await
    }

    /// Pauses every process of the cluster (`SIGSTOP`): the whole member is cut off from
    /// every client, which [`resume_all`](Self::resume_all) undoes.
    pub fn pause_all(&self) -> Result<(), HarnessError> {
        self.nodes.iter().try_for_each(Node::pause)
    }

    /// Resumes every process of the cluster (`SIGCONT`).
    pub fn resume_all(&self) -> Result<(), HarnessError> {
        self.nodes.iter().try_for_each(Node::resume)
    }

    /// Whether `key` exists on the master that serves it.
    pub async fn exists(&self, key: &str) -> Result<bool, HarnessError> {
        self.topology.exists(key).await
    }

    /// The number of subscribers to `channel` over all masters (a subscriber of a cluster
    /// is connected to one of them, and hears what any of them publishes).
    pub async fn subscribers(&self, channel: &str) -> Result<u64, HarnessError> {
        self.topology.subscribers(channel).await
    }

    /// The number of keys over all masters (`DBSIZE` on each).
    pub async fn dbsize(&self) -> Result<u64, HarnessError> {
        self.topology.dbsize().await
    }
}

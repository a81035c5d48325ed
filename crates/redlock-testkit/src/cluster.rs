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

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use fred::types::Value;

use crate::{poll, HarnessError, Node, NodeOptions, NodeSet, RedisAt};

/// The number of hash slots of a Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16384;

/// How long a new cluster may take to agree on its slots.
const FORM_TIMEOUT: Duration = Duration::from_secs(20);

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
    /// For each shard, the index in `nodes` of its master now, then of its replicas.
    shards: Mutex<Vec<Vec<usize>>>,
    /// Slots moved since the cluster was formed ([`ClusterSet::move_slot`]), to the shard
    /// that serves them now.
    moved: Mutex<BTreeMap<u16, usize>>,
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
    /// every replica is linked to its master.
    ///
    /// `masters` must be at least 1. Fails with [`HarnessError::InvalidOptions`] otherwise.
    pub async fn start_with_replicas(
        masters: usize,
        replicas: usize,
    ) -> Result<ClusterSet, HarnessError> {
        if masters == 0 || masters > usize::from(CLUSTER_SLOTS) {
            return Err(HarnessError::InvalidOptions {
                reason: format!("a cluster needs 1 to {CLUSTER_SLOTS} masters, not {masters}"),
            });
        }
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
        let shards = (0..masters)
            .map(|i| {
                let mut shard = vec![i];
                shard.extend((0..replicas).map(|r| masters + i * replicas + r));
                shard
            })
            .collect();
        let cluster = ClusterSet {
            nodes,
            shards: Mutex::new(shards),
            moved: Mutex::new(BTreeMap::new()),
        };
        cluster.form(masters).await?;
        Ok(cluster)
    }

    async fn form(&self, masters: usize) -> Result<(), HarnessError> {
        for i in 0..masters {
            let (first, last) = slot_range(i, masters);
            self.nodes
                .node(i)
                .redis()
                .command(&[
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &first.to_string(),
                    &last.to_string(),
                ])
                .await?;
        }
        let first = self.nodes.node(0).redis();
        for node in self.nodes.iter().skip(1) {
            first
                .command(&["CLUSTER", "MEET", "127.0.0.1", &node.port().to_string()])
                .await?;
        }
        let total = self.nodes.len();
        // A replica may follow a master only once it knows it.
        let all_known = || async {
            for node in self.nodes.iter() {
                match text(node.redis().command(&["CLUSTER", "NODES"]).await) {
                    // A node met but not yet shaken hands with is listed under a
                    // temporary ID, which `CLUSTER REPLICATE` does not know.
                    Some(nodes)
                        if nodes.lines().count() == total && !nodes.contains("handshake") => {}
                    _ => return false,
                }
            }
            true
        };
        self.formed(all_known, "know every node").await?;
        let shards = self.shards().clone();
        for shard in &shards {
            let master_id = node_id(&self.nodes.node(shard[0]).redis()).await?;
            for &replica in &shard[1..] {
                self.nodes
                    .node(replica)
                    .redis()
                    .command(&["CLUSTER", "REPLICATE", &master_id])
                    .await?;
            }
        }
        let all_ok = || async {
            for node in self.nodes.iter() {
                let at = node.redis();
                let ok = text(at.command(&["CLUSTER", "INFO"]).await)
                    .is_some_and(|info| info.contains("cluster_state:ok"));
                let linked = text(at.command(&["INFO", "replication"]).await).is_some_and(|info| {
                    info.contains("role:master") || info.contains("master_link_status:up")
                });
                if !(ok && linked) {
                    return false;
                }
            }
            true
        };
        self.formed(all_ok, "report cluster_state:ok with every replica linked")
            .await
    }

    async fn formed<F, Fut>(&self, check: F, what: &str) -> Result<(), HarnessError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        if poll::eventually(FORM_TIMEOUT, check).await {
            return Ok(());
        }
        Err(HarnessError::InvalidOptions {
            reason: format!(
                "the cluster's {} nodes did not {what} within {FORM_TIMEOUT:?}; see their logs",
                self.nodes.len()
            ),
        })
    }

    fn shards(&self) -> std::sync::MutexGuard<'_, Vec<Vec<usize>>> {
        self.shards.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cluster's URL, as a lock's node list takes it:
    /// `redis-cluster://127.0.0.1:P0?node=127.0.0.1:P1&...`, every master a seed.
    pub fn url(&self) -> String {
        let masters = self.shards().len();
        let mut url = String::from("redis-cluster://");
        for i in 0..masters {
            if i == 1 {
                url.push('?');
            } else if i > 1 {
                url.push('&');
            }
            if i > 0 {
                url.push_str("node=");
            }
            url.push_str(&format!("127.0.0.1:{}", self.nodes.node(i).port()));
        }
        url
    }

    /// Every process: the masters as started first, then the replicas shard by shard.
    pub fn nodes(&self) -> &NodeSet {
        &self.nodes
    }

    /// The number of shards (masters).
    pub fn shard_count(&self) -> usize {
        self.shards().len()
    }

    /// The master of shard `i` now. Panics if `i` is out of range.
    pub fn master(&self, i: usize) -> &Node {
        self.nodes.node(self.shards()[i][0])
    }

    /// The masters now, shard by shard.
    pub fn masters(&self) -> Vec<&Node> {
        let shards = self.shards();
        shards
            .iter()
            .map(|shard| self.nodes.node(shard[0]))
            .collect()
    }

    /// The first replica of shard `i` now, if it has one.
    pub fn replica(&self, i: usize) -> Option<&Node> {
        self.shards()[i].get(1).map(|&r| self.nodes.node(r))
    }

    /// The first and last slot shard `i` was given.
    pub fn slots(&self, i: usize) -> (u16, u16) {
        slot_range(i, self.shard_count())
    }

    /// The shard that serves `key`'s slot: as the cluster was formed, or as
    /// [`move_slot`](Self::move_slot) moved it.
    pub fn shard_of(&self, key: &str) -> usize {
        let slot = slot_of(key);
        let moved = self.moved.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&i) = moved.get(&slot) {
            return i;
        }
        let n = self.shard_count();
        (0..n)
            .find(|&i| slot <= slot_range(i, n).1)
            .unwrap_or(n - 1)
    }

    /// The master that serves `key`'s slot now.
    pub fn master_of(&self, key: &str) -> &Node {
        self.master(self.shard_of(key))
    }

    /// Moves `key`'s slot, with its keys, to shard `to`, as a resharding does (`CLUSTER
    /// SETSLOT .. IMPORTING`/`MIGRATING`, `MIGRATE`, then `SETSLOT .. NODE` on every
    /// master): a client that routed the slot to its old master is answered `MOVED` there.
    pub async fn move_slot(&self, key: &str, to: usize) -> Result<(), HarnessError> {
        let slot = slot_of(key);
        let from = self.shard_of(key);
        let (source, target) = (self.master(from).redis(), self.master(to).redis());
        let (from_id, to_id) = (node_id(&source).await?, node_id(&target).await?);
        let slot_arg = slot.to_string();
        if from != to {
            target
                .command(&["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &from_id])
                .await?;
            source
                .command(&["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &to_id])
                .await?;
            let keys = source
                .command(&["CLUSTER", "GETKEYSINSLOT", &slot_arg, "1000"])
                .await?;
            let keys: Vec<String> = match keys {
                Value::Array(keys) => keys
                    .iter()
                    .filter_map(|k| k.as_str().map(|k| k.to_string()))
                    .collect(),
                _ => Vec::new(),
            };
            if !keys.is_empty() {
                let port = self.master(to).port().to_string();
                let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
                migrate.extend(keys.iter().map(String::as_str));
                source.command(&migrate).await?;
            }
        }
        // The target first, then the source, then the others, as Redis documents it: the
        // target takes the slot with a new configuration epoch, which the others' gossip
        // cannot undo.
        let others: Vec<usize> = (0..self.shard_count())
            .filter(|&i| i != to && i != from)
            .collect();
        for i in [to, from].into_iter().chain(others) {
            self.master(i)
                .redis()
                .command(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id])
                .await?;
        }
        // Until every master agrees: the target serves the key, the others send it there.
        let target_port = self.master(to).port();
        let moved_there = format!("MOVED {slot} 127.0.0.1:{target_port}");
        let agreed = || async {
            for master in self.masters() {
                let reply = master.redis().command(&["GET", key]).await;
                let ok = if master.port() == target_port {
                    reply.is_ok()
                } else {
                    reply.is_err_and(|e| e.to_string().contains(&moved_there))
                };
                if !ok {
                    return false;
                }
            }
            true
        };
        self.formed(agreed, "agree on the moved slot's master")
            .await?;
        self.moved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(slot, to);
        Ok(())
    }

    /// Promotes shard `i`'s first replica to its master, as `how` says, and waits until it
    /// reports itself master and the cluster `cluster_state:ok` again; the old master
    /// becomes its replica (when it is up). Fails with [`HarnessError::InvalidOptions`]
    /// for a shard without a replica.
    pub async fn fail_over(&self, i: usize, how: Failover) -> Result<(), HarnessError> {
        let Some(replica) = self.shards()[i].get(1).copied() else {
            return Err(HarnessError::InvalidOptions {
                reason: format!("shard {i} has no replica to fail over to"),
            });
        };
        let at = self.nodes.node(replica).redis();
        let mut words = vec!["CLUSTER", "FAILOVER"];
        match how {
            Failover::Coordinated => {}
            Failover::Force => words.push("FORCE"),
            Failover::Takeover => words.push("TAKEOVER"),
        }
        at.command(&words).await?;
        let promoted = || async {
            text(at.command(&["INFO", "replication"]).await)
                .is_some_and(|info| info.contains("role:master"))
                && text(at.command(&["CLUSTER", "INFO"]).await)
                    .is_some_and(|info| info.contains("cluster_state:ok"))
        };
        self.formed(promoted, "promote the replica").await?;
        self.shards()[i].swap(0, 1);
        Ok(())
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
        let master = self.master(i).redis();
        master
            .command(&["ACL", "SETUSER", "default", "-psync", "-sync"])
            .await?;
        master
            .command(&["CLIENT", "KILL", "TYPE", "replica"])
            .await?;
        // Until no replica is linked (the killed links may take a moment to go).
        let unlinked = || async {
            text(master.command(&["INFO", "replication"]).await)
                .is_some_and(|info| info.contains("connected_slaves:0"))
        };
        self.formed(unlinked, "drop the held-back master's replicas")
            .await
    }

    /// Lets shard `i`'s master (now, or the node it was before a failover: pass the same
    /// `i`) serve its replicas again, undoing
    /// [`hold_back_replication`](Self::hold_back_replication) on every node of the shard.
    pub async fn resume_replication(&self, i: usize) -> Result<(), HarnessError> {
        let shard = self.shards()[i].clone();
        for n in shard {
            self.nodes
                .node(n)
                .redis()
                .command(&["ACL", "SETUSER", "default", "+psync", "+sync"])
                .await?;
        }
        Ok(())
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
        self.master_of(key).redis().exists(key).await
    }

    /// The number of subscribers to `channel` over all masters (a subscriber of a cluster
    /// is connected to one of them, and hears what any of them publishes).
    pub async fn subscribers(&self, channel: &str) -> Result<u64, HarnessError> {
        let mut total = 0;
        for master in self.masters() {
            total += master.redis().subscribers(channel).await?;
        }
        Ok(total)
    }

    /// The number of keys over all masters (`DBSIZE` on each).
    pub async fn dbsize(&self) -> Result<u64, HarnessError> {
        let mut total = 0;
        for master in self.masters() {
            total += master.redis().dbsize().await?;
        }
        Ok(total)
    }
}

/// The text of a reply, if it is one.
fn text(reply: Result<Value, HarnessError>) -> Option<String> {
    match reply {
        Ok(Value::String(text)) => Some(text.to_string()),
        Ok(Value::Bytes(bytes)) => Some(String::from_utf8_lossy(&bytes).into_owned()),
        _ => None,
    }
}

/// The cluster node ID of the server at `at` (`CLUSTER MYID`).
async fn node_id(at: &RedisAt) -> Result<String, HarnessError> {
    let reply = at.command(&["CLUSTER", "MYID"]).await;
    text(reply).ok_or_else(|| HarnessError::InvalidOptions {
        reason: format!("{} did not answer CLUSTER MYID with its ID", at.name()),
    })
}

/// The hash slot of `key`.
fn slot_of(key: &str) -> u16 {
    fred::util::redis_keyslot(key.as_bytes())
}

/// The first and last slot of master `i` of `n`.
fn slot_range(i: usize, n: usize) -> (u16, u16) {
    let slots = usize::from(CLUSTER_SLOTS);
    let first = slots * i / n;
    let last = slots * (i + 1) / n - 1;
    // Both are below `CLUSTER_SLOTS`, which fits a `u16`.
    (first as u16, last as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_ranges_cover_every_slot_once() {
        for n in [1, 2, 3, 5, 7] {
            let mut next = 0_usize;
            for i in 0..n {
                let (first, last) = slot_range(i, n);
                assert_eq!(usize::from(first), next, "{n} masters, master {i}");
                assert!(first <= last);
                next = usize::from(last) + 1;
            }
            assert_eq!(next, usize::from(CLUSTER_SLOTS), "{n} masters");
        }
    }
}

//! A cluster's shape and how it changes, whatever runs its nodes (local processes in
//! [`ClusterSet`](super::ClusterSet), containers in
//! [`DockerCluster`](crate::DockerCluster)): forming it by hand (`CLUSTER ADDSLOTSRANGE` on
//! each master, `CLUSTER MEET` from the first node, `CLUSTER REPLICATE` on each replica, no
//! `redis-cli` needed), its shards and their masters now, moving a slot, failing a shard
//! over, holding a shard's replication back, and reading it.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use fred::types::Value;

use super::{Failover, CLUSTER_SLOTS};
use crate::{poll, HarnessError, RedisAt};

/// How long a new cluster may take to agree on its slots.
const FORM_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a failover is waited for before `CLUSTER FAILOVER` is sent again: past the
/// server's own timeout of a manual failover (5 s), after which the replica has given up.
const MANUAL_FAILOVER_RETRY: Duration = Duration::from_secs(6);

/// One node of a cluster, as the host and the other nodes reach it.
#[derive(Debug)]
pub(crate) struct Peer {
    /// Commands from the host (its port on `127.0.0.1`, where clients reach it too).
    pub(crate) at: RedisAt,
    /// The address the other nodes meet it at (`CLUSTER MEET`): the loopback for local
    /// processes, the container's address on its network for containers.
    pub(crate) meet_ip: String,
}

impl Peer {
    fn port(&self) -> u16 {
        self.at.addr().port()
    }
}

/// The nodes of a cluster (the masters as started first, then the replicas shard by shard)
/// and which of them serves what now.
#[derive(Debug)]
pub(crate) struct Topology {
    nodes: Vec<Peer>,
    /// For each shard, the index in `nodes` of its master now, then of its replicas.
    shards: Mutex<Vec<Vec<usize>>>,
    /// Slots moved since the cluster was formed ([`Topology::move_slot`]), to the shard
    /// that serves them now.
    moved: Mutex<BTreeMap<u16, usize>>,
}

impl Topology {
    /// The layout of `masters` shards of `1 + replicas` nodes each over `nodes`, not formed
    /// yet ([`form`](Self::form)).
    pub(crate) fn new(nodes: Vec<Peer>, masters: usize, replicas: usize) -> Topology {
        let shards = (0..masters)
            .map(|i| {
                let mut shard = vec![i];
                shard.extend((0..replicas).map(|r| masters + i * replicas + r));
                shard
            })
            .collect();
        Topology {
            nodes,
            shards: Mutex::new(shards),
            moved: Mutex::new(BTreeMap::new()),
        }
    }

    /// Checks the shape a set is asked for: at least one master, at most one per slot.
    pub(crate) fn check(masters: usize) -> Result<(), HarnessError> {
        if masters == 0 || masters > usize::from(CLUSTER_SLOTS) {
            return Err(HarnessError::InvalidOptions {
                reason: format!("a cluster needs 1 to {CLUSTER_SLOTS} masters, not {masters}"),
            });
        }
        Ok(())
    }

    /// Gives each master its share of the slots, introduces every node to the first, makes
    /// each replica follow its master, and waits until every node reports
    /// `cluster_state:ok` and every replica is linked.
    pub(crate) async fn form(&self) -> Result<(), HarnessError> {
        let shards = self.shards().clone();
        for (i, shard) in shards.iter().enumerate() {
            let (first, last) = slot_range(i, shards.len());
            self.at(shard[0])
                .command(&[
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &first.to_string(),
                    &last.to_string(),
                ])
                .await?;
        }
        let first = &self.nodes[0].at;
        for node in self.nodes.iter().skip(1) {
            first
                .command(&["CLUSTER", "MEET", &node.meet_ip, &node.port().to_string()])
                .await?;
        }
        let total = self.nodes.len();
        // A replica may follow a master only once it knows it.
        let all_known = || async {
            for node in &self.nodes {
                match text(node.at.command(&["CLUSTER", "NODES"]).await) {
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
        for shard in &shards {
            let master_id = node_id(self.at(shard[0])).await?;
            for &replica in &shard[1..] {
                self.at(replica)
                    .command(&["CLUSTER", "REPLICATE", &master_id])
                    .await?;
            }
        }
        let all_ok = || async {
            for node in &self.nodes {
                let ok = text(node.at.command(&["CLUSTER", "INFO"]).await)
                    .is_some_and(|info| info.contains("cluster_state:ok"));
                let linked =
                    text(node.at.command(&["INFO", "replication"]).await).is_some_and(|info| {
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

    fn shards(&self) -> MutexGuard<'_, Vec<Vec<usize>>> {
        self.shards.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Node `n`'s handle.
    pub(crate) fn at(&self, n: usize) -> &RedisAt {
        &self.nodes[n].at
    }

    /// The cluster's URL, as a lock's node list takes it:
    /// `redis-cluster://127.0.0.1:P0?node=127.0.0.1:P1&...`, every master as started a seed.
    pub(crate) fn url(&self) -> String {
        let masters = self.shard_count();
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
            url.push_str(&format!("127.0.0.1:{}", self.nodes[i].port()));
        }
        url
    }

    /// The number of shards (masters).
    pub(crate) fn shard_count(&self) -> usize {
        self.shards().len()
    }

    /// The index of shard `i`'s master now. Panics if `i` is out of range.
    pub(crate) fn master(&self, i: usize) -> usize {
        self.shards()[i][0]
    }

    /// The indices of the masters now, shard by shard.
    pub(crate) fn masters(&self) -> Vec<usize> {
        self.shards().iter().map(|shard| shard[0]).collect()
    }

    /// The index of shard `i`'s first replica now, if it has one.
    pub(crate) fn replica(&self, i: usize) -> Option<usize> {
        self.shards()[i].get(1).copied()
    }

    /// The indices of shard `i`'s nodes now: its master, then its replicas.
    pub(crate) fn shard(&self, i: usize) -> Vec<usize> {
        self.shards()[i].clone()
    }

    /// The shard that serves `key`'s slot: as the cluster was formed, or as
    /// [`move_slot`](Self::move_slot) moved it.
    pub(crate) fn shard_of(&self, key: &str) -> usize {
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

    /// See `ClusterSet::move_slot`.
    pub(crate) async fn move_slot(&self, key: &str, to: usize) -> Result<(), HarnessError> {
        let slot = slot_of(key);
        let from = self.shard_of(key);
        let (source, target) = (self.at(self.master(from)), self.at(self.master(to)));
        let (from_id, to_id) = (node_id(source).await?, node_id(target).await?);
        let slot_arg = slot.to_string();
        let target_port = target.addr().port();
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
                // From node to node: by the target's address as the source meets it.
                let target_ip = &self.nodes[self.master(to)].meet_ip;
                let port = target_port.to_string();
                let mut migrate = vec!["MIGRATE", target_ip, &port, "", "0", "5000", "KEYS"];
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
            self.at(self.master(i))
                .command(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id])
                .await?;
        }
        // Until every master agrees: the target serves the key, the others send it there.
        let moved_there = format!("MOVED {slot} 127.0.0.1:{target_port}");
        let agreed = || async {
            for master in self.masters() {
                let at = self.at(master);
                let reply = at.command(&["GET", key]).await;
                let ok = if at.addr().port() == target_port {
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

    /// See `ClusterSet::fail_over`.
    pub(crate) async fn fail_over(&self, i: usize, how: Failover) -> Result<(), HarnessError> {
        let Some(replica) = self.replica(i) else {
            return Err(HarnessError::InvalidOptions {
                reason: format!("shard {i} has no replica to fail over to"),
            });
        };
        let at = self.at(replica);
        let mut words = vec!["CLUSTER", "FAILOVER"];
        match how {
            Failover::Coordinated => {}
            Failover::Force => words.push("FORCE"),
            Failover::Takeover => words.push("TAKEOVER"),
        }
        at.command(&words).await?;
        // A replica whose election fails (a master that does not vote in time, under load
        // or just after a pause) drops the manual failover after the server's timeout (5 s)
        // and does not try again: it is asked again until promoted.
        let mut asked = Instant::now();
        let words = &words;
        let promoted = || {
            let again = asked.elapsed() >= MANUAL_FAILOVER_RETRY;
            if again {
                asked = Instant::now();
            }
            async move {
                if again {
                    // Refused once the replica is promoted (it is a master then): checked below.
                    let _ = at.command(words).await;
                }
                text(at.command(&["INFO", "replication"]).await)
                    .is_some_and(|info| info.contains("role:master"))
                    && text(at.command(&["CLUSTER", "INFO"]).await)
                        .is_some_and(|info| info.contains("cluster_state:ok"))
            }
        };
        self.formed(promoted, "promote the replica").await?;
        self.shards()[i].swap(0, 1);
        Ok(())
    }

    /// See `ClusterSet::hold_back_replication`.
    pub(crate) async fn hold_back_replication(&self, i: usize) -> Result<(), HarnessError> {
        let master = self.at(self.master(i));
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

    /// See `ClusterSet::resume_replication`.
    pub(crate) async fn resume_replication(&self, i: usize) -> Result<(), HarnessError> {
        for n in self.shard(i) {
            self.at(n)
                .command(&["ACL", "SETUSER", "default", "+psync", "+sync"])
                .await?;
        }
        Ok(())
    }

    /// Whether `key` exists on the master that serves it.
    pub(crate) async fn exists(&self, key: &str) -> Result<bool, HarnessError> {
        self.at(self.master(self.shard_of(key))).exists(key).await
    }

    /// The number of subscribers to `channel` over all masters (a subscriber of a cluster
    /// is connected to one of them, and hears what any of them publishes).
    pub(crate) async fn subscribers(&self, channel: &str) -> Result<u64, HarnessError> {
        let mut total = 0;
        for master in self.masters() {
            total += self.at(master).subscribers(channel).await?;
        }
        Ok(total)
    }

    /// The number of keys over all masters (`DBSIZE` on each).
    pub(crate) async fn dbsize(&self) -> Result<u64, HarnessError> {
        let mut total = 0;
        for master in self.masters() {
            total += self.at(master).dbsize().await?;
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
pub(crate) fn slot_range(i: usize, n: usize) -> (u16, u16) {
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

//! [`ClusterSet`]: a Redis Cluster of local `redis-server` processes, started on free loopback
//! ports, for a lock whose quorum member is a whole cluster.
//!
//! The masters are started as a [`NodeSet`] with `--cluster-enabled yes`, so every fault of a
//! node (kill, pause, restart) works on one master. The slots are split evenly, in order:
//! master 0 serves the first range, and so on. The cluster is formed by hand (`CLUSTER
//! ADDSLOTSRANGE` on each master, `CLUSTER MEET` from the first), so no `redis-cli` is needed,
//! and the set waits until every master reports `cluster_state:ok`.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use fred::types::Value;

use crate::{poll, HarnessError, Node, NodeOptions, NodeSet, RedisAt};

/// The number of hash slots of a Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16384;

/// How long a new cluster may take to agree on its slots.
const FORM_TIMEOUT: Duration = Duration::from_secs(20);

/// A Redis Cluster of `masters` local processes (no replicas).
///
/// Dropping it kills and reaps every process, as a [`NodeSet`] does.
#[derive(Debug)]
pub struct ClusterSet {
    masters: NodeSet,
    /// Slots moved since the cluster was formed ([`ClusterSet::move_slot`]), to the index of
    /// the master that serves them now.
    moved: Mutex<BTreeMap<u16, usize>>,
}

impl ClusterSet {
    /// Starts a cluster of `masters` masters, each serving an equal share of the slots, and
    /// waits until all of them report `cluster_state:ok`.
    ///
    /// `masters` must be at least 1. Fails with [`HarnessError::InvalidOptions`] otherwise.
    pub async fn start(masters: usize) -> Result<ClusterSet, HarnessError> {
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
        let set = NodeSet::start_with(masters, opts).await?;
        let cluster = ClusterSet {
            masters: set,
            moved: Mutex::new(BTreeMap::new()),
        };
        cluster.form().await?;
        Ok(cluster)
    }

    async fn form(&self) -> Result<(), HarnessError> {
        let n = self.masters.len();
        for (i, node) in self.masters.iter().enumerate() {
            let (first, last) = slot_range(i, n);
            node.redis()
                .command(&[
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &first.to_string(),
                    &last.to_string(),
                ])
                .await?;
        }
        let first = self.masters.node(0).redis();
        for node in self.masters.iter().skip(1) {
            first
                .command(&["CLUSTER", "MEET", "127.0.0.1", &node.port().to_string()])
                .await?;
        }
        let all_ok = || async {
            for node in self.masters.iter() {
                if !cluster_ok(&node.redis()).await {
                    return false;
                }
            }
            true
        };
        if poll::eventually(FORM_TIMEOUT, all_ok).await {
            Ok(())
        } else {
            Err(HarnessError::InvalidOptions {
                reason: format!(
                    "the cluster of {n} masters did not report cluster_state:ok within \
                     {FORM_TIMEOUT:?}; see the masters' logs"
                ),
            })
        }
    }

    /// The cluster's URL, as a lock's node list takes it:
    /// `redis-cluster://127.0.0.1:P0?node=127.0.0.1:P1&...`, every master a seed.
    pub fn url(&self) -> String {
        let mut masters = self.masters.iter();
        let first = masters.next().map_or(0, Node::port);
        let mut url = format!("redis-cluster://127.0.0.1:{first}");
        for (i, node) in masters.enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(&format!("node=127.0.0.1:{}", node.port()));
        }
        url
    }

    /// The masters, in slot order: master `i` serves the `i`-th range of slots.
    pub fn masters(&self) -> &NodeSet {
        &self.masters
    }

    /// The first and last slot master `i` was given (no failover since).
    pub fn slots(&self, i: usize) -> (u16, u16) {
        slot_range(i, self.masters.len())
    }

    /// The master that serves `key`'s slot: as the cluster was formed, or as
    /// [`move_slot`](Self::move_slot) moved it (no failover since).
    pub fn master_of(&self, key: &str) -> &Node {
        self.masters.node(self.serving(slot_of(key)))
    }

    /// The index of the master that serves `slot`.
    fn serving(&self, slot: u16) -> usize {
        let moved = self.moved.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&i) = moved.get(&slot) {
            return i;
        }
        let n = self.masters.len();
        (0..n)
            .find(|&i| slot <= slot_range(i, n).1)
            .unwrap_or(n - 1)
    }

    /// Moves `key`'s slot, with its keys, to master `to`, as a resharding does (`CLUSTER
    /// SETSLOT .. IMPORTING`/`MIGRATING`, `MIGRATE`, then `SETSLOT .. NODE` on every
    /// master): a client that routed the slot to its old master is answered `MOVED` there.
    pub async fn move_slot(&self, key: &str, to: usize) -> Result<(), HarnessError> {
        let slot = slot_of(key);
        let from = self.serving(slot);
        let (source, target) = (
            self.masters.node(from).redis(),
            self.masters.node(to).redis(),
        );
        let id = |at: RedisAt| async move {
            match at.command(&["CLUSTER", "MYID"]).await? {
                Value::String(id) => Ok(id.to_string()),
                Value::Bytes(id) => Ok(String::from_utf8_lossy(&id).into_owned()),
                other => Err(HarnessError::InvalidOptions {
                    reason: format!("CLUSTER MYID answered {other:?}"),
                }),
            }
        };
        let (from_id, to_id) = (id(source.clone()).await?, id(target.clone()).await?);
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
                let port = self.masters.node(to).port().to_string();
                let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
                migrate.extend(keys.iter().map(String::as_str));
                source.command(&migrate).await?;
            }
        }
        for node in self.masters.iter() {
            node.redis()
                .command(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id])
                .await?;
        }
        self.moved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(slot, to);
        Ok(())
    }

    /// Whether `key` exists on the master that serves it.
    pub async fn exists(&self, key: &str) -> Result<bool, HarnessError> {
        self.master_of(key).redis().exists(key).await
    }

    /// The number of subscribers to `channel` over all masters (a subscriber of a cluster
    /// is connected to one of them, and hears what any of them publishes).
    pub async fn subscribers(&self, channel: &str) -> Result<u64, HarnessError> {
        let mut total = 0;
        for node in self.masters.iter() {
            total += node.redis().subscribers(channel).await?;
        }
        Ok(total)
    }

    /// The number of keys over all masters (`DBSIZE` on each).
    pub async fn dbsize(&self) -> Result<u64, HarnessError> {
        let mut total = 0;
        for node in self.masters.iter() {
            total += node.redis().dbsize().await?;
        }
        Ok(total)
    }
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

/// Whether the server at `at` reports `cluster_state:ok`.
async fn cluster_ok(at: &RedisAt) -> bool {
    match at.command(&["CLUSTER", "INFO"]).await {
        Ok(Value::String(text)) => text.contains("cluster_state:ok"),
        Ok(Value::Bytes(bytes)) => String::from_utf8_lossy(&bytes).contains("cluster_state:ok"),
        _ => false,
    }
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

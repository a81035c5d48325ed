//! P7's third contender: the per-node-limit semaphore, the design the library did not take,
//! modelled here with raw fred so that its capacity under contention can be measured beside
//! ours. It is the bench's model of the rejected design, not library code.
//!
//! Each node keeps, per semaphore, a sorted set of holder token -> expiry (the node's own
//! clock, `TIME`, in ms). One script per node drops the expired entries and admits the token
//! when fewer than `L = floor(k * q / N)` entries are live (`k` permits, `q = N/2 + 1` the
//! quorum, `N` nodes: `k = 4`, `N = 5` give `L = 2`). The script goes to every node at once,
//! and the round waits for every reply (each bounded by the library's node timeout). The
//! contender holds when at least `q` nodes admitted it and validity is left (the TTL less
//! the round's time and the library's drift allowance); otherwise it takes its entries back
//! (`ZREM` on every node) and tries again after the library's default backoff (full jitter,
//! 50 ms doubling to 1 s, giving up after 10 s). Release: `ZREM` on every node. No release
//! is announced to waiters: they poll, as ours-permit's do.
//!
//! Safe over independent nodes: every holder has an entry on at least `q` nodes and a node
//! keeps at most `L`, so `holders * q <= L * N` and `holders <= floor(L * N / q) = 3 <= k`.
//! (A limit of `k` per node, the naive version, is not: see the fault lab's per-node-limit
//! demonstration.) A winner admitted by all five nodes keeps all five entries, so two such
//! winners fill every node; with [`Trim::ToQuorum`] a winner takes back its entries beyond
//! `q` nodes at once (keeping the least crowded ones), and up to `floor(L * N / q) = 3` can
//! hold together.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use fred::prelude::{Client, ClientLike, LuaInterface};
use futures::future::join_all;
use redlock_client::RetryPolicy;
use redlock_core::{drift, quorum, validity, Token, DEFAULT_DRIFT_FACTOR, DEFAULT_NODE_TIMEOUT};
use tokio::time::Instant;

use crate::error::BenchError;
use crate::floor::connect_raw;

/// `KEYS[1]` = the node's holder set, `ARGV` = the token, the TTL in ms, the limit. The
/// set's scores are expiry times in the node's milliseconds: expired entries go first; a
/// token already in is admitted again; one more is admitted below the limit. Answers the
/// live entries with the token's (at least 1) when admitted, 0 when not.
const ADMIT: &str = r#"local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return redis.call('ZCARD', KEYS[1]) end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('ZCARD', KEYS[1])"#;

/// `KEYS[1]` = the node's holder set, `ARGV[1]` = the token: out of the set.
const LEAVE: &str = "return redis.call('ZREM', KEYS[1], ARGV[1])";

/// What a winner does with the entries it won beyond the quorum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trim {
    /// Keeps them until its release.
    Keep,
    /// Takes them back at once, keeping `q` entries: on the nodes that had the fewest
    /// entries when they admitted it (ties in random order), so that holders spread over
    /// the nodes (keeping the same `q` nodes every time would let only two hold).
    ToQuorum,
}

/// The per-node limit for `permits` permits over `nodes` nodes: `floor(k * q / N)`.
pub fn limit(permits: u32, nodes: usize) -> u32 {
    (permits as usize * quorum(nodes) / nodes) as u32
}

/// Raw fred clients, one per node, with the two scripts loaded.
#[derive(Debug, Clone)]
pub struct PerNode {
    clients: Vec<Client>,
    admit: String,
    leave: String,
    ttl: Duration,
    limit: u32,
    trim: Trim,
}

impl PerNode {
    pub async fn connect(
        urls: &[String],
        ttl: Duration,
        permits: u32,
        trim: Trim,
    ) -> Result<PerNode, BenchError> {
        let mut clients = Vec::with_capacity(urls.len());
        let (mut admit, mut leave) = (String::new(), String::new());
        for url in urls {
            let (client, shas) =
                connect_raw(url, "the per-node-limit contender", &[ADMIT, LEAVE]).await?;
            if let [a, l] = &shas[..] {
                (admit, leave) = (a.clone(), l.clone());
            }
            clients.push(client);
        }
        Ok(PerNode {
            limit: limit(permits, clients.len()),
            clients,
            admit,
            leave,
            ttl,
            trim,
        })
    }

    /// The holder set that `key` names on every node.
    fn set(key: &str) -> String {
        format!("per-node-limit:{key}")
    }

    /// One round: the token when at least a quorum admitted it with validity left
    /// (`Ok(None)` when not, its entries taken back), or a failure when nodes failed.
    pub async fn try_acquire(&self, key: &str) -> Result<Option<Token>, String> {
        let token = Token::random();
        let set = Self::set(key);
        let args = vec![
            token.as_str().to_string(),
            self.ttl.as_millis().to_string(),
            self.limit.to_string(),
        ];
        let start = Instant::now();
        let replies = join_all(self.clients.iter().map(|c| {
            let round =
                c.evalsha::<i64, _, _, _>(self.admit.clone(), vec![set.clone()], args.clone());
            tokio::time::timeout(DEFAULT_NODE_TIMEOUT, round)
        }))
        .await;
        let elapsed = start.elapsed();
        let mut admitted = Vec::new();
        let mut error = None;
        for (node, reply) in replies.into_iter().enumerate() {
            match reply {
                Ok(Ok(live)) if live > 0 => admitted.push((live, node)),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    error.get_or_insert_with(|| format!("per-node-limit: node {node}: {e}"));
                }
                Err(_) => {
                    error.get_or_insert_with(|| {
                        format!("per-node-limit: node {node}: no reply within the node timeout")
                    });
                }
            }
        }
        let q = quorum(self.clients.len());
        let valid = validity(self.ttl, elapsed, drift(self.ttl, DEFAULT_DRIFT_FACTOR)).is_some();
        if admitted.len() >= q && valid {
            if self.trim == Trim::ToQuorum {
                // The least crowded first, ties in an order of this round's own.
                let spin = RandomState::new().build_hasher().finish() as usize;
                let n = self.clients.len();
                admitted.sort_by_key(|&(live, node)| (live, (node + spin % n) % n));
                let beyond: Vec<usize> = admitted[q..].iter().map(|&(_, node)| node).collect();
                self.leave(&set, &token, &beyond).await?;
            }
            return Ok(Some(token));
        }
        let all: Vec<usize> = (0..self.clients.len()).collect();
        self.leave(&set, &token, &all).await?;
        match error {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    /// Rounds under the library's default retry policy until one wins; `Ok(None)` when the
    /// policy's overall wait ran out.
    pub async fn acquire(&self, key: &str) -> Result<Option<Token>, String> {
        let policy = RetryPolicy::default();
        let deadline = policy.max_wait.map(|wait| Instant::now() + wait);
        let mut delays = policy.backoff();
        loop {
            if let Some(token) = self.try_acquire(key).await? {
                return Ok(Some(token));
            }
            let delay = delays.next().unwrap_or(policy.max_delay);
            match deadline {
                Some(deadline) if Instant::now() + delay >= deadline => return Ok(None),
                _ => tokio::time::sleep(delay).await,
            }
        }
    }

    /// Release: the token out of the set on every node.
    pub async fn release(&self, key: &str, token: &Token) -> Result<(), String> {
        let all: Vec<usize> = (0..self.clients.len()).collect();
        self.leave(&Self::set(key), token, &all).await
    }

    /// `ZREM` of the token on the nodes `nodes`, at once; the first failure, if any.
    async fn leave(&self, set: &str, token: &Token, nodes: &[usize]) -> Result<(), String> {
        let replies = join_all(nodes.iter().map(|&node| {
            let leave = self.clients[node].evalsha::<i64, _, _, _>(
                self.leave.clone(),
                vec![set.to_string()],
                vec![token.as_str().to_string()],
            );
            tokio::time::timeout(DEFAULT_NODE_TIMEOUT, leave)
        }))
        .await;
        for (node, reply) in nodes.iter().zip(replies) {
            match reply {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(format!("per-node-limit: release on node {node}: {e}")),
                Err(_) => {
                    return Err(format!(
                        "per-node-limit: release on node {node}: no reply within the node timeout"
                    ))
                }
            }
        }
        Ok(())
    }

    /// Closes the connections.
    pub async fn close(&self) {
        for client in &self.clients {
            let _ = client.quit().await;
        }
    }
}

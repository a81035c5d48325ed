//! The inspection methods of a local [`Node`]: its [`RedisAt`], and the same commands
//! refused with [`HarnessError::NotRunning`] while the process is down (instead of waiting
//! for a connection refused).

use std::net::{Ipv4Addr, SocketAddr};

use super::RedisAt;
use crate::{HarnessError, Node};

impl Node {
    /// A [`RedisAt`] handle for this node (`127.0.0.1:port`, named like the node, with the
    /// node's password if it has one). Unlike the node's own inspection methods it does not
    /// check first whether the process runs.
    pub fn redis(&self) -> RedisAt {
        let at = RedisAt::new(
            self.name(),
            SocketAddr::from((Ipv4Addr::LOCALHOST, self.port())),
        );
        match self.password() {
            Some(password) => at.with_password(password),
            None => at,
        }
    }

    /// `GET key`.
    pub async fn get(&self, key: &str) -> Result<Option<String>, HarnessError> {
        self.running(&format!("GET {key}"))?.get(key).await
    }

    /// `PTTL key`: milliseconds left, `-1` without expiry, `-2` if the key does not exist.
    pub async fn pttl(&self, key: &str) -> Result<i64, HarnessError> {
        self.running(&format!("PTTL {key}"))?.pttl(key).await
    }

    /// `SET key value [PX px]` (unconditional).
    pub async fn set(&self, key: &str, value: &str, px: Option<u64>) -> Result<(), HarnessError> {
        self.running(&format!("SET {key}"))?
            .set(key, value, px)
            .await
    }

    /// `DEL key` (deleting a missing key is fine).
    pub async fn del(&self, key: &str) -> Result<(), HarnessError> {
        self.running(&format!("DEL {key}"))?.del(key).await
    }

    /// `EXISTS key`.
    pub async fn exists(&self, key: &str) -> Result<bool, HarnessError> {
        self.running(&format!("EXISTS {key}"))?.exists(key).await
    }

    /// `FLUSHALL` (synchronous).
    pub async fn flushall(&self) -> Result<(), HarnessError> {
        self.running("FLUSHALL")?.flushall().await
    }

    /// `SAVE`; see [`RedisAt::save`].
    pub async fn save(&self) -> Result<(), HarnessError> {
        self.running("SAVE")?.save().await
    }

    /// `DBSIZE`: number of keys in the current database.
    pub async fn dbsize(&self) -> Result<u64, HarnessError> {
        self.running("DBSIZE")?.dbsize().await
    }

    /// Every key matching the glob `pattern`; see [`RedisAt::keys`].
    pub async fn keys(&self, pattern: &str) -> Result<Vec<String>, HarnessError> {
        self.running(&format!("SCAN MATCH {pattern}"))?
            .keys(pattern)
            .await
    }

    /// How many times the node has executed `command` (lower case, e.g. `"evalsha"`) since
    /// it started; see [`RedisAt::command_calls`].
    pub async fn command_calls(&self, command: &str) -> Result<u64, HarnessError> {
        self.running("INFO commandstats")?
            .command_calls(command)
            .await
    }

    /// Real eviction of every key through a temporary `maxmemory` of 1 byte, configuration
    /// restored afterwards; returns the number of evicted keys. See [`RedisAt::evict_all`].
    pub async fn evict_all(&self) -> Result<u64, HarnessError> {
        self.running("evict_all")?.evict_all().await
    }

    /// Makes `key` vanish before its TTL (`DEL`, counted as a deletion, not an eviction);
    /// returns whether it existed. See [`RedisAt::lose_key`].
    pub async fn lose_key(&self, key: &str) -> Result<bool, HarnessError> {
        self.running(&format!("DEL {key}"))?.lose_key(key).await
    }

    /// The node's [`RedisAt`], or [`HarnessError::NotRunning`] for `op`.
    fn running(&self, op: &str) -> Result<RedisAt, HarnessError> {
        if self.is_running() {
            Ok(self.redis())
        } else {
            Err(self.not_running(op))
        }
    }
}

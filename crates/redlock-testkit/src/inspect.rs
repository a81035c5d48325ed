//! Inspecting a node's data through a fresh, short-lived fred connection.
//!
//! Each call builds its own client with ~1 s connection/command timeouts and no reconnection,
//! so a paused or dead node yields an error instead of a hang, and no state leaks between
//! calls. A hard outer deadline backs up fred's own timeouts.

use std::future::Future;
use std::time::Duration;

use fred::prelude::{
    Builder, Client, ClientLike, Config, Error as FredError, ErrorKind, Expiration, KeysInterface,
    ServerConfig, ServerInterface,
};

use crate::{HarnessError, Node};

/// fred's connection and command timeout for inspection.
pub const INSPECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Safety net around a whole inspection call, should fred's own timeouts not fire.
const HARD_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a polite QUIT may take after a successful call.
const QUIT_TIMEOUT: Duration = Duration::from_millis(200);

impl Node {
    /// `GET key`.
    pub async fn get(&self, key: &str) -> Result<Option<String>, HarnessError> {
        let key = key.to_owned();
        self.inspect(format!("GET {key}"), |c| async move { c.get(key).await })
            .await
    }

    /// `PTTL key`: milliseconds left, `-1` without expiry, `-2` if the key does not exist.
    pub async fn pttl(&self, key: &str) -> Result<i64, HarnessError> {
        let key = key.to_owned();
        self.inspect(format!("PTTL {key}"), |c| async move { c.pttl(key).await })
            .await
    }

    /// `SET key value [PX px]` (unconditional).
    pub async fn set(&self, key: &str, value: &str, px: Option<u64>) -> Result<(), HarnessError> {
        let (key, value) = (key.to_owned(), value.to_owned());
        let expire = px.map(|ms| Expiration::PX(i64::try_from(ms).unwrap_or(i64::MAX)));
        self.inspect(format!("SET {key}"), |c| async move {
            c.set::<(), _, _>(key, value, expire, None, false).await
        })
        .await
    }

    /// `DEL key` (deleting a missing key is fine).
    pub async fn del(&self, key: &str) -> Result<(), HarnessError> {
        let key = key.to_owned();
        self.inspect(format!("DEL {key}"), |c| async move {
            c.del::<i64, _>(key).await.map(drop)
        })
        .await
    }

    /// `EXISTS key`.
    pub async fn exists(&self, key: &str) -> Result<bool, HarnessError> {
        let key = key.to_owned();
        self.inspect(format!("EXISTS {key}"), |c| async move {
            c.exists::<i64, _>(key).await.map(|n| n > 0)
        })
        .await
    }

    /// `FLUSHALL` (synchronous).
    pub async fn flushall(&self) -> Result<(), HarnessError> {
        self.inspect("FLUSHALL".to_owned(), |c| async move {
            c.flushall::<()>(false).await
        })
        .await
    }

    /// `DBSIZE`: number of keys in the current database.
    pub async fn dbsize(&self) -> Result<u64, HarnessError> {
        self.inspect("DBSIZE".to_owned(), |c| async move { c.dbsize().await })
            .await
    }

    /// How many times the node has executed `command` (lower case, e.g. `"evalsha"`) since
    /// it started, from `INFO commandstats`. Lets a test assert how many commands a
    /// mechanism sent, instead of timing it.
    pub async fn command_calls(&self, command: &str) -> Result<u64, HarnessError> {
        let stats: String = self
            .inspect("INFO commandstats".to_owned(), |c| async move {
                c.info(Some(fred::types::InfoKind::CommandStats)).await
            })
            .await?;
        Ok(parse_command_calls(&stats, command))
    }

    /// Runs `op` on a fresh client connected to this node.
    async fn inspect<T, F, Fut>(&self, op: String, f: F) -> Result<T, HarnessError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, FredError>>,
    {
        if !self.is_running() {
            return Err(self.not_running(&op));
        }
        let client = self.client().map_err(|e| self.redis_error(&op, e))?;
        let call = async {
            let task = client.init().await?;
            let result = f(client.clone()).await;
            if result.is_ok() {
                let _ = tokio::time::timeout(QUIT_TIMEOUT, client.quit()).await;
            }
            task.abort();
            result
        };
        match tokio::time::timeout(HARD_TIMEOUT, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) if *e.kind() == ErrorKind::Timeout => Err(self.timeout_error(op)),
            Ok(Err(e)) => Err(self.redis_error(&op, e)),
            Err(_elapsed) => {
                // Close the routing task fred may still run for this client.
                let _ = tokio::time::timeout(QUIT_TIMEOUT, client.quit()).await;
                Err(self.timeout_error(op))
            }
        }
    }

    fn client(&self) -> Result<Client, FredError> {
        let config = Config {
            server: ServerConfig::new_centralized("127.0.0.1", self.port()),
            ..Config::default()
        };
        Builder::from_config(config)
            .with_connection_config(|c| {
                c.connection_timeout = INSPECT_TIMEOUT;
                c.internal_command_timeout = INSPECT_TIMEOUT;
                c.max_command_attempts = 1;
            })
            .with_performance_config(|p| p.default_command_timeout = INSPECT_TIMEOUT)
            .build()
    }

    fn timeout_error(&self, op: String) -> HarnessError {
        HarnessError::Timeout {
            name: self.name().to_owned(),
            port: self.port(),
            op,
            timeout: INSPECT_TIMEOUT,
        }
    }

    fn redis_error(&self, op: &str, source: FredError) -> HarnessError {
        HarnessError::Redis {
            name: self.name().to_owned(),
            port: self.port(),
            op: op.to_owned(),
            source,
        }
    }
}

/// Finds `calls=N` on the line `cmdstat_<command>:calls=N,...` of `INFO commandstats`.
fn parse_command_calls(stats: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:");
    stats
        .lines()
        .find_map(|line| line.trim().strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod command_stats_tests {
    use super::parse_command_calls;

    #[test]
    fn parses_calls_of_one_command() {
        let info =
            "# Commandstats\r\ncmdstat_set:calls=7,usec=10\r\ncmdstat_evalsha:calls=3,usec=5\r\n";
        assert_eq!(parse_command_calls(info, "evalsha"), 3);
        assert_eq!(parse_command_calls(info, "set"), 7);
        assert_eq!(parse_command_calls(info, "get"), 0);
    }
}

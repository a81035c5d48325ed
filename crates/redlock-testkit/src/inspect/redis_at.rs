//! [`RedisAt`]: inspecting and manipulating the data of any Redis server by address (a local
//! [`Node`] or a container), through fresh, short-lived fred connections.
//!
//! Each call builds its own client with ~1 s connection/command timeouts and no reconnection,
//! so a paused or dead server yields an error instead of a hang, and no state leaks between
//! calls. A hard outer deadline backs up fred's own timeouts.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use fred::prelude::{
    Builder, Client, ClientLike, Config, Error as FredError, ErrorKind, Expiration, KeysInterface,
    ServerConfig, ServerInterface,
};
use fred::types::{CustomCommand, InfoKind, SetOptions, Value};
use tokio::task::JoinHandle;

use crate::{HarnessError, Node};

/// fred's connection and command timeout for inspection.
pub const INSPECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Safety net around each command (and the connect), should fred's own timeouts not fire.
const HARD_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a polite QUIT may take after a successful call.
const QUIT_TIMEOUT: Duration = Duration::from_millis(200);
/// How long [`RedisAt::evict_all`] keeps poking the server until it reports that nothing is
/// left to evict. A few keys go in the first poke; the margin is for servers holding many keys,
/// which evict in time-limited slices.
const EVICT_DEADLINE: Duration = Duration::from_secs(2);
/// Pause between two eviction pokes.
const EVICT_POLL: Duration = Duration::from_millis(10);
/// The key [`RedisAt::evict_all`] writes with `SET .. XX`: the write runs the server's
/// eviction loop, and `XX` on a key that never exists means it stores nothing itself.
const EVICT_TRIGGER_KEY: &str = "__redlock_testkit_evict_trigger__";
/// `SCAN .. COUNT` hint per page.
const SCAN_COUNT: u32 = 100;

/// A Redis server at a socket address, with a name for error messages.
///
/// Cheap to clone; it holds no connection. Every method opens its own connection, runs one
/// step (or, for [`RedisAt::keys`] and [`RedisAt::evict_all`], a short sequence) and closes it.
/// Errors are [`HarnessError::Timeout`] (no answer within about [`INSPECT_TIMEOUT`]: paused
/// or unreachable) or [`HarnessError::Redis`] (refused, protocol or server error), both naming
/// the server and the command.
#[derive(Clone, Debug)]
pub struct RedisAt {
    name: String,
    addr: SocketAddr,
}

impl RedisAt {
    /// A handle for the server `name` listening on `addr`. Does not connect.
    pub fn new(name: impl Into<String>, addr: SocketAddr) -> RedisAt {
        RedisAt {
            name: name.into(),
            addr,
        }
    }

    /// The name used in error messages (`node-0`, `redis1`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `PING`; succeeds only on `PONG`.
    pub async fn ping(&self) -> Result<(), HarnessError> {
        let reply: String = self
            .one("PING", |c| async move { c.ping(None).await })
            .await?;
        if reply == "PONG" {
            Ok(())
        } else {
            Err(self.redis_error(
                "PING",
                FredError::new(ErrorKind::Protocol, format!("expected PONG, got {reply:?}")),
            ))
        }
    }

    /// `GET key`.
    pub async fn get(&self, key: &str) -> Result<Option<String>, HarnessError> {
        let key = key.to_owned();
        self.one(&format!("GET {key}"), |c| async move { c.get(key).await })
            .await
    }

    /// `PTTL key`: milliseconds left, `-1` without expiry, `-2` if the key does not exist.
    pub async fn pttl(&self, key: &str) -> Result<i64, HarnessError> {
        let key = key.to_owned();
        self.one(&format!("PTTL {key}"), |c| async move { c.pttl(key).await })
            .await
    }

    /// `SET key value [PX px]` (unconditional).
    pub async fn set(&self, key: &str, value: &str, px: Option<u64>) -> Result<(), HarnessError> {
        let (key, value) = (key.to_owned(), value.to_owned());
        let expire = px.map(|ms| Expiration::PX(i64::try_from(ms).unwrap_or(i64::MAX)));
        self.one(&format!("SET {key}"), |c| async move {
            c.set::<(), _, _>(key, value, expire, None, false).await
        })
        .await
    }

    /// `DEL key` (deleting a missing key is fine).
    pub async fn del(&self, key: &str) -> Result<(), HarnessError> {
        self.lose_key(key).await.map(drop)
    }

    /// `EXISTS key`.
    pub async fn exists(&self, key: &str) -> Result<bool, HarnessError> {
        let key = key.to_owned();
        self.one(&format!("EXISTS {key}"), |c| async move {
            c.exists::<i64, _>(key).await.map(|n| n > 0)
        })
        .await
    }

    /// `FLUSHALL` (synchronous).
    pub async fn flushall(&self) -> Result<(), HarnessError> {
        self.one("FLUSHALL", |c| async move { c.flushall::<()>(false).await })
            .await
    }

    /// `DBSIZE`: number of keys in the current database.
    pub async fn dbsize(&self) -> Result<u64, HarnessError> {
        self.one("DBSIZE", |c| async move { c.dbsize().await })
            .await
    }

    /// Every key matching the glob `pattern` (`*` for all), by `SCAN .. MATCH` over all pages,
    /// sorted and without the duplicates `SCAN` may return.
    pub async fn keys(&self, pattern: &str) -> Result<Vec<String>, HarnessError> {
        let op = format!("SCAN MATCH {pattern}");
        let session = Session::open(self, &op).await?;
        let mut keys = BTreeSet::new();
        let mut cursor = "0".to_owned();
        loop {
            let (next, page): (String, Vec<String>) = session
                .run(
                    &op,
                    session
                        .client
                        .scan_page(cursor, pattern.to_owned(), Some(SCAN_COUNT), None),
                )
                .await?;
            keys.extend(page);
            if next == "0" {
                break;
            }
            cursor = next;
        }
        session.close().await;
        Ok(keys.into_iter().collect())
    }

    /// How many times the server has executed `command` (lower case, e.g. `"evalsha"`) since
    /// it started, from `INFO commandstats`. Lets a test assert how many commands a
    /// mechanism sent, instead of timing it.
    pub async fn command_calls(&self, command: &str) -> Result<u64, HarnessError> {
        let stats: String = self
            .one("INFO commandstats", |c| async move {
                c.info(Some(InfoKind::CommandStats)).await
            })
            .await?;
        Ok(parse_info_field(&stats, &format!("cmdstat_{command}"), "calls").unwrap_or(0))
    }

    /// How many client connections the server has open, from `INFO clients` (the one this
    /// call opens included). Lets a test assert that a client closed its connections.
    pub async fn connected_clients(&self) -> Result<u64, HarnessError> {
        let info: String = self
            .one("INFO clients", |c| async move {
                c.info(Some(InfoKind::Clients)).await
            })
            .await?;
        parse_info_field(&info, "connected_clients", "").ok_or_else(|| {
            self.redis_error(
                "INFO clients",
                FredError::new(ErrorKind::Protocol, "no connected_clients field"),
            )
        })
    }

    /// How many clients are subscribed to `channel` (`PUBSUB NUMSUB`). Lets a test wait
    /// until a subscriber is in place instead of sleeping.
    pub async fn subscribers(&self, channel: &str) -> Result<u64, HarnessError> {
        let reply: Vec<Value> = self
            .one("PUBSUB NUMSUB", |c| async move {
                c.custom(
                    CustomCommand::new_static("PUBSUB", None, false),
                    vec!["NUMSUB".to_owned(), channel.to_owned()],
                )
                .await
            })
            .await?;
        Ok(match reply.get(1) {
            Some(Value::Integer(n)) => u64::try_from(*n).unwrap_or(0),
            _ => 0,
        })
    }

    /// `CONFIG GET parameter` for one parameter (no glob): its value, or `None` if the server
    /// does not know the parameter.
    pub async fn config_get(&self, parameter: &str) -> Result<Option<String>, HarnessError> {
        let op = format!("CONFIG GET {parameter}");
        let session = Session::open(self, &op).await?;
        let value = session.config_get(parameter).await?;
        session.close().await;
        Ok(value)
    }

    /// `TIME`: the server's clock as a duration since the Unix epoch. Under a fake clock (see
    /// the clock shim) this is the faked time.
    pub async fn time(&self) -> Result<Duration, HarnessError> {
        let (secs, micros): (String, String) = self
            .one("TIME", |c| async move {
                c.custom(
                    CustomCommand::new_static("TIME", None, false),
                    Vec::<String>::new(),
                )
                .await
            })
            .await?;
        match (secs.parse::<u64>(), micros.parse::<u32>()) {
            (Ok(secs), Ok(micros)) => Ok(Duration::new(secs, micros.saturating_mul(1_000))),
            _ => Err(self.redis_error(
                "TIME",
                FredError::new(
                    ErrorKind::Protocol,
                    format!("expected two integers, got {secs:?} {micros:?}"),
                ),
            )),
        }
    }

    /// Real eviction of every key, as memory pressure does it (Redlock assumption H2 broken).
    ///
    /// Reads `maxmemory` and `maxmemory-policy` (`CONFIG GET`), sets `maxmemory-policy
    /// allkeys-random` and `maxmemory 1` (byte), then writes `SET <throw-away key> x XX` until
    /// the server answers `OOM` (its eviction loop found nothing left to evict; `XX` on a key
    /// that never exists means the write itself stores nothing), for at most 2 s. Then it
    /// restores the previous `maxmemory` and `maxmemory-policy`, also when a step failed.
    ///
    /// Returns how many keys the server evicted meanwhile (`evicted_keys` of `INFO stats`,
    /// after minus before); these are counted as evictions, not deletions. Keys of every
    /// database go. Writes other clients send meanwhile fail with `OOM`.
    pub async fn evict_all(&self) -> Result<u64, HarnessError> {
        let session = Session::open(self, "evict_all (CONFIG GET maxmemory)").await?;
        let maxmemory = session.config_get_known("maxmemory").await?;
        let policy = session.config_get_known("maxmemory-policy").await?;
        let before = session.evicted_keys().await?;
        let evicting = session.evict_everything().await;
        // maxmemory first: once it is back, the server stops evicting whatever the policy.
        let restored = match session.config_set("maxmemory", &maxmemory, true).await {
            Ok(()) => session.config_set("maxmemory-policy", &policy, true).await,
            Err(e) => Err(e),
        };
        evicting?;
        restored?;
        let after = session.evicted_keys().await?;
        session.close().await;
        Ok(after.saturating_sub(before))
    }

    /// Makes `key` vanish before its TTL, which is what an eviction does to it, by `DEL key`.
    /// Returns whether the key existed.
    ///
    /// Redis has no command to evict one chosen key: an eviction is a deletion done by the
    /// server itself. The data effect is the same, but the server counts this as a deletion
    /// (`evicted_keys` in `INFO stats` does not move and no `evicted` keyspace event fires).
    /// For real eviction use [`RedisAt::evict_all`].
    pub async fn lose_key(&self, key: &str) -> Result<bool, HarnessError> {
        let key = key.to_owned();
        self.one(&format!("DEL {key}"), |c| async move {
            c.del::<i64, _>(key).await.map(|n| n > 0)
        })
        .await
    }

    /// Runs one command on a fresh connection.
    async fn one<T, F, Fut>(&self, op: &str, f: F) -> Result<T, HarnessError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, FredError>>,
    {
        let session = Session::open(self, op).await?;
        let result = session.run(op, f(session.client.clone())).await;
        if result.is_ok() {
            session.close().await;
        }
        result
    }

    fn client(&self) -> Result<Client, FredError> {
        let config = Config {
            server: ServerConfig::new_centralized(self.addr.ip().to_string(), self.addr.port()),
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

    /// Awaits `fut` under the hard deadline and maps fred's errors.
    async fn bounded<T>(
        &self,
        op: &str,
        fut: impl Future<Output = Result<T, FredError>>,
    ) -> Result<T, HarnessError> {
        match tokio::time::timeout(HARD_TIMEOUT, fut).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) if *e.kind() == ErrorKind::Timeout => Err(self.timeout_error(op)),
            Ok(Err(e)) => Err(self.redis_error(op, e)),
            Err(_elapsed) => Err(self.timeout_error(op)),
        }
    }

    fn timeout_error(&self, op: &str) -> HarnessError {
        HarnessError::Timeout {
            name: self.name.clone(),
            port: self.addr.port(),
            op: op.to_owned(),
            timeout: INSPECT_TIMEOUT,
        }
    }

    fn redis_error(&self, op: &str, source: FredError) -> HarnessError {
        HarnessError::Redis {
            name: self.name.clone(),
            port: self.addr.port(),
            op: op.to_owned(),
            source,
        }
    }
}

/// One connection, closed by [`Session::close`] (QUIT) or, on an error path, by dropping it
/// (which stops fred's routing task and with it the socket).
struct Session<'a> {
    at: &'a RedisAt,
    client: Client,
    task: Option<JoinHandle<Result<(), FredError>>>,
}

impl<'a> Session<'a> {
    async fn open(at: &'a RedisAt, op: &str) -> Result<Session<'a>, HarnessError> {
        let client = at.client().map_err(|e| at.redis_error(op, e))?;
        match at.bounded(op, client.init()).await {
            Ok(task) => Ok(Session {
                at,
                client,
                task: Some(task),
            }),
            Err(e) => {
                // Close the connection task fred may still run for this client.
                let _ = tokio::time::timeout(QUIT_TIMEOUT, client.quit()).await;
                Err(e)
            }
        }
    }

    async fn run<T>(
        &self,
        op: &str,
        fut: impl Future<Output = Result<T, FredError>>,
    ) -> Result<T, HarnessError> {
        self.at.bounded(op, fut).await
    }

    async fn close(mut self) {
        let _ = tokio::time::timeout(QUIT_TIMEOUT, self.client.quit()).await;
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    async fn config_get(&self, parameter: &str) -> Result<Option<String>, HarnessError> {
        let op = format!("CONFIG GET {parameter}");
        let reply: HashMap<String, String> = self
            .run(
                &op,
                self.client.custom(
                    CustomCommand::new_static("CONFIG", None, false),
                    vec!["GET", parameter],
                ),
            )
            .await?;
        Ok(reply.get(parameter).cloned())
    }

    /// `CONFIG GET` of a parameter every Redis 7 has.
    async fn config_get_known(&self, parameter: &str) -> Result<String, HarnessError> {
        self.config_get(parameter).await?.ok_or_else(|| {
            self.at.redis_error(
                &format!("CONFIG GET {parameter}"),
                FredError::new(
                    ErrorKind::Unknown,
                    "the server does not know this parameter (evict_all needs Redis 4 or newer)",
                ),
            )
        })
    }

    /// `CONFIG SET`; `restoring` marks the step that undoes [`RedisAt::evict_all`]'s change.
    async fn config_set(
        &self,
        parameter: &str,
        value: &str,
        restoring: bool,
    ) -> Result<(), HarnessError> {
        let op = if restoring {
            format!(
                "CONFIG SET {parameter} {value} (restoring it after evict_all; until this \
                 succeeds the server keeps maxmemory 1 byte and evicts every key written)"
            )
        } else {
            format!("CONFIG SET {parameter} {value}")
        };
        self.run(
            &op,
            self.client.custom::<(), _>(
                CustomCommand::new_static("CONFIG", None, false),
                vec!["SET", parameter, value],
            ),
        )
        .await
    }

    /// `evicted_keys` of `INFO stats`.
    async fn evicted_keys(&self) -> Result<u64, HarnessError> {
        let op = "INFO stats";
        let stats: String = self
            .run(op, self.client.info(Some(InfoKind::Stats)))
            .await?;
        parse_info_field(&stats, "evicted_keys", "").ok_or_else(|| {
            self.at.redis_error(
                op,
                FredError::new(ErrorKind::Protocol, "no evicted_keys field in INFO stats"),
            )
        })
    }

    /// Switches to `maxmemory 1` + `allkeys-random` and pokes the server until it has nothing
    /// left to evict (or [`EVICT_DEADLINE`] passed). The caller restores the configuration.
    async fn evict_everything(&self) -> Result<(), HarnessError> {
        self.config_set("maxmemory-policy", "allkeys-random", false)
            .await?;
        self.config_set("maxmemory", "1", false).await?;
        let op = format!("SET {EVICT_TRIGGER_KEY} x XX (evict_all)");
        let deadline = tokio::time::Instant::now() + EVICT_DEADLINE;
        loop {
            let poke = self.client.set::<Option<String>, _, _>(
                EVICT_TRIGGER_KEY,
                "x",
                None,
                Some(SetOptions::XX),
                false,
            );
            match self.run(&op, poke).await {
                // The eviction loop ran out of keys: the server refused the write.
                Err(HarnessError::Redis { source, .. }) if source.details().starts_with("OOM") => {
                    return Ok(())
                }
                Err(e) => return Err(e),
                // Still evicting in time-limited slices (many keys), or `maxmemory` did not
                // take: poke again.
                Ok(_) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    node = self.at.name(),
                    "evict_all: the server still had keys to evict after {EVICT_DEADLINE:?}"
                );
                return Ok(());
            }
            tokio::time::sleep(EVICT_POLL).await;
        }
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Node {
    /// A [`RedisAt`] handle for this node (`127.0.0.1:port`, named like the node). Unlike the
    /// node's own inspection methods it does not check first whether the process runs.
    pub fn redis(&self) -> RedisAt {
        RedisAt::new(
            self.name(),
            SocketAddr::from((Ipv4Addr::LOCALHOST, self.port())),
        )
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

/// Finds `field=N` on the `INFO` line `<line>:...` (or `<line>:N` when `field` is empty).
fn parse_info_field(info: &str, line: &str, field: &str) -> Option<u64> {
    let prefix = format!("{line}:");
    let rest = info
        .lines()
        .find_map(|l| l.trim().strip_prefix(prefix.as_str()))?;
    if field.is_empty() {
        return rest.parse().ok();
    }
    let field = format!("{field}=");
    rest.split(',')
        .find_map(|kv| kv.strip_prefix(field.as_str()))
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod info_tests {
    use super::parse_info_field;

    #[test]
    fn parses_calls_of_one_command() {
        let info =
            "# Commandstats\r\ncmdstat_set:calls=7,usec=10\r\ncmdstat_evalsha:calls=3,usec=5\r\n";
        assert_eq!(parse_info_field(info, "cmdstat_evalsha", "calls"), Some(3));
        assert_eq!(parse_info_field(info, "cmdstat_set", "calls"), Some(7));
        assert_eq!(parse_info_field(info, "cmdstat_get", "calls"), None);
    }

    #[test]
    fn parses_a_plain_counter() {
        let info = "# Stats\r\nexpired_keys:2\r\nevicted_keys:12\r\nevicted_clients:0\r\n";
        assert_eq!(parse_info_field(info, "evicted_keys", ""), Some(12));
        assert_eq!(parse_info_field(info, "evicted", ""), None);
    }
}

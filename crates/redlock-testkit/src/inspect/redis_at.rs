//! [`RedisAt`]: one Redis server by address, with a name for error messages, and its data
//! commands (`PING`, `GET`, `SET`, `SCAN`, `TIME`, ...). The `INFO` counters are in `stats`,
//! key loss in `evict`.

use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use fred::prelude::{
    Builder, Client, ClientLike, Config, Error as FredError, ErrorKind, Expiration, KeysInterface,
    ServerConfig, ServerInterface,
};
use fred::types::CustomCommand;

use super::session::Session;
use super::INSPECT_TIMEOUT;
use crate::HarnessError;

/// Safety net around each command (and the connect), should fred's own timeouts not fire.
const HARD_TIMEOUT: Duration = Duration::from_secs(3);
/// `SCAN .. COUNT` hint per page.
const SCAN_COUNT: u32 = 100;

/// A Redis server at a socket address, with a name for error messages.
///
/// Cheap to clone; it holds no connection. Every method opens its own connection, runs one
/// step (or, for [`RedisAt::keys`] and [`RedisAt::evict_all`], a short sequence) and closes it.
/// Errors are [`HarnessError::Timeout`] (no answer within about [`INSPECT_TIMEOUT`]: paused
/// or unreachable) or [`HarnessError::Redis`] (refused, protocol or server error), both naming
/// the server and the command.
///
/// On a server with a password, set it with [`RedisAt::with_password`] (a local
/// [`Node`](crate::Node) hands out handles that have it); `Debug` does not show it.
#[derive(Clone)]
pub struct RedisAt {
    name: String,
    addr: SocketAddr,
    password: Option<String>,
}

impl RedisAt {
    /// A handle for the server `name` listening on `addr`. Does not connect.
    pub fn new(name: impl Into<String>, addr: SocketAddr) -> RedisAt {
        RedisAt {
            name: name.into(),
            addr,
            password: None,
        }
    }

    /// The same handle authenticating as the `default` user with `password` (`AUTH`) on
    /// every connection it opens.
    #[must_use]
    pub fn with_password(mut self, password: impl Into<String>) -> RedisAt {
        self.password = Some(password.into());
        self
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

    /// `PEXPIRE key ms` (unconditional): `true` when the key existed.
    pub async fn pexpire(&self, key: &str, ms: i64) -> Result<bool, HarnessError> {
        let key = key.to_owned();
        self.one(&format!("PEXPIRE {key}"), |c| async move {
            c.pexpire::<i64, _>(key, ms, None).await.map(|n| n > 0)
        })
        .await
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

    /// `SAVE`: writes a snapshot (RDB file) of every key now. A node without
    /// `appendonly_always` loads it when it restarts ([`Node::restart`]): the "restart from
    /// an older snapshot" fault, once keys have changed since.
    ///
    /// [`Node::restart`]: crate::Node::restart
    pub async fn save(&self) -> Result<(), HarnessError> {
        self.one("SAVE", |c| async move {
            c.custom::<(), String>(CustomCommand::new_static("SAVE", None, false), Vec::new())
                .await
        })
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

    /// Any command, its words given as strings (`["CLUSTER", "INFO"]`), and its reply as
    /// fred returns it: for commands this handle has no method for.
    pub async fn command(&self, words: &[&str]) -> Result<fred::types::Value, HarnessError> {
        let op = words.join(" ");
        let (name, args) = words
            .split_first()
            .map_or(("PING".to_owned(), Vec::new()), |(n, a)| {
                (
                    n.to_string(),
                    a.iter().map(|w| w.to_string()).collect::<Vec<_>>(),
                )
            });
        self.one(&op, |c| async move {
            c.custom(CustomCommand::new(name, None, false), args).await
        })
        .await
    }

    /// Runs one command on a fresh connection.
    pub(super) async fn one<T, F, Fut>(&self, op: &str, f: F) -> Result<T, HarnessError>
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

    pub(super) fn client(&self) -> Result<Client, FredError> {
        let config = Config {
            server: ServerConfig::new_centralized(self.addr.ip().to_string(), self.addr.port()),
            password: self.password.clone(),
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
    pub(super) async fn bounded<T>(
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

    pub(super) fn redis_error(&self, op: &str, source: FredError) -> HarnessError {
        HarnessError::Redis {
            name: self.name.clone(),
            port: self.addr.port(),
            op: op.to_owned(),
            source,
        }
    }
}

impl fmt::Debug for RedisAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisAt")
            .field("name", &self.name)
            .field("addr", &self.addr)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

//! The floor: the raw commands of a Redlock cycle through fred, with no library around them.
//!
//! One connection per node. Acquire is `SET key token NX PX ttl` on every node at once;
//! release is the classic compare-and-delete script (preloaded, run by `EVALSHA`) on every
//! node at once. [`Wait::All`] waits for every reply of each step, as plain code does;
//! [`Wait::Quorum`] returns once `N/2 + 1` nodes answered, the least any correct Redlock
//! client must wait for, and leaves the other replies to arrive in the background.

use std::future::Future;
use std::time::Duration;

use fred::prelude::{
    Builder, Client, ClientLike, Config, Expiration, KeysInterface, LuaInterface, SetOptions,
};
use fred::types::Value;
use futures::stream::{FuturesUnordered, StreamExt};
use redlock_core::Token;

use crate::error::{BenchError, Context};

/// The compare-and-delete every Redlock client runs on release.
pub const UNLOCK_SCRIPT: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

/// How many replies each step waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    All,
    Quorum,
}

/// Raw fred clients, one per node.
#[derive(Debug, Clone)]
pub struct Floor {
    clients: Vec<Client>,
    sha: String,
    ttl_ms: i64,
    wait: Wait,
}

/// A raw fred client of the node at `url` (no delay on its socket), connected, with each of
/// `scripts` loaded: their SHAs, in order. `who` names the contender in errors.
pub async fn connect_raw(
    url: &str,
    who: &str,
    scripts: &[&str],
) -> Result<(Client, Vec<String>), BenchError> {
    let step = format!("connecting {who} to {url}");
    let config = Config::from_url(url).during(&step, "check the node URL")?;
    let client = Builder::from_config(config)
        .with_connection_config(|c| c.tcp.nodelay = Some(true))
        .build()
        .during(&step, "check the node URL")?;
    client
        .init()
        .await
        .during(&step, "is the node running and reachable?")?;
    let mut shas = Vec::with_capacity(scripts.len());
    for script in scripts {
        shas.push(
            client
                .script_load(*script)
                .await
                .during(format!("SCRIPT LOAD on {url}"), "is the node running?")?,
        );
    }
    Ok((client, shas))
}

impl Floor {
    pub async fn connect(urls: &[String], ttl: Duration, wait: Wait) -> Result<Floor, BenchError> {
        let mut clients = Vec::with_capacity(urls.len());
        let mut sha = String::new();
        for url in urls {
            let (client, shas) = connect_raw(url, "the raw fred client", &[UNLOCK_SCRIPT]).await?;
            sha = shas.into_iter().next().unwrap_or_default();
            clients.push(client);
        }
        Ok(Floor {
            clients,
            sha,
            ttl_ms: ttl.as_millis() as i64,
            wait,
        })
    }

    /// The SHA-1 of [`UNLOCK_SCRIPT`], loaded on every node.
    pub fn unlock_sha(&self) -> &str {
        &self.sha
    }

    /// Acquire: true when at least a quorum answered OK. Returns the token to release with.
    pub async fn acquire(&self, key: &str) -> Result<(bool, Token), String> {
        let token = Token::random();
        let (key_, value, ttl_ms) = (key.to_string(), token.as_str().to_string(), self.ttl_ms);
        let oks = self
            .fan_out(
                move |c| {
                    let (key, value) = (key_.clone(), value.clone());
                    async move {
                        c.set::<Value, _, _>(
                            key,
                            value,
                            Some(Expiration::PX(ttl_ms)),
                            Some(SetOptions::NX),
                            false,
                        )
                        .await
                    }
                },
                |v| matches!(v, Value::String(s) if &**s == "OK"),
            )
            .await?;
        Ok((oks > self.clients.len() / 2, token))
    }

    /// Release: compare-and-delete on every node.
    pub async fn release(&self, key: &str, token: &Token) -> Result<(), String> {
        let (key, value, sha) = (
            key.to_string(),
            token.as_str().to_string(),
            self.sha.clone(),
        );
        self.fan_out(
            move |c| {
                let (key, value, sha) = (key.clone(), value.clone(), sha.clone());
                async move { c.evalsha::<Value, _, _, _>(sha, key, value).await }
            },
            |_| true,
        )
        .await
        .map(|_| ())
    }

    /// Sends one command to every node at once and counts the replies that pass `ok`.
    /// [`Wait::All`] returns after every reply; [`Wait::Quorum`] as soon as a quorum passed
    /// or can no longer pass, and leaves the other replies to a background task (so the
    /// commands still run, in order, as a Redlock client's must).
    async fn fan_out<C, F>(&self, command: C, ok: fn(&Value) -> bool) -> Result<usize, String>
    where
        C: Fn(Client) -> F,
        F: Future<Output = Result<Value, fred::error::Error>> + Send + 'static,
    {
        let mut pending: FuturesUnordered<F> = self.clients.iter().cloned().map(command).collect();
        let n = self.clients.len();
        let quorum = n / 2 + 1;
        let (mut oks, mut refused) = (0, 0);
        let mut error = None;
        while let Some(reply) = pending.next().await {
            match reply {
                Ok(value) if ok(&value) => oks += 1,
                Ok(_) => refused += 1,
                Err(e) => {
                    refused += 1;
                    error.get_or_insert(e);
                }
            }
            if self.wait == Wait::Quorum && (oks >= quorum || refused > n - quorum) {
                break;
            }
        }
        if !pending.is_empty() {
            tokio::spawn(async move { while pending.next().await.is_some() {} });
        }
        match error {
            Some(e) if oks < quorum => Err(format!("floor: {e}")),
            _ => Ok(oks),
        }
    }
}

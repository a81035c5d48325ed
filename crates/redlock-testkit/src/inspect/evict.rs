//! Key loss on purpose (Redlock assumption H2 broken): real eviction of every key through
//! memory pressure ([`RedisAt::evict_all`]), or one key deleted before its TTL
//! ([`RedisAt::lose_key`]).

use std::time::Duration;

use fred::prelude::{ClientLike, Error as FredError, ErrorKind, KeysInterface};
use fred::types::{CustomCommand, InfoKind, SetOptions};

use super::session::Session;
use super::stats::parse_info_field;
use super::RedisAt;
use crate::HarnessError;

/// How long [`RedisAt::evict_all`] keeps poking the server until it reports that nothing is
/// left to evict. A few keys go in the first poke; the margin is for servers holding many keys,
/// which evict in time-limited slices.
const EVICT_DEADLINE: Duration = Duration::from_secs(2);
/// Pause between two eviction pokes.
const EVICT_POLL: Duration = Duration::from_millis(10);
/// The key [`RedisAt::evict_all`] writes with `SET .. XX`: the write runs the server's
/// eviction loop, and `XX` on a key that never exists means it stores nothing itself.
const EVICT_TRIGGER_KEY: &str = "__redlock_testkit_evict_trigger__";

impl RedisAt {
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
}

impl Session<'_> {
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

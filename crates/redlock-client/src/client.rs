//! The client facade: connecting, the lock calls (their acquisition is in `acquire/`),
//! the scoped form, inspection, and releases and extensions by token.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use redlock_core::{ArgumentError, Coordinator, Inspection, RoundReport, Token};

use crate::acquire::{acquire, LockOptions, Shape};
use crate::config::LockConfig;
use crate::error::{Error, InvalidConfig};
use crate::guard::{LockGuard, LockHandle};
use crate::notify::Notifier;
use crate::owner::Owner;
use crate::renew::Renewer;
use crate::retry::RetryPolicy;
use crate::shared::Inner;

/// A Redlock client: share one per node set (it is cheap to clone).
///
/// It owns one connection per node for rounds, one subscriber connection per node for
/// wake-up on release (unless `notify` is off), and one renewal task for all its locks.
///
/// ```no_run
/// # async fn demo() -> Result<(), redlock_client::Error> {
/// use redlock_client::{LockConfig, Redlock};
///
/// let client = Redlock::connect(
///     LockConfig::builder()
///         .nodes(["redis://127.0.0.1:7101", "redis://127.0.0.1:7102", "redis://127.0.0.1:7103"])
///         .build()?,
/// )
/// .await?;
/// let guard = client.lock("invoice:42").await?; // waits, retrying, up to retry.max_wait
/// // ... work while guard.is_valid(); it is renewed in the background ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Redlock {
    pub(crate) inner: Arc<Inner>,
}

/// Its coordinator (nodes with passwords masked, quorum), key prefix, TTL and whether
/// wake-ups are on: a few lines.
impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let config = &self.inner.config;
        f.debug_struct("Redlock")
            .field("core", &self.inner.core)
            .field("key_prefix", &config.key_prefix)
            .field("ttl", &config.ttl)
            .field("notify", &self.inner.notifier.is_some())
            .finish_non_exhaustive()
    }
}

impl Redlock {
    /// Validates the configuration and connects. Nodes that are down do not fail this: they
    /// are reconnected in the background and count as failing meanwhile.
    pub async fn connect(config: LockConfig) -> Result<Redlock, Error> {
        config.validate()?;
        let channel = format!("{}released", config.key_prefix);
        let mut core_config = config.core();
        if config.notify {
            core_config.release_channel = Some(channel.clone());
        }
        let core = Coordinator::connect(core_config)
            .await
            .map_err(InvalidConfig::Core)?;
        let notifier = config
            .notify
            .then(|| Notifier::start(core.waiters().subscribers(), &channel, config.node_timeout));
        let renewer = Renewer::start(core.clone());
        Ok(Redlock {
            inner: Arc::new(Inner::new(core, config, renewer, notifier)),
        })
    }

    /// The configuration this client runs with.
    pub fn config(&self) -> &LockConfig {
        &self.inner.config
    }

    /// The core coordinator, for single rounds without policy. A copy of it (`clone`)
    /// shares this client's connections and keeps working after the client is dropped;
    /// [`shutdown`](Self::shutdown) closes them for every copy.
    pub fn coordinator(&self) -> &Coordinator {
        &self.inner.core
    }

    /// The key as stored on the nodes: the configured prefix plus `key`.
    pub fn full_key(&self, key: &str) -> String {
        // Every call names a key: no formatting machinery for two strings.
        let prefix = &self.inner.config.key_prefix;
        let mut full = String::with_capacity(prefix.len() + key.len());
        full.push_str(prefix);
        full.push_str(key);
        full
    }

    /// [`full_key`](Self::full_key) for a key a caller asked to lock or inspect: the key
    /// itself must not be empty (the prefix alone names no resource).
    fn checked_key(&self, key: &str) -> Result<String, Error> {
        if key.is_empty() {
            return Err(ArgumentError::EmptyKey.into());
        }
        Ok(self.full_key(key))
    }

    /// One attempt, no waiting: the lock, or why not.
    pub async fn try_lock(&self, key: &str) -> Result<LockGuard, Error> {
        let options = LockOptions {
            retry: Some(RetryPolicy::no_retry()),
            ..Default::default()
        };
        self.lock_with(key, &options).await
    }

    /// Acquires `key`, retrying under the client's retry policy (and waking up early when
    /// the holder releases). Cancel-safe: dropping the future rolls back whatever the
    /// current attempt set.
    ///
    /// With [`RetryPolicy::max_wait`] set, it returns at most one attempt's duration after
    /// the deadline (`start + max_wait`, `start` taken before the first round): no attempt
    /// and no sleep starts at or after the deadline, sleeps are cut to end at it, and only
    /// the attempt in flight finishes, by `deadline + node_timeout`: one attempt is one
    /// round, bounded by one node timeout, and a fenced attempt's fencing step (the token's
    /// write-back, see `LockConfig::fencing`) is cut at that same instant (its lock is then
    /// released in the background and the call fails). One exception: with
    /// `LockConfig::group_commit`, a plain attempt that joins the next grouped round waits
    /// for the round in flight first (at most a node timeout and 50 ms, then it sends a
    /// round of its own), so it may end up to two node timeouts and 50 ms after it
    /// started. Rollbacks and releases of what the call does not keep run in the
    /// background, after it returned.
    ///
    /// It does not retry when so many nodes refused the attempt for a reason that only a
    /// change of settings clears (credentials, ACL permissions, a read-only replica; see
    /// `ServerErrorKind::needs_a_change`) that no quorum can form: it returns
    /// [`Error::NotAcquired`] at once, each node's error and advice in the report. Nor
    /// does it retry a fenced lock whose node set lost its fencing counters: it returns
    /// [`Error::Round`] with `redlock_core::Error::FencingCountersLost` (or
    /// `FencingTokenBehind`, when the counters went back below a token this client handed
    /// out) at once, which says how an operator mends it. A fenced call whose last attempt won the lock but got no
    /// token by the call's bound returns [`Error::Round`] with
    /// `redlock_core::Error::NotFenced` (which says why), not [`Error::DeadlinePassed`].
    pub async fn lock(&self, key: &str) -> Result<LockGuard, Error> {
        self.lock_with(key, &LockOptions::default()).await
    }

    /// [`lock`](Self::lock) with per-call overrides.
    pub async fn lock_with(&self, key: &str, options: &LockOptions) -> Result<LockGuard, Error> {
        let full = self.checked_key(key)?;
        acquire(&self.inner, Shape::One(&full), options).await
    }

    /// Acquires several keys all-or-nothing (each node sets all of them or none) and holds
    /// them as one lock, released together.
    ///
    /// Each node runs the acquisition as one script over every key, so its round takes
    /// longer with more keys (tens of milliseconds for 20,000 keys), and must still fit in
    /// the per-node timeout (`node_timeout`): for locks over thousands of keys, raise it.
    /// A round that every node timed out fails with [`Error::Unreachable`], whose message
    /// says so; nothing it set is left behind.
    pub async fn lock_many(
        &self,
        keys: &[&str],
        options: &LockOptions,
    ) -> Result<LockGuard, Error> {
        let full = keys
            .iter()
            .map(|k| self.checked_key(k))
            .collect::<Result<Vec<_>, _>>()?;
        acquire(&self.inner, Shape::Many(&full), options).await
    }

    /// Acquires `key` for `owner`, reentrantly: if `owner` already holds it, this adds a
    /// hold instead of waiting for itself. Each guard releases its own hold; the key goes
    /// with the last. See [`Owner`] for why the owner is a value and not the current thread.
    pub async fn lock_reentrant(
        &self,
        key: &str,
        owner: &Owner,
        options: &LockOptions,
    ) -> Result<LockGuard, Error> {
        let full = self.checked_key(key)?;
        acquire(&self.inner, Shape::Reentrant(&full, owner), options).await
    }

    /// Runs `work` under the lock: acquires `key` (retrying), renews it while `work` runs,
    /// and releases it at the end, also when `work` fails or panics. If the lock is lost
    /// meanwhile, `work`'s future is dropped at its next await and
    /// [`Error::LockLost`] is returned. `work` gets a [`LockHandle`] to check validity.
    ///
    /// ```no_run
    /// # async fn demo(client: redlock_client::Redlock) -> Result<(), redlock_client::Error> {
    /// let total = client
    ///     .with_lock("ledger", |lock| async move {
    ///         // ... long work; the lock is renewed meanwhile ...
    ///         assert!(lock.is_valid());
    ///         42
    ///     })
    ///     .await?;
    /// # let _ = total; Ok(()) }
    /// ```
    pub async fn with_lock<F, Fut, T>(&self, key: &str, work: F) -> Result<T, Error>
    where
        F: FnOnce(LockHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let options = LockOptions {
            renew: Some(true),
            ..Default::default()
        };
        let guard = self.lock_with(key, &options).await?;
        let handle = guard.handle();
        let lost = guard.lost();
        let work = AssertUnwindSafe(work(handle)).catch_unwind();
        let outcome = tokio::select! {
            biased;
            reason = lost => Err(reason),
            done = work => Ok(done),
        };
        let key = guard.key();
        if let Err(e) = guard.release().await {
            tracing::warn!(error = %e, "release after with_lock failed; the key expires with its TTL");
        }
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(reason) => Err(Error::LockLost { key, reason }),
        }
    }

    /// Reads every node's settings and says which break the algorithm's assumptions (a
    /// replica or cluster node, an evicting memory policy, persistence that can lose keys),
    /// with each node's latency. What a node does not let us read (managed services often
    /// refuse `CONFIG GET`) is unknown, not a problem. The same check runs at
    /// [`connect`](Self::connect), as `LockConfig::health` says.
    pub async fn health(&self) -> Vec<redlock_core::NodeHealth> {
        self.inner.core.health().await
    }

    /// Reads from every node whether `key` is held and for how long (a quorum read; a
    /// snapshot that may change right after).
    pub async fn inspect(&self, key: &str) -> Result<Inspection, Error> {
        Ok(self.inner.core.inspect(&self.checked_key(key)?).await?)
    }

    /// Releases the lock on `key` (without the prefix, as with [`lock`](Self::lock)) that
    /// holds `token`, for a process that did not acquire it: the token was stored
    /// ([`LockGuard::lock`]`().token()`), or handed over, and read back with
    /// [`Token::from_string`]. Compare-and-delete on every node, like
    /// [`LockGuard::release`]: a key that holds another token is left alone, so a stale
    /// token never releases a newer holder.
    ///
    /// Idempotent, like [`LockGuard::release`]: `Ok` means a quorum of nodes do not hold
    /// the key for `token`. Whether this call deleted it shows in the report: nodes that
    /// did say [`NodeOutcome::Released`](crate::NodeOutcome::Released), the others
    /// [`NotHeld`](crate::NodeOutcome::NotHeld) (absent, or held by another token).
    ///
    /// For plain locks of one key (a reentrant hold's release also needs its owner).
    /// Fails with [`Error::InvalidArgument`] for an empty key or an unusable token (nothing
    /// is sent), and with [`Error::Round`] when fewer than a quorum of nodes answered.
    ///
    /// ```no_run
    /// # async fn demo(client: redlock_client::Redlock, stored: String) -> Result<(), redlock_client::Error> {
    /// use redlock_client::Token;
    ///
    /// let report = client.release_token("invoice:42", &Token::from_string(stored)).await?;
    /// println!("{report}");
    /// # Ok(()) }
    /// ```
    pub async fn release_token(&self, key: &str, token: &Token) -> Result<RoundReport, Error> {
        let full = self.checked_key(key)?;
        Ok(self.inner.core.release_token(&full, token).await?)
    }

    /// Extends the lock on `key` (without the prefix) that holds `token` to at least `ttl`
    /// from now, for a process that did not acquire it, by one extension round. Returns
    /// the validity this round gives: `ttl` minus the round's time and the drift
    /// allowance, measured from the start of the round.
    ///
    /// Like every extension it never shortens: a node whose key already lives at least
    /// `ttl` keeps its expiry (the validity returned is then a lower bound), and it never
    /// recreates a key that expired. For plain locks of one key. Fails with
    /// [`Error::InvalidArgument`] for an empty key, an unusable token or TTL, and with
    /// [`Error::Round`] when the round did not reach a quorum or left no validity; a
    /// failed extension deletes nothing.
    pub async fn extend_token(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
    ) -> Result<Duration, Error> {
        let full = self.checked_key(key)?;
        let lock = self.inner.core.extend_token(&full, token, ttl).await?;
        Ok(lock.remaining().unwrap_or(Duration::ZERO))
    }

    /// Waits for background work (rollbacks, background releases of dropped guards) and
    /// closes every connection (for every copy of [`coordinator`](Self::coordinator) too). Guards still held are not released, and their renewal stops
    /// at its next tick: their health turns
    /// [`RenewalFailing`](crate::HoldHealth::RenewalFailing), saying why, and they expire
    /// with their validity. Later acquisitions fail at once with [`Error::Closed`], and
    /// releases and extensions with every node reporting `NodeOutcome::Closed`.
    ///
    /// Bounded whatever the nodes do: about `8 × node_timeout + 30 ms` for the background
    /// work (see [`Coordinator::quiesce`]), then one node timeout for the `QUIT`s and at
    /// most one more for the wake-up subscribers'.
    pub async fn shutdown(&self) {
        self.inner.core.close().await;
        if let Some(notifier) = &self.inner.notifier {
            notifier.close().await;
        }
    }
}

//! The client: acquiring with retries and wake-up, and the scoped form.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use redlock_core::{Coordinator, Inspection, Lock, NodeOutcome, RoundReport, Token};
use tokio::time::Instant;
use tracing::Instrument;

use crate::config::{InvalidConfig, LockConfig};
use crate::error::Error;
use crate::guard::{LockGuard, LockHandle, Shared};
use crate::notify::Notifier;
use crate::owner::Owner;
use crate::renew::{Plan, Renewer};
use crate::retry::RetryPolicy;

/// Per-call overrides of the client's configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LockOptions {
    /// The TTL for this lock. Defaults to the client's `ttl`.
    pub ttl: Option<Duration>,
    /// The retry policy for this call. Defaults to the client's `retry`.
    pub retry: Option<RetryPolicy>,
    /// Whether to renew this lock automatically. Defaults to the client's `renewal.enabled`.
    pub renew: Option<bool>,
}

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
#[derive(Debug, Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    core: Coordinator,
    config: LockConfig,
    renewer: Renewer,
    notifier: Option<Notifier>,
}

/// What a round tries to take.
#[derive(Clone, Copy)]
enum Target<'a> {
    One(&'a str),
    Many(&'a [String]),
    Reentrant(&'a str, &'a Owner),
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
            .then(|| Notifier::start(&config.nodes, &channel, config.node_timeout));
        let renewer = Renewer::start(core.clone());
        Ok(Redlock {
            inner: Arc::new(Inner {
                core,
                config,
                renewer,
                notifier,
            }),
        })
    }

    /// The configuration this client runs with.
    pub fn config(&self) -> &LockConfig {
        &self.inner.config
    }

    /// The core coordinator, for single rounds without policy.
    pub fn coordinator(&self) -> &Coordinator {
        &self.inner.core
    }

    /// The key as stored on the nodes: the configured prefix plus `key`.
    pub fn full_key(&self, key: &str) -> String {
        format!("{}{key}", self.inner.config.key_prefix)
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
    pub async fn lock(&self, key: &str) -> Result<LockGuard, Error> {
        self.lock_with(key, &LockOptions::default()).await
    }

    /// [`lock`](Self::lock) with per-call overrides.
    pub async fn lock_with(&self, key: &str, options: &LockOptions) -> Result<LockGuard, Error> {
        let full = self.full_key(key);
        self.acquire(Target::One(&full), options).await
    }

    /// Acquires several keys all-or-nothing (each node sets all of them or none) and holds
    /// them as one lock, released together.
    pub async fn lock_many(
        &self,
        keys: &[&str],
        options: &LockOptions,
    ) -> Result<LockGuard, Error> {
        let full: Vec<String> = keys.iter().map(|k| self.full_key(k)).collect();
        self.acquire(Target::Many(&full), options).await
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
        let full = self.full_key(key);
        self.acquire(Target::Reentrant(&full, owner), options).await
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

    /// Reads from every node whether `key` is held and for how long (a quorum read; a
    /// snapshot that may change right after).
    pub async fn inspect(&self, key: &str) -> Result<Inspection, Error> {
        Ok(self.inner.core.inspect(&self.full_key(key)).await?)
    }

    /// Waits for background work (rollbacks, background releases) and closes every
    /// connection. Guards still held are not released.
    pub async fn shutdown(&self) {
        self.inner.core.close().await;
        if let Some(notifier) = &self.inner.notifier {
            notifier.close().await;
        }
    }

    async fn acquire(&self, target: Target<'_>, options: &LockOptions) -> Result<LockGuard, Error> {
        let config = &self.inner.config;
        let ttl = options.ttl.unwrap_or(config.ttl);
        let retry = options.retry.as_ref().unwrap_or(&config.retry);
        retry.validate()?;
        let keys: Vec<String> = match target {
            Target::One(key) | Target::Reentrant(key, _) => vec![key.to_string()],
            Target::Many(keys) => keys.to_vec(),
        };
        let name = keys.join(", ");
        let span =
            tracing::debug_span!("redlock.lock", key = %name, attempts = tracing::field::Empty);
        async {
            let start = Instant::now();
            let deadline = retry.max_wait.map(|wait| start + wait);
            let mut backoff = retry.backoff();
            // Registered before the first attempt, so a release during it is not missed.
            let watch = self.inner.notifier.as_ref().map(|n| n.watch(&keys));
            let mut attempts = 0u32;
            loop {
                attempts += 1;
                tracing::Span::current().record("attempts", attempts);
                let report = match self.round(target, ttl).await {
                    Ok(lock) => return Ok(self.guard(lock, ttl, options, attempts, start)),
                    Err(redlock_core::Error::Config(e)) => {
                        return Err(InvalidConfig::Core(e).into())
                    }
                    Err(e) => Box::new(
                        e.report()
                            .cloned()
                            .expect("a round error carries its report"),
                    ),
                };
                let exhausted = retry.max_attempts.is_some_and(|max| attempts >= max);
                let now = Instant::now();
                let past_deadline = deadline.is_some_and(|d| now >= d);
                if exhausted || past_deadline {
                    return Err(give_up(
                        &name,
                        attempts,
                        report,
                        past_deadline.then(|| now - start),
                    ));
                }
                let mut delay = backoff.next().unwrap_or(retry.max_delay);
                if let Some(d) = deadline {
                    delay = delay.min(d - now);
                }
                match &watch {
                    Some(watch) => {
                        let woken = tokio::select! {
                            _ = watch.released() => true,
                            _ = tokio::time::sleep(delay) => false,
                        };
                        if woken {
                            // One waiter per client is woken, but the waiters of other
                            // clients hear the same release at the same instant; sent all
                            // at once, their rounds split the vote and all lose. A random
                            // pause of up to one round's duration spreads them out, so the
                            // first one through wins and the rest see the key held.
                            let spread = rand::Rng::gen_range(
                                &mut rand::thread_rng(),
                                Duration::ZERO..=report.elapsed,
                            );
                            tracing::debug!(?spread, "woken by a release");
                            tokio::time::sleep(spread).await;
                        }
                    }
                    None => tokio::time::sleep(delay).await,
                }
            }
        }
        .instrument(span)
        .await
    }

    async fn round(&self, target: Target<'_>, ttl: Duration) -> Result<Lock, redlock_core::Error> {
        let core = &self.inner.core;
        match target {
            Target::One(key) => core.acquire(key, ttl).await,
            Target::Many(keys) => core.acquire_many(keys, Token::random(), ttl).await,
            Target::Reentrant(key, owner) => {
                core.acquire_reentrant(key, owner.as_str(), Token::random(), ttl)
                    .await
            }
        }
    }

    fn guard(
        &self,
        lock: Lock,
        ttl: Duration,
        options: &LockOptions,
        attempts: u32,
        start: Instant,
    ) -> LockGuard {
        let config = &self.inner.config;
        let shared = Shared::new(lock, ttl);
        if options.renew.unwrap_or(config.renewal.enabled) {
            let every = config
                .renewal
                .renew_after
                .filter(|every| *every < ttl)
                .unwrap_or(ttl / 3);
            let hold_until = config.renewal.max_hold.map(|max| start + max);
            self.inner
                .renewer
                .add(shared.clone(), Plan { every, hold_until });
        }
        LockGuard::new(shared, self.inner.core.clone(), attempts)
    }
}

/// The error for an acquisition that gave up.
fn give_up(key: &str, attempts: u32, report: Box<RoundReport>, waited: Option<Duration>) -> Error {
    // No node gave an answer about the key (pending ones had not answered either).
    let unreachable = report.nodes.iter().all(|n| {
        matches!(
            n.outcome,
            NodeOutcome::TimedOut | NodeOutcome::ConnectionError(_) | NodeOutcome::Pending
        )
    });
    let key = key.to_string();
    if unreachable {
        Error::Unreachable { key, report }
    } else if let Some(waited) = waited {
        Error::DeadlinePassed {
            key,
            waited,
            attempts,
            report,
        }
    } else {
        Error::NotAcquired {
            key,
            attempts,
            report,
        }
    }
}

//! The client: acquiring with retries and wake-up, and the scoped form.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use redlock_core::{
    handover_token, Acquisition, ConfigError, Coordinator, FairPlace, Handover, Inspection, Lock,
    NodeOutcome, RoundReport, Token,
};
use tokio::time::Instant;
use tracing::Instrument;

use crate::config::LockConfig;
use crate::error::{Error, InvalidConfig};
use crate::guard::{HoldState, KeepAlive, LockGuard, LockHandle};
use crate::metrics;
use crate::notify::{Notifier, Waiter};
use crate::owner::Owner;
use crate::renew::{RenewalPlan, Renewer};
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
    /// Whether this lock gets a fencing token ([`LockGuard::fencing_token`]). Defaults to
    /// the client's `fencing`.
    pub fenced: Option<bool>,
    /// Whether this lock waits in its keys' fair queues (see [`LockConfig::fair`]). Defaults
    /// to the client's `fair`.
    pub fair: Option<bool>,
    /// The least validity an acquisition must leave for this call (see
    /// [`LockConfig::min_validity`]). Defaults to the client's `min_validity`.
    pub min_validity: Option<Duration>,
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
    /// The runtime it was connected in, whose tasks run its connections.
    runtime: tokio::runtime::Handle,
}

impl Drop for Inner {
    /// The last client handle and the last guard are gone (guards hold the client): close
    /// the wake-up subscriptions, in the runtime the client was connected in, wherever the
    /// drop happens (on a plain thread, or in another runtime that is shutting down and
    /// would drop the task unrun); if that one has shut down, they are gone with it. The
    /// coordinator closes its own connections, once background work is done, when its
    /// last copy is gone: a copy the caller kept ([`Redlock::coordinator`]) goes on
    /// working.
    fn drop(&mut self) {
        if let Some(notifier) = self.notifier.take() {
            self.runtime.spawn(async move { notifier.close().await });
        }
    }
}

/// What a round tries to take.
#[derive(Clone, Copy)]
enum LockShape<'a> {
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
            .then(|| Notifier::start(core.subscribers(), &channel, config.node_timeout));
        let renewer = Renewer::start(core.clone());
        Ok(Redlock {
            inner: Arc::new(Inner {
                core,
                config,
                renewer,
                notifier,
                runtime: tokio::runtime::Handle::current(),
            }),
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
        format!("{}{key}", self.inner.config.key_prefix)
    }

    /// [`full_key`](Self::full_key) for a key a caller asked to lock or inspect: the key
    /// itself must not be empty (the prefix alone names no resource).
    fn checked_key(&self, key: &str) -> Result<String, Error> {
        if key.is_empty() {
            return Err(InvalidConfig::Core(ConfigError::EmptyKey).into());
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
        self.acquire(LockShape::One(&full), options).await
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
        self.acquire(LockShape::Many(&full), options).await
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
        self.acquire(LockShape::Reentrant(&full, owner), options)
            .await
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
    /// Idempotent, like [`LockGuard::release`]: `Ok` means a quorum of nodes no longer hold
    /// the key for `token`. Whether this call deleted it shows in the report: nodes that
    /// did say [`NodeOutcome::Released`], the others
    /// [`NotHeld`](NodeOutcome::NotHeld) (absent, or held by another token).
    ///
    /// For plain locks of one key (a reentrant hold's release also needs its owner).
    /// Fails with [`Error::InvalidConfig`] for an empty key or an unusable token (nothing
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
    /// [`Error::InvalidConfig`] for an empty key, an unusable token or TTL, and with
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

    async fn acquire(
        &self,
        target: LockShape<'_>,
        options: &LockOptions,
    ) -> Result<LockGuard, Error> {
        let config = &self.inner.config;
        let renew = options.renew.unwrap_or(config.renewal.enabled);
        let fenced = options.fenced.unwrap_or(config.fencing);
        let fair = match (options.fair, target) {
            (Some(fair), _) => fair,
            (None, _) => config.fair,
        };
        let ttl = match options.ttl {
            // The configured TTL was checked at connect (renewal rule included).
            None if renew == config.renewal.enabled => config.ttl,
            // A per-call TTL, or renewal turned on for this call, gets the same checks as
            // the configuration: a TTL renewal cannot keep up with would be lost on
            // healthy nodes.
            ttl => config.check_hold(ttl.unwrap_or(config.ttl), renew)?,
        };
        let retry = options.retry.as_ref().unwrap_or(&config.retry);
        retry.validate()?;
        let min_validity = options.min_validity.or(config.min_validity);
        config.check_min_validity(ttl, min_validity)?;
        let min_validity = min_validity.unwrap_or(Duration::ZERO);
        // One waiter id and one ticket for every attempt of this call: its place in the
        // key's fair queue. Without `fair`, a waiter for a lock of one key (fenced or not,
        // not reentrant) still queues from its second attempt on (the first is a plain
        // `SET NX`, or the fenced script), ungated, so
        // that a release wakes the client of the oldest waiter instead of one waiter in
        // every client: with many clients on one key, a release announced to each of them
        // costs every client and every node more than the waiters' rounds do. And a
        // release that finds nobody queued is announced to nobody, which spares every
        // uncontended lock the messages.
        //
        // A call of one attempt (`try_lock`) never waits, so it neither queues nor needs a
        // wake-up, unless it is fair (its attempt queues it, and a release may hand it the
        // key while its round runs) or reentrant (when it wins, it wakes its owner's other
        // waiters for the key in this client). Registering one cost every such call a
        // waiter id and a turn of the registry's lock, with 256 calls in flight at once in
        // the bench's P5.
        let waits = retry.max_attempts != Some(1);
        let queues =
            fair || (waits && self.inner.notifier.is_some() && matches!(target, LockShape::One(_)));
        let waiter = queues.then(|| match &self.inner.notifier {
            Some(notifier) => notifier.waiter_id(),
            None => crate::owner::random_id().to_string(),
        });
        let patience = config.fair_patience_for(retry);
        let mut place = waiter
            .as_deref()
            .map(|waiter| FairPlace::now(waiter, patience));
        let keys: Vec<String> = match target {
            LockShape::One(key) | LockShape::Reentrant(key, _) => vec![key.to_string()],
            LockShape::Many(keys) => keys.to_vec(),
        };
        let name = redlock_core::lock_name(&keys);
        let span = tracing::debug_span!(
            "redlock.lock",
            key = %name,
            nodes = config.nodes.len(),
            attempts = tracing::field::Empty,
            outcome = tracing::field::Empty,
            wait_us = tracing::field::Empty,
        );
        // Counts the acquisition once, also when this future is dropped midway.
        let acquiring = metrics::Acquiring::start();
        let result = async {
            // A closed client sends nothing: say why at once rather than retry until
            // `max_wait` over rounds whose every node fails.
            if let Some(reason) = self.inner.core.closed() {
                return Err(Error::Closed {
                    key: name.clone(),
                    reason,
                });
            }
            let start = Instant::now();
            // A wait too long to represent (`Duration::MAX`) is no deadline at all.
            let deadline = retry.max_wait.and_then(|wait| start.checked_add(wait));
            let node_timeout = config.node_timeout;
            let mut backoff = retry.backoff();
            // Registered before the first attempt, so a release during it is not missed.
            let watched = waits || fair || matches!(target, LockShape::Reentrant(..));
            let watch = self.inner.notifier.as_ref().filter(|_| watched).map(|n| {
                let owner = match target {
                    LockShape::Reentrant(_, owner) => Some(owner.as_str()),
                    _ => None,
                };
                n.watch(&keys, waiter.as_deref(), owner)
            });
            let mut attempts = 0u32;
            // Attempts after a wake-up that lost, in this call: each doubles the window the
            // next woken attempt's pause is drawn from (see below).
            let mut woken_losses = 0u32;
            let mut woken = false;
            // A fair waiter's lost rounds in a row that no node refused (see
            // `HEAD_LOSSES_BEFORE_STEPPING_BACK`).
            let mut unrefused_losses = 0u32;
            // Whether a waiter that queues only to be woken still does: one whose woken
            // attempts kept losing until its pause window reached `max_delay` leaves the
            // queue and polls (see below).
            let mut announced = true;
            // Leaves the queue when this call ends, however it ends (won, given up, failed,
            // or its future dropped), once an attempt has queued the waiter, unless the
            // winning round already took the waiter out on every node.
            let mut queued = None;
            // A fair waiter's last attempt that registered a hand-over: its number, an
            // instant before its round started (the hand-over's validity starts there), and
            // the host's suspend then.
            let mut handover: Option<(u64, Instant, Duration)> = None;
            // Why the call gives up, from the last attempt's report: `past_deadline` with
            // the time waited, or every allowed attempt used. A fenced attempt that won and
            // got no token says so (a "gave up waiting" would send the user after a
            // holder).
            let fail = |not_fenced: Option<redlock_core::Error>,
                        report: Box<RoundReport>,
                        short: Option<Duration>,
                        attempts: u32,
                        past_deadline: bool| {
                if let Some(e) = not_fenced {
                    return Error::Round(e);
                }
                match short {
                    Some(validity) => Error::BelowMinValidity {
                        key: name.clone(),
                        attempts,
                        validity,
                        min_validity,
                        report,
                    },
                    None => give_up(
                        &name,
                        attempts,
                        report,
                        past_deadline.then(|| start.elapsed()),
                    ),
                }
            };
            loop {
                attempts = attempts.saturating_add(1);
                tracing::Span::current().record("attempts", attempts);
                // The validity of a round won with less than the minimum, released again.
                let mut short = None;
                let mut short_lock = None;
                // A fenced attempt that won and got no token (`NotFenced`).
                let mut not_fenced = None;
                // A fenced attempt's write-back ends by the call's bound too.
                let fence_by = deadline.and_then(|d| d.checked_add(node_timeout));
                // A fair waiter queues from its first attempt, gated; another one from its
                // second, only to be woken. With wake-ups on, each fair attempt registers a
                // hand-over: a release that finds the waiter at the head of the queue hands
                // it the key, and tells its client (see `handover` below).
                let places = match place {
                    Some(place) if fair => {
                        // Only a plain lock is handed over (a reentrant hold or a fencing
                        // token needs a round): the others are woken and run one.
                        let hands_over = matches!(target, LockShape::One(_)) && !fenced;
                        let number = watch.as_ref().filter(|_| hands_over).map(|watch| {
                            let number = u64::from(attempts);
                            watch.expect(handover_token(place.waiter, number).as_str().into());
                            // The suspend first: one between the readings then counts.
                            let suspended = redlock_core::host_suspended();
                            handover = Some((number, Instant::now(), suspended));
                            number
                        });
                        (
                            Some(FairPlace {
                                handover: number,
                                ..place
                            }),
                            None,
                        )
                    }
                    Some(place) if attempts > 1 && announced => (None, Some(place)),
                    _ => (None, None),
                };
                if let (Some(waiter), (Some(_), _) | (_, Some(_))) = (&waiter, places) {
                    // Made only once: a `QueueExit` that is dropped leaves the queue.
                    queued.get_or_insert_with(|| QueueExit {
                        core: &self.inner.core,
                        keys: &keys,
                        waiter,
                        lost: None,
                    });
                }
                let report = match self.round(target, ttl, fenced, places, fence_by).await {
                    Ok(lock) => match lock.remaining() {
                        validity if long_enough(validity, min_validity) => {
                            // The winning script took the waiter out of the queue
                            // where it set the key: leave only where it did not.
                            if let Some(exit) = queued.take() {
                                exit.after_win(&lock);
                            }
                            if let Some(watch) = &watch {
                                watch.owner_holds();
                            }
                            return Ok(self.guard(lock, ttl, renew, attempts));
                        }
                        validity => {
                            short = Some(validity.unwrap_or(Duration::ZERO));
                            let report = Box::new(lock.report().clone());
                            short_lock = Some(lock);
                            report
                        }
                    },
                    Err(redlock_core::Error::Config(e)) => {
                        return Err(InvalidConfig::Core(e).into())
                    }
                    // Only an operator can mend this (see the error): no retry.
                    Err(
                        e @ (redlock_core::Error::FencingCountersLost { .. }
                        | redlock_core::Error::FencingTokenBehind { .. }),
                    ) => return Err(Error::Round(e)),
                    // Won, but no token by the call's bound: if the call gives up now, this
                    // says why (a "gave up waiting" would send the user after a holder).
                    Err(e @ redlock_core::Error::NotFenced { .. }) => {
                        let report = Box::new(
                            e.report()
                                .cloned()
                                .expect("a round error carries its report"),
                        );
                        not_fenced = Some(e);
                        report
                    }
                    Err(e) => Box::new(
                        e.report()
                            .cloned()
                            .expect("a round error carries its report"),
                    ),
                };
                // Whatever comes next, the waiter's leave waits for this round's
                // rollbacks (they may put it back in the queues).
                if let Some(exit) = queued.as_mut() {
                    exit.lost = Some(RoundReport::clone(&report));
                }
                // The client closed while this call waited (shut down, or its runtime
                // stopped): no later round can send anything either.
                if let Some(reason) = self.inner.core.closed() {
                    return Err(Error::Closed {
                        key: name.clone(),
                        reason,
                    });
                }
                // The nodes may have handed the key over while the round ran: a release
                // that came after the round's command reached a node. (Never also a won
                // round: a hand-over and a round's `SET` need a quorum each of one key.)
                // One with too little validity left is taken on by a round at once (below).
                let handed = |handover| {
                    self.handed_over(
                        watch.as_ref(),
                        &keys[0],
                        waiter.as_deref(),
                        handover,
                        (ttl, min_validity),
                    )
                };
                let mut take_on = false;
                // Whether the lost round's late answers and rollbacks are all in (below).
                let mut settled = false;
                if short_lock.is_none() {
                    match handed(handover) {
                        Handed::Held(lock) => {
                            if let Some(exit) = queued.take() {
                                exit.after_win(&lock);
                            }
                            return Ok(self.guard(lock, ttl, renew, attempts));
                        }
                        Handed::TooLate => take_on = true,
                        // Some nodes handed it the key while its round was out, and the
                        // round took the key on others (where the release had come first)
                        // but lost, so its rollback freed those again and put the waiter
                        // back at the head of their queues: no message will come from
                        // them, and the key is out of everyone's reach where it was handed
                        // over. The next round, at once, takes both kinds (or its rollback
                        // frees them too). A node may take the key after the round was
                        // decided (its answer came late), so the round's settled report
                        // tells, once its rollbacks are done too.
                        Handed::Not => {
                            if let Some(watch) = watch.as_ref().filter(|w| w.handed_partly()) {
                                take_on = settle(&report, node_timeout, deadline)
                                    .await
                                    .nodes
                                    .iter()
                                    .any(|n| n.outcome == redlock_core::NodeOutcome::Acquired);
                                settled = true;
                                if take_on {
                                    watch.forget_wake();
                                }
                            }
                        }
                    }
                }
                // Refused by so many nodes for a reason that only a change of settings
                // clears (credentials, ACL, a replica) that no quorum can form: waiting out
                // `max_wait` would only delay the error.
                if woken {
                    woken_losses = woken_losses.saturating_add(1);
                    // Woken attempts that lost twice: the key is taken back at once after
                    // its releases (the releasing holder locks again, or another waiter
                    // gets there first). Each further wake-up would only send this waiter
                    // into a round at a random moment of someone else's hold, at a rate
                    // far above its backoff's, where it loses, splits the vote with the
                    // holder taking the key back, or wins a hand-off that costs more than
                    // that holder's retake. The same goes, sooner, for a pause window
                    // grown to `max_delay` (rounds slower than half of it): a wake-up
                    // would only start a pause as long as the backoff's. Such a waiter
                    // leaves the queue (a release with nobody queued is announced to
                    // nobody) and polls for the rest of the call, at its backoff's rate.
                    if !fair
                        && announced
                        && (woken_losses >= WOKEN_LOSSES_BEFORE_POLLING
                            || wake_window(report.elapsed, woken_losses, retry.max_delay)
                                >= retry.max_delay)
                    {
                        announced = false;
                        drop(queued.take());
                    }
                }
                let exhausted = retry.max_attempts.is_some_and(|max| attempts >= max)
                    || refused_until_changed(&report);
                let past_deadline = deadline.is_some_and(|d| Instant::now() >= d);
                if let (Some(lock), Some(validity)) = (short_lock, short) {
                    if exhausted || past_deadline {
                        // The last attempt: its release must not hold up the return past
                        // the bound that `max_wait` documents.
                        self.inner.core.release_in_background(lock);
                    } else {
                        self.release_short(&lock, validity, min_validity).await;
                    }
                }
                if exhausted || past_deadline {
                    return Err(fail(not_fenced, report, short, attempts, past_deadline));
                }
                // A fair head that keeps losing rounds no node refused (the key was free
                // and its turn had come wherever it got an answer) cannot win: its answers
                // come after the node timeout, or it reaches too few nodes. Each attempt
                // refreshes its place, so it would hold every waiter behind it up for its
                // whole `max_wait` (for ever without one), though they could win. It steps
                // back: leaves the queues (which passes the key on to the next waiter) and
                // queues again under a new ticket, behind the waiters already there.
                // (A fenced round that won and got no token is no such loss: its report
                // is the token's write-back.)
                let unrefused = fair
                    && short.is_none()
                    && not_fenced.is_none()
                    && !take_on
                    && report.kind == redlock_core::RoundKind::Acquire
                    && not_refused(&report);
                if unrefused {
                    unrefused_losses = unrefused_losses.saturating_add(1);
                } else {
                    unrefused_losses = 0;
                }
                // Not within a few node timeouts of the deadline: the call's own leave
                // comes then anyway, and the step-back must not hold its return up.
                let room = deadline.is_none_or(|d| {
                    d.saturating_duration_since(Instant::now()) > node_timeout.saturating_mul(3)
                });
                if let (Some(waiter), true) = (
                    waiter.as_deref(),
                    room && unrefused_losses >= HEAD_LOSSES_BEFORE_STEPPING_BACK,
                ) {
                    unrefused_losses = 0;
                    // Its rollbacks first: they put it back at the head where they free
                    // the key, and a leave must come after them.
                    if !settled {
                        settle(&report, node_timeout, deadline).await;
                    }
                    // A release may have handed the key over meanwhile: then it holds it.
                    if let Handed::Held(lock) = handed(handover) {
                        if let Some(exit) = queued.take() {
                            exit.after_win(&lock);
                        }
                        return Ok(self.guard(lock, ttl, renew, attempts));
                    }
                    // From here on no hand-over of its earlier attempts counts: the leave
                    // deletes a key handed to it and passes it on to the next waiter, who
                    // may then hold it. A late message for one only wakes the waiter.
                    if let Some(watch) = &watch {
                        watch.forget_handover();
                    }
                    handover = None;
                    metrics::stepped_back();
                    tracing::debug!(
                        attempt = attempts,
                        "a fair head lost rounds that no node refused; stepping back"
                    );
                    self.step_back(&keys, waiter, u64::from(attempts), node_timeout)
                        .await;
                    place = Some(FairPlace::now(waiter, patience));
                }
                if take_on {
                    // The lost round's rollbacks run in the background, on the connections
                    // the next round uses: sent at once, that round could reach a node
                    // before the rollback of the key this one took there, find its own
                    // old token and lose too, and then nothing would wake the waiter
                    // before its backoff's delay. So it waits for them first.
                    if !settled {
                        settle(&report, node_timeout, deadline).await;
                    }
                    // No attempt starts at or past the deadline (the wait may have ended
                    // there).
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(fail(not_fenced, report, short, attempts, true));
                    }
                    continue;
                }
                let mut delay = backoff.next().unwrap_or(retry.max_delay);
                // A waiter that queues only to be woken makes its second attempt, the one
                // that queues it, after the backoff's first delay, as a polling waiter
                // would, but no later than a node timeout, so that a long backoff does not
                // put off its wake-ups: a release of a plain lock of one key is announced
                // only to the queue's next waiter (to nobody when none is queued), so a
                // release within that delay is found by the attempt itself (the key is
                // free, unless taken back), and one after it names the waiter when it is
                // next. Queuing at once cost every contended call a round and a leave more
                // than polling, which short holds taken back at once do not repay: with no
                // critical section at all (the bench's `--p4-section 0s`, where every round
                // counts), 0.71-0.78x polling's rate that way, 0.84-0.90x with the delay.
                if attempts == 1 && place.is_some() && !fair {
                    delay = delay.min(node_timeout);
                }
                // A fair waiter is woken when its turn comes: a release announces itself to
                // the queue's head. Until then its attempts can only be refused (it is not
                // the head, or the key is held), so while every subscriber is up it tries
                // again only at the backoff's longest delay, which refreshes its place well
                // within its patience and still finds a key whose holder expired or a head
                // that died. At the backoff's short early delays, every waiter in the queue
                // ran a refused round per delay: with tens of waiters on a key, more rounds
                // than the hand-offs themselves. An attempt that lost after a wake-up
                // keeps the backoff: nothing may announce the key again. It tries again
                // within half a TTL all the same: a hand-over's validity counts from the
                // attempt that registered it, so with a TTL not much longer than
                // `max_delay`, a waiter whose turn came late in its pause would be handed a
                // key with little or no validity left, and need a round to take it on. A
                // round that no node refused was a head's that found the key free: it keeps
                // the backoff too, so that a head that cannot win steps back within a few
                // short delays, not `max_delay`s (the waiters behind it wait that long).
                if fair
                    && !woken
                    && unrefused_losses == 0
                    && watch.as_ref().is_some_and(|w| w.all_subscribed())
                {
                    delay = delay.max(retry.max_delay).min(ttl / 2);
                }
                if let Some(d) = deadline {
                    delay = delay.min(d.saturating_duration_since(Instant::now()));
                }
                tracing::debug!(
                    attempt = attempts,
                    outcome = if short.is_some() {
                        "below_min_validity"
                    } else {
                        "lost"
                    },
                    accepted = report.accepted,
                    quorum = report.quorum,
                    round_us = report.elapsed.as_micros() as u64,
                    delay_us = delay.as_micros() as u64,
                    "attempt not won; retrying"
                );
                match &watch {
                    Some(watch) => {
                        woken = tokio::select! {
                            _ = watch.released() => true,
                            _ = tokio::time::sleep(delay) => false,
                        };
                        // Handed the key by the release that woke it: held without a round.
                        if woken && fair {
                            let mut held = handed(handover);
                            if matches!(held, Handed::Not) && watch.handed_partly() {
                                // Woken by the first nodes that handed it the key: the
                                // others normally follow within a round trip, but one that
                                // will not would leave the key handed to this waiter on
                                // these, out of everyone's reach, until this waiter's
                                // next attempt (see `Waiter::handed_partly`). So it waits
                                // for the rest at most a node timeout, then tries again at
                                // once: its round takes the keys handed to it on (a lost
                                // round's rollback frees them and puts this waiter back at
                                // the head of their queues, for its next round).
                                let mut grace = node_timeout;
                                if let Some(d) = deadline {
                                    grace = grace.min(d.saturating_duration_since(Instant::now()));
                                }
                                tokio::select! {
                                    _ = watch.released() => {}
                                    _ = tokio::time::sleep(grace) => {}
                                }
                                held = handed(handover);
                            }
                            if let Handed::Held(lock) = held {
                                if let Some(exit) = queued.take() {
                                    exit.after_win(&lock);
                                }
                                return Ok(self.guard(lock, ttl, renew, attempts));
                            }
                        }
                        // In a fair queue only the head writes, so woken waiters cannot
                        // split the vote: no spread.
                        if woken && !fair {
                            // One waiter per client is woken, but the waiters of other
                            // clients hear the same release at the same instant; sent all
                            // at once, their rounds split the vote and all lose. A random
                            // pause spreads them out, so the first one through wins and the
                            // rest see the key held. Its window is one round's duration,
                            // doubled for each woken attempt of this call that lost:
                            // many clients on one key need a window of about one round
                            // per client, which this reaches without knowing their number
                            // (binary exponential backoff, as on a shared Ethernet). It
                            // grows on up to `max_delay`, as the backoff does, for a
                            // waiter still woken after it left the queue (as the oldest of
                            // its client's waiters for a release announced to all). Drawn
                            // from the backoff's generator: a seeded policy fixes it too.
                            let window = wake_window(report.elapsed, woken_losses, retry.max_delay);
                            let mut spread = backoff.spread(window);
                            if let Some(d) = deadline {
                                spread = spread.min(d.saturating_duration_since(Instant::now()));
                            }
                            tracing::debug!(?spread, "woken by a release");
                            tokio::time::sleep(spread).await;
                        }
                    }
                    None => tokio::time::sleep(delay).await,
                }
                // No attempt starts at or past the deadline: a sleep cut short to it ends
                // the call here, with the last attempt's report (or, for a fenced attempt
                // that won and got no token, with that: not "gave up waiting").
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(fail(not_fenced, report, short, attempts, true));
                }
            }
        }
        .instrument(span.clone())
        .await;
        let (outcome, waited) = acquiring.finish(&result);
        span.record("outcome", outcome);
        span.record("wait_us", waited.as_micros() as u64);
        result
    }

    /// The lock that a quorum of nodes handed over to fair waiter `waiter` for its attempt
    /// `handover` (number, an instant before its round started, and the host's suspend
    /// then), when they did and it
    /// has at least `min_validity` left (`bounds` = TTL, minimum validity). With less
    /// ([`Handed::TooLate`]), the waiter's next round, at once, takes the key on under its
    /// own token, with a fresh TTL.
    ///
    /// The lock is held from the quorum's messages on, without waiting for the last nodes'
    /// (a wait bounded by a timer costs up to a millisecond of the timer's resolution, more
    /// than the whole hand-over): the nodes whose message has not come yet are left in the
    /// background ([`QueueExit::after_win`]), a no-op script where the key was handed over
    /// meanwhile.
    fn handed_over(
        &self,
        watch: Option<&Waiter<'_>>,
        key: &str,
        waiter: Option<&str>,
        handover: Option<(u64, Instant, Duration)>,
        (ttl, min_validity): (Duration, Duration),
    ) -> Handed {
        let (Some(watch), Some(waiter), Some((number, since, suspended))) =
            (watch, waiter, handover)
        else {
            return Handed::Not;
        };
        let Some(nodes) = watch.handed() else {
            return Handed::Not;
        };
        let handed = Handover {
            key,
            waiter,
            number,
            ttl,
            since,
            suspended,
            nodes: &nodes,
        };
        match self.inner.core.handed_over(handed) {
            Ok(lock) if long_enough(lock.remaining(), min_validity) => {
                metrics::handover(true);
                tracing::debug!(
                    nodes = nodes.len(),
                    "the key was handed over by the release"
                );
                Handed::Held(lock)
            }
            Ok(_) | Err(_) => {
                metrics::handover(false);
                tracing::debug!(
                    "a hand-over with too little validity left; a round takes the key on"
                );
                Handed::TooLate
            }
        }
    }

    /// Releases a lock won with less validity than the caller's minimum, before the next
    /// attempt: the key is free again for it (and for everyone else) at once, instead of
    /// after its TTL.
    async fn release_short(&self, lock: &Lock, validity: Duration, min_validity: Duration) {
        tracing::debug!(
            ?validity,
            ?min_validity,
            "round won with less than the minimum validity; releasing it"
        );
        if let Err(e) = self.inner.core.release(lock).await {
            tracing::warn!(error = %e, "release of a lock below the minimum validity failed; the key expires with its TTL");
        }
    }

    /// A fair waiter that steps back after its attempt `last` leaves each of its keys'
    /// queues, on every node it reaches (where the key is free, the leave passes it on to
    /// the next waiter; a key handed over for a later attempt stays: the leave is sent
    /// again where a node did not answer, and may land after that attempt), waiting
    /// at most a node timeout and a half. Where a leave did not get through, the entry keeps
    /// its old ticket (the next attempt's `ZADD NX` does not move it) until the waiter
    /// steps back again or its patience runs out there.
    async fn step_back(&self, keys: &[String], waiter: &str, last: u64, node_timeout: Duration) {
        let leaves = keys
            .iter()
            .map(|key| self.inner.core.leave_queue_up_to(key, waiter, last));
        let bound = node_timeout.saturating_add(node_timeout / 2);
        match tokio::time::timeout(bound, futures::future::join_all(leaves)).await {
            Ok(reports) => {
                for e in reports.into_iter().filter_map(Result::err) {
                    tracing::debug!(error = %e, "stepping back in a fair queue: a leave failed");
                }
            }
            Err(_) => tracing::debug!("stepping back in a fair queue: the leave ran out of time"),
        }
    }

    async fn round(
        &self,
        shape: LockShape<'_>,
        ttl: Duration,
        fenced: bool,
        (fair, queued): (Option<FairPlace<'_>>, Option<FairPlace<'_>>),
        deadline: Option<Instant>,
    ) -> Result<Lock, redlock_core::Error> {
        let (keys, owner): (Vec<&str>, _) = match shape {
            LockShape::One(key) => (vec![key], None),
            LockShape::Many(keys) => (keys.iter().map(String::as_str).collect(), None),
            LockShape::Reentrant(key, owner) => (vec![key], Some(owner.as_str())),
        };
        let acquisition = Acquisition {
            owner,
            fenced,
            fair,
            queued,
            deadline,
            ..Acquisition::new(&keys, ttl)
        };
        self.inner.core.acquire_with(acquisition).await
    }

    /// Wraps a won lock in its guard. Runs after the round won, so nothing here may fail:
    /// every value was checked before the first round.
    fn guard(&self, lock: Lock, ttl: Duration, renew: bool, attempts: u32) -> LockGuard {
        let config = &self.inner.config;
        let shared = HoldState::new(lock, ttl);
        // `max_hold` counts from the acquisition's `t0`, not from the call (a long wait for
        // the lock used to eat into it, or all of it).
        let acquired = shared.validity_start(self.inner.core.drift(ttl));
        if renew {
            // Checked against `ttl` by `check_hold` (or `validate` for the configured TTL).
            let every = config.renew_every_for(ttl);
            // A cap too long to represent (`Duration::MAX`) is no cap at all.
            let hold_until = config
                .renewal
                .max_hold
                .and_then(|max| acquired.checked_add(max));
            self.inner
                .renewer
                .add(shared.clone(), RenewalPlan { every, hold_until });
        }
        let keep_alive = KeepAlive(self.inner.clone());
        LockGuard::new(shared, self.inner.core.clone(), keep_alive, attempts)
    }
}

/// Whether a fair waiter was handed the lock by the nodes' releases.
enum Handed {
    /// By a quorum, with enough validity left.
    Held(Lock),
    /// By a quorum, with too little validity left: a round takes the key on at once.
    TooLate,
    /// Not (yet) by a quorum.
    Not,
}

/// A queued waiter's way out of its queues: when dropped, it takes the waiter out of each
/// of its keys' queues on every node in the background, so that the waiters behind it need
/// not wait for its entries to expire.
struct QueueExit<'a> {
    core: &'a Coordinator,
    keys: &'a [String],
    waiter: &'a str,
    /// The waiter's last round that was not won: the leave waits for its rollbacks, which
    /// put the waiter back in the queues where they free the keys.
    lost: Option<RoundReport>,
}

impl QueueExit<'_> {
    /// The waiter won `lock`: it leaves the queue only on the nodes whose winning script
    /// did not take it out (see [`Coordinator::leave_queue_after_win`]).
    fn after_win(mut self, lock: &Lock) {
        let lost = self.lost.take();
        self.core
            .leave_queue_after_win(lock, self.waiter.to_string(), lost);
        std::mem::forget(self);
    }
}

impl Drop for QueueExit<'_> {
    fn drop(&mut self) {
        for key in self.keys {
            self.core.leave_queue_in_background(
                key.clone(),
                self.waiter.to_string(),
                self.lost.clone(),
            );
        }
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

/// Whether more nodes than a quorum can spare refused the round with an error that
/// retrying cannot clear ([`ServerErrorKind::needs_a_change`]).
///
/// [`ServerErrorKind::needs_a_change`]: redlock_core::ServerErrorKind::needs_a_change
fn refused_until_changed(report: &RoundReport) -> bool {
    let refused = report
        .nodes
        .iter()
        .filter(|n| matches!(&n.outcome, NodeOutcome::ServerError(e) if e.kind.needs_a_change()))
        .count();
    refused > report.nodes.len().saturating_sub(report.quorum)
}

/// Whether no node refused a lost round: none held the keys for someone else, or said
/// that another waiter's turn had come (which a gated round's report counts as held). A
/// fair waiter's round lost so was the head's, wherever it got an answer.
fn not_refused(report: &RoundReport) -> bool {
    !report
        .nodes
        .iter()
        .any(|n| n.outcome == NodeOutcome::HeldByOther)
}

/// A fair waiter's lost rounds in a row that no node refused ([`not_refused`]) before it
/// steps back to the end of its keys' queues. A healthy head whose key is free wins its
/// first round; one that loses three without a refusal has answers that keep coming after
/// the node timeout, or reaches fewer nodes than a quorum, and would hold the waiters
/// behind it up for its whole wait. Three rides out a reconnection or a slow moment.
const HEAD_LOSSES_BEFORE_STEPPING_BACK: u32 = 3;

/// A lost round's report once every node answered and every rollback finished, waiting
/// at most a node timeout and not past the call's deadline; the report as decided if that
/// runs out.
async fn settle(
    report: &RoundReport,
    node_timeout: Duration,
    deadline: Option<Instant>,
) -> RoundReport {
    let mut bound = node_timeout;
    if let Some(d) = deadline {
        bound = bound.min(d.saturating_duration_since(Instant::now()));
    }
    match tokio::time::timeout(bound, report.settled()).await {
        Ok(settled) => settled,
        Err(_) => report.clone(),
    }
}

/// Woken attempts of one call that may lose before a waiter that queues only to be woken
/// (not fair) leaves the queue and polls. In the bench's P4 (every worker locks again as
/// soon as it released), waiters that stayed queued until their pause window reached
/// `max_delay` ran about four times the rounds of polling ones, and the lock went to
/// another worker three times as often, each such hand-off slower than the holder's own
/// retake: 0.91-1.01x polling's sections per second. Leaving after one or two losses: at
/// parity (0.95-1.05x over five runs each); two keeps the wake-up through one unlucky loss.
const WOKEN_LOSSES_BEFORE_POLLING: u32 = 2;

/// Whether a lock won with `remaining` validity (`None`: none left) may be handed to the
/// caller, who asked for at least `min_validity`. A lock with nothing left never is, even
/// at a `min_validity` of zero: it is released and the attempt counts as lost.
fn long_enough(remaining: Option<Duration>, min_validity: Duration) -> bool {
    remaining.is_some_and(|left| left >= min_validity)
}

/// The window a woken waiter's pause is drawn from: its last round's duration, doubled for
/// each of its call's woken attempts that lost, up to the retry policy's `max_delay` (or
/// one round, when that is longer).
fn wake_window(round: Duration, woken_losses: u32, max_delay: Duration) -> Duration {
    round
        .saturating_mul(1 << woken_losses.min(31))
        .min(max_delay.max(round))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock whose validity ran out between its round's decision and the check (its
    /// answer waited in a busy runtime, a fenced write-back ended with it) was handed to
    /// the caller as won whenever `min_validity` was zero, the default: `lock()` returned
    /// a lock that was not valid, and code that does not call `is_valid()` used the
    /// resource unprotected.
    #[test]
    fn a_lock_with_no_validity_left_is_never_long_enough() {
        assert!(!long_enough(None, Duration::ZERO));
        assert!(!long_enough(None, Duration::from_secs(1)));
        assert!(long_enough(Some(Duration::from_millis(1)), Duration::ZERO));
        assert!(long_enough(
            Some(Duration::from_secs(1)),
            Duration::from_secs(1)
        ));
        assert!(!long_enough(
            Some(Duration::from_millis(999)),
            Duration::from_secs(1)
        ));
    }

    #[test]
    fn the_wake_window_doubles_with_each_woken_loss_up_to_the_largest_backoff_delay() {
        let round = Duration::from_micros(250);
        let max = Duration::from_secs(1);
        assert_eq!(wake_window(round, 0, max), round);
        assert_eq!(wake_window(round, 1, max), round * 2);
        assert_eq!(wake_window(round, 5, max), round * 32);
        assert_eq!(wake_window(round, 6, max), round * 64);
        // 250 µs * 2^12 is past 1 s: the window stops there, as the backoff does.
        assert_eq!(wake_window(round, 12, max), max);
        assert_eq!(wake_window(round, u32::MAX, max), max);
        // A round longer than `max_delay` is still one window.
        assert_eq!(wake_window(max * 2, 0, max), max * 2);
        assert_eq!(wake_window(Duration::MAX, 6, max), Duration::MAX);
        assert_eq!(wake_window(Duration::ZERO, 3, max), Duration::ZERO);
    }
}

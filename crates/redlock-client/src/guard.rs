//! Holding a lock: the guard, the cheap handle given to scoped closures, and the lost signal.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use redlock_core::{Coordinator, Deadline, FencingToken, Lock, NodeOutcome, Renewed, RoundReport};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{Error, LostReason};
use crate::metrics;

/// What the guard, its handles and the renewal scheduler share.
pub(crate) struct HoldState {
    /// The lock as last acquired or extended.
    pub(crate) lock: Mutex<Lock>,
    pub(crate) status: watch::Sender<Status>,
    /// Released or dropped: renewal stops.
    pub(crate) done: AtomicBool,
    /// The TTL renewals ask for.
    pub(crate) ttl: Duration,
    /// When the guard was made, for how long a lost lock was held.
    acquired_at: Instant,
}

#[derive(Debug, Clone)]
pub(crate) struct Status {
    /// The end of the validity; a host suspend since it began counts as time passed.
    pub(crate) valid_until: Deadline,
    pub(crate) lost: Option<LostReason>,
    /// Since when renewals have failed without a refusal, and the last failure; cleared by
    /// the next successful renewal or extension.
    pub(crate) failing: Option<(Instant, String)>,
}

/// How a held lock is doing, for a holder that wants to stop work before the lock is lost
/// (like Apache Curator's `SUSPENDED` before `LOST`).
///
/// A renewal that fails for want of answers (nodes down, slow or partitioned) does not lose
/// the lock: it keeps the validity it had, and renewal is tried again sooner. The lock is
/// then [`RenewalFailing`](Self::RenewalFailing) until a renewal succeeds (back to
/// [`Healthy`](Self::Healthy)) or the validity runs out ([`Lost`](Self::Lost)). Read it
/// with [`LockGuard::health`], or wait for it to leave `Healthy` with
/// [`LockGuard::suspended`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HoldHealth {
    /// Held, and the last renewal (if any) succeeded.
    Healthy,
    /// Still valid, but the renewals since `since` failed to reach a quorum; the last one
    /// failed with `last_error`. Finish or pause the work: unless a renewal succeeds, the
    /// lock is lost at [`LockGuard::valid_until`].
    RenewalFailing {
        /// When the first of the failed renewals ended.
        since: Instant,
        /// Why the last renewal failed (its round's report).
        last_error: String,
    },
    /// No longer held, for this reason. Final: a lock whose validity ran out is not renewed
    /// again, and a renewal that was in flight then does not make it valid again.
    Lost(LostReason),
}

impl HoldState {
    pub(crate) fn new(lock: Lock, ttl: Duration) -> Arc<HoldState> {
        let status = Status {
            valid_until: lock.deadline(),
            lost: None,
            failing: None,
        };
        // Paired with the one `lock_ended` of `mark_lost`'s first call: every guard's
        // release, drop or loss goes through it.
        metrics::lock_taken();
        Arc::new(HoldState {
            lock: Mutex::new(lock),
            status: watch::Sender::new(status),
            done: AtomicBool::new(false),
            ttl,
            acquired_at: Instant::now(),
        })
    }

    pub(crate) fn current(&self) -> Lock {
        self.lock.lock().expect("lock state").clone()
    }

    /// Records a successful renewal: the validity moves on (never back, as in
    /// [`extended`](Self::extended)); the lock keeps its report, so that a renewal tick
    /// leaves no allocation behind per held lock. Changes nothing for a lock already lost
    /// (see [`record`](Self::record)).
    pub(crate) fn renewed(&self, renewal: &Renewed) {
        let _ = self.record(renewal.deadline(), |lock| lock.apply(renewal));
    }

    /// Records a successful extension. Extensions never shorten a key on the nodes, so
    /// the validity only moves forward: a renewal with the configured TTL that finishes
    /// after a longer manual extension does not take the longer validity back. `Err` with
    /// the reason for a lock already lost, which stays lost (see [`record`](Self::record)).
    pub(crate) fn extended(&self, lock: Lock) -> Result<(), LostReason> {
        let valid_until = lock.deadline();
        self.record(valid_until, |current| {
            if !current.deadline().ends_after(valid_until) {
                *current = lock;
            }
        })
    }

    /// The status after a successful extension or renewal: valid until at least
    /// `valid_until`, no longer failing, and `update` applied to the lock. Not for a lock
    /// that was lost, or whose validity ran out before the round's answer was recorded:
    /// its holder may have been told so already (`is_valid`, `health`), and a lock that was
    /// lost stays lost, whoever watched (see `renew_due`), with the lock itself unchanged
    /// too (taking the new validity on would make `lock().is_valid()` contradict the
    /// guard's).
    fn record(
        &self,
        valid_until: Deadline,
        update: impl FnOnce(&mut Lock),
    ) -> Result<(), LostReason> {
        let now = Instant::now();
        let mut outcome = Ok(());
        {
            // Held from the check to the update: a `mark_lost` waits for it (it marks the
            // loss holding this mutex), so a lost lock cannot take the extension's
            // validity on.
            let mut lock = self.lock.lock().expect("lock state");
            self.status.send_modify(|s| match &s.lost {
                Some(reason) => outcome = Err(reason.clone()),
                None if s.valid_until.is_past(now) => outcome = Err(LostReason::Expired),
                None => {
                    s.valid_until = s.valid_until.later(valid_until);
                    s.failing = None;
                }
            });
            if outcome.is_ok() {
                update(&mut lock);
            }
        }
        // Ran out before anyone marked it: lost now, as `renew_due` would have it.
        if outcome == Err(LostReason::Expired) {
            self.mark_lost(LostReason::Expired);
        }
        outcome
    }

    /// Records a renewal that failed without a refusal: the lock keeps its validity.
    pub(crate) fn renewal_failed(&self, error: String) {
        self.status.send_if_modified(|s| {
            if s.lost.is_some() {
                return false;
            }
            let since = s
                .failing
                .take()
                .map_or_else(Instant::now, |(since, _)| since);
            s.failing = Some((since, error));
            true
        });
    }

    fn health(&self) -> HoldHealth {
        health(&self.status.borrow())
    }

    /// Marks the lock no longer held, for `reason`; only the first call counts.
    pub(crate) fn mark_lost(&self, reason: LostReason) {
        let mut ended = None;
        // Held while the loss is marked and until the lock the guard hands out is ended
        // too: whoever the loss wakes (`lost()`) then finds `lock()` ended, never still
        // valid for a moment (and a concurrent `record` finishes first, see there).
        let mut lock = self.lock.lock().expect("lock state");
        self.status.send_modify(|s| {
            if s.lost.is_none() {
                // A lock released after its validity ran out was lost before: say so, even
                // if nobody watched for it.
                let expired = s.valid_until.is_past(Instant::now());
                ended = Some(match reason {
                    LostReason::Released if expired => LostReason::Expired,
                    ref other => other.clone(),
                });
                s.lost = Some(reason);
                // Lost is not valid, whoever reads the end of the validity.
                s.valid_until = s.valid_until.cut_now();
            }
        });
        let Some(reason) = ended else {
            return;
        };
        // The lock the guard hands out says so too: code given `lock()` must stop using
        // the resource when a majority said the key is no longer ours.
        lock.expire();
        drop(lock);
        metrics::lock_ended();
        if reason != LostReason::Released {
            metrics::lock_lost(&reason);
            let lock = self.current();
            tracing::warn!(
                key = lock.key(),
                nodes = lock.report().nodes.len(),
                reason = metrics::lost_reason_label(&reason),
                held_for = ?self.acquired_at.elapsed(),
                "lock lost: {reason}"
            );
        }
    }

    /// The end of the validity, brought forward by any host suspend since it began.
    pub(crate) fn valid_until(&self) -> Instant {
        self.status.borrow().valid_until.instant()
    }

    /// The start (`t0`) of the current validity, which a round's validity counts from:
    /// `valid_until = t0 + ttl - drift`, `drift` being the TTL's drift allowance.
    pub(crate) fn validity_start(&self, drift: Duration) -> Instant {
        self.valid_until()
            .checked_sub(self.ttl.saturating_sub(drift))
            .unwrap_or_else(Instant::now)
    }

    fn is_valid(&self) -> bool {
        let status = self.status.borrow();
        status.lost.is_none() && !status.valid_until.is_past(Instant::now())
    }
}

/// The health that `status` shows now.
fn health(status: &Status) -> HoldHealth {
    match (&status.lost, &status.failing) {
        (Some(reason), _) => HoldHealth::Lost(reason.clone()),
        (None, _) if status.valid_until.is_past(Instant::now()) => {
            HoldHealth::Lost(LostReason::Expired)
        }
        (None, Some((since, error))) => HoldHealth::RenewalFailing {
            since: *since,
            last_error: error.clone(),
        },
        (None, None) => HoldHealth::Healthy,
    }
}

/// Completes when the lock is no longer [`HoldHealth::Healthy`], with its health then.
async fn suspended(shared: Arc<HoldState>) -> HoldHealth {
    let mut rx = shared.status.subscribe();
    let mut suspend = redlock_core::suspend_watch();
    loop {
        let until = {
            let status = rx.borrow_and_update();
            match health(&status) {
                HoldHealth::Healthy => status.valid_until.instant(),
                HoldHealth::Lost(LostReason::Expired) if status.lost.is_none() => {
                    drop(status);
                    shared.mark_lost(LostReason::Expired);
                    return HoldHealth::Lost(LostReason::Expired);
                }
                other => return other,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep_until(until) => {}
            _ = rx.changed() => {}
            // The host was suspended: the validity's end came nearer, and the sleep above,
            // on the monotonic clock, would wake up to the whole suspend late.
            _ = suspend.changed() => {}
        }
    }
}

/// Completes when the lock is no longer held: a majority of nodes refused a renewal or an
/// extension, the validity ran out before a renewal succeeded, or the holder released it
/// (or dropped its guard).
async fn lost(shared: Arc<HoldState>) -> LostReason {
    let mut rx = shared.status.subscribe();
    let mut suspend = redlock_core::suspend_watch();
    loop {
        let (until, lost) = {
            let status = rx.borrow_and_update();
            (status.valid_until.instant(), status.lost.clone())
        };
        if let Some(reason) = lost {
            return reason;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(until) => {
                // A renewal may have moved the deadline while we slept; only an unmoved
                // deadline in the past means the lock is gone.
                if shared.valid_until() <= Instant::now() {
                    shared.mark_lost(LostReason::Expired);
                }
            }
            _ = rx.changed() => {}
            // The host was suspended: the end, read again, came nearer (or passed), and
            // the sleep above would wake up to the whole suspend late.
            _ = suspend.changed() => {}
        }
    }
}

/// A cheap, cloneable view of a held lock, for code that must watch the lock without owning
/// it (the closure of [`Redlock::with_lock`](crate::Redlock::with_lock), a worker task).
#[derive(Debug, Clone)]
pub struct LockHandle {
    shared: Arc<HoldState>,
}

impl LockHandle {
    /// The locked key (with the prefix; the first key of a multi-key lock).
    pub fn key(&self) -> String {
        self.shared.current().key().to_string()
    }

    /// The fencing token, for a fenced lock (see [`LockGuard::fencing_token`]).
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.shared.current().fencing_token()
    }

    /// Whether the lock is still valid now. Check it before each use of the resource.
    pub fn is_valid(&self) -> bool {
        self.shared.is_valid()
    }

    /// The validity left, or `None` once it has run out or the lock was lost.
    pub fn remaining(&self) -> Option<Duration> {
        self.is_valid().then(|| {
            self.shared
                .valid_until()
                .saturating_duration_since(Instant::now())
        })
    }

    /// The end of the current validity (moved forward by every renewal, and back by a
    /// host suspend since it began); once the lock is lost, no later than the moment it
    /// was (a refused renewal ends it then, not at its old deadline).
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// A future that completes when the lock is lost, with the reason
    /// ([`LostReason::Released`] once the guard was released or dropped). It owns what it
    /// needs, so it can be moved into another task or raced against work with
    /// `tokio::select!`. A host suspend counts as time passed (see
    /// [`Deadline`](redlock_core::Deadline)): a validity that ran out while the host slept
    /// completes this future within about a quarter of a second of the resume (see
    /// [`suspend_watch`](redlock_core::suspend_watch)).
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        lost(self.shared.clone())
    }

    /// How the lock is doing now (see [`HoldHealth`]).
    pub fn health(&self) -> HoldHealth {
        self.shared.health()
    }

    /// A future that completes as soon as the lock is no longer [`HoldHealth::Healthy`]:
    /// renewal started failing, or the lock was lost. Race it against work to stop early.
    pub fn suspended(&self) -> impl Future<Output = HoldHealth> + Send + 'static {
        suspended(self.shared.clone())
    }
}

/// A held lock. Release it with [`release`](Self::release), which reports what each node
/// did. A guard dropped without `release` is released in the background (and a warning is
/// logged), so the key does not linger for a whole TTL; the client's `shutdown` and its
/// coordinator's `quiesce` wait for that release. Dropped outside a tokio runtime (on a
/// plain thread), it is released in the runtime its client was connected in; only when that
/// runtime has shut down does the key expire with its TTL.
///
/// A guard keeps its client's connections and renewal running: dropping every
/// [`Redlock`](crate::Redlock) handle while guards live does not stop their renewal. Connections close
/// once the last client handle and the last guard are gone.
///
/// Once released (or dropped), the guard's handles report the lock as no longer valid and
/// their [`lost`](LockHandle::lost) futures complete with [`LostReason::Released`].
#[must_use = "dropping the guard releases the lock"]
pub struct LockGuard {
    shared: Arc<HoldState>,
    core: Coordinator,
    /// The client that made this guard: kept alive (its renewal task, its connections)
    /// while the guard lives.
    _client: KeepAlive,
    released: bool,
    attempts: u32,
}

/// The keys, the token (abbreviated) and the TTL: what a [`LockHandle`] shows.
impl std::fmt::Debug for HoldState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lock = self.current();
        f.debug_struct("HoldState")
            .field("keys", &lock.keys().collect::<Vec<_>>())
            .field("token", lock.token())
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// The keys, the token (abbreviated), the fencing token, the validity left and the
/// attempts: a few lines, not the client behind it.
impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lock = self.shared.current();
        f.debug_struct("LockGuard")
            .field("keys", &lock.keys().collect::<Vec<_>>())
            .field("token", lock.token())
            .field("fencing_token", &lock.fencing_token())
            .field("remaining", &self.remaining())
            .field("attempts", &self.attempts)
            .field("released", &self.released)
            .finish_non_exhaustive()
    }
}

/// Something kept alive for as long as its holder lives, whatever its type.
// Never read: holding it is the point.
#[allow(dead_code)]
pub(crate) struct KeepAlive(pub(crate) Arc<dyn std::any::Any + Send + Sync>);

impl std::fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeepAlive")
    }
}

impl LockGuard {
    pub(crate) fn new(
        shared: Arc<HoldState>,
        core: Coordinator,
        client: KeepAlive,
        attempts: u32,
    ) -> LockGuard {
        LockGuard {
            shared,
            core,
            _client: client,
            released: false,
            attempts,
        }
    }

    /// Stops renewal and tells every handle that the holder let the lock go.
    fn let_go(&self) {
        self.shared.done.store(true, Ordering::SeqCst);
        self.shared.mark_lost(LostReason::Released);
    }

    /// How many rounds the acquisition took (1 when the first attempt won).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The locked key, with the prefix (the first key of a multi-key lock).
    pub fn key(&self) -> String {
        self.handle().key()
    }

    /// Every locked key, with the prefix.
    pub fn keys(&self) -> Vec<String> {
        self.shared.current().keys().map(str::to_string).collect()
    }

    /// The fencing token, for a fenced lock (`None` otherwise): send it with every write to
    /// the protected resource, which must reject a token lower than the highest it has
    /// seen. See [`LockConfig::fencing`](crate::LockConfig::fencing).
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.handle().fencing_token()
    }

    /// The lock as the core sees it: token, TTL, validity, and the report of its
    /// acquisition or of its last [`extend`](Self::extend). Automatic renewal moves the
    /// validity on and keeps the report (a guard keeps no report per renewal tick: failing
    /// renewals show in [`health`](Self::health), the logs and the metrics).
    pub fn lock(&self) -> Lock {
        self.shared.current()
    }

    /// Whether the lock is still valid now.
    pub fn is_valid(&self) -> bool {
        self.shared.is_valid()
    }

    /// The validity left, or `None` once it has run out or the lock was lost.
    pub fn remaining(&self) -> Option<Duration> {
        self.handle().remaining()
    }

    /// The end of the current validity (see [`LockHandle::valid_until`]).
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// A handle that watches this lock without owning it.
    pub fn handle(&self) -> LockHandle {
        LockHandle {
            shared: self.shared.clone(),
        }
    }

    /// Completes when the lock is lost (see [`LockHandle::lost`]).
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        lost(self.shared.clone())
    }

    /// How the lock is doing now: [`HoldHealth::Healthy`], renewal failing (still valid,
    /// but the nodes did not confirm the last renewals), or lost.
    pub fn health(&self) -> HoldHealth {
        self.shared.health()
    }

    /// Completes as soon as the lock is no longer [`HoldHealth::Healthy`] (see
    /// [`LockHandle::suspended`]).
    pub fn suspended(&self) -> impl Future<Output = HoldHealth> + Send + 'static {
        suspended(self.shared.clone())
    }

    /// Extends the lock to at least `ttl` (or the TTL it was taken with) from now, by one
    /// extension round.
    ///
    /// An extension never shortens: nodes whose key lives longer keep their expiry, and
    /// the validity never moves back (a shorter `ttl` than the validity left changes
    /// nothing). On failure the lock keeps the validity it had, which the nodes still
    /// hold, because a failed extension only ever lengthened keys; when a majority of nodes
    /// answered that the key is no longer ours, the lock is marked lost
    /// ([`LostReason::Refused`]) at once. A lock that was lost already, or whose validity
    /// ran out before the extension's answer came, stays lost: [`Error::LockLost`], even
    /// when the nodes accepted the extension (its keys then expire with it).
    pub async fn extend(&self, ttl: Option<Duration>) -> Result<(), Error> {
        let lock = self.shared.current();
        match self
            .core
            .extend(&lock, ttl.unwrap_or(self.shared.ttl))
            .await
        {
            // A lock lost meanwhile (or before) stays lost: the extension's validity is not
            // the caller's to use, and its keys expire with it.
            Ok(extended) => self
                .shared
                .extended(extended)
                .map_err(|reason| Error::LockLost {
                    key: lock.key().to_string(),
                    reason,
                }),
            Err(e) => {
                if let redlock_core::Error::NoQuorum { report } = &e {
                    if refused_by_majority(report) {
                        self.shared.mark_lost(LostReason::Refused);
                    }
                }
                Err(e.into())
            }
        }
    }

    /// Asks the nodes whether they still hold this lock for this guard: one inspection
    /// round per key (see [`Inspection::held_by`](redlock_core::Inspection::held_by)).
    /// `Ok(true)` only when a quorum of nodes hold every key with this guard's token;
    /// `Ok(false)` when they do not, or when too few nodes answered to confirm it (read
    /// [`Redlock::inspect`](crate::Redlock::inspect) to tell the two apart). A snapshot:
    /// use [`is_valid`](Self::is_valid) before each use of the resource, and this to find
    /// out whether the lock was taken from under the holder (a key lost on the nodes, an
    /// expiry the holder missed).
    pub async fn check(&self) -> Result<bool, Error> {
        let lock = self.shared.current();
        let inspections = join_all(lock.keys().map(|key| self.core.inspect(key))).await;
        for inspection in inspections {
            if inspection?.held_by(lock.token()) != Some(true) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Releases the lock on every node and reports what each did. Stops renewal first, and
    /// from then on the guard's handles report the lock as not valid.
    pub async fn release(mut self) -> Result<RoundReport, Error> {
        self.released = true;
        self.let_go();
        let lock = self.shared.current();
        Ok(self.core.release(&lock).await?)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.let_go();
        let lock = self.shared.current();
        let key = lock.key().to_string();
        if self.core.release_in_background(lock) {
            tracing::warn!(%key, "lock guard dropped without release(); releasing it in the background");
        } else {
            tracing::warn!(
                %key,
                "lock guard dropped without release() after its client's runtime shut down; the key expires with its TTL"
            );
        }
    }
}

/// Whether so many nodes answered "not ours" that no quorum can hold the key for us.
pub(crate) fn refused_by_majority(report: &redlock_core::RoundReport) -> bool {
    let refused = report
        .nodes
        .iter()
        .filter(|n| n.outcome == NodeOutcome::NotHeld)
        .count();
    report.out_of_reach(refused)
}

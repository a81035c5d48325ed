//! What a guard, its handles and the renewal scheduler share about one held lock: the lock
//! as last acquired or extended, its status (validity, loss, failing renewals) and the
//! health read from it, and the futures that wait for it to be suspended or lost. Apart
//! from the guard, since the renewal scheduler holds it too.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock_core::{Deadline, Lock, Renewed};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::LostReason;
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
///
/// [`LockGuard::health`]: super::LockGuard::health
/// [`LockGuard::suspended`]: super::LockGuard::suspended
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HoldHealth {
    /// Held, and the last renewal (if any) succeeded.
    Healthy,
    /// Still valid, but the renewals since `since` failed to reach a quorum; the last one
    /// failed with `last_error`. Finish or pause the work: unless a renewal succeeds, the
    /// lock is lost at [`LockGuard::valid_until`].
    ///
    /// [`LockGuard::valid_until`]: super::LockGuard::valid_until
    RenewalFailing {
        /// When the first of the failed renewals ended.
        since: Instant,
        /// Why the last renewal failed (its round's report).
        last_error: String,
    },
    /// Not held, for this reason. Final: a lock whose validity ran out is not renewed
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
    /// `valid_until`, not failing, and `update` applied to the lock. Not for a lock
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

    pub(super) fn health(&self) -> HoldHealth {
        health(&self.status.borrow())
    }

    /// Marks the lock not held, for `reason`; only the first call counts.
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
        // the resource when a majority said the key is not ours.
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

    pub(super) fn is_valid(&self) -> bool {
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

/// Completes when the lock leaves [`HoldHealth::Healthy`], with its health then.
pub(super) async fn suspended(shared: Arc<HoldState>) -> HoldHealth {
    let mut rx = shared.status.subscribe();
    let mut suspend = redlock_core::support::suspend_watch();
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

/// Completes when the hold ends: a majority of nodes refused a renewal or an
/// extension, the validity ran out before a renewal succeeded, or the holder released it
/// (or dropped its guard).
pub(super) async fn lost(shared: Arc<HoldState>) -> LostReason {
    let mut rx = shared.status.subscribe();
    let mut suspend = redlock_core::support::suspend_watch();
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

/// The keys, the token (abbreviated) and the TTL: what a [`LockHandle`](super::LockHandle) shows.
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

//! Holding a lock: the guard, the cheap handle given to scoped closures, and the lost signal.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock_core::{Coordinator, FencingToken, Lock, NodeOutcome, RoundReport};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{Error, LostReason};

/// What the guard, its handles and the renewal scheduler share.
#[derive(Debug)]
pub(crate) struct HoldState {
    /// The lock as last acquired or extended.
    pub(crate) lock: Mutex<Lock>,
    pub(crate) status: watch::Sender<Status>,
    /// Released or dropped: renewal stops.
    pub(crate) done: AtomicBool,
    /// The TTL renewals ask for.
    pub(crate) ttl: Duration,
}

#[derive(Debug, Clone)]
pub(crate) struct Status {
    pub(crate) valid_until: Instant,
    pub(crate) lost: Option<LostReason>,
}

impl HoldState {
    pub(crate) fn new(lock: Lock, ttl: Duration) -> Arc<HoldState> {
        let status = Status {
            valid_until: lock.valid_until(),
            lost: None,
        };
        Arc::new(HoldState {
            lock: Mutex::new(lock),
            status: watch::Sender::new(status),
            done: AtomicBool::new(false),
            ttl,
        })
    }

    pub(crate) fn current(&self) -> Lock {
        self.lock.lock().expect("lock state").clone()
    }

    /// Records a successful extension. Extensions never shorten a key on the nodes, so
    /// the validity only moves forward: a renewal with the configured TTL that finishes
    /// after a longer manual extension does not take the longer validity back.
    pub(crate) fn extended(&self, lock: Lock) {
        let valid_until = lock.valid_until();
        {
            let mut current = self.lock.lock().expect("lock state");
            if valid_until >= current.valid_until() {
                *current = lock;
            }
        }
        self.status.send_modify(|s| {
            if s.lost.is_none() {
                s.valid_until = s.valid_until.max(valid_until);
            }
        });
    }

    pub(crate) fn mark_lost(&self, reason: LostReason) {
        self.status.send_modify(|s| {
            if s.lost.is_none() {
                s.lost = Some(reason);
            }
        });
    }

    fn valid_until(&self) -> Instant {
        self.status.borrow().valid_until
    }

    fn is_valid(&self) -> bool {
        let status = self.status.borrow();
        status.lost.is_none() && status.valid_until > Instant::now()
    }
}

/// Completes when the lock is no longer held: a majority of nodes refused a renewal or an
/// extension, the validity ran out before a renewal succeeded, or the holder released it
/// (or dropped its guard).
async fn lost(shared: Arc<HoldState>) -> LostReason {
    let mut rx = shared.status.subscribe();
    loop {
        let (until, lost) = {
            let status = rx.borrow_and_update();
            (status.valid_until, status.lost.clone())
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

    /// The end of the current validity (moved forward by every renewal).
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// A future that completes when the lock is lost, with the reason
    /// ([`LostReason::Released`] once the guard was released or dropped). It owns what it
    /// needs, so it can be moved into another task or raced against work with
    /// `tokio::select!`.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        lost(self.shared.clone())
    }
}

/// A held lock. Release it with [`release`](Self::release), which reports what each node
/// did. A guard dropped without `release` is released in the background (and a warning is
/// logged), so the key does not linger for a whole TTL; the client's `shutdown` and its
/// coordinator's `quiesce` wait for that release. Outside a tokio runtime the key expires
/// with its TTL.
///
/// A guard keeps its client's connections and renewal running: dropping every
/// [`Redlock`](crate::Redlock) handle while guards live does not stop their renewal. Connections close
/// once the last client handle and the last guard are gone.
///
/// Once released (or dropped), the guard's handles report the lock as no longer valid and
/// their [`lost`](LockHandle::lost) futures complete with [`LostReason::Released`].
#[derive(Debug)]
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

    /// The lock as the core sees it: token, TTL, the report of its last round.
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

    /// The end of the current validity.
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

    /// Extends the lock to at least `ttl` (or the TTL it was taken with) from now, by one
    /// extension round.
    ///
    /// An extension never shortens: nodes whose key lives longer keep their expiry, and
    /// the validity never moves back (a shorter `ttl` than the validity left changes
    /// nothing). On failure the lock keeps the validity it had, which the nodes still
    /// hold, because a failed extension only ever lengthened keys; when a majority of nodes
    /// answered that the key is no longer ours, the lock is marked lost
    /// ([`LostReason::Refused`]) at once.
    pub async fn extend(&self, ttl: Option<Duration>) -> Result<(), Error> {
        let lock = self.shared.current();
        match self
            .core
            .extend(&lock, ttl.unwrap_or(self.shared.ttl))
            .await
        {
            Ok(extended) => {
                self.shared.extended(extended);
                Ok(())
            }
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
                "lock guard dropped without release() outside a tokio runtime; the key expires with its TTL"
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
    refused > report.nodes.len() - report.quorum
}

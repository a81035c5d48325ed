//! Holding a lock: the guard, the cheap handle given to scoped closures, and the lost signal.
//!
//! This file holds the guard: what it owns, `extend`, `check`, and its release, explicit or
//! on drop. `handle` holds the cheap view given to scoped closures, `state` what the guard,
//! its handles and the renewal scheduler share, with the lost and suspended signals.

mod handle;
mod state;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use redlock_core::{Coordinator, FencingToken, Lock, NodeOutcome, RoundReport};
use tokio::time::Instant;

use crate::error::{Error, LostReason};
pub use handle::LockHandle;
pub use state::HoldHealth;
pub(crate) use state::HoldState;
use state::{lost, suspended};

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
/// Once released (or dropped), the guard's handles report the lock as not valid and
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

    /// Completes as soon as the lock leaves [`HoldHealth::Healthy`] (see
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
    /// answered that the key is not ours, the lock is marked lost
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

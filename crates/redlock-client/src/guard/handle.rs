//! A cheap, cloneable view of a held lock, for code that watches it without owning it.
//! Apart from the guard, which owns the lock and releases it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redlock_core::FencingToken;
use tokio::time::Instant;

use super::state::{lost, suspended, HoldHealth, HoldState};
use crate::error::LostReason;

/// A cheap, cloneable view of a held lock, for code that must watch the lock without owning
/// it (the closure of [`Redlock::with_lock`](crate::Redlock::with_lock), a worker task).
#[derive(Debug, Clone)]
pub struct LockHandle {
    pub(super) shared: Arc<HoldState>,
}

impl LockHandle {
    /// The locked key (with the prefix; the first key of a multi-key lock).
    pub fn key(&self) -> String {
        self.shared.current().key().to_string()
    }

    /// The fencing token, for a fenced lock (see [`LockGuard::fencing_token`]).
    ///
    /// [`LockGuard::fencing_token`]: super::LockGuard::fencing_token
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
    /// [`suspend_watch`](redlock_core::support::suspend_watch)).
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        lost(self.shared.clone())
    }

    /// How the lock is doing now (see [`HoldHealth`]).
    pub fn health(&self) -> HoldHealth {
        self.shared.health()
    }

    /// A future that completes as soon as the lock leaves [`HoldHealth::Healthy`]:
    /// renewal started failing, or the lock was lost. Race it against work to stop early.
    pub fn suspended(&self) -> impl Future<Output = HoldHealth> + Send + 'static {
        suspended(self.shared.clone())
    }
}

//! Acquisition rounds: one key, several keys or a reentrant hold, plain or fenced.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::coordinator::Coordinator;
use crate::deadline::{host_suspended, Deadline};
use crate::error::{ArgumentError, Error};
use crate::fair::FairPlace;
use crate::fence;
use crate::layout::hash_tag;
use crate::lock::Lock;
use crate::lock_spec::LockSpec;
use crate::report::RoundKind;
use crate::round::Round;
use crate::token::Token;

mod fenced;
mod permit;
mod rwlock;

use fenced::Bounds;
pub use permit::{PermitAcquisition, MAX_PERMITS};
pub use rwlock::RwAcquisition;

/// What one acquisition round takes: one key (a plain or reentrant lock) or several (all
/// or nothing), under which token, for how long, and whether it is fenced.
///
/// ```
/// use std::time::Duration;
/// use redlock_core::Acquisition;
///
/// let keys = ["invoice:42"];
/// let fenced = Acquisition {
///     fenced: true,
///     ..Acquisition::new(&keys, Duration::from_secs(10))
/// };
/// assert!(fenced.owner.is_none());
/// ```
#[derive(Debug, Clone)]
pub struct Acquisition<'a> {
    /// The keys: one for a plain or reentrant lock, several for a lock over all of them.
    pub keys: &'a [&'a str],
    /// For a reentrant lock (one key only): its owner.
    pub owner: Option<&'a str>,
    /// The token stored under the keys. Defaults to a fresh random one. A caller's token
    /// may not contain `~`: a value `"<waiter>~<number>"` is a key handed over to fair
    /// waiter `<waiter>` (see [`FairPlace::handover`]), which that waiter's next attempt
    /// takes on as its own.
    pub token: Token,
    /// The lock's TTL.
    pub ttl: Duration,
    /// Whether the lock gets a fencing token ([`Lock::fencing_token`]). It costs one more
    /// round trip: the token's write-back. Defaults to `false`.
    pub fenced: bool,
    /// For a fair acquisition: the waiter's place in its keys' queues ([`FairPlace`]). Every
    /// shape of lock waits in them: plain, reentrant or over several keys (which must head
    /// the queue of each of its keys), fenced or not. Only a plain lock of one key's
    /// attempt, not fenced, registers the place's [`handover`](FairPlace::handover): a
    /// release hands such a waiter the key, and tells the others (which then run a
    /// round). An attempt that is not won puts the waiter back in the queues wherever its
    /// rollback frees the keys (the script that set them took it out), so that every node
    /// keeps the same queue. Defaults to `None`.
    pub fair: Option<FairPlace<'a>>,
    /// For a waiter that is not fair: its place in the key's queue all the same, only so
    /// that the release of the key wakes the oldest waiter's client instead of every
    /// client's. The attempt is not gated: it tries `SET NX` wherever it stands in the
    /// queue, and the releasing holder or a newcomer may still take the lock first. Same
    /// shapes as [`fair`](Self::fair), which wins when both are set. Defaults to `None`.
    pub queued: Option<FairPlace<'a>>,
    /// For a fenced acquisition: when the fencing step (reading the counters when needed,
    /// and the token's write-back) must be over. Past it, the won lock is released in the
    /// background and the acquisition fails with [`Error::NotFenced`], so the call returns
    /// by this instant or one node timeout after it started, whichever is later. `None`
    /// (the default): the fencing step takes up to two or three node timeouts after the
    /// acquisition round. Plain acquisitions are one round, bounded by the node timeout,
    /// and ignore it.
    pub deadline: Option<Instant>,
}

impl<'a> Acquisition<'a> {
    /// A plain, unfenced acquisition of `keys` for `ttl` with a fresh random token.
    pub fn new(keys: &'a [&'a str], ttl: Duration) -> Self {
        Acquisition {
            keys,
            owner: None,
            token: Token::random(),
            ttl,
            fenced: false,
            fair: None,
            queued: None,
            deadline: None,
        }
    }
}

impl Coordinator {
    /// One acquisition round with a fresh random token.
    pub async fn acquire(&self, key: &str, ttl: Duration) -> Result<Lock, Error> {
        self.acquire_with(Acquisition::new(&[key], ttl)).await
    }

    /// One acquisition round: `SET key token NX PX ttl` on every node at once, decided as
    /// soon as a quorum accepted or can no longer accept.
    ///
    /// Won only with a quorum and positive validity. Otherwise, and also when this future
    /// is dropped before it finishes, the key is deleted again on every node where it holds
    /// `token`, including nodes that answer after the decision; that runs in the
    /// background, and [`RoundReport::settled`](crate::RoundReport::settled) or
    /// [`quiesce`](Self::quiesce) wait for it.
    pub async fn acquire_with_token(
        &self,
        key: &str,
        token: Token,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let keys = [key];
        self.acquire_with(Acquisition {
            token,
            ..Acquisition::new(&keys, ttl)
        })
        .await
    }

    /// One acquisition round over several keys, all or nothing: each node sets every key or
    /// none (one script per node), and the lock is won when a quorum of nodes set them all.
    /// A cluster member takes keys of several hash slots in one script per slot, sent
    /// together, and counts only if every slot set its keys; see
    /// [`NodeOutcome::PartlyHeldByOther`](crate::NodeOutcome::PartlyHeldByOther).
    /// Rolled back like [`acquire_with_token`](Self::acquire_with_token).
    pub async fn acquire_many<K: AsRef<str>>(
        &self,
        keys: &[K],
        token: Token,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let keys: Vec<&str> = keys.iter().map(AsRef::as_ref).collect();
        self.acquire_with(Acquisition {
            token,
            ..Acquisition::new(&keys, ttl)
        })
        .await
    }

    /// One acquisition round of a reentrant lock: succeeds when the key is free or already
    /// held by `owner`, adding one hold (identified by `token`) either way. Each hold is
    /// released on its own; the key goes with the last one. A key is used either reentrantly
    /// or not: a plain lock and a reentrant lock on one key see each other as taken.
    pub async fn acquire_reentrant(
        &self,
        key: &str,
        owner: &str,
        token: Token,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let keys = [key];
        self.acquire_with(Acquisition {
            owner: Some(owner),
            token,
            ..Acquisition::new(&keys, ttl)
        })
        .await
    }

    /// One acquisition round as `what` describes; every other `acquire` method calls this.
    ///
    /// A fenced acquisition reads each node's fencing counter in the same script as its
    /// `SET NX`; once won, it takes `max + 1` over a quorum of nodes that have a counter,
    /// writes that back (raise-only) to every node, and returns the lock with the token
    /// only after a quorum recorded it and while the lock is still valid. Otherwise it
    /// releases the lock again and fails with [`Error::NotFenced`] (a retry may get one),
    /// or with [`Error::FencingCountersLost`] when a quorum lost its counters. Each fenced
    /// acquisition, reentrant holds and locks over several keys included, gets its own
    /// token; extensions keep it.
    pub async fn acquire_with(&self, what: Acquisition<'_>) -> Result<Lock, Error> {
        let config = &self.inner.config;
        check_owner(what.owner, what.keys)?;
        // The fair place gates the attempt; a queued one only enqueues it.
        let place = what.fair.or(what.queued);
        if let Some(place) = &place {
            place.check()?;
        }
        what.token.check_not_handover()?;
        let mut spec = LockSpec::new(what.keys, what.token, what.owner.map(Arc::from))?;
        spec.fair = what.fair.is_some();
        if let Some(key) = what.keys.iter().find(|k| config.is_reserved(k)) {
            return Err(ArgumentError::ReservedKey {
                key: key.to_string(),
            }
            .into());
        }
        let ttl = config.check_ttl(what.ttl)?;
        self.acquire_spec(spec, ttl, place, what.fenced, what.deadline)
            .await
    }

    /// The acquisition of `spec` (checked) for `ttl` (checked), in the queues of `place`
    /// when it has one, fenced when `fenced`: one round, or a place in a grouped one.
    pub(crate) async fn acquire_spec(
        &self,
        spec: LockSpec,
        ttl: Duration,
        place: Option<FairPlace<'_>>,
        fenced: bool,
        deadline: Option<Instant>,
    ) -> Result<Lock, Error> {
        if self.inner.groups && spec.groups() && !fenced && place.is_none() {
            // Concurrent plain acquisitions share their rounds (group commit).
            return self.acquire_grouped(spec, ttl).await;
        }
        // Before the round's start, for a fenced acquisition only: the write-back window
        // (suspend counted), and the highest token handed out before this acquisition
        // began, which its token must pass.
        let bounds = fenced.then(|| self.fencing_bounds()).transpose()?;
        let round = self.acquisition_round(&spec, ttl, place.as_ref(), (spec.fair, fenced));
        let decided = self.run_one(round).await;
        let Some(bounds) = bounds else {
            return decided.into_lock(spec, ttl, None);
        };
        self.fenced_lock(decided, spec, ttl, bounds, deadline).await
    }

    /// What a fenced acquisition's token must meet, taken before its round starts; `Err`
    /// with a cluster member and a fence key without a hash tag (see `Inner::cluster`).
    fn fencing_bounds(&self) -> Result<Bounds, ArgumentError> {
        let fence_key = &self.inner.config.fence_key;
        if let Some(node) = self
            .inner
            .cluster
            .as_ref()
            .filter(|_| hash_tag(fence_key).is_none())
        {
            return Err(ArgumentError::FencingOnCluster {
                node: node.to_string(),
                fence_key: fence_key.clone(),
            });
        }
        Ok(Bounds {
            window: Deadline::new(Instant::now() + fence::WRITE_BACK_WINDOW, host_suspended()),
            floor: self.inner.fencing.handed_out.load(Ordering::SeqCst),
        })
    }

    /// The acquisition round of `spec` for `ttl`: in the queues of `place` when it has one
    /// (gated by it when `fair`), and reading the fencing counters when `fenced`.
    fn acquisition_round(
        &self,
        spec: &LockSpec,
        ttl: Duration,
        place: Option<&FairPlace<'_>>,
        (fair, fenced): (bool, bool),
    ) -> Round {
        let config = &self.inner.config;
        let fence_key = fenced.then_some(config.fence_key.as_str());
        Round {
            kind: RoundKind::Acquire,
            alternatives: false,
            // A lock over keys of several hash slots goes to a cluster member as one share
            // per slot (see `LockSpec::by_slot`).
            command: spec.by_slot(
                self.inner.cluster.is_some(),
                Some(ttl),
                |share| match place {
                    Some(place) => {
                        share.acquire_queued(ttl, place, fair, &config.fair_prefix, fence_key)
                    }
                    None => share.acquire(ttl, fence_key),
                },
            ),
            requests: vec![match place {
                Some(place) => spec.acquire_queued_request(
                    ttl,
                    place,
                    (fair, fenced),
                    &config.fair_prefix,
                    self.inner.release_channel.as_ref(),
                ),
                None => spec.acquire_request(ttl),
            }],
            drift_factor: config.drift_factor,
        }
    }
}

/// Whether `owner`, for a reentrant lock, goes with `keys`: it may not be empty, and a
/// reentrant lock has one key.
fn check_owner(owner: Option<&str>, keys: &[&str]) -> Result<(), Error> {
    if let Some(owner) = owner {
        if owner.is_empty() {
            return Err(ArgumentError::EmptyOwner.into());
        }
        if keys.len() != 1 {
            return Err(ArgumentError::ReentrantKeys { count: keys.len() }.into());
        }
    }
    Ok(())
}

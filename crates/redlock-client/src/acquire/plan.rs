//! What one call asks for, with every per-call override resolved and checked before the
//! first round: nothing about the call's settings can fail after a round won.

use std::time::Duration;

use crate::config::LockConfig;
use crate::error::Error;
use crate::owner::Owner;
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
    /// Whether this lock gets a fencing token ([`LockGuard::fencing_token`](crate::LockGuard::fencing_token)). Defaults to
    /// the client's `fencing`.
    pub fenced: Option<bool>,
    /// Whether this lock waits in its keys' fair queues (see [`LockConfig::fair`]). Defaults
    /// to the client's `fair`.
    pub fair: Option<bool>,
    /// The least validity an acquisition must leave for this call (see
    /// [`LockConfig::min_validity`]). Defaults to the client's `min_validity`.
    pub min_validity: Option<Duration>,
}

/// What a round tries to take.
#[derive(Clone, Copy)]
pub(crate) enum Shape<'a> {
    /// One key.
    One(&'a str),
    /// Several keys, all or none.
    Many(&'a [String]),
    /// One key, reentrantly for its owner.
    Reentrant(&'a str, &'a Owner),
    /// A permit of a semaphore: its `name` (as the core takes it), the name `shown` in
    /// errors and traces, and its number of `permits`.
    Permit {
        name: &'a str,
        shown: &'a str,
        permits: u32,
    },
    /// A read-write lock's read or write side: its `name` (as the core takes it), the name
    /// `shown`, and for the write side the writer's id for its intent.
    Rw {
        name: &'a str,
        shown: &'a str,
        writer: Option<&'a str>,
    },
}

impl<'a> Shape<'a> {
    /// The full keys, in order; for a semaphore, what its permits' keys start with.
    pub(super) fn keys(self) -> Vec<String> {
        match self {
            Shape::One(key) | Shape::Reentrant(key, _) => vec![key.to_string()],
            Shape::Many(keys) => keys.to_vec(),
            Shape::Permit { shown, .. } => vec![shown.to_string()],
            // A reader waits for the writer's release; a writer for it or the last
            // reader's.
            Shape::Rw { shown, writer, .. } => {
                let mut keys = vec![format!("{shown}:write")];
                if writer.is_some() {
                    keys.push(format!("{shown}:read"));
                }
                keys
            }
        }
    }

    /// The keys whose fair queues a waiter for `keys` (from [`keys`](Self::keys)) enters:
    /// a read-write lock has one queue, its writer's key's, for both sides; a semaphore
    /// one, its base key's (its one key here).
    pub(super) fn queues(self, keys: &[String]) -> &[String] {
        match self {
            Shape::Rw { .. } => &keys[..1],
            _ => keys,
        }
    }

    /// The name of the lock, or of the semaphore, in errors and traces.
    pub(super) fn name(self, keys: &[String]) -> String {
        match self {
            Shape::Permit { shown, .. } | Shape::Rw { shown, .. } => shown.to_string(),
            _ => redlock_core::support::lock_name(keys),
        }
    }

    /// The owner of a reentrant hold.
    pub(super) fn owner(self) -> Option<&'a str> {
        match self {
            Shape::Reentrant(_, owner) => Some(owner.as_str()),
            Shape::One(_) | Shape::Many(_) | Shape::Permit { .. } | Shape::Rw { .. } => None,
        }
    }
}

/// One call's settings.
pub(super) struct Plan<'a> {
    pub(super) ttl: Duration,
    pub(super) renew: bool,
    pub(super) fenced: bool,
    pub(super) fair: bool,
    pub(super) retry: &'a RetryPolicy,
    /// The least validity a won round must leave (zero: any).
    pub(super) min_validity: Duration,
    /// How long a queue entry outlives the waiter's last attempt.
    pub(super) patience: Duration,
    /// Whether the call may make more than one attempt.
    pub(super) waits: bool,
}

impl<'a> Plan<'a> {
    /// `options` over `config`, checked as the configuration is at connect.
    pub(super) fn resolve(config: &'a LockConfig, options: &'a LockOptions) -> Result<Self, Error> {
        let renew = options.renew.unwrap_or(config.renewal.enabled);
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
        Ok(Plan {
            ttl,
            renew,
            fenced: options.fenced.unwrap_or(config.fencing),
            fair: options.fair.unwrap_or(config.fair),
            retry,
            min_validity: min_validity.unwrap_or(Duration::ZERO),
            patience: config.fair_patience_for(retry),
            waits: retry.max_attempts != Some(1),
        })
    }

    /// Whether the call takes a place in its keys' fair queues (and so needs a waiter id).
    ///
    /// A fair call queues from its first attempt, gated. Without `fair`, a call that may
    /// wait for a lock of one key (fenced or not, not reentrant) still queues from its
    /// second attempt on, ungated, when wake-ups are on: a release then wakes the client of
    /// the oldest waiter instead of one waiter in every client (a release announced to
    /// every client costs each client and each node more than the waiters' rounds do), and
    /// a release that finds nobody queued is announced to nobody, which spares every
    /// uncontended lock the messages. A call of one attempt (`try_lock`) never waits, so it
    /// neither queues nor needs a wake-up unless it is fair.
    pub(super) fn queues(&self, shape: Shape<'_>, notify: bool) -> bool {
        self.fair || (self.waits && notify && matches!(shape, Shape::One(_)))
    }

    /// Whether the call listens for releases: one that waits or queues, and a reentrant
    /// one, which wakes its owner's other waiters for the key in this client when it wins.
    /// Registering costs a waiter id and a turn of the registry's lock, which calls that
    /// never wait are spared.
    ///
    /// A semaphore's waiter does not, unless it is fair: it tries again after its backoff's
    /// delay. Each release woke a waiter in every client, whose rounds then split the
    /// permits' votes, and under contention that gave fewer permits per second than polling
    /// (see `docs/benchmarks.md`). A fair waiter is told by name when its turn may have
    /// come (a release, or the win or leave of the waiter ahead of it), and only waiters
    /// whose turn came try.
    pub(super) fn watches(&self, shape: Shape<'_>) -> bool {
        match shape {
            Shape::Permit { .. } => self.fair,
            Shape::Reentrant(..) => true,
            _ => self.waits || self.fair,
        }
    }

    /// Whether a fair attempt registers a hand-over: only a plain lock of one key is handed
    /// over (a reentrant hold or a fencing token needs a round); the others are woken and
    /// run one.
    pub(super) fn hands_over(&self, shape: Shape<'_>) -> bool {
        matches!(shape, Shape::One(_)) && !self.fenced
    }
}

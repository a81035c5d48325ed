//! An acquired lock: the key, the token that proves ownership, and its validity deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::deadline::Deadline;
use crate::fence::FencingToken;
use crate::report::RoundReport;
use crate::token::Token;

/// A lock won by a round. Plain data: it does nothing when dropped (`redlock-client`'s guard
/// adds release-on-drop and renewal). The holder may use the protected resource only while
/// [`is_valid`](Lock::is_valid) is true, and must stop before
/// [`valid_until`](Lock::valid_until): no lock service can stop a holder that pauses past
/// its validity (fence the resource for that).
#[derive(Clone)]
pub struct Lock {
    /// The keys, in the caller's order (one for a plain lock).
    pub(crate) keys: Arc<[Arc<str>]>,
    /// The keys as reports name them.
    pub(crate) name: Arc<str>,
    pub(crate) token: Token,
    /// How the nodes hold it (see [`crate::kind`]).
    pub(crate) kind: &'static dyn crate::kind::Kind,
    /// The owner, for a reentrant lock (the kind's argument).
    pub(crate) owner: Option<Arc<str>>,
    /// Won through a fair queue (`support::FairPlace`).
    pub(crate) fair: bool,
    pub(crate) ttl: Duration,
    pub(crate) valid_until: Deadline,
    /// Shared: a held lock is copied for every renewal tick and every `lock()` call.
    pub(crate) report: Arc<RoundReport>,
    /// For a fenced acquisition: its token, handed out only after a quorum recorded it.
    pub(crate) fencing_token: Option<FencingToken>,
}

/// The owner shows as its first characters only, as the token does: either lets its
/// bearer act as the holder (an owner enters a reentrant lock it holds).
impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("keys", &self.keys)
            .field("kind", &self.kind)
            .field("token", &self.token)
            .field(
                "owner",
                &self.owner.as_deref().map(crate::token::abbreviated),
            )
            .field("fair", &self.fair)
            .field("ttl", &self.ttl)
            .field("valid_until", &self.valid_until)
            .field("report", &self.report)
            .field("fencing_token", &self.fencing_token)
            .finish()
    }
}

impl Lock {
    /// The locked key (the first one, for a lock over several keys).
    pub fn key(&self) -> &str {
        &self.keys[0]
    }

    /// Every locked key.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> {
        self.keys.iter().map(|k| &**k)
    }

    /// The owner, for a reentrant lock.
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    /// The token stored under the key on the nodes (for a reentrant lock: this hold's
    /// token).
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// The TTL the last acquisition or extension set.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The end of the validity: `t0 + ttl - drift`, with `t0` read before the round's first
    /// command was sent, brought forward by any host suspend since `t0` (see [`Deadline`]).
    pub fn valid_until(&self) -> Instant {
        self.valid_until.instant()
    }

    /// The end of the validity with what it takes to count host suspend (see
    /// [`Deadline`]): what [`valid_until`](Self::valid_until) reads.
    pub fn deadline(&self) -> Deadline {
        self.valid_until
    }

    /// Takes on the validity (and TTL) of `extended`, an extension of this same lock (the
    /// same keys and token) that ends later, and keeps this lock's report and everything
    /// else: what a holder that renews many locks keeps instead of every renewal's report.
    /// Does nothing when `extended` is another lock or ends no later.
    pub fn renew_from(&mut self, extended: &Lock) {
        self.take_on(
            &extended.keys,
            &extended.token,
            extended.ttl,
            extended.valid_until,
        );
    }

    /// Takes on the validity (and TTL) of `renewed`, a won extension of this same lock (the
    /// same keys and token) from [`Coordinator::renew_many`](crate::Coordinator::renew_many),
    /// when it ends later; does nothing otherwise.
    pub fn apply(&mut self, renewed: &Renewed) {
        self.take_on(
            &renewed.keys,
            &renewed.token,
            renewed.ttl,
            renewed.valid_until,
        );
    }

    /// Takes on `ttl` and `valid_until` when they belong to this lock (`keys` and `token`)
    /// and end later.
    fn take_on(&mut self, keys: &[Arc<str>], token: &Token, ttl: Duration, valid_until: Deadline) {
        if *token == self.token && *keys == *self.keys && valid_until.ends_after(self.valid_until) {
            self.valid_until = valid_until;
            self.ttl = ttl;
        }
    }

    /// Ends the validity now (when it ends later): for a holder that learned the lock is no
    /// longer its own (a majority refused its extension), so that whoever reads this lock
    /// afterwards ([`is_valid`](Self::is_valid), [`remaining`](Self::remaining)) stops
    /// using the resource. Copies taken before keep their validity.
    pub fn expire(&mut self) {
        self.valid_until = self.valid_until.cut_now();
    }

    /// What a won extension of this lock that ends at `valid_until` amounts to.
    pub(crate) fn renewed(&self, ttl: Duration, valid_until: Deadline) -> Renewed {
        Renewed {
            keys: self.keys.clone(),
            token: self.token.clone(),
            ttl,
            valid_until: valid_until.later(self.valid_until),
        }
    }

    /// The validity left now, or `None` once it has run out.
    pub fn remaining(&self) -> Option<Duration> {
        self.remaining_at(Instant::now())
    }

    /// The validity left at `now`, or `None` once it has run out (host suspend since the
    /// validity began counts as time passed, see [`Deadline`]).
    pub fn remaining_at(&self, now: Instant) -> Option<Duration> {
        self.valid_until.remaining_at(now)
    }

    /// Whether the validity has not yet run out.
    pub fn is_valid(&self) -> bool {
        self.remaining().is_some()
    }

    /// The fencing token of a fenced acquisition (`None` for a plain one): pass it to the
    /// protected resource with every write, and have the resource reject tokens lower
    /// than the highest it has seen. Extensions keep the token.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.fencing_token
    }

    /// The report of the round that won (or last extended) this lock.
    pub fn report(&self) -> &RoundReport {
        &self.report
    }
}

/// A won extension of a lock as [`Coordinator::renew_many`](crate::Coordinator::renew_many)
/// reports it: the lock's new deadline and TTL, without the round's report. Applied to its
/// lock with [`Lock::apply`]; it names the lock (keys and token), so it cannot move another
/// lock's deadline.
#[derive(Debug, Clone)]
pub struct Renewed {
    keys: Arc<[Arc<str>]>,
    token: Token,
    ttl: Duration,
    valid_until: Deadline,
}

impl Renewed {
    /// The end of the lock's validity now: the later of its previous deadline and the
    /// extension's `t0 + ttl - drift` (brought forward by host suspend, see [`Deadline`]).
    pub fn valid_until(&self) -> Instant {
        self.valid_until.instant()
    }

    /// [`valid_until`](Self::valid_until) with what it takes to count host suspend.
    pub fn deadline(&self) -> Deadline {
        self.valid_until
    }

    /// The TTL the lock was extended by.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

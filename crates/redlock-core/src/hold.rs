//! The rounds of a held lock: extension (one lock, many, and the renewal batches that keep
//! only each lock's new deadline), release, and both by key and token for a lock that
//! another process took.

use std::time::Duration;

use fred::types::{Key, Value};
use futures::future::join;

use crate::coordinator::Coordinator;
use crate::error::{ArgumentError, Error};
use crate::kind::EXTEND_BATCH;
use crate::lock::{Lock, Renewed};
use crate::lock_spec::LockSpec;
use crate::report::{RoundKind, RoundReport};
use crate::round::{self, Command, Decided, Request, Round};
use crate::token::Token;

/// The most locks [`Coordinator::extend_many`] sends in one script call per node. At this
/// size a call carries about 25 KB of arguments and runs on a node in about a millisecond.
pub const EXTEND_BATCH_LOCKS: usize = 256;

impl Coordinator {
    /// One extension round: compare-and-`PEXPIRE` to `ttl` on every node, counted like an
    /// acquisition, with validity measured from the start of this round. It never
    /// recreates a key that expired, and it never shortens one: a node whose key already
    /// lives at least `ttl` keeps its expiry, so an extension (won, lost or late) can never
    /// pull a node's expiry before a validity some holder relies on. The returned lock is
    /// valid until the later of its previous deadline and this round's `t0 + ttl - drift`.
    /// On failure nothing is deleted or shortened: the lock keeps the validity it had, and
    /// the caller should stop using it by then and release it.
    pub async fn extend(&self, lock: &Lock, ttl: Duration) -> Result<Lock, Error> {
        let ttl = self.inner.config.check_ttl(ttl)?;
        let mut results = self.extend_checked(&[(lock, ttl)], Self::extended).await;
        results.pop().expect("one result per lock")
    }

    /// Extends several locks at once: one script call per node for up to
    /// [`EXTEND_BATCH_LOCKS`] of them, each lock decided on its own by the same quorum and
    /// validity rules as [`extend`](Self::extend), with its validity measured from the start
    /// of its own batch. Larger sets are split into batches, two in flight at a time, so
    /// that no single script keeps a node busy for long: a script that outlives the node
    /// timeout still runs to its end on the node, and a renewal of thousands of locks in
    /// one call would pile such scripts up. Returns one result per lock, in order.
    pub async fn extend_many(&self, locks: &[(&Lock, Duration)]) -> Vec<Result<Lock, Error>> {
        self.extend_each(locks, Self::extended).await
    }

    /// [`extend_many`](Self::extend_many) for a scheduler that keeps its locks and only
    /// needs each one's new deadline: the same rounds, but a lock whose extension won yields
    /// a [`Renewed`] (valid until the later of its previous deadline and its batch's
    /// `t0 + ttl - drift`; [`Lock::apply`] takes it on), and its round's report is dropped
    /// with its batch. A
    /// failed extension's error carries its report, as with `extend_many`. Renewing
    /// thousands of locks this way keeps no report per lock past its batch, so a renewal
    /// tick's memory does not grow with the number of locks held.
    pub async fn renew_many(&self, locks: &[(&Lock, Duration)]) -> Vec<Result<Renewed, Error>> {
        self.extend_each(locks, |_, decided, lock, ttl| {
            decided
                .into_deadline(ttl)
                .map(|until| lock.renewed(ttl, until))
        })
        .await
    }

    /// Checks every TTL, then extends the locks whose TTL is valid, turning each decision
    /// into a result with `each` as its batch is decided; one result per lock, in order.
    async fn extend_each<T>(
        &self,
        locks: &[(&Lock, Duration)],
        each: impl Fn(&Self, Decided, &Lock, Duration) -> Result<T, Error>,
    ) -> Vec<Result<T, Error>> {
        let mut checked = Vec::with_capacity(locks.len());
        let mut errors = Vec::new();
        for (i, (lock, ttl)) in locks.iter().enumerate() {
            match self.inner.config.check_ttl(*ttl) {
                Ok(ttl) => checked.push((*lock, ttl)),
                Err(e) => errors.push((i, e)),
            }
        }
        let mut results = self.extend_checked(&checked, each).await.into_iter();
        let mut errors = errors.into_iter().peekable();
        (0..locks.len())
            .map(|i| match errors.next_if(|(at, _)| *at == i) {
                Some((_, e)) => Err(e.into()),
                None => results.next().expect("one result per checked lock"),
            })
            .collect()
    }

    /// Extends `locks` (TTLs checked) in batches of [`EXTEND_BATCH_LOCKS`], two in flight;
    /// each batch's decisions become results (through `each`) before the next batches go,
    /// so no more than two batches' reports are alive at once.
    async fn extend_checked<T>(
        &self,
        locks: &[(&Lock, Duration)],
        each: impl Fn(&Self, Decided, &Lock, Duration) -> Result<T, Error>,
    ) -> Vec<Result<T, Error>> {
        let mut results: Vec<Option<Result<T, Error>>> = Vec::new();
        results.resize_with(locks.len(), || None);
        let specs = |chunk: &[usize]| -> Vec<(LockSpec, Duration)> {
            chunk
                .iter()
                .map(|&i| (LockSpec::of(locks[i].0), locks[i].1))
                .collect()
        };
        let batches = self.extend_batches(locks);
        let mut chunks = batches.iter();
        while let Some(first) = chunks.next() {
            let second = chunks.next();
            let (a, b) = (specs(first), second.map(|c| specs(c)).unwrap_or_default());
            let (a_decided, b_decided) = join(self.extend_batch(&a), async {
                if b.is_empty() {
                    Vec::new()
                } else {
                    self.extend_batch(&b).await
                }
            })
            .await;
            let at = first.iter().chain(second.into_iter().flatten());
            for (&i, decided) in at.zip(a_decided.into_iter().chain(b_decided)) {
                let (lock, ttl) = locks[i];
                results[i] = Some(each(self, decided, lock, ttl));
            }
        }
        results
            .into_iter()
            .map(|result| result.expect("every lock is in one batch"))
            .collect()
    }

    /// The batches that [`extend_checked`](Self::extend_checked) sends, as indices into
    /// `locks`: in order, [`EXTEND_BATCH_LOCKS`] at most each. A batch may hold locks of
    /// several hash slots: a cluster member runs it as one script per slot (see
    /// [`Command::per_slot`]). With a cluster member, a lock whose own keys fall in several
    /// slots goes in a batch of its own, which a cluster member runs as one script per
    /// share of the lock (see `LockSpec::by_slot`).
    fn extend_batches(&self, locks: &[(&Lock, Duration)]) -> Vec<Vec<usize>> {
        let alone = |i: &usize| {
            self.inner.cluster.is_some() && LockSpec::of(locks[*i].0).slot_shares().is_some()
        };
        let (apart, together): (Vec<usize>, Vec<usize>) = (0..locks.len()).partition(alone);
        together
            .chunks(EXTEND_BATCH_LOCKS)
            .map(<[usize]>::to_vec)
            .chain(apart.into_iter().map(|i| vec![i]))
            .collect()
    }

    /// A won extension of `lock` as the lock valid until the later of its previous deadline
    /// and the extension's; it keeps its fencing token, which belongs to the acquisition.
    fn extended(&self, decided: Decided, lock: &Lock, ttl: Duration) -> Result<Lock, Error> {
        // Extensions only lengthen, so what the lock held before still stands.
        let extended = decided.into_lock(LockSpec::of(lock), ttl, Some(lock.valid_until));
        extended.map(|extended| Lock {
            fencing_token: lock.fencing_token,
            ..extended
        })
    }

    /// One extension round for up to [`EXTEND_BATCH_LOCKS`] locks: one script call per
    /// node, each lock decided on its own quorum.
    async fn extend_batch(&self, locks: &[(LockSpec, Duration)]) -> Vec<Decided> {
        let requests: Vec<Request> = locks
            .iter()
            .map(|(spec, ttl)| Request {
                name: spec.name.clone(),
                ttl: Some(*ttl),
                undo: None,
                redo: false,
            })
            .collect();
        let by_slot = self.inner.cluster.is_some();
        let command = match locks {
            // Alone in its batch (see `extend_batches`): in shares on a cluster member.
            [(spec, ttl)] => spec.by_slot(by_slot, Some(*ttl), |share| {
                extend_command([(share, *ttl)].into_iter())
            }),
            _ => {
                let first_keys = locks.iter().map(|(spec, _)| &*spec.keys[0]);
                Command::per_slot(by_slot, first_keys, &requests, |carried| {
                    extend_command(carried.iter().map(|&j| (&locks[j].0, locks[j].1)))
                })
            }
        };
        let round = Round {
            kind: RoundKind::Extend,
            alternatives: false,
            command,
            requests,
            drift_factor: self.inner.config.drift_factor,
        };
        round::run(&self.inner.connections, round, &self.inner.work).await
    }

    /// Releases a lock: compare-and-delete on every node (for a reentrant lock: drops this
    /// hold, and the key with the last one). Returns once a quorum of nodes no longer hold
    /// it; the remaining nodes finish in the background, where a node that did not answer
    /// (timed out, or its connection failed) gets the release again, up to three tries like
    /// a rollback (see [`quiesce`](Self::quiesce)). It only ever deletes a key that
    /// still holds this lock's token, so a late release never touches a newer holder.
    pub async fn release(&self, lock: &Lock) -> Result<RoundReport, Error> {
        self.release_spec(LockSpec::of(lock)).await
    }

    /// Releases a plain lock on `key` by its token, for a process that did not acquire it
    /// (the token was stored, or handed over): compare-and-delete on every node, exactly as
    /// [`release`](Self::release) does for the lock that holds `token`. It deletes nothing
    /// where the key holds another token, so a stale token never releases a newer holder.
    ///
    /// Idempotent like every release: a node counts as done once its key does not hold
    /// `token`, whether this call deleted it or not. To know whether it deleted anything,
    /// look for [`NodeOutcome::Released`](crate::NodeOutcome::Released) in the report
    /// ([`NotHeld`](crate::NodeOutcome::NotHeld): absent, or held by another token).
    ///
    /// Only for a lock of one key taken with a token (not a reentrant hold, whose release
    /// also needs its owner). Fails with [`Error::Argument`] for an empty or invalid key or
    /// token, or a reserved key (the fencing counter's, or one under the fair queues'
    /// prefix), and with [`Error::NoQuorum`] when fewer than a quorum of nodes answered.
    pub async fn release_token(&self, key: &str, token: &Token) -> Result<RoundReport, Error> {
        let spec = self.token_spec(key, token)?;
        self.release_spec(spec).await
    }

    /// Extends a plain lock on `key` by its token, for a process that did not acquire it:
    /// the same round as [`extend`](Self::extend), by the same rules. It never recreates an
    /// expired key and never shortens one (a node whose key already lives at least `ttl`
    /// keeps its expiry).
    ///
    /// The returned lock is valid until this round's `t0 + ttl - drift`: the caller does
    /// not know the validity the lock had before, so a longer one that the nodes still
    /// hold is not counted. Errors as for [`release_token`](Self::release_token), plus the
    /// TTL's checks and [`Error::ValidityExhausted`].
    pub async fn extend_token(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let spec = self.token_spec(key, token)?;
        let ttl = self.inner.config.check_ttl(ttl)?;
        let batch = [(spec, ttl)];
        let decided = self
            .extend_batch(&batch)
            .await
            .pop()
            .expect("one result per lock");
        let [(spec, ttl)] = batch;
        decided.into_lock(spec, ttl, None)
    }

    /// The identity of a plain lock known only by its key and token, checked like an
    /// acquisition's: the key, the token, and not the fencing counter (whose value a
    /// number as token would match).
    fn token_spec(&self, key: &str, token: &Token) -> Result<LockSpec, ArgumentError> {
        let spec = LockSpec::new(&[key], token.clone(), None)?;
        if self.inner.config.is_reserved(key) {
            return Err(ArgumentError::ReservedKey {
                key: key.to_string(),
            });
        }
        Ok(spec)
    }

    async fn release_spec(&self, spec: LockSpec) -> Result<RoundReport, Error> {
        if self.inner.groups && spec.groups() {
            // Concurrent releases of plain locks share their rounds (group commit).
            return self.release_grouped(spec).await;
        }
        let by_slot = self.inner.cluster.is_some();
        let command = spec.by_slot(by_slot, None, |share| {
            share.release(
                self.inner.release_channel.as_ref(),
                &self.inner.config.fair_prefix,
            )
        });
        let round = self.untimed_round(RoundKind::Release, command, spec.name.clone());
        self.run_to_quorum(round).await
    }
}

/// The batch extension script for `locks` (each with its TTL), one script call.
fn extend_command<'a>(locks: impl Iterator<Item = (&'a LockSpec, Duration)>) -> Command {
    let mut keys: Vec<Key> = Vec::new();
    // The script's first argument is reserved.
    let mut args: Vec<Value> = vec![Value::from("batch")];
    for (spec, ttl) in locks {
        keys.extend(spec.fred_keys());
        spec.extend_args(ttl, &mut args);
    }
    Command::Script {
        script: &EXTEND_BATCH,
        keys,
        args,
    }
}

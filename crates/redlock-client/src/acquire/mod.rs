//! One acquisition call, as a state machine over rounds.
//!
//! ```text
//!             ┌──────────────────────────────────────────────┐
//!             ▼                                              │ at once (take on a hand-over)
//!  start ─▶ attempt ── won ──────────────────────────▶ hold (the one exit)
//!             │ lost                                   ▲
//!             ▼                                        │ handed the lock
//!           judge ── handed / stepped back and handed ─┤
//!             │  └── exhausted or past the deadline ─▶ give up (an error)
//!             ▼ wait (the schedule's delay)            │
//!           wait ── woken and handed the lock ─────────┘
//!             │ timer, or woken
//!             └─▶ attempt
//! ```
//!
//! - [`Call::attempt`] runs one round (`redlock-core`), queuing the waiter where its
//!   [`Plan`] says.
//! - [`Call::judge`] looks at a lost round: a hand-over that came while it ran, whether
//!   the call gives up, whether a fair head that cannot win steps back, and what the next
//!   step is.
//! - [`Call::wait`] waits out the [`Schedule`]'s delay or a wake-up by a release, which may
//!   hand a fair waiter the lock.
//! - [`Call::hold`] wraps the lock in its guard; errors leave through `?` from each step.
//!
//! The delay rules live in [`schedule`], the fair queue's parts (the queue exit, hand-over,
//! step-back) in [`fair`], the reading of a lost round in [`verdict`].

mod fair;
mod plan;
mod schedule;
mod verdict;

use std::sync::Arc;
use std::time::Duration;

use redlock_core::support::FairPlace;
use redlock_core::{Acquisition, Lock, PermitAcquisition, RoundReport, RwAcquisition};
use tokio::time::Instant;
use tracing::Instrument;

use crate::error::Error;
use crate::guard::{HoldState, KeepAlive, LockGuard};
use crate::metrics;
use crate::notify::Waiter;
use crate::renew::RenewalPlan;
use crate::retry::Backoff;
use crate::shared::Inner;

use fair::{Handed, Handover, QueueExit};
pub use plan::LockOptions;
use plan::Plan;
pub(crate) use plan::Shape;
use schedule::Schedule;
use verdict::Lost;

/// Acquires `shape` for `client` under `options`: the body of `lock`, `lock_many` and
/// `lock_reentrant`.
pub(crate) async fn acquire(
    client: &Arc<Inner>,
    shape: Shape<'_>,
    options: &LockOptions,
) -> Result<LockGuard, Error> {
    let inner = &**client;
    let plan = Plan::resolve(&inner.config, options)?;
    // One waiter id for every attempt of this call: its place in the keys' fair queues.
    let waiter = plan
        .queues(shape, inner.notifier.is_some())
        .then(|| match &inner.notifier {
            Some(notifier) => notifier.waiter_id(),
            None => crate::owner::random_id().to_string(),
        });
    let keys = shape.keys();
    let name = shape.name(&keys);
    let span = tracing::debug_span!(
        "redlock.lock",
        key = %name,
        nodes = inner.config.nodes.len(),
        attempts = tracing::field::Empty,
        outcome = tracing::field::Empty,
        wait_us = tracing::field::Empty,
    );
    // Counts the acquisition once, also when this future is dropped midway.
    let acquiring = metrics::Acquiring::start();
    let result = async {
        // A closed client sends nothing: say why at once rather than retry until
        // `max_wait` over rounds whose every node fails.
        check_open(inner, &name)?;
        let ids = Ids {
            keys: &keys,
            queues: shape.queues(&keys),
            name: &name,
            waiter: waiter.as_deref(),
        };
        // A writer takes its intent back when the call ends, however it ends.
        let _intent = match shape {
            Shape::Rw {
                name,
                writer: Some(id),
                ..
            } => Some(IntentExit(&inner.core, name, id)),
            _ => None,
        };
        let mut call = Call::new(client, &plan, shape, ids);
        let lock = call.run().await?;
        Ok(call.hold(lock))
    }
    .instrument(span.clone())
    .await;
    let (outcome, waited) = acquiring.finish(&result);
    span.record("outcome", outcome);
    span.record("wait_us", waited.as_micros() as u64);
    result
}

/// A writer's intent on the nodes, taken back (in the background) when its call ends.
struct IntentExit<'a>(&'a redlock_core::Coordinator, &'a str, &'a str);

impl Drop for IntentExit<'_> {
    fn drop(&mut self) {
        let IntentExit(core, name, id) = *self;
        core.leave_write_intent_in_background(name.to_string(), id.to_string());
    }
}

/// What names the call's lock and its waiter.
#[derive(Clone, Copy)]
struct Ids<'a> {
    keys: &'a [String],
    /// The keys whose fair queues the call's waiter enters: the lock's keys, or a
    /// read-write lock's one queue.
    queues: &'a [String],
    /// The lock's name in errors and traces.
    name: &'a str,
    /// The waiter's id in the keys' fair queues, when the call queues.
    waiter: Option<&'a str>,
}

/// One call in flight: its settings and the state its steps share.
struct Call<'a> {
    client: &'a Arc<Inner>,
    plan: &'a Plan<'a>,
    shape: Shape<'a>,
    ids: Ids<'a>,
    /// Before the first round: `max_wait` counts from here.
    start: Instant,
    /// `start + max_wait`; `None` for a wait too long to represent, or none.
    deadline: Option<Instant>,
    backoff: Backoff,
    schedule: Schedule,
    attempts: u32,
    /// The waiter's place in its keys' queues (its ticket), when it queues.
    place: Option<FairPlace<'a>>,
    /// Leaves the queue when this call ends, however it ends (won, given up, failed, or its
    /// future dropped), once an attempt has queued the waiter, unless the winning round
    /// already took the waiter out on every node. Dropped before `watch`.
    queued: Option<QueueExit<'a>>,
    /// The last fair attempt that registered a hand-over.
    handover: Option<Handover>,
    /// The call's registration for wake-ups, made before the first attempt so that a
    /// release during it is not missed.
    watch: Option<Waiter<'a>>,
}

/// What comes after a lost round.
enum Next {
    /// Handed the lock (by a release, or found so while stepping back).
    Held(Lock),
    /// A round at once: it takes on what was handed over too late or partly.
    AtOnce,
    /// A pause of this long, or until a wake-up; the call gives up with the lost round if
    /// the pause reaches the deadline.
    Wait(Duration, Lost),
}

impl<'a> Call<'a> {
    fn new(client: &'a Arc<Inner>, plan: &'a Plan<'a>, shape: Shape<'a>, ids: Ids<'a>) -> Self {
        let inner = &**client;
        let start = Instant::now();
        let node_timeout = inner.config.node_timeout;
        let watch = inner
            .notifier
            .as_ref()
            .filter(|_| plan.watches(shape))
            .map(|n| n.watch(ids.keys, ids.waiter, shape.owner()));
        Call {
            client,
            plan,
            shape,
            ids,
            start,
            deadline: plan.retry.max_wait.and_then(|wait| start.checked_add(wait)),
            backoff: plan.retry.backoff(),
            schedule: Schedule::new(plan.fair, plan.retry, node_timeout, plan.ttl),
            attempts: 0,
            place: ids
                .waiter
                .map(|waiter| FairPlace::now(waiter, plan.patience)),
            queued: None,
            handover: None,
            watch,
        }
    }

    fn inner(&self) -> &'a Inner {
        self.client
    }

    fn node_timeout(&self) -> Duration {
        self.inner().config.node_timeout
    }

    /// The time left until the deadline (`None`: no deadline).
    fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    fn past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Rounds until the lock is held or the call gives up.
    async fn run(&mut self) -> Result<Lock, Error> {
        loop {
            let lost = match self.attempt().await? {
                Ok(lock) => return Ok(lock),
                Err(lost) => lost,
            };
            let (delay, lost) = match self.judge(lost).await? {
                Next::Held(lock) => return Ok(lock),
                Next::AtOnce => continue,
                Next::Wait(delay, lost) => (delay, lost),
            };
            if let Some(lock) = self.wait(delay, lost).await? {
                return Ok(lock);
            }
        }
    }

    /// One round: the lock won with enough validity, or what the lost round says. Fails
    /// at once where no retry can help: a setting the nodes refuse, fencing counters lost.
    async fn attempt(&mut self) -> Result<Result<Lock, Lost>, Error> {
        self.attempts = self.attempts.saturating_add(1);
        tracing::Span::current().record("attempts", self.attempts);
        let places = self.places();
        if let (Some(waiter), (Some(_), _) | (_, Some(_))) = (self.ids.waiter, places) {
            // Made only once: a `QueueExit` that is dropped leaves the queue.
            let core = &self.inner().core;
            let keys = self.ids.queues;
            self.queued
                .get_or_insert_with(|| QueueExit::new(core, keys, waiter));
        }
        // A fenced attempt's write-back ends by the call's bound too.
        let fence_by = self
            .deadline
            .and_then(|d| d.checked_add(self.node_timeout()));
        let round = self.round(places, fence_by).await;
        Lost::judge(round, self.plan.min_validity)
    }

    /// Runs one round of the core for this call.
    async fn round(
        &self,
        (fair, queued): (Option<FairPlace<'a>>, Option<FairPlace<'a>>),
        deadline: Option<Instant>,
    ) -> Result<Lock, redlock_core::Error> {
        let keys: Vec<&str> = match self.shape {
            Shape::One(key) | Shape::Reentrant(key, _) => vec![key],
            Shape::Many(keys) => keys.iter().map(String::as_str).collect(),
            Shape::Permit { name, permits, .. } => {
                let permit = PermitAcquisition {
                    fenced: self.plan.fenced,
                    deadline,
                    fair,
                    ..PermitAcquisition::new(name, permits, self.plan.ttl)
                };
                return self.inner().core.acquire_permit_with(permit).await;
            }
            Shape::Rw { name, writer, .. } => {
                let side = RwAcquisition {
                    write: writer.is_some(),
                    fenced: self.plan.fenced && writer.is_some(),
                    deadline,
                    writer: writer.map(|id| (id, self.plan.patience)),
                    fair,
                    ..RwAcquisition::read(name, self.plan.ttl)
                };
                return self.inner().core.acquire_rw(side).await;
            }
        };
        let acquisition = Acquisition {
            owner: self.shape.owner(),
            fenced: self.plan.fenced,
            fair,
            queued,
            deadline,
            ..Acquisition::new(&keys, self.plan.ttl)
        };
        self.inner().core.acquire_with(acquisition).await
    }

    /// After a lost round: held (handed over), a round at once, a pause, or an error that
    /// ends the call.
    async fn judge(&mut self, mut lost: Lost) -> Result<Next, Error> {
        // Whatever comes next, the waiter's leave waits for this round's rollbacks (they
        // may put it back in the queues).
        if let Some(exit) = self.queued.as_mut() {
            exit.lost = Some(RoundReport::clone(&lost.report));
        }
        // The client closed while this call waited (shut down, or its runtime stopped): no
        // later round can send anything either.
        check_open(self.inner(), self.ids.name)?;
        let mut taken = fair::TakeOn::default();
        if lost.short_lock.is_none() {
            match self.handed_while_out(&lost.report).await {
                Ok(lock) => return Ok(Next::Held(lock)),
                Err(take_on) => taken = take_on,
            }
        }
        if self.schedule.lost_after_wake(lost.report.elapsed) {
            // Leaves the queue: a release with nobody queued is announced to nobody.
            drop(self.queued.take());
        }
        let exhausted = self
            .plan
            .retry
            .max_attempts
            .is_some_and(|max| self.attempts >= max)
            || verdict::refused_until_changed(&lost.report);
        let past_deadline = self.past_deadline();
        self.release_short(&mut lost, exhausted || past_deadline)
            .await;
        if exhausted || past_deadline {
            return Err(self.give_up(lost, past_deadline));
        }
        let unrefused = self.plan.fair && lost.head_found_the_key_free() && !taken.take_on;
        if self.schedule.head_lost(unrefused, self.remaining()) {
            if let Some(lock) = self.step_back(&lost.report, taken.settled).await {
                return Ok(Next::Held(lock));
            }
        }
        if taken.take_on {
            // The lost round's rollbacks run in the background, on the connections the
            // next round uses: sent at once, that round could reach a node before the
            // rollback of the key this one took there, find its own old token and lose
            // too, and then nothing would wake the waiter before its backoff's delay. So
            // it waits for them first.
            if !taken.settled {
                fair::settle(&lost.report, self.node_timeout(), self.deadline).await;
            }
            // No attempt starts at or past the deadline (the wait may have ended there).
            if self.past_deadline() {
                return Err(self.give_up(lost, true));
            }
            return Ok(Next::AtOnce);
        }
        let delay = self.schedule.delay(
            self.backoff.next(),
            self.attempts,
            self.place.is_some(),
            || self.watch.as_ref().is_some_and(|w| w.all_subscribed()),
            self.remaining(),
        );
        tracing::debug!(
            attempt = self.attempts,
            outcome = if lost.short.is_some() {
                "below_min_validity"
            } else {
                "lost"
            },
            accepted = lost.report.accepted,
            quorum = lost.report.quorum,
            round_us = lost.report.elapsed.as_micros() as u64,
            delay_us = delay.as_micros() as u64,
            "attempt not won; retrying"
        );
        Ok(Next::Wait(delay, lost))
    }

    /// A lock won with less validity than the caller's minimum is released before the next
    /// attempt, so that the key is free again for it (and for everyone else) at once; on the
    /// call's last attempt in the background, so that the release does not hold up the
    /// return past the bound that `max_wait` documents.
    async fn release_short(&self, lost: &mut Lost, last: bool) {
        let (Some(lock), Some(validity)) = (lost.short_lock.take(), lost.short) else {
            return;
        };
        let core = &self.inner().core;
        if last {
            core.release_in_background(lock);
            return;
        }
        tracing::debug!(
            ?validity,
            min_validity = ?self.plan.min_validity,
            "round won with less than the minimum validity; releasing it"
        );
        if let Err(e) = core.release(&lock).await {
            tracing::warn!(error = %e, "release of a lock below the minimum validity failed; the key expires with its TTL");
        }
    }

    /// Waits `delay`, or until a release wakes the call: the lock when a release handed it
    /// over, `None` for the next attempt; the call gives up with `lost` when the wait ends
    /// at the deadline (no attempt starts at or past it).
    async fn wait(&mut self, delay: Duration, lost: Lost) -> Result<Option<Lock>, Error> {
        match &self.watch {
            Some(watch) => {
                let woken = tokio::select! {
                    _ = watch.released() => true,
                    _ = tokio::time::sleep(delay) => false,
                };
                self.schedule.woken = woken;
                if woken && self.plan.fair {
                    if let Handed::Held(lock) = self.handed_on_wake().await {
                        return Ok(Some(lock));
                    }
                } else if woken {
                    self.spread(lost.report.elapsed).await;
                }
            }
            None => tokio::time::sleep(delay).await,
        }
        if self.past_deadline() {
            return Err(self.give_up(lost, true));
        }
        Ok(None)
    }

    /// The random pause of a woken waiter that is not fair (see
    /// [`schedule::wake_window`]), drawn from the backoff's generator: a seeded policy fixes
    /// it too. In a fair queue only the head writes, so woken waiters cannot split the vote:
    /// no spread there.
    async fn spread(&mut self, round: Duration) {
        let window = self.schedule.wake_window(round);
        let spread = schedule::until(self.backoff.spread(window), self.remaining());
        tracing::debug!(?spread, "woken by a release");
        tokio::time::sleep(spread).await;
    }

    /// The one exit of a won call: leaves the queues where the winning script did not, wakes
    /// the owner's other waiters (a reentrant lock), and wraps the lock in its guard. Runs
    /// after the round won, so nothing here may fail: every value was checked before the
    /// first round.
    fn hold(&mut self, lock: Lock) -> LockGuard {
        if let Some(exit) = self.queued.take() {
            match self.shape {
                // A permit's or a read-write lock's winning script took the waiter out of
                // the queue, but the lock's key is not the queue's: its leave runs on every
                // node, and passes the turn on to the next waiter (the readers behind a
                // reader).
                Shape::Permit { .. } | Shape::Rw { .. } => drop(exit),
                _ => exit.after_win(&lock),
            }
        }
        if let Some(watch) = &self.watch {
            watch.owner_holds();
        }
        let inner = self.client;
        let (ttl, config) = (self.plan.ttl, &inner.config);
        let shared = HoldState::new(lock, ttl);
        // `max_hold` counts from the acquisition's `t0`, not from the call: a long wait for
        // the lock does not eat into it.
        let acquired = shared.validity_start(inner.core.drift(ttl));
        if self.plan.renew {
            // Checked against `ttl` by `check_hold` (or `validate` for the configured TTL).
            let every = config.renew_every_for(ttl);
            // A cap too long to represent (`Duration::MAX`) is no cap at all.
            let hold_until = config
                .renewal
                .max_hold
                .and_then(|max| acquired.checked_add(max));
            inner
                .renewer
                .add(shared.clone(), RenewalPlan { every, hold_until });
        }
        let keep_alive = KeepAlive(inner.clone());
        LockGuard::new(shared, inner.core.clone(), keep_alive, self.attempts)
    }
}

/// Fails with [`Error::Closed`] once the client is closed.
fn check_open(inner: &Inner, name: &str) -> Result<(), Error> {
    match inner.core.closed() {
        Some(reason) => Err(Error::Closed {
            key: name.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

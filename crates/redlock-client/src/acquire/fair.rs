//! The call's parts in its keys' fair queues: taking a place, leaving the queues however
//! the call ends, being handed the lock by a release, and stepping back when, at the head,
//! it cannot win.
//!
//! A fair waiter queues from its first attempt, gated; another waiter from its second, only
//! to be woken (see [`Plan::queues`](super::plan::Plan::queues)). With wake-ups on, each
//! fair attempt of a plain lock of one key registers a hand-over: a release that finds the
//! waiter at the head of the queue sets the key for it and tells its client, which then
//! holds the lock without a round of its own.

use std::time::Duration;

use redlock_core::message::handover_token_text;
use redlock_core::support::FairPlace;
use redlock_core::{Coordinator, Lock, NodeOutcome, RoundReport};
use tokio::time::Instant;

use super::Call;
use crate::metrics;

/// A fair attempt that registered a hand-over: its number, an instant before its round
/// started (the hand-over's validity starts there), and the host's suspend then.
#[derive(Debug, Clone, Copy)]
pub(super) struct Handover {
    number: u64,
    since: Instant,
    suspended: Duration,
}

/// Whether a fair waiter was handed the lock by the nodes' releases.
pub(super) enum Handed {
    /// By a quorum, with enough validity left.
    Held(Lock),
    /// By a quorum, with too little validity left: a round takes the key on at once.
    TooLate,
    /// Not (yet) by a quorum.
    Not,
}

/// After a lost round: whether the next round comes at once, to take on keys handed over
/// to this waiter, and whether the lost round's rollbacks are known to be done.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct TakeOn {
    pub(super) take_on: bool,
    pub(super) settled: bool,
}

/// A queued waiter's way out of its queues: when dropped, it takes the waiter out of each
/// of its keys' queues on every node in the background, so that the waiters behind it need
/// not wait for its entries to expire.
pub(super) struct QueueExit<'a> {
    core: &'a Coordinator,
    keys: &'a [String],
    waiter: &'a str,
    /// The waiter's last round that was not won: the leave waits for its rollbacks, which
    /// put the waiter back in the queues where they free the keys.
    pub(super) lost: Option<RoundReport>,
}

impl<'a> QueueExit<'a> {
    pub(super) fn new(core: &'a Coordinator, keys: &'a [String], waiter: &'a str) -> Self {
        QueueExit {
            core,
            keys,
            waiter,
            lost: None,
        }
    }

    /// The waiter won `lock`: it leaves the queue only on the nodes whose winning script
    /// did not take it out (see [`Waiters::leave_after_win`](redlock_core::support::Waiters::leave_after_win)).
    pub(super) fn after_win(mut self, lock: &Lock) {
        let lost = self.lost.take();
        self.core
            .waiters()
            .leave_after_win(lock, self.waiter.to_string(), lost);
        std::mem::forget(self);
    }
}

impl Drop for QueueExit<'_> {
    fn drop(&mut self) {
        for key in self.keys {
            self.core.waiters().leave_in_background(
                key.clone(),
                self.waiter.to_string(),
                self.lost.clone(),
            );
        }
    }
}

/// A lost round's report once every node answered and every rollback finished, waiting
/// at most a node timeout and not past the call's deadline; the report as decided if that
/// runs out.
pub(super) async fn settle(
    report: &RoundReport,
    node_timeout: Duration,
    deadline: Option<Instant>,
) -> RoundReport {
    let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
    let bound = super::schedule::until(node_timeout, remaining);
    match tokio::time::timeout(bound, report.settled()).await {
        Ok(settled) => settled,
        Err(_) => report.clone(),
    }
}

impl<'a> Call<'a> {
    /// The next attempt's places: a gated one (a fair waiter, which registers its
    /// hand-over here) or one that only enqueues (a waiter queued to be woken, from its
    /// second attempt on, while it is still announced).
    pub(super) fn places(&mut self) -> (Option<FairPlace<'a>>, Option<FairPlace<'a>>) {
        match self.place {
            Some(place) if self.plan.fair => {
                let mut handover = None;
                if let Some(watch) = self
                    .watch
                    .as_ref()
                    .filter(|_| self.plan.hands_over(self.shape))
                {
                    let number = u64::from(self.attempts);
                    watch.expect(handover_token_text(place.waiter, number));
                    // The suspend first: one between the readings then counts.
                    let suspended = redlock_core::support::host_suspended();
                    self.handover = Some(Handover {
                        number,
                        since: Instant::now(),
                        suspended,
                    });
                    handover = Some(number);
                }
                (Some(FairPlace { handover, ..place }), None)
            }
            Some(place) if self.attempts > 1 && self.schedule.announced => (None, Some(place)),
            _ => (None, None),
        }
    }

    /// The lock that a quorum of nodes handed over to this waiter for its last registered
    /// attempt, when they did and it has at least the minimum validity left. With less
    /// ([`Handed::TooLate`]), the waiter's next round, at once, takes the key on under its
    /// own token, with a fresh TTL.
    ///
    /// The lock is held from the quorum's messages on, without waiting for the last nodes'
    /// (a wait bounded by a timer costs up to a millisecond of the timer's resolution, more
    /// than the whole hand-over): the nodes whose message has not come yet are left in the
    /// background ([`QueueExit::after_win`]), a no-op script where the key was handed over
    /// meanwhile.
    pub(super) fn handed(&self) -> Handed {
        let (Some(watch), Some(waiter), Some(handover)) =
            (&self.watch, self.ids.waiter, self.handover)
        else {
            return Handed::Not;
        };
        let Some(nodes) = watch.handed() else {
            return Handed::Not;
        };
        let handed = redlock_core::support::Handover {
            key: &self.ids.keys[0],
            waiter,
            number: handover.number,
            ttl: self.plan.ttl,
            since: handover.since,
            suspended: handover.suspended,
            nodes: &nodes,
        };
        match self.inner().core.waiters().handed_over(handed) {
            Ok(lock) if super::verdict::long_enough(lock.remaining(), self.plan.min_validity) => {
                metrics::handover(true);
                tracing::debug!(
                    nodes = nodes.len(),
                    "the key was handed over by the release"
                );
                Handed::Held(lock)
            }
            Ok(_) | Err(_) => {
                metrics::handover(false);
                tracing::debug!(
                    "a hand-over with too little validity left; a round takes the key on"
                );
                Handed::TooLate
            }
        }
    }

    /// Whether the nodes handed the key over while the lost round ran (a release that came
    /// after the round's command reached a node; never also a won round: a hand-over and a
    /// round's `SET` need a quorum each of one key): the lock, or whether the next round
    /// comes at once to take on what was handed over.
    ///
    /// Some nodes may have handed the key over while the round took it on others (where the
    /// release came first) and lost: its rollback freed those again and put the waiter back
    /// at the head of their queues, so no message will come from them, and the key is out of
    /// everyone's reach where it was handed over. The next round, at once, takes both kinds
    /// (or its rollback frees them too). A node may take the key after the round was decided
    /// (its answer came late), so the round's settled report tells, once its rollbacks are
    /// done too.
    pub(super) async fn handed_while_out(&self, report: &RoundReport) -> Result<Lock, TakeOn> {
        match self.handed() {
            Handed::Held(lock) => Ok(lock),
            Handed::TooLate => Err(TakeOn {
                take_on: true,
                settled: false,
            }),
            Handed::Not => {
                let Some(watch) = self.watch.as_ref().filter(|w| w.handed_partly()) else {
                    return Err(TakeOn::default());
                };
                let take_on = settle(report, self.node_timeout(), self.deadline)
                    .await
                    .nodes
                    .iter()
                    .any(|n| n.outcome == NodeOutcome::Acquired);
                if take_on {
                    watch.forget_wake();
                }
                Err(TakeOn {
                    take_on,
                    settled: true,
                })
            }
        }
    }

    /// A fair waiter woken by a release: the lock, when the release handed it over. Woken by
    /// the first nodes that handed it the key, it waits for the others a grace period (see
    /// [`Schedule::handover_grace`](super::schedule::Schedule::handover_grace)): one that
    /// will not hand it over would leave the key handed to this waiter on these, out of
    /// everyone's reach, until its next attempt (see `Waiter::handed_partly`).
    pub(super) async fn handed_on_wake(&self) -> Handed {
        let held = self.handed();
        let Some(watch) = &self.watch else {
            return held;
        };
        if !matches!(held, Handed::Not) || !watch.handed_partly() {
            return held;
        }
        let grace = self.schedule.handover_grace(self.remaining());
        tokio::select! {
            _ = watch.released() => {}
            _ = tokio::time::sleep(grace) => {}
        }
        self.handed()
    }

    /// A fair head that keeps losing rounds no node refused (the key was free and its turn
    /// had come wherever it got an answer) cannot win, yet each attempt refreshes its place,
    /// holding every waiter behind it up for its whole wait. It steps back: leaves the
    /// queues (which passes the key on to the next waiter) and queues again under a new
    /// ticket, behind the waiters already there. Returns the lock if a release handed it
    /// over meanwhile.
    pub(super) async fn step_back(&mut self, report: &RoundReport, settled: bool) -> Option<Lock> {
        let waiter = self.ids.waiter?;
        // Its rollbacks first: they put it back at the head where they free the key, and a
        // leave must come after them.
        if !settled {
            settle(report, self.node_timeout(), self.deadline).await;
        }
        if let Handed::Held(lock) = self.handed() {
            return Some(lock);
        }
        // From here on no hand-over of its earlier attempts counts: the leave deletes a key
        // handed to it and passes it on to the next waiter, who may then hold it. A late
        // message for one only wakes the waiter.
        if let Some(watch) = &self.watch {
            watch.forget_handover();
        }
        self.handover = None;
        metrics::stepped_back();
        tracing::debug!(
            attempt = self.attempts,
            "a fair head lost rounds that no node refused; stepping back"
        );
        self.leave_queues(waiter).await;
        self.place = Some(FairPlace::now(waiter, self.plan.patience));
        None
    }

    /// Leaves each of the keys' queues after the current attempt, on every node it reaches
    /// (where the key is free, the leave passes it on to the next waiter; a key handed over
    /// for a later attempt stays: the leave is sent again where a node did not answer, and
    /// may land after that attempt), waiting at most a node timeout and a half. Where a leave
    /// did not get through, the entry keeps its old ticket (the next attempt's `ZADD NX`
    /// does not move it) until the waiter steps back again or its patience runs out there.
    async fn leave_queues(&self, waiter: &str) {
        let core = &self.inner().core;
        let last = u64::from(self.attempts);
        let leaves = self
            .ids
            .queues
            .iter()
            .map(|key| core.waiters().leave_up_to(key, waiter, last));
        let node_timeout = self.node_timeout();
        let bound = node_timeout.saturating_add(node_timeout / 2);
        match tokio::time::timeout(bound, futures::future::join_all(leaves)).await {
            Ok(reports) => {
                for e in reports.into_iter().filter_map(Result::err) {
                    tracing::debug!(error = %e, "stepping back in a fair queue: a leave failed");
                }
            }
            Err(_) => tracing::debug!("stepping back in a fair queue: the leave ran out of time"),
        }
    }
}

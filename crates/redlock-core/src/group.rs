//! Group commit for plain acquisitions.
//!
//! While an acquisition round of a plain lock (one key, not fenced, not reentrant, not
//! fair) is in flight, the plain acquisitions started meanwhile on the same coordinator
//! wait, and go out together in the next round: one script call per node
//! ([`ACQUIRE_BATCH`]) instead of one `SET NX PX` per lock, each lock still decided on its
//! own quorum, with its own validity and rollback, by the round engine. A lone acquisition
//! (nothing in flight) is sent at once as `SET NX PX`, exactly as before, so an uncontended
//! caller pays nothing; under load the commands, and the system calls that the client's
//! CPU goes to, fall to a fraction per lock.
//!
//! A waiting acquisition's validity is measured from the start of the round that carries
//! it (its `t0`, read before that round's commands leave), never from when it began
//! waiting, so waiting costs time, not safety. A caller whose future is dropped while it
//! waits is left out of the next round; one dropped while its round is in flight gets its
//! lock released in the background if it was won, as a round dropped mid-flight rolls
//! back.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use fred::types::Key;
use tokio::sync::oneshot;

use crate::coordinator::Coordinator;
use crate::error::Error;
use crate::lock::Lock;
use crate::lock_spec::LockSpec;
use crate::report::RoundKind;
use crate::round::{self, Command, Round};
use crate::scripts::ACQUIRE_BATCH;

/// The most acquisitions one round carries: a script call of about 10 KB of arguments that
/// runs on a node in well under a millisecond. More waiting ones go in the next round.
pub(crate) const GROUP_MAX: usize = 128;

/// The acquisitions waiting for the round in flight, per coordinator.
#[derive(Debug, Default)]
pub(crate) struct Group {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// An acquisition round is in flight, or a group task is running them.
    busy: bool,
    waiting: Vec<Waiting>,
}

/// One acquisition waiting for the next round.
struct Waiting {
    spec: LockSpec,
    ttl: Duration,
    answer: oneshot::Sender<Answer>,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("key", &self.spec.name)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// What an acquisition does now: send its own round, or wait for the group's.
enum Turn {
    Lead,
    Wait(oneshot::Receiver<Answer>),
}

impl Group {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Leads when nothing is in flight; waits for the next round otherwise.
    fn join(&self, spec: &LockSpec, ttl: Duration) -> Turn {
        let mut state = self.state();
        if !state.busy {
            state.busy = true;
            return Turn::Lead;
        }
        let (answer, rx) = oneshot::channel();
        state.waiting.push(Waiting {
            spec: spec.clone(),
            ttl,
            answer,
        });
        Turn::Wait(rx)
    }

    /// The next round's acquisitions (up to [`GROUP_MAX`], oldest first); `None`, and no
    /// longer busy, when none waits.
    fn next(&self) -> Option<Vec<Waiting>> {
        let mut state = self.state();
        if state.waiting.is_empty() {
            state.busy = false;
            return None;
        }
        let cut = state.waiting.len().min(GROUP_MAX);
        let rest = state.waiting.split_off(cut);
        Some(std::mem::replace(&mut state.waiting, rest))
    }
}

/// A grouped acquisition's result on its way to its caller. A won lock that nobody takes
/// (the caller's future was dropped meanwhile) is released in the background.
struct Answer {
    result: Option<Result<Lock, Error>>,
    coordinator: Coordinator,
}

impl Answer {
    fn take(mut self) -> Result<Lock, Error> {
        self.result.take().expect("an answer is taken once")
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(Ok(lock)) = self.result.take() {
            self.coordinator.release_in_background(lock);
        }
    }
}

/// The leader's turn: when its round is decided (or its future dropped), the acquisitions
/// that waited meanwhile go out in a round of their own.
struct Lead<'a>(&'a Coordinator);

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        self.0.hand_on();
    }
}

impl Coordinator {
    /// A plain acquisition of one key: its own `SET NX PX` round when nothing is in flight,
    /// else a place in the next grouped round.
    pub(crate) async fn acquire_grouped(
        &self,
        spec: LockSpec,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let answer = match self.inner.group.join(&spec, ttl) {
            Turn::Lead => {
                let lead = Lead(self);
                let decided = self.run_one(self.plain_round(&spec, ttl)).await;
                drop(lead);
                return self.lock_from(decided, spec, ttl, None);
            }
            Turn::Wait(answer) => answer.await,
        };
        match answer {
            Ok(answer) => answer.take(),
            // The group's task ended without answering (its runtime is shutting down): a
            // round of its own.
            Err(_) => {
                let decided = self.run_one(self.plain_round(&spec, ttl)).await;
                self.lock_from(decided, spec, ttl, None)
            }
        }
    }

    /// Sends the acquisitions that waited for the round just decided, if any, from a task
    /// of their own (counted as background work), round after round until none waits.
    fn hand_on(&self) {
        let Some(first) = self.inner.group.next() else {
            return;
        };
        let spawned = self.spawn_background(move |this| async move {
            let mut batch = first;
            loop {
                // Callers that gave up while waiting are left out.
                batch.retain(|w| !w.answer.is_closed());
                if !batch.is_empty() {
                    this.acquire_batch(batch).await;
                }
                match this.inner.group.next() {
                    Some(next) => batch = next,
                    None => return,
                }
            }
        });
        if !spawned {
            // No runtime to run them on: their answers are dropped, and each waiting caller
            // (if any can still run) sends a round of its own.
            while self.inner.group.next().is_some() {}
        }
    }

    /// One round for `batch`: `SET NX PX` for one, [`ACQUIRE_BATCH`] for several; each
    /// caller gets its own lock or error.
    async fn acquire_batch(&self, batch: Vec<Waiting>) {
        let round = match batch.as_slice() {
            [one] => self.plain_round(&one.spec, one.ttl),
            many => {
                let mut keys = Vec::with_capacity(many.len());
                let mut args = Vec::with_capacity(2 * many.len());
                let mut requests = Vec::with_capacity(many.len());
                for waiting in many {
                    keys.push(Key::from(&*waiting.spec.keys[0]));
                    waiting.spec.batch_args(waiting.ttl, &mut args);
                    requests.push(waiting.spec.acquire_request(waiting.ttl));
                }
                Round {
                    kind: RoundKind::Acquire,
                    command: Command::Script {
                        script: &ACQUIRE_BATCH,
                        keys,
                        args,
                    },
                    requests,
                    drift_factor: self.inner.config.drift_factor,
                }
            }
        };
        let decided = round::run(&self.inner.connections, round, &self.inner.work).await;
        for (waiting, decided) in batch.into_iter().zip(decided) {
            let result = self.lock_from(decided, waiting.spec, waiting.ttl, None);
            // A caller gone meanwhile drops the answer, which releases a won lock.
            let _ = waiting.answer.send(Answer {
                result: Some(result),
                coordinator: self.clone(),
            });
        }
    }

    /// The round of one plain acquisition: `SET key token NX PX ttl`.
    fn plain_round(&self, spec: &LockSpec, ttl: Duration) -> Round {
        Round {
            kind: RoundKind::Acquire,
            command: spec.acquire(ttl, None),
            requests: vec![spec.acquire_request(ttl)],
            drift_factor: self.inner.config.drift_factor,
        }
    }
}

//! The calls waiting for group commit's next round (see the parent module): who leads,
//! who waits with what, the answer a waiting acquisition gets, and the waves of rounds.
//! No coordinator here: the rounds and the coordinator's groups build on this.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::error::Error;
use crate::lock::Lock;
use crate::lock_spec::LockSpec;
use crate::report::RoundReport;

/// The most calls one round carries: a script call of about 10 KB of arguments that runs on
/// a node in well under a millisecond. More waiting ones go in further rounds of the same
/// wave, in flight together.
pub(crate) const GROUP_MAX: usize = 128;

/// The calls (acquisitions, or releases) waiting for the round in flight, per coordinator;
/// `A` is what each caller gets back.
pub(crate) struct Group<A> {
    state: Mutex<State<A>>,
}

impl<A> std::fmt::Debug for Group<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("Group")
            .field("busy", &state.busy)
            .field("waiting", &state.waiting)
            .finish()
    }
}

impl<A> Default for Group<A> {
    fn default() -> Self {
        Group {
            state: Mutex::new(State {
                busy: false,
                waiting: Vec::new(),
                next_id: 0,
            }),
        }
    }
}

pub(super) struct State<A> {
    /// A round of this kind is in flight, or a group task is running them.
    busy: bool,
    waiting: Vec<Waiting<A>>,
    /// The id of the next call to wait.
    next_id: u64,
}

/// One call waiting for the next round.
pub(super) struct Waiting<A> {
    /// Which call it is, for [`Group::withdraw`].
    pub(super) id: u64,
    pub(super) spec: LockSpec,
    pub(super) ttl: Duration,
    pub(super) answer: oneshot::Sender<A>,
}

impl<A> std::fmt::Debug for Waiting<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("key", &self.spec.name)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// What a call does now: send its own round, or wait for the group's.
pub(super) enum Turn<A> {
    Lead,
    /// The answer, and the call's id in the group.
    Wait(oneshot::Receiver<A>, u64),
}

impl<A> Group<A> {
    fn state(&self) -> std::sync::MutexGuard<'_, State<A>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Leads when nothing is in flight; waits for the next round otherwise.
    pub(super) fn join(&self, spec: &LockSpec, ttl: Duration) -> Turn<A> {
        let mut state = self.state();
        if !state.busy {
            state.busy = true;
            return Turn::Lead;
        }
        let (answer, rx) = oneshot::channel();
        let id = state.next_id;
        state.next_id = id.wrapping_add(1);
        state.waiting.push(Waiting {
            id,
            spec: spec.clone(),
            ttl,
            answer,
        });
        Turn::Wait(rx, id)
    }

    /// Takes the call `id` out of the group if no round took it yet: `true` when it was
    /// still waiting (nothing was sent for it), `false` when a round carries it.
    pub(super) fn withdraw(&self, id: u64) -> bool {
        let mut state = self.state();
        let before = state.waiting.len();
        state.waiting.retain(|w| w.id != id);
        state.waiting.len() < before
    }

    /// Every call waiting now, oldest first, for the next wave of rounds; `None`, and no
    /// longer busy, when none waits.
    pub(super) fn next(&self) -> Option<Vec<Waiting<A>>> {
        let mut state = self.state();
        if state.waiting.is_empty() {
            state.busy = false;
            return None;
        }
        Some(std::mem::take(&mut state.waiting))
    }
}

/// A grouped acquisition's result on its way to its caller. A won lock that nobody takes
/// (the caller's future was dropped meanwhile) is released in the background.
pub(crate) struct Answer {
    pub(super) result: Option<Result<Lock, Error>>,
    pub(super) unclaimed: Arc<dyn Unclaimed>,
}

impl Answer {
    pub(super) fn take(mut self) -> Result<Lock, Error> {
        self.result.take().expect("an answer is taken once")
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(Ok(lock)) = self.result.take() {
            Arc::clone(&self.unclaimed).release_in_background(lock);
        }
    }
}

/// What releases a won lock that nobody took: the coordinator's shared state, so that this
/// file needs no coordinator.
pub(crate) trait Unclaimed: Send + Sync {
    /// Releases `lock` in the background (see `Coordinator::release_in_background`).
    fn release_in_background(self: Arc<Self>, lock: Lock);
}

/// What a grouped release's caller gets back.
pub(crate) type Released = Result<RoundReport, Error>;

/// A wave of waiting calls as rounds of at most [`GROUP_MAX`] each, oldest first: the
/// rounds of one wave are in flight together, so a burst of a thousand calls costs two
/// round trips (the lead round, then the wave), not one per [`GROUP_MAX`]. Calls of any
/// hash slots share a round: a cluster member runs it as one command per slot (see
/// `Command::PerSlot`).
pub(super) fn chunks<A>(mut wave: Vec<Waiting<A>>) -> Vec<Vec<Waiting<A>>> {
    let mut batches = Vec::with_capacity(wave.len().div_ceil(GROUP_MAX));
    while wave.len() > GROUP_MAX {
        let rest = wave.split_off(GROUP_MAX);
        batches.push(std::mem::replace(&mut wave, rest));
    }
    if !wave.is_empty() {
        batches.push(wave);
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::Token;

    fn waiting(id: u64, key: &str) -> Waiting<()> {
        Waiting {
            id,
            spec: LockSpec::new(&[key], Token::random(), None).unwrap(),
            ttl: Duration::from_secs(1),
            answer: oneshot::channel().0,
        }
    }

    fn ids(batches: Vec<Vec<Waiting<()>>>) -> Vec<Vec<u64>> {
        batches
            .into_iter()
            .map(|b| b.iter().map(|w| w.id).collect())
            .collect()
    }

    #[test]
    fn a_wave_goes_in_rounds_of_at_most_group_max_in_order() {
        let wave: Vec<_> = (0..GROUP_MAX as u64 + 2)
            .map(|i| waiting(i, &format!("k{i}")))
            .collect();
        let batches = ids(chunks(wave));
        assert_eq!(batches.len(), 2);
        assert_eq!(batches[0].len(), GROUP_MAX);
        assert_eq!(batches[1], vec![GROUP_MAX as u64, GROUP_MAX as u64 + 1]);
    }
}

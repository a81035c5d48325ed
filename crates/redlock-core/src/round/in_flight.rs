//! A round until its decision: its commands and the answers so far, and the hand-off of
//! what is left after the decision (commands still in flight, rollbacks) to one background
//! task (see `background`). A round dropped before its decision hands everything off with
//! the verdict "roll back" (deadpool's drop-guard idea), so an abandoned round leaves no key
//! behind either.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::background::{needs_redo, Background, Call};
use super::command::Answer;
use super::plan::Round;
use super::polled::Polled;
use super::work::BackgroundWork;
use crate::connection::Connection;
use crate::report::{CleanupOutcome, NodeReport, SettlingWriter};

/// A round's commands and answers until the decision; dropped undecided, it rolls back.
pub(crate) struct InFlight {
    pub(crate) connections: Arc<[Connection]>,
    pub(crate) round: Arc<Round>,
    pub(crate) t0: Instant,
    pub(crate) settling: Arc<SettlingWriter>,
    pub(crate) work: BackgroundWork,
    pub(crate) calls: Polled<Call>,
    pub(crate) answered: Vec<Option<(Vec<Answer>, Duration)>>,
    pub(crate) handed_off: bool,
    /// By request, those already handed to their callers as won (see `round::run_early`;
    /// empty without): never rolled back, even by a drop before the decision.
    pub(crate) won_early: Vec<bool>,
}

impl InFlight {
    /// Request `j`'s node reports as answered so far (the others pending): the report of a
    /// request decided before the round's end.
    pub(crate) fn reports(&self, j: usize) -> Vec<NodeReport> {
        self.connections
            .iter()
            .zip(&self.answered)
            .map(|(connection, answer)| {
                let mut report = NodeReport::pending(connection.name.clone());
                if let Some((answer, latency)) = answer
                    .as_ref()
                    .and_then(|(answers, latency)| answers.get(j).map(|answer| (answer, latency)))
                {
                    report.outcome = answer.outcome.clone();
                    report.latency = Some(*latency);
                }
                report
            })
            .collect()
    }

    /// Records the answers so far in the settling, then hands what is left to a background
    /// task: the commands still in flight, and the rollback of every request in
    /// `roll_back` on every node that may hold its key. `abandoned`: the round's future was
    /// dropped before its decision (see `Undo::waiter_arg`).
    pub(crate) fn hand_off(&mut self, roll_back: Vec<bool>, abandoned: bool) {
        self.handed_off = true;
        let answered = std::mem::take(&mut self.answered);
        let calls = std::mem::replace(&mut self.calls, Polled::new());
        let round = &self.round;
        for (i, answer) in answered.iter().enumerate() {
            if let Some((answers, latency)) = answer {
                let outcomes = answers.iter().map(|a| &a.outcome);
                let node = &self.connections[i].metrics;
                node.answered(round.kind, outcomes, *latency, false);
            }
        }
        let mut to_undo = Vec::new();
        self.settling.update(|settling| {
            for (i, answer) in answered.into_iter().enumerate() {
                let Some((answers, latency)) = answer else {
                    continue;
                };
                let mut undo_here = false;
                for (j, answer) in answers.iter().enumerate() {
                    let report = &mut settling.requests[j][i];
                    report.latency = Some(latency);
                    report.outcome = answer.outcome.clone();
                    if round.requests[j].redo && needs_redo(&answer.outcome) {
                        undo_here = true;
                    } else if roll_back[j] {
                        if answer.outcome.may_have_set() {
                            undo_here = true;
                        } else {
                            // A refusal set nothing: our key is not there (the token is new).
                            report.cleanup = Some(CleanupOutcome::NotPresent);
                        }
                    }
                }
                if undo_here {
                    to_undo.push((i, answers));
                } else {
                    settling.open -= 1;
                }
            }
        });
        if calls.is_empty() && to_undo.is_empty() {
            return;
        }
        let work = Background {
            connections: self.connections.clone(),
            round: round.clone(),
            t0: self.t0,
            settling: self.settling.clone(),
            roll_back,
            abandoned,
            _work: self.work.enter(),
        };
        self.work.spawn(work.run(calls, to_undo).in_current_span());
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.handed_off {
            // The round's future was dropped before it decided: nothing may be kept but
            // the locks its callers already hold (a wave task that unwinds from another
            // batch's panic drops this one).
            let roll_back = self
                .round
                .requests
                .iter()
                .enumerate()
                .map(|(j, r)| r.undo.is_some() && !self.won_early.get(j).copied().unwrap_or(false))
                .collect();
            self.hand_off(roll_back, true);
        }
    }
}

//! The part of a round that outlives its decision: commands still in flight, whose late
//! answers are recorded, and the rollback of what a round that is not kept may have set.
//! A round dropped before its decision hands everything here with the verdict "roll back"
//! (deadpool's drop-guard idea), so an abandoned round leaves no key behind either. The
//! hand-off itself is `in_flight`'s, the set of futures polled together is `polled`, and
//! the count of background work that callers wait for is `work`.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use fred::bytes_utils::Str;
use fred::types::{Key, Value};

use super::command::Answer;
use super::plan::{Request, Round, Undo};
use super::polled::Polled;
use super::work::WorkGuard;
use crate::connection::Connection;
use crate::report::{CleanupOutcome, NodeOutcome, SettlingWriter};
use crate::scripts::Script;
use crate::server_error::ServerErrorKind;

/// How many times a rollback is tried on one node. Each try is bounded by the node timeout,
/// and so is each wait for a node whose connection is down to come back (see
/// [`try_on`]); a node that failed this often is down or hung, and our key there expires
/// with its TTL.
/// Bounding the tries (rather than retrying until the TTL runs out) bounds how long
/// [`Coordinator::quiesce`](crate::Coordinator::quiesce) and `close` can wait, and keeps
/// rollbacks from piling up while a node stays down.
pub(crate) const ROLLBACK_ATTEMPTS: u32 = 3;

/// The pause before the second try; it doubles before each later one (10 ms, 20 ms). A node
/// whose connection is down is then waited for, up to the node timeout.
const ROLLBACK_PAUSE: Duration = Duration::from_millis(10);

/// One node's command: its index, what it answered for each request, and when (from the
/// round's start).
pub(crate) type Reply = (usize, Vec<Answer>, Duration);
pub(crate) type Call = Pin<Box<dyn Future<Output = Reply> + Send>>;

/// Whether a command that removes what is ours ([`Request::redo`](super::Request)) must be
/// sent again on a node: it did not answer, so it may not have run there, the node was
/// not ready for it (`LOADING`, `BUSY`: it did not run), or a cluster member's master sent
/// it on to another (`MOVED`, `ASK`).
pub(super) fn needs_redo(outcome: &NodeOutcome) -> bool {
    matches!(
        outcome,
        NodeOutcome::TimedOut | NodeOutcome::ConnectionError(_)
    ) || outcome.not_ready()
        || matches!(outcome, NodeOutcome::ServerError(e) if e.kind == ServerErrorKind::Redirected)
}

/// What outlives the decision.
pub(super) struct Background {
    pub(super) connections: Arc<[Connection]>,
    pub(super) round: Arc<Round>,
    pub(super) t0: Instant,
    pub(super) settling: Arc<SettlingWriter>,
    pub(super) roll_back: Vec<bool>,
    /// Dropped before its decision: nobody waits for the keys any more.
    pub(super) abandoned: bool,
    pub(super) _work: WorkGuard,
}

impl Background {
    pub(super) async fn run(self, mut calls: Polled<Call>, answered: Vec<(usize, Vec<Answer>)>) {
        let this = &self;
        let mut finishing: Polled<Pin<Box<dyn Future<Output = ()> + Send + '_>>> = Polled::new();
        for (i, answers) in answered {
            this.start_finish(i, answers, &mut finishing);
        }
        // Late answers as they come, while the rollbacks started so far go on.
        std::future::poll_fn(|cx| {
            while let Poll::Ready(Some((i, answers, latency))) = calls.poll_next(cx) {
                this.late_answer(i, &answers, latency);
                this.start_finish(i, answers, &mut finishing);
            }
            while let Poll::Ready(Some(())) = finishing.poll_next(cx) {}
            if calls.is_empty() && finishing.is_empty() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }

    /// Records node `i`'s answer that came after the decision.
    fn late_answer(&self, i: usize, answers: &[Answer], latency: Duration) {
        let connection = &self.connections[i];
        let outcomes = answers.iter().map(|a| &a.outcome);
        connection
            .metrics
            .answered(self.round.kind, outcomes, latency, true);
        if let [answer, ..] = answers {
            tracing::debug!(node = %connection.name, outcome = %answer.outcome, ?latency, "late answer");
        }
        self.settling.update(|settling| {
            for (j, answer) in answers.iter().enumerate() {
                let report = &mut settling.requests[j][i];
                report.outcome = answer.outcome.clone();
                report.latency = Some(latency);
                report.late = true;
            }
        });
    }

    /// Finishes node `i` ([`finish`](Self::finish)): at once when nothing is to be sent
    /// there (the usual late answer: no future kept, no allocation), else in `finishing`.
    fn start_finish<'a>(
        &'a self,
        i: usize,
        answers: Vec<Answer>,
        finishing: &mut Polled<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>,
    ) {
        if self.sends_nothing(&answers) {
            // Each request to roll back was refused there: nothing of ours was set.
            let cleanups = (0..answers.len())
                .filter(|&j| self.round.requests[j].undo.is_some() && self.roll_back[j])
                .map(|j| (j, CleanupOutcome::NotPresent))
                .collect();
            self.close(i, cleanups);
        } else {
            finishing.push(Box::pin(async move { self.finish(i, &answers).await }));
        }
    }

    /// Whether [`finish`](Self::finish) sends nothing for these answers: no request to
    /// roll back where its key may be set, none to send again.
    fn sends_nothing(&self, answers: &[Answer]) -> bool {
        self.round
            .requests
            .iter()
            .zip(answers)
            .enumerate()
            .all(|(j, (request, answer))| {
                let redo = request.redo && needs_redo(&answer.outcome);
                let undo =
                    request.undo.is_some() && self.roll_back[j] && answer.outcome.may_have_set();
                !redo && !undo
            })
    }

    /// Rolls node `i` back for every request that is not kept and whose answer may have
    /// set its key there, sends a release (or leave) again where the node did not answer
    /// it, then closes the node in the settling. A grouped round's rollbacks on the node go
    /// out together: one after another, those on a silent node would each wait out their
    /// tries, and the last key would stay there for the batch's length times that.
    async fn finish(&self, i: usize, answers: &[Answer]) {
        let connection = &self.connections[i];
        let requests = self.round.requests.iter().zip(answers);
        // The command is sent again once for the node, whatever the number of requests
        // (a grouped release carries many): one answer stands for them all.
        let redo: Vec<usize> = requests
            .clone()
            .enumerate()
            .filter(|(_, (request, answer))| request.redo && needs_redo(&answer.outcome))
            .map(|(j, _)| j)
            .collect();
        let undos = requests.enumerate().filter_map(|(j, (request, answer))| {
            let (Some(undo), true) = (&request.undo, self.roll_back[j]) else {
                return None;
            };
            if request.redo && needs_redo(&answer.outcome) {
                return None;
            }
            Some(async move { (j, self.undo(connection, request, undo, answer).await) })
        });
        let redone = async {
            match redo.first() {
                Some(&j) => Some(self.redo(connection, &answers[j].outcome).await),
                None => None,
            }
        };
        let (redone, mut cleanups) = futures::join!(redone, futures::future::join_all(undos));
        if let Some(redone) = redone {
            cleanups.extend(redo.into_iter().map(|j| (j, redone.clone())));
        }
        self.close(i, cleanups);
    }

    /// Rolls `request` back on node `connection`, which answered `answer`: a
    /// compare-and-delete where the answer may have set its key, nothing where it was
    /// refused.
    async fn undo(
        &self,
        connection: &Connection,
        request: &Request,
        undo: &Undo,
        answer: &Answer,
    ) -> CleanupOutcome {
        if !answer.outcome.may_have_set() {
            return CleanupOutcome::NotPresent;
        }
        // Past the TTL our key is gone by itself, wherever it was set.
        let deadline = self.t0 + request.ttl.unwrap_or_default();
        let args = match undo.waiter_arg {
            Some(i) if self.abandoned => {
                let mut args = undo.args.clone();
                if let Some(waiter) = args.get_mut(i) {
                    *waiter = Value::String(Str::from_static(""));
                }
                Cow::Owned(args)
            }
            _ => Cow::Borrowed(&undo.args),
        };
        // A lock over keys of several hash slots is undone on a cluster member in one
        // script per slot, sent together, as it was taken there (see `LockSpec::by_slot`):
        // its undo treats each key (with its queues) alone.
        let cleanup = if connection.is_cluster() {
            let shares = undo.keys_by_slot();
            let tries = shares
                .iter()
                .map(|keys| try_on(connection, undo.script, keys, &args, Some(deadline)));
            CleanupOutcome::together(futures::future::join_all(tries).await)
        } else {
            try_on(connection, undo.script, &undo.keys, &args, Some(deadline)).await
        };
        connection.metrics.rolled_back(&cleanup);
        let key = &request.name;
        if answer.outcome.is_answer() || matches!(cleanup, CleanupOutcome::Removed) {
            tracing::debug!(node = %connection.name, %key, outcome = %answer.outcome, %cleanup, "rolled back");
        } else {
            tracing::warn!(node = %connection.name, %key, outcome = %answer.outcome, %cleanup, "rollback on an unresponsive node");
        }
        cleanup
    }

    /// Records node `i`'s cleanups in the settling and closes the node there.
    fn close(&self, i: usize, cleanups: Vec<(usize, CleanupOutcome)>) {
        self.settling.update(|settling| {
            for (j, cleanup) in cleanups {
                settling.requests[j][i].cleanup = Some(cleanup);
            }
            settling.open -= 1;
        });
    }
}

impl Background {
    /// Sends the round's command (a release or a leave) again on node `connection`, which
    /// answered `outcome` (no answer): up to [`ROLLBACK_ATTEMPTS`] times, like a rollback.
    /// The release's own TTL is not known here; the tries are bounded by their number. A
    /// compare-and-delete is sent again as its script, a batch over several hash slots as
    /// one script per slot on a cluster member (see
    /// [`Command::cleanups_on`](super::command::Command::cleanups_on)).
    async fn redo(&self, connection: &Connection, outcome: &NodeOutcome) -> CleanupOutcome {
        let scripts = self.round.command.cleanups_on(connection);
        let tries = scripts
            .into_iter()
            .map(|(script, keys, args)| try_on(connection, script, keys, args, None));
        let cleanup = CleanupOutcome::together(futures::future::join_all(tries).await);
        // Debug, not warn: with a node down, every release would warn; the node's health
        // and metrics say that already.
        tracing::debug!(node = %connection.name, %outcome, %cleanup, kind = %self.round.kind, "sent again");
        cleanup
    }
}

/// A compare-and-delete (`script` on `keys` and `args`, answering 1 when it deleted, 0
/// when there was nothing of ours) on one node, tried up to [`ROLLBACK_ATTEMPTS`] times,
/// no try started at or past `deadline` if there is one (for a rollback, the key's TTL: after
/// it our key is gone by itself). Between tries it pauses (a node timeout after a node
/// that was not ready: `LOADING`, `BUSY`), then waits for a node whose connection is down
/// to reconnect (up to the node timeout): a cut that heals within that does not leave the
/// key behind. A command that timed out is usually still queued on the
/// connection behind the command it undoes, so it will run in order.
pub(crate) async fn try_on(
    connection: &Connection,
    script: &Script,
    keys: &[Key],
    args: &[Value],
    deadline: Option<Instant>,
) -> CleanupOutcome {
    let mut pause = ROLLBACK_PAUSE;
    let mut attempt = 1;
    loop {
        let (failure, not_ready) = match connection.eval_cleanup(script, keys, args).await {
            Ok(Value::Integer(n)) if n > 0 => return CleanupOutcome::Removed,
            Ok(Value::Integer(_)) => return CleanupOutcome::NotPresent,
            // A grouped release sent again: one flag per lock.
            Ok(Value::Array(flags)) => {
                let removed = flags
                    .iter()
                    .any(|f| matches!(f, Value::Integer(n) if *n > 0));
                return if removed {
                    CleanupOutcome::Removed
                } else {
                    CleanupOutcome::NotPresent
                };
            }
            Ok(other) => (format!("unexpected reply to the script: {other:?}"), false),
            Err(failure) => (failure.to_string(), failure.not_ready()),
        };
        // A node that is loading its data or busy with a script is given a node timeout
        // before the next try: a few milliseconds would not outlast either.
        let wait = if not_ready {
            pause.max(connection.timeout())
        } else {
            pause
        };
        let past = deadline.is_some_and(|deadline| Instant::now() + wait >= deadline);
        if attempt >= ROLLBACK_ATTEMPTS || past {
            return CleanupOutcome::Failed(failure);
        }
        tokio::time::sleep(wait).await;
        // A node whose connection is down is waited for: a try while it is down fails at
        // once, and the next ones would too, a few milliseconds later.
        connection.until_connected(deadline).await;
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return CleanupOutcome::Failed(failure);
        }
        pause *= 2;
        attempt += 1;
    }
}

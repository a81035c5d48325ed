//! The part of a round that outlives its decision: commands still in flight, whose late
//! answers are recorded, and the rollback of what a round that is not kept may have set.
//! A round dropped before its decision hands everything here with the verdict "roll back"
//! (deadpool's drop-guard idea), so an abandoned round leaves no key behind either.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use fred::bytes_utils::Str;
use fred::types::{Key, Value};

use super::command::{Answer, Command};
use super::plan::{Request, Round, Undo};
use crate::connection::Connection;
use crate::report::{CleanupOutcome, NodeOutcome, NodeReport, Settling};
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

/// Counts a coordinator's background work (commands still in flight, rollbacks,
/// background releases), so that callers can wait for it to drain, and runs it in the
/// runtime the coordinator was connected in.
#[derive(Debug, Clone)]
pub(crate) struct BackgroundWork(Arc<watch::Sender<usize>>, tokio::runtime::Handle);

impl BackgroundWork {
    /// Background work run in `runtime`: the coordinator's, whose tasks its connections
    /// are.
    pub(crate) fn new(runtime: tokio::runtime::Handle) -> Self {
        BackgroundWork(Arc::new(watch::Sender::new(0)), runtime)
    }

    /// Runs `task` in the coordinator's runtime, not the caller's: a caller may run in
    /// another runtime, one shutting down (its tasks dropping their guards and rounds),
    /// which would drop the task unrun. Dropped too if the coordinator's runtime has shut
    /// down (its connections are gone with it).
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        drop(self.1.spawn(task));
    }

    /// Counts one piece of work until the returned guard is dropped.
    ///
    /// Only the count's return to zero notifies: [`idle`](Self::idle) is the one waiter,
    /// and each notification of a `watch` takes eight locks (its wake lists), on every
    /// round's hand-off.
    pub(crate) fn enter(&self) -> WorkGuard {
        self.0.send_if_modified(|n| {
            *n += 1;
            false
        });
        WorkGuard(self.0.clone())
    }

    pub(crate) async fn idle(&self) {
        let _ = self.0.subscribe().wait_for(|n| *n == 0).await;
    }
}

/// One piece of background work, counted while it lives.
pub(crate) struct WorkGuard(Arc<watch::Sender<usize>>);

impl Drop for WorkGuard {
    fn drop(&mut self) {
        self.0.send_if_modified(|n| {
            *n -= 1;
            *n == 0
        });
    }
}

/// One node's command: its index, what it answered for each request, and when (from the
/// round's start).
pub(crate) type Reply = (usize, Vec<Answer>, Duration);
pub(crate) type Call = Pin<Box<dyn Future<Output = Reply> + Send>>;

/// Futures polled together, all on the waker of the task that polls the set: a round's
/// commands (one per node) and its rollbacks. Every poll polls each pending future, which
/// for a handful costs less than `FuturesUnordered`'s task allocation for each future
/// pushed (and its own for each set made), which a round would pay several times per node.
pub(crate) struct Polled<F: Future + Unpin> {
    pending: Vec<F>,
    /// Finished, not yet taken, in the order they were found finished.
    ready: VecDeque<F::Output>,
}

impl<F: Future + Unpin> Polled<F> {
    pub(crate) fn new() -> Self {
        Polled::with_capacity(0)
    }

    /// A set for up to `n` futures without growing.
    pub(crate) fn with_capacity(n: usize) -> Self {
        Polled {
            pending: Vec::with_capacity(n),
            ready: VecDeque::with_capacity(n),
        }
    }

    pub(crate) fn push(&mut self, future: F) {
        self.pending.push(future);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.ready.is_empty()
    }

    /// Polls every pending future (so that each is registered with this task's waker,
    /// also right after the set moved to another task), then yields one finished
    /// output; `None` once none is left.
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        let mut i = 0;
        while i < self.pending.len() {
            match Pin::new(&mut self.pending[i]).poll(cx) {
                Poll::Ready(output) => {
                    self.ready.push_back(output);
                    drop(self.pending.swap_remove(i));
                }
                Poll::Pending => i += 1,
            }
        }
        match self.ready.pop_front() {
            Some(output) => Poll::Ready(Some(output)),
            None if self.pending.is_empty() => Poll::Ready(None),
            None => Poll::Pending,
        }
    }

    pub(crate) async fn next(&mut self) -> Option<F::Output> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }
}

/// A round's commands and answers until the decision; dropped undecided, it rolls back.
pub(crate) struct InFlight {
    pub(crate) connections: Arc<[Connection]>,
    pub(crate) round: Arc<Round>,
    pub(crate) t0: Instant,
    pub(crate) settling: Arc<watch::Sender<Settling>>,
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
        update(&self.settling, |settling| {
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
                        if needs_undo(&answer.outcome) {
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

/// Updates a round's settling. Only its closing (every node answered or timed out, every
/// rollback over) notifies: the one waiter is [`RoundReport::settled`], which waits for
/// that, and each notification of a `watch` takes eight locks (its wake lists), several
/// times per round. Readers of the state still see every update.
///
/// [`RoundReport::settled`]: crate::RoundReport::settled
pub(crate) fn update(settling: &watch::Sender<Settling>, f: impl FnOnce(&mut Settling)) {
    settling.send_if_modified(|settling| {
        f(settling);
        settling.open == 0
    });
}

/// Whether a node's answer leaves our key possibly set there: everything but a refusal,
/// a script the node did not know (see `OnNoScript::Refuse`), a node not ready for the
/// command (`LOADING`, `BUSY`) and a client that sent nothing (closed): nothing ran.
fn needs_undo(outcome: &NodeOutcome) -> bool {
    match outcome {
        NodeOutcome::HeldByOther | NodeOutcome::Closed(_) => false,
        // Nothing was sent to a node that casts no vote.
        NodeOutcome::ServerError(e)
            if matches!(
                e.kind,
                ServerErrorKind::ScriptNotLoaded | ServerErrorKind::SameServer
            ) =>
        {
            false
        }
        other => !not_ready(other),
    }
}

/// Whether the node refused the command as not ready for it (`LOADING`, `BUSY`): it did
/// not run, and may run if sent again a little later.
fn not_ready(outcome: &NodeOutcome) -> bool {
    // A node being identified was sent nothing (see `connection::identity`).
    matches!(outcome, NodeOutcome::ServerError(e)
        if matches!(e.kind, ServerErrorKind::NotReady | ServerErrorKind::NotIdentified))
}

/// Whether a command that removes what is ours ([`Request::redo`](super::Request)) must be
/// sent again on a node: it did not answer, so it may not have run there, or the node was
/// not ready for it (`LOADING`, `BUSY`: it did not run).
fn needs_redo(outcome: &NodeOutcome) -> bool {
    matches!(
        outcome,
        NodeOutcome::TimedOut | NodeOutcome::ConnectionError(_)
    ) || not_ready(outcome)
}

/// What outlives the decision.
struct Background {
    connections: Arc<[Connection]>,
    round: Arc<Round>,
    t0: Instant,
    settling: Arc<watch::Sender<Settling>>,
    roll_back: Vec<bool>,
    /// Dropped before its decision: nobody waits for the keys any more.
    abandoned: bool,
    _work: WorkGuard,
}

impl Background {
    async fn run(self, mut calls: Polled<Call>, answered: Vec<(usize, Vec<Answer>)>) {
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
        update(&self.settling, |settling| {
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
                    request.undo.is_some() && self.roll_back[j] && needs_undo(&answer.outcome);
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
        if !needs_undo(&answer.outcome) {
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
        let cleanup = try_on(connection, undo.script, &undo.keys, &args, Some(deadline)).await;
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
        update(&self.settling, |settling| {
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
    /// The release's own TTL is not known here; the tries are bounded by their number.
    async fn redo(&self, connection: &Connection, outcome: &NodeOutcome) -> CleanupOutcome {
        let Command::Script { script, keys, args } = &self.round.command else {
            return CleanupOutcome::NotPresent;
        };
        let cleanup = try_on(connection, script, keys, args, None).await;
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
            Err(failure) => (failure.to_string(), not_ready(&failure)),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A node a closed client sent nothing to needs no rollback: it must not get three
    /// tries, each waiting for a connection that has quit.
    #[test]
    fn nothing_sent_needs_no_undo() {
        use crate::report::ClosedReason;
        assert!(!needs_undo(&NodeOutcome::Closed(ClosedReason::Shutdown)));
        assert!(!needs_undo(&NodeOutcome::Closed(
            ClosedReason::RuntimeStopped
        )));
        assert!(!needs_undo(&NodeOutcome::HeldByOther));
        assert!(needs_undo(&NodeOutcome::TimedOut));
        assert!(needs_undo(&NodeOutcome::Acquired));
    }

    /// A set first polled on one task (a round, with a no-op waker) and then driven by
    /// another (the background task) is woken by whichever future finishes, the last one
    /// pushed too: each poll registers every pending future with the current waker.
    #[tokio::test]
    async fn a_set_moved_to_another_task_is_woken_by_any_of_its_futures() {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..3)
            .map(|_| tokio::sync::oneshot::channel::<usize>())
            .unzip();
        let mut set = Polled::with_capacity(3);
        for receiver in receivers {
            set.push(receiver);
        }
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        assert!(set.poll_next(&mut cx).is_pending());
        let task = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(value) = set.next().await {
                got.push(value.unwrap());
            }
            got
        });
        // The last first, after the task has waited: the others are still pending then.
        for (i, sender) in senders.into_iter().enumerate().rev() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            sender.send(i).unwrap();
        }
        let got = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("a finished future never woke the set")
            .unwrap();
        assert_eq!(got, vec![2, 1, 0]);
    }
}

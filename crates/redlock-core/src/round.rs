//! The round engine: one command fanned out to every node at once, decided as soon as the
//! replies allow, with whatever was set rolled back on every node when the round is lost,
//! cancelled, or won too late.
//!
//! Each node's command runs in a task of its own, so it goes on after the round is decided
//! (or after the caller drops the round's future): a reply that arrives late is still seen,
//! and rolled back if the round did not keep its keys. The tasks learn the round's verdict
//! through a `watch` channel; a channel closed without a verdict means the round's future
//! was dropped, and is treated as "roll back" (deadpool's drop-guard idea, without a guard
//! object: the closed channel is the signal).

use std::future::Future;
use std::sync::Arc;
use std::task::Context;
use std::time::Duration;

use fred::types::{Key, Value};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::Instrument;

use crate::drift::{drift, validity};
use crate::node::Node;
use crate::quorum::{quorum, Decision, Tally};
use crate::report::{CleanupOutcome, NodeOutcome, NodeReport, RoundKind, RoundReport, Tail};
use crate::scripts::Script;

/// What is sent to each node.
#[derive(Debug)]
pub(crate) enum Forward {
    /// `SET key token NX PX ttl` on the first key.
    SetNx { token: Value, ttl_ms: u64 },
    /// A script over all keys that answers 1 (done) or 0 (refused).
    Script {
        script: &'static Script,
        args: Vec<Value>,
    },
}

/// One round's work, shared by its node tasks.
#[derive(Debug)]
pub(crate) struct Op {
    pub(crate) kind: RoundKind,
    /// The key as reported (one key, or several joined).
    pub(crate) name: Arc<str>,
    pub(crate) keys: Vec<Key>,
    pub(crate) forward: Forward,
    /// What undoes `forward` on a node, for rounds that must roll back when not won.
    pub(crate) undo: Option<(&'static Script, Vec<Value>)>,
    /// The TTL the round asks for; validity is computed from it.
    pub(crate) ttl: Option<Duration>,
    pub(crate) drift_factor: f64,
}

impl Op {
    async fn apply(&self, node: &Node) -> NodeOutcome {
        let done = match &self.forward {
            Forward::SetNx { token, ttl_ms } => {
                node.set_nx_px(self.keys[0].clone(), token.clone(), *ttl_ms)
                    .await
            }
            Forward::Script { script, args } => node.eval_flag(script, &self.keys, args).await,
        };
        match (self.kind, done) {
            (_, Err(failure)) => failure,
            (RoundKind::Acquire, Ok(true)) => NodeOutcome::Acquired,
            (RoundKind::Acquire, Ok(false)) => NodeOutcome::HeldByOther,
            (RoundKind::Extend, Ok(true)) => NodeOutcome::Extended,
            (RoundKind::Release, Ok(true)) => NodeOutcome::Released,
            (RoundKind::Extend | RoundKind::Release, Ok(false)) => NodeOutcome::NotHeld,
        }
    }

    /// Whether an outcome counts towards the quorum. A release is done on a node once our
    /// key is gone from it, whether we deleted it or it had already expired.
    fn counts(&self, outcome: &NodeOutcome) -> bool {
        match self.kind {
            RoundKind::Acquire => *outcome == NodeOutcome::Acquired,
            RoundKind::Extend => *outcome == NodeOutcome::Extended,
            RoundKind::Release => matches!(outcome, NodeOutcome::Released | NodeOutcome::NotHeld),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Undecided,
    Keep,
    RollBack,
}

/// Counts the background work of a coordinator (node tasks still running, rollbacks), so
/// that callers can wait for it to drain.
#[derive(Debug, Clone)]
pub(crate) struct Busy(Arc<watch::Sender<usize>>);

impl Busy {
    pub(crate) fn new() -> Self {
        Busy(Arc::new(watch::Sender::new(0)))
    }

    fn enter(&self) -> BusyGuard {
        self.0.send_modify(|n| *n += 1);
        BusyGuard(self.0.clone())
    }

    pub(crate) async fn idle(&self) {
        let _ = self.0.subscribe().wait_for(|n| *n == 0).await;
    }
}

struct BusyGuard(Arc<watch::Sender<usize>>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// The end of a round: its report, when it started, and whether it was won.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) report: RoundReport,
    pub(crate) t0: Instant,
    pub(crate) won: bool,
}

/// Runs one round over all nodes.
pub(crate) async fn run(nodes: &Arc<[Node]>, op: Op, busy: &Busy) -> Finished {
    let span = tracing::debug_span!(
        "redlock.round",
        kind = %op.kind,
        key = %op.name,
        nodes = nodes.len(),
        accepted = tracing::field::Empty,
        won = tracing::field::Empty,
        elapsed_us = tracing::field::Empty,
    );
    run_inner(nodes, Arc::new(op), busy).instrument(span).await
}

async fn run_inner(nodes: &Arc<[Node]>, op: Arc<Op>, busy: &Busy) -> Finished {
    let n = nodes.len();
    let pending: Vec<NodeReport> = nodes
        .iter()
        .map(|node| NodeReport::pending(node.name.clone()))
        .collect();
    let tail = Arc::new(watch::Sender::new(Tail {
        nodes: pending,
        open: n,
    }));
    let (verdict_tx, verdict_rx) = watch::channel(Verdict::Undecided);
    let (reply_tx, mut reply_rx) = mpsc::unbounded_channel();

    // t0 is read before the first command can leave (guarantee G2).
    let t0 = Instant::now();
    for i in 0..n {
        let task = NodeTask {
            nodes: nodes.clone(),
            index: i,
            op: op.clone(),
            t0,
            replies: reply_tx.clone(),
            verdict: verdict_rx.clone(),
            tail: tail.clone(),
            _busy: busy.enter(),
        };
        // Poll the task once here, before spawning it: that hands its command to the node's
        // connection now, in this round's order. A spawned task that had not been polled
        // yet when the round returned could otherwise send its SET after the caller's next
        // round (a release) had sent its delete, leaving the key behind until its TTL.
        let mut task = Box::pin(task.run().in_current_span());
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        if task.as_mut().poll(&mut cx).is_pending() {
            tokio::spawn(task);
        }
    }
    drop(reply_tx);
    drop(verdict_rx);

    let mut tally = Tally::new(n);
    let mut answered: Vec<Option<(NodeOutcome, Duration)>> = vec![None; n];
    let decision = loop {
        match reply_rx.recv().await {
            Some((i, outcome, latency)) => {
                let decision = tally.record(op.counts(&outcome));
                answered[i] = Some((outcome, latency));
                if let Some(decision) = decision {
                    break decision;
                }
            }
            // Every task has replied, so the tally has decided; this is only a fallback.
            None => break tally.decision().unwrap_or(Decision::Lost),
        }
    };
    let elapsed = t0.elapsed();
    // Validity only means something for a round that reached its quorum.
    let validity = op
        .ttl
        .filter(|_| decision == Decision::Won)
        .and_then(|ttl| validity(ttl, elapsed, drift(ttl, op.drift_factor)));
    let won = decision == Decision::Won && (op.ttl.is_none() || validity.is_some());

    // The tail gets the decided view before the tasks get the verdict; they only touch it
    // after the verdict, so answers that arrive from now on are marked late.
    tail.send_modify(|tail| {
        for (report, answer) in tail.nodes.iter_mut().zip(&answered) {
            if let Some((outcome, latency)) = answer {
                report.outcome = outcome.clone();
                report.latency = Some(*latency);
            }
        }
    });
    let verdict = if won || op.undo.is_none() {
        Verdict::Keep
    } else {
        Verdict::RollBack
    };
    let _ = verdict_tx.send(verdict);

    let report = RoundReport {
        kind: op.kind,
        key: op.name.clone(),
        quorum: quorum(n),
        accepted: tally.accepted(),
        nodes: tail.borrow().nodes.clone(),
        elapsed,
        validity,
        tail: Some(tail.subscribe()),
    };
    let span = tracing::Span::current();
    span.record("accepted", report.accepted);
    span.record("won", won);
    span.record("elapsed_us", elapsed.as_micros() as u64);
    tracing::debug!(report = %report, "round decided");
    Finished { report, t0, won }
}

struct NodeTask {
    nodes: Arc<[Node]>,
    index: usize,
    op: Arc<Op>,
    t0: Instant,
    replies: mpsc::UnboundedSender<(usize, NodeOutcome, Duration)>,
    verdict: watch::Receiver<Verdict>,
    tail: Arc<watch::Sender<Tail>>,
    _busy: BusyGuard,
}

impl NodeTask {
    async fn run(mut self) {
        let node = &self.nodes[self.index];
        let outcome = self.op.apply(node).await;
        let latency = self.t0.elapsed();
        // Fails when the round has been decided or dropped: the answer is late.
        let _ = self.replies.send((self.index, outcome.clone(), latency));
        drop(self.replies);

        let verdict = match self.verdict.wait_for(|v| *v != Verdict::Undecided).await {
            Ok(v) => *v,
            // The round's future was dropped before it decided: nothing may be kept.
            Err(_) => Verdict::RollBack,
        };
        let cleanup = match (&self.op.undo, verdict) {
            (Some((script, args)), Verdict::RollBack) => {
                // Past the TTL our key is gone by itself, wherever it was set.
                let deadline = self.t0 + self.op.ttl.unwrap_or_default();
                let cleanup = roll_back(node, script, &self.op.keys, args, deadline).await;
                if outcome.is_answer() || matches!(cleanup, CleanupOutcome::Removed) {
                    tracing::debug!(node = %node.name, %outcome, %cleanup, "rolled back");
                } else {
                    tracing::warn!(node = %node.name, %outcome, %cleanup, "rollback on an unresponsive node");
                }
                Some(cleanup)
            }
            _ => None,
        };
        self.tail.send_modify(|tail| {
            let report = &mut tail.nodes[self.index];
            if report.outcome == NodeOutcome::Pending {
                report.outcome = outcome;
                report.latency = Some(latency);
                report.late = true;
            }
            report.cleanup = cleanup;
            tail.open -= 1;
        });
    }
}

/// Compare-and-delete on one node, retried until it is confirmed or the key's TTL has run
/// out (after which the key is gone by itself). A command that timed out is usually still
/// queued on the connection behind the command it undoes, so it will run in order.
async fn roll_back(
    node: &Node,
    script: &Script,
    keys: &[Key],
    args: &[Value],
    deadline: Instant,
) -> CleanupOutcome {
    let mut pause = Duration::from_millis(10);
    loop {
        match node.eval_flag(script, keys, args).await {
            Ok(true) => return CleanupOutcome::Removed,
            Ok(false) => return CleanupOutcome::NotPresent,
            Err(failure) => {
                if Instant::now() + pause >= deadline {
                    return CleanupOutcome::Failed(failure.to_string());
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

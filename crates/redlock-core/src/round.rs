//! The round engine: one command fanned out to every node at once, decided as soon as the
//! replies allow, with whatever was set rolled back on every node when the round is lost,
//! cancelled, or won too late.
//!
//! The round's own task drives every node's command until the decision, with no task or
//! channel in between (each command is handed to its node's connection before the round
//! first waits, so commands leave in the order rounds are started). Whatever is left after
//! the decision goes to one background task: commands still in flight, whose late answers
//! are recorded and, when the round is not kept, rolled back; and the rollbacks of nodes
//! that had answered. When the caller drops the round's future before the decision, a drop
//! guard hands everything to that task with the verdict "roll back" (deadpool's drop-guard
//! idea), so an abandoned round leaves no key behind either.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use fred::types::{Key, Value};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::watch;
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

/// What happens to the nodes once the round is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
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

    pub(crate) fn enter(&self) -> BusyGuard {
        self.0.send_modify(|n| *n += 1);
        BusyGuard(self.0.clone())
    }

    pub(crate) async fn idle(&self) {
        let _ = self.0.subscribe().wait_for(|n| *n == 0).await;
    }
}

pub(crate) struct BusyGuard(Arc<watch::Sender<usize>>);

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

/// One node's command: its index, what it answered, and when (from the round's start).
type Reply = (usize, NodeOutcome, Duration);
type Call = Pin<Box<dyn Future<Output = Reply> + Send>>;

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

    // t0 is read before the first command can leave (guarantee G2).
    let t0 = Instant::now();
    let mut flight = Flight {
        nodes: nodes.clone(),
        op: op.clone(),
        t0,
        tail: tail.clone(),
        busy: busy.clone(),
        calls: FuturesUnordered::new(),
        answered: vec![None; n],
        handed_off: false,
    };
    let mut tally = Tally::new(n);
    let mut decision = None;
    for i in 0..n {
        let mut call: Call = Box::pin(
            {
                let (nodes, op) = (nodes.clone(), op.clone());
                async move {
                    let outcome = op.apply(&nodes[i]).await;
                    (i, outcome, t0.elapsed())
                }
            }
            .in_current_span(),
        );
        // Polling the command once here hands it to the node's connection now, in this
        // round's order: a command first polled after the round returned could otherwise
        // send its SET after the caller's next round (a release) had sent its delete,
        // leaving the key behind until its TTL. (The waker is replaced at the next poll.)
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        match call.as_mut().poll(&mut cx) {
            Poll::Ready((i, outcome, latency)) => {
                let d = tally.record(op.counts(&outcome));
                flight.answered[i] = Some((outcome, latency));
                decision = decision.or(d);
            }
            Poll::Pending => flight.calls.push(call),
        }
    }
    while decision.is_none() {
        match flight.calls.next().await {
            Some((i, outcome, latency)) => {
                decision = tally.record(op.counts(&outcome));
                flight.answered[i] = Some((outcome, latency));
            }
            // Every node has answered, so the tally has decided; this is only a fallback.
            None => decision = Some(tally.decision().unwrap_or(Decision::Lost)),
        }
    }
    let decision = decision.unwrap_or(Decision::Lost);
    let elapsed = t0.elapsed();
    // Validity only means something for a round that reached its quorum.
    let validity = op
        .ttl
        .filter(|_| decision == Decision::Won)
        .and_then(|ttl| validity(ttl, elapsed, drift(ttl, op.drift_factor)));
    let won = decision == Decision::Won && (op.ttl.is_none() || validity.is_some());
    let verdict = if won || op.undo.is_none() {
        Verdict::Keep
    } else {
        Verdict::RollBack
    };
    flight.hand_off(verdict);

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

/// A round's commands and answers until the decision; dropped undecided, it rolls back.
struct Flight {
    nodes: Arc<[Node]>,
    op: Arc<Op>,
    t0: Instant,
    tail: Arc<watch::Sender<Tail>>,
    busy: Busy,
    calls: FuturesUnordered<Call>,
    answered: Vec<Option<(NodeOutcome, Duration)>>,
    handed_off: bool,
}

impl Flight {
    /// Records the answers so far in the tail, then hands what is left to a background
    /// task: the commands still in flight, and with [`Verdict::RollBack`] the rollback on
    /// every node that may hold our key.
    fn hand_off(&mut self, verdict: Verdict) {
        self.handed_off = true;
        let roll_back = verdict == Verdict::RollBack && self.op.undo.is_some();
        let answered = std::mem::take(&mut self.answered);
        let calls = std::mem::take(&mut self.calls);
        let mut to_undo = Vec::new();
        self.tail.send_modify(|tail| {
            for (i, answer) in answered.into_iter().enumerate() {
                let Some((outcome, latency)) = answer else {
                    continue;
                };
                let report = &mut tail.nodes[i];
                report.latency = Some(latency);
                if roll_back && needs_undo(&outcome) {
                    to_undo.push((i, outcome.clone()));
                } else {
                    if roll_back {
                        // A refusal set nothing: our key is not there (the token is new).
                        report.cleanup = Some(CleanupOutcome::NotPresent);
                    }
                    tail.open -= 1;
                }
                report.outcome = outcome;
            }
        });
        if calls.is_empty() && to_undo.is_empty() {
            return;
        }
        let work = Background {
            nodes: self.nodes.clone(),
            op: self.op.clone(),
            t0: self.t0,
            tail: self.tail.clone(),
            roll_back,
            _busy: self.busy.enter(),
        };
        let task = work.run(calls, to_undo).in_current_span();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(task);
            }
            // Dropped outside a runtime: nothing can be awaited any more. The keys set by
            // this round expire with their TTL.
            Err(_) => {
                tracing::warn!(key = %self.op.name, "round dropped outside a tokio runtime: no rollback")
            }
        }
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        if !self.handed_off {
            // The round's future was dropped before it decided: nothing may be kept.
            self.hand_off(Verdict::RollBack);
        }
    }
}

/// Whether a node's answer leaves our key possibly set there: everything but a refusal.
fn needs_undo(outcome: &NodeOutcome) -> bool {
    !matches!(outcome, NodeOutcome::HeldByOther)
}

/// The part of a round that outlives its decision.
struct Background {
    nodes: Arc<[Node]>,
    op: Arc<Op>,
    t0: Instant,
    tail: Arc<watch::Sender<Tail>>,
    roll_back: bool,
    _busy: BusyGuard,
}

impl Background {
    async fn run(self, calls: FuturesUnordered<Call>, answered: Vec<(usize, NodeOutcome)>) {
        let this = &self;
        let mut work: FuturesUnordered<Pin<Box<dyn Future<Output = ()> + Send + '_>>> =
            FuturesUnordered::new();
        for call in calls {
            work.push(Box::pin(async move {
                let (i, outcome, latency) = call.await;
                this.tail.send_modify(|tail| {
                    let report = &mut tail.nodes[i];
                    report.outcome = outcome.clone();
                    report.latency = Some(latency);
                    report.late = true;
                });
                this.finish(i, &outcome).await;
            }));
        }
        for (i, outcome) in answered {
            work.push(Box::pin(async move { this.finish(i, &outcome).await }));
        }
        while work.next().await.is_some() {}
    }

    /// Rolls node `i` back when the round is not kept and its answer may have set our key,
    /// then closes the node in the tail.
    async fn finish(&self, i: usize, outcome: &NodeOutcome) {
        let node = &self.nodes[i];
        let cleanup = match &self.op.undo {
            Some((script, args)) if self.roll_back && needs_undo(outcome) => {
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
            Some(_) if self.roll_back => Some(CleanupOutcome::NotPresent),
            _ => None,
        };
        self.tail.send_modify(|tail| {
            tail.nodes[i].cleanup = cleanup;
            tail.open -= 1;
        });
    }
}

/// How many times a rollback is tried on one node. Each try is bounded by the node timeout;
/// a node that failed this often is down or hung, and our key there expires with its TTL.
/// Bounding the tries (rather than retrying until the TTL runs out) bounds how long
/// [`Coordinator::quiesce`](crate::Coordinator::quiesce) and `close` can wait, and keeps
/// rollbacks from piling up while a node stays down.
pub(crate) const ROLLBACK_ATTEMPTS: u32 = 3;

/// The pause before the second try; it doubles before each later one (10 ms, 20 ms).
const ROLLBACK_PAUSE: Duration = Duration::from_millis(10);

/// Compare-and-delete on one node, tried up to [`ROLLBACK_ATTEMPTS`] times and never past
/// `deadline` (the key's TTL: after it our key is gone by itself). A command that timed out
/// is usually still queued on the connection behind the command it undoes, so it will run
/// in order.
async fn roll_back(
    node: &Node,
    script: &Script,
    keys: &[Key],
    args: &[Value],
    deadline: Instant,
) -> CleanupOutcome {
    let mut pause = ROLLBACK_PAUSE;
    let mut attempt = 1;
    loop {
        match node.eval_flag(script, keys, args).await {
            Ok(true) => return CleanupOutcome::Removed,
            Ok(false) => return CleanupOutcome::NotPresent,
            Err(failure) => {
                if attempt >= ROLLBACK_ATTEMPTS || Instant::now() + pause >= deadline {
                    return CleanupOutcome::Failed(failure.to_string());
                }
                tokio::time::sleep(pause).await;
                pause *= 2;
                attempt += 1;
            }
        }
    }
}

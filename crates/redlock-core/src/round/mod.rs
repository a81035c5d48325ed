//! The round engine: one command fanned out to every node at once, each of the round's
//! requests (one lock, or a batch of extensions) decided on its own quorum as soon as the
//! replies allow, validity computed from the round's `t0`, and whatever was set rolled back
//! on every node when a request is lost, cancelled, or won too late.
//!
//! Every round of the crate runs here: single-key, multi-key and reentrant acquisitions,
//! extensions (one or a batch), releases and inspections. What differs between them is the
//! [`Command`] sent and the [`RoundKind`](crate::RoundKind), which says which answers count.
//!
//! The round's own task drives every node's command until the decision, with no task or
//! channel in between (each command is handed to its node's connection before the round
//! first waits, so commands leave in the order rounds are started). Whatever is left after
//! the decision goes to one background task (see `background`).

mod background;
pub(crate) mod command;
mod decided;
mod in_flight;
pub(crate) mod plan;
mod polled;
mod work;

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use fred::types::Value;
use tokio::time::Instant;
use tracing::Instrument;

use crate::connection::Connection;
use crate::deadline::{host_suspended, Deadline};
use crate::metrics;
use crate::quorum::{quorum, Decision, Votes};
use crate::report::{NodeReport, RoundReport, Settling, SettlingWriter};

pub(crate) use background::try_on;
use background::Call;
use command::Answer;
pub(crate) use command::Command;
use decided::granted;
pub(crate) use decided::{unsent, Decided};
use in_flight::InFlight;
pub(crate) use plan::{Request, Round};
use polled::Polled;
pub(crate) use work::BackgroundWork;

/// Runs one round over all nodes; returns one result per request, in order.
pub(crate) async fn run(
    connections: &Arc<[Connection]>,
    round: Round,
    work: &BackgroundWork,
) -> Vec<Decided> {
    // Without an early hand-over every request is in the result.
    run_early(connections, round, work, None).await
}

/// A request won before the round's end, handed to its caller at once (see
/// [`run_early`]): its index in the round, and its result.
pub(crate) type WonEarly<'a> = &'a mut (dyn FnMut(usize, Decided) + Send);

/// [`run`] for a round whose requests have callers of their own (a grouped acquisition):
/// with `won`, each request that wins is handed to it as soon as its quorum is in, with the
/// validity left then, instead of when the round's last request is decided (otherwise one
/// contended key whose decision needs a slow node's answer would hold every lock of its
/// batch up that long, and take its validity). The result holds the rest, in order (those handed over
/// left out).
/// A request handed over is not rolled back; the others are decided, and rolled back, as
/// in [`run`].
pub(crate) async fn run_early(
    connections: &Arc<[Connection]>,
    round: Round,
    work: &BackgroundWork,
    won: Option<WonEarly<'_>>,
) -> Vec<Decided> {
    let span = tracing::debug_span!(
        "redlock.round",
        kind = %round.kind,
        // The key itself, not a copy: a round must cost nothing extra when no subscriber
        // wants debug spans.
        key = %RoundKey(&round.requests),
        nodes = connections.len(),
        accepted = tracing::field::Empty,
        won = tracing::field::Empty,
        elapsed_us = tracing::field::Empty,
    );
    run_inner(connections, Arc::new(round), work, won)
        .instrument(span)
        .await
}

/// A round's key as spans show it: the key of a round of one lock, or how many locks.
struct RoundKey<'a>(&'a [Request]);

impl std::fmt::Display for RoundKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            [one] => f.write_str(&one.name),
            many => write!(f, "{} locks", many.len()),
        }
    }
}

async fn run_inner(
    connections: &Arc<[Connection]>,
    round: Arc<Round>,
    work: &BackgroundWork,
    mut won_early: Option<WonEarly<'_>>,
) -> Vec<Decided> {
    let n = connections.len();
    let r = round.requests.len();
    let pending: Vec<NodeReport> = connections
        .iter()
        .map(|c| NodeReport::pending(c.name.clone()))
        .collect();
    let settling = Arc::new(SettlingWriter::new(Settling {
        requests: vec![pending; r],
        open: n,
    }));
    let ttl = round.requests.first().and_then(|request| request.ttl);

    // What the host had been suspended by t0 (read first: a suspend between the two
    // readings then counts): later suspend shortens the validity.
    let suspended = host_suspended();
    // t0 is read before the first command can leave (guarantee G2).
    let t0 = Instant::now();
    let mut flight = InFlight {
        connections: connections.clone(),
        round: round.clone(),
        t0,
        settling: settling.clone(),
        work: work.clone(),
        // Each command checks its backstop when polled; the set wakes them (see
        // `Sending::InRound`).
        calls: Polled::waking_every(n, backstop(connections)),
        answered: vec![None; n],
        handed_off: false,
        // The requests handed to `won_early` (see `run_early`).
        won_early: vec![false; if won_early.is_some() { r } else { 0 }],
    };
    let mut tally = RoundVotes::new(n, r);
    send_all(&mut flight, &mut tally, ttl);
    let decide = Decide {
        round: &round,
        nodes: n,
        t0,
        suspended,
        settling: &settling,
    };
    while !tally.done(round.waits_for_all()) {
        match flight.calls.next().await {
            Some((i, answers, latency)) => {
                tally.record(&round, i, &answers);
                flight.answered[i] = Some((answers, latency));
                if let Some(won_early) = won_early.as_mut() {
                    hand_over_won(&mut flight, &tally, &decide, &mut **won_early);
                }
            }
            // Every node has answered, so every request is decided.
            None => break,
        }
    }
    finish(&mut flight, &mut tally, &decide)
}

/// The longest backstop of the round's commands (see `Sending::InRound`): the period at
/// which the round's set of calls wakes them.
fn backstop(connections: &[Connection]) -> Duration {
    connections
        .iter()
        .map(Connection::backstop)
        .max()
        .unwrap_or_default()
}

/// Starts the round's command on every node, in node order, with the round's `ttl`;
/// records the answers that are in at once.
fn send_all(flight: &mut InFlight, tally: &mut RoundVotes, ttl: Option<Duration>) {
    let r = flight.round.requests.len();
    let t0 = flight.t0;
    for i in 0..flight.connections.len() {
        // No span of its own: a call is only ever polled inside the round's span (here, in
        // the round's task, and in its background work, spawned in that span), and a
        // wrapper would enter and leave it at each of the call's polls.
        let (connections, round) = (flight.connections.clone(), flight.round.clone());
        let mut call: Call = Box::pin(async move {
            let answers = (round.command)
                .answers(&connections[i], round.kind, ttl, r)
                .await;
            (i, answers, t0.elapsed())
        });
        // Polling the command once here hands it to the node's connection now, in this
        // round's order: a command first polled after the round returned could otherwise
        // send its SET after the caller's next round (a release) had sent its delete,
        // leaving the key behind until its TTL. (The waker is replaced at the next poll.)
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        match call.as_mut().poll(&mut cx) {
            Poll::Ready((i, answers, latency)) => {
                tally.record(&flight.round, i, &answers);
                flight.answered[i] = Some((answers, latency));
            }
            Poll::Pending => flight.calls.push(call),
        }
    }
}

/// Hands each request won by now, with validity left now, to its caller (`won_early`, see
/// [`run_early`]), once.
fn hand_over_won(
    flight: &mut InFlight,
    tally: &RoundVotes,
    decide: &Decide<'_>,
    won_early: WonEarly<'_>,
) {
    let r = decide.round.requests.len();
    let elapsed = decide.t0.elapsed();
    for j in 0..r {
        let handed = flight.won_early[j];
        if handed || tally.votes[j].decision() != Some(Decision::Won) {
            continue;
        }
        let outcome = decide.outcome(j, elapsed, tally);
        if !outcome.1 {
            continue;
        }
        flight.won_early[j] = true;
        let nodes = flight.reports(j);
        let values = tally.values[j].clone();
        let decided = decide.decided(j, outcome, elapsed, nodes, values);
        if r == 1 {
            round_decided(&decided);
        }
        won_early(j, decided);
    }
}

/// The round's end, once every request is decided (or every node answered): the rollback
/// of each request lost (not handed over early) handed off with the commands still in
/// flight, the round's metrics and span, and the results of the requests not handed over,
/// in order.
fn finish(flight: &mut InFlight, tally: &mut RoundVotes, decide: &Decide<'_>) -> Vec<Decided> {
    let round = decide.round;
    let r = round.requests.len();
    let elapsed = decide.t0.elapsed();

    let mut results = Vec::with_capacity(r);
    let mut roll_back = Vec::with_capacity(r);
    for (j, request) in round.requests.iter().enumerate() {
        let result = decide.outcome(j, elapsed, tally);
        let early = flight.won_early.get(j).copied().unwrap_or(false);
        roll_back.push(!early && !result.1 && request.undo.is_some());
        results.push((result, early));
    }
    flight.hand_off(roll_back, false);
    // A batch counts as won only if every lock in it was: one lost renewal is worth seeing.
    let won = |((_, won, _), early): &(Outcome, bool)| *won || *early;
    let round_won = if round.alternatives {
        results.iter().any(won)
    } else {
        results.iter().all(won)
    };
    metrics::round_decided(round.kind, round_won, elapsed);

    let span = tracing::Span::current();
    let values = std::mem::take(&mut tally.values);
    let decided = results
        .into_iter()
        .zip(values)
        .enumerate()
        .filter(|(_, ((_, early), _))| !early)
        .map(|(j, ((outcome, _), values))| {
            let nodes = decide.settling.nodes(j);
            let decided = decide.decided(j, outcome, elapsed, nodes, values);
            if r == 1 {
                round_decided(&decided);
            }
            decided
        })
        .collect();
    if r > 1 {
        span.record("won", round_won);
    }
    span.record("elapsed_us", elapsed.as_micros() as u64);
    decided
}

/// What decides a round's requests from its votes: the round and its number of nodes, its
/// `t0` and the host's suspend by then, and its settling (which each report watches).
struct Decide<'a> {
    round: &'a Round,
    nodes: usize,
    t0: Instant,
    suspended: Duration,
    settling: &'a Arc<SettlingWriter>,
}

impl Decide<'_> {
    /// Request `j`'s outcome `elapsed` after `t0`, by the votes in `tally`.
    fn outcome(&self, j: usize, elapsed: Duration, tally: &RoundVotes) -> Outcome {
        let request = &self.round.requests[j];
        let reached = tally.votes[j].decision() == Some(Decision::Won);
        // Validity only means something for a request that reached its quorum.
        // A host suspend during the round counts as time passed, as it will for the lock.
        let lease = request.ttl.filter(|_| reached).and_then(|ttl| {
            granted(
                ttl,
                self.round.drift_factor,
                self.t0,
                elapsed,
                self.suspended,
            )
        });
        let won = reached && (request.ttl.is_none() || lease.is_some());
        (tally.votes[j].accepted(), won, lease)
    }

    /// Request `j`'s result: its `outcome` `elapsed` after `t0`, with the node reports and
    /// values so far.
    fn decided(
        &self,
        j: usize,
        (accepted, won, lease): Outcome,
        elapsed: Duration,
        nodes: Vec<NodeReport>,
        values: Vec<Option<Value>>,
    ) -> Decided {
        Decided {
            report: RoundReport {
                kind: self.round.kind,
                key: self.round.requests[j].name.clone(),
                quorum: quorum(self.nodes),
                accepted,
                nodes,
                elapsed,
                validity: lease.map(|(validity, _)| validity),
                settling: Some(self.settling.view(j)),
            },
            won,
            valid_until: lease.map(|(_, deadline)| deadline),
            values,
        }
    }
}

/// Records a round of one request's decision on its span, and logs it (debug).
fn round_decided(decided: &Decided) {
    let span = tracing::Span::current();
    span.record("accepted", decided.report.accepted);
    span.record("won", decided.won);
    tracing::debug!(report = %decided.report, "round decided");
}

/// How a request ended: the nodes that accepted it, whether it was won, and its validity
/// (left at the decision) and deadline.
type Outcome = (usize, bool, Option<(Duration, Deadline)>);

/// The votes of every request of a round, and what the nodes returned with them.
struct RoundVotes {
    votes: Vec<Votes>,
    /// By request, then by node.
    values: Vec<Vec<Option<Value>>>,
    /// Requests not decided yet.
    open: usize,
    /// Nodes that have not answered yet.
    silent: usize,
}

impl RoundVotes {
    fn new(nodes: usize, requests: usize) -> Self {
        RoundVotes {
            votes: vec![Votes::new(nodes); requests],
            values: vec![vec![None; nodes]; requests],
            open: requests,
            silent: nodes,
        }
    }

    /// Records node `i`'s answers; each request counts only until it is decided.
    fn record(&mut self, round: &Round, i: usize, answers: &[Answer]) {
        self.silent -= 1;
        for (j, answer) in answers.iter().enumerate() {
            self.values[j][i] = answer.value.clone();
            let votes = &mut self.votes[j];
            if votes.decision().is_none() && votes.record(round.counts(&answer.outcome)).is_some() {
                self.open -= 1;
            }
        }
    }

    fn done(&self, wait_for_all: bool) -> bool {
        if wait_for_all {
            self.silent == 0
        } else {
            self.open == 0
        }
    }
}

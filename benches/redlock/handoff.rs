//! P4: contended hand-off. Eight workers, then fifty, each with its own client (as separate
//! services would have), take turns on one key and hold it for a 1 ms critical section (or
//! what `--p4-section` says: `0s` for none, where the hand-offs alone set the rate).
//! Ours also runs with one client shared by the eight workers (tasks of one service), where
//! a release wakes only the oldest waiter, and with the fair queue (`fair`), where the lock
//! goes to the workers in the order they began waiting.
//!
//! Each acquisition and release is logged; afterwards the hand-off of acquisition `k` is
//! the time from the start of release `k - 1` (the holder is done with the resource) to the
//! return of `lock` for `k` (the next holder may use it). The same gap measured from the
//! *end* of the release is kept too. Round trips are counted against one raw fan-out round
//! (`SET NX` to every node at once, all replies awaited) measured on the same nodes first.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::error::BenchError;
use crate::floor::{Floor, Wait};
use crate::progress;
use crate::stats::{Recorder, Summary};
use crate::subjects::{Kind, ReleaseRound, Subject, TTL};

/// The worker counts: each contender runs once with each.
pub const WORKERS: [usize; 2] = [8, 50];
/// A worker whose `lock` has not returned after this long is counted as failed.
const LOCK_DEADLINE: Duration = Duration::from_secs(30);
/// Rounds timed to find the reference round trip.
const RT_ROUNDS: usize = 300;

/// P4's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Handoff {
    /// The median raw fan-out round (`SET NX` on every node at once, all replies), µs.
    pub round_trip_us: f64,
    pub workers: Vec<usize>,
    pub critical_section_ms: f64,
    pub cases: Vec<HandoffCase>,
}

/// One contender under contention.
#[derive(Debug, Clone, Serialize)]
pub struct HandoffCase {
    pub subject: &'static str,
    pub label: &'static str,
    pub workers: usize,
    pub seconds: f64,
    pub critical_sections: u64,
    pub per_second: f64,
    /// From the start of the previous holder's release to the return of `lock`.
    pub handoff: Summary,
    /// From the end of the previous holder's release to the return of `lock`.
    pub handoff_after_release_returned: Summary,
    /// The hand-offs that went to another worker than the one releasing (the rest are the
    /// releasing worker taking the lock again at once).
    pub handoff_to_other: Summary,
    /// `handoff.median_us / round_trip_us` of [`Handoff`].
    pub median_round_trips: f64,
    /// The critical section as it really lasted (from the return of `lock` to the start of
    /// the release), mean in µs: a timer of 1 ms sleeps past it. Its inverse is the most
    /// sections per second any lock could reach with free hand-offs.
    pub section_mean_us: f64,
    /// Critical sections of the worker that ran the fewest and of the one that ran the
    /// most, inside the measured window.
    pub sections_per_worker_min: u64,
    pub sections_per_worker_max: u64,
    /// `lock` calls that gave up (the library's own deadline passed).
    pub gave_up: u64,
    /// Two holders inside the critical section at once: must be 0.
    pub overlaps: u64,
    /// Ours only: its hand-offs to another worker, step by step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<Trace>,
}

/// Ours' hand-offs to another worker step by step: the median of each step over those
/// hand-offs, in µs, each from the holder's release (its round's times from the release's
/// report). Where a release's time goes, against the round trip.
#[derive(Debug, Clone, Serialize)]
pub struct Trace {
    pub samples: u64,
    /// The release call, from its start to its return.
    pub release_call_us: f64,
    /// Of which the release's round: from its first command sent to its decision.
    pub release_round_us: f64,
    /// The release's first reply, and the one that made its quorum, from the round's first
    /// command sent.
    pub first_reply_us: f64,
    pub quorum_reply_us: f64,
    /// The release call less its round: the client's own work before the first command
    /// leaves and after the decision.
    pub release_client_us: f64,
    /// From the release's return to the return of the next holder's `lock`.
    pub next_after_release_us: f64,
}

/// The steps of [`Trace`], recorded hand-off by hand-off.
#[derive(Default)]
struct Steps {
    call: Recorder,
    round: Recorder,
    first_reply: Recorder,
    quorum_reply: Recorder,
    client: Recorder,
    next: Recorder,
}

impl Steps {
    fn record(&mut self, (start, end, round): Released, next_at: Instant) {
        let Some(round) = round else { return };
        let call = end.saturating_duration_since(start);
        self.call.record(call);
        self.round.record(round.round);
        if let Some(first_reply) = round.first_reply {
            self.first_reply.record(first_reply);
        }
        if let Some(quorum_reply) = round.quorum_reply {
            self.quorum_reply.record(quorum_reply);
        }
        self.client.record(call.saturating_sub(round.round));
        self.next.record(next_at.saturating_duration_since(end));
    }

    fn trace(&self) -> Option<Trace> {
        let call = self.call.summary();
        (call.samples > 0).then(|| Trace {
            samples: call.samples,
            release_call_us: call.median_us,
            release_round_us: self.round.summary().median_us,
            first_reply_us: self.first_reply.summary().median_us,
            quorum_reply_us: self.quorum_reply.summary().median_us,
            release_client_us: self.client.summary().median_us,
            next_after_release_us: self.next.summary().median_us,
        })
    }
}

/// A release: its start and end, and ours' round times.
type Released = (Instant, Instant, Option<ReleaseRound>);

/// What the workers log.
#[derive(Default)]
struct Log {
    /// When, and by which worker.
    acquired: Vec<(Instant, usize)>,
    /// The release of acquisition `k`, at index `k`.
    released: Vec<Option<Released>>,
    gave_up: u64,
    failures: Recorder,
}

struct Shared {
    log: Mutex<Log>,
    busy: AtomicBool,
    overlaps: AtomicU64,
}

impl Shared {
    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Measures the reference round trip, then each contender for `warmup + time`.
pub async fn run(
    urls: &[String],
    kinds: &[Kind],
    section: Duration,
    warmup: Duration,
    time: Duration,
) -> Result<Handoff, BenchError> {
    // The reference is timed before each contender and pooled, so that a noisy moment on
    // this shared machine does not skew it.
    let floor = Floor::connect(urls, TTL, Wait::All).await?;
    let mut round_trips = Recorder::default();
    let mut cases = Vec::new();
    for workers in WORKERS {
        for &kind in kinds {
            round_trips.merge(&round_trip(&floor).await);
            let run = (section, warmup, time);
            cases.push(contend(urls, kind, Clients::PerWorker, workers, run).await?);
            if kind == Kind::Ours && workers == WORKERS[0] {
                round_trips.merge(&round_trip(&floor).await);
                cases.push(contend(urls, kind, Clients::Shared, workers, run).await?);
            }
        }
    }
    let round_trip_us = round_trips.summary().median_us;
    for case in &mut cases {
        case.median_round_trips = case.handoff.median_us / round_trip_us;
        progress!(
            "P4 {:<13} x{:<2} {:>6.0} sections/s, hand-off median {:.0} µs ({:.1} round trips of {round_trip_us:.0} µs), p99 {:.0} µs, to another worker {:.0} %, sections per worker {}-{}, {} gave up, {} overlaps",
            case.subject,
            case.workers,
            case.per_second,
            case.handoff.median_us,
            case.median_round_trips,
            case.handoff.p99_us,
            case.handoff_to_other.samples as f64 * 100.0 / case.handoff.samples.max(1) as f64,
            case.sections_per_worker_min,
            case.sections_per_worker_max,
            case.gave_up,
            case.overlaps
        );
        if let Some(t) = &case.trace {
            progress!(
                "P4 {:<13} x{:<2} trace of {} hand-offs to another worker (medians): release call {:.0} µs = its round {:.0} µs (first reply at {:.0} µs, the quorum's at {:.0} µs) + the client's own {:.0} µs; next lock returned {:.0} µs after the release returned",
                case.subject,
                case.workers,
                t.samples,
                t.release_call_us,
                t.release_round_us,
                t.first_reply_us,
                t.quorum_reply_us,
                t.release_client_us,
                t.next_after_release_us
            );
        }
    }
    Ok(Handoff {
        round_trip_us,
        workers: WORKERS.to_vec(),
        critical_section_ms: section.as_secs_f64() * 1000.0,
        cases,
    })
}

async fn round_trip(floor: &Floor) -> Recorder {
    let mut rec = Recorder::default();
    for _ in 0..RT_ROUNDS {
        let start = Instant::now();
        let acquired = floor.acquire("bench:P4:rt").await;
        rec.record(start.elapsed());
        if let Ok((_, token)) = acquired {
            let _ = floor.release("bench:P4:rt", &token).await;
        }
    }
    rec
}

/// Whether each worker has a client of its own, or all share one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Clients {
    PerWorker,
    Shared,
}

async fn contend(
    urls: &[String],
    kind: Kind,
    clients: Clients,
    workers: usize,
    (section, warmup, time): (Duration, Duration, Duration),
) -> Result<HandoffCase, BenchError> {
    let (subject, label) = match clients {
        Clients::PerWorker => (kind.name(), kind.label()),
        Clients::Shared => ("ours-shared", "ours, one client shared by the workers"),
    };
    let key = format!("bench:P4:{subject}:{workers}");
    let mut subjects = Vec::with_capacity(workers);
    for _ in 0..workers {
        let next = match (clients, subjects.first()) {
            (Clients::Shared, Some(first)) => Subject::clone(first),
            _ => Subject::connect(kind, urls).await?,
        };
        subjects.push(next);
    }
    let shared = Arc::new(Shared {
        log: Mutex::default(),
        busy: AtomicBool::new(false),
        overlaps: AtomicU64::new(0),
    });
    let from = Instant::now() + warmup;
    let stop = from + time;
    let tasks: Vec<_> = subjects
        .iter()
        .cloned()
        .enumerate()
        .map(|(id, subject)| {
            tokio::spawn(worker(
                id,
                subject,
                key.clone(),
                section,
                shared.clone(),
                stop,
            ))
        })
        .collect();
    for task in tasks {
        // A worker stuck in a library call past its deadline is abandoned (and counted).
        if tokio::time::timeout(LOCK_DEADLINE + time, task)
            .await
            .is_err()
        {
            shared.log().failures.fail("a worker did not finish");
        }
    }
    let distinct = match clients {
        Clients::PerWorker => &subjects[..],
        Clients::Shared => &subjects[..1],
    };
    for subject in distinct {
        subject.close().await;
    }
    let log = std::mem::take(&mut *shared.log());
    let mut case = summarize(kind, &log, from, stop, &shared, workers);
    (case.subject, case.label) = (subject, label);
    Ok(case)
}

async fn worker(
    id: usize,
    subject: Subject,
    key: String,
    section: Duration,
    shared: Arc<Shared>,
    stop: Instant,
) {
    while Instant::now() < stop {
        match tokio::time::timeout(LOCK_DEADLINE, subject.lock(&key)).await {
            Ok(Ok(Some(held))) => {
                let k = {
                    let mut log = shared.log();
                    log.acquired.push((Instant::now(), id));
                    log.acquired.len() - 1
                };
                if shared.busy.swap(true, Ordering::SeqCst) {
                    shared.overlaps.fetch_add(1, Ordering::SeqCst);
                }
                if section.is_zero() {
                    // No section: still a turn of the scheduler, as any work would be.
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(section).await;
                }
                shared.busy.store(false, Ordering::SeqCst);
                let start = Instant::now();
                let released = subject.release_timed(held).await;
                let end = Instant::now();
                let mut log = shared.log();
                if log.released.len() <= k {
                    log.released.resize(k + 1, None);
                }
                let round = released.as_ref().ok().copied().flatten();
                log.released[k] = Some((start, end, round));
                if let Err(why) = released {
                    log.failures.fail(why);
                }
            }
            Ok(Ok(None)) => shared.log().gave_up += 1,
            Ok(Err(why)) => {
                shared.log().failures.fail(why);
                // A failing library must not turn this loop into a busy loop.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(_) => shared
                .log()
                .failures
                .fail(format!("lock() did not return within {LOCK_DEADLINE:?}")),
        }
    }
}

fn summarize(
    kind: Kind,
    log: &Log,
    from: Instant,
    stop: Instant,
    shared: &Shared,
    workers: usize,
) -> HandoffCase {
    let mut per_worker = vec![0u64; workers];
    let mut handoff = Recorder::default();
    let mut after_return = Recorder::default();
    let mut to_other = Recorder::default();
    let mut steps = Steps::default();
    handoff.merge(&log.failures);
    let mut sections = 0;
    let (mut held, mut held_count) = (Duration::ZERO, 0u32);
    for (k, &(at, worker)) in log.acquired.iter().enumerate() {
        if at < from || at >= stop {
            continue;
        }
        sections += 1;
        per_worker[worker] += 1;
        if let Some((start, ..)) = log.released.get(k).copied().flatten() {
            held += start.saturating_duration_since(at);
            held_count += 1;
        }
        let Some(p) = k.checked_sub(1) else { continue };
        if let Some(released @ (start, end, _)) = log.released.get(p).copied().flatten() {
            handoff.record(at.saturating_duration_since(start));
            after_return.record(at.saturating_duration_since(end));
            if log.acquired[p].1 != worker {
                to_other.record(at.saturating_duration_since(start));
                steps.record(released, at);
            }
        }
    }
    let seconds = (stop - from).as_secs_f64();
    let handoff = handoff.summary();
    HandoffCase {
        subject: kind.name(),
        label: kind.label(),
        workers,
        seconds,
        critical_sections: sections,
        per_second: sections as f64 / seconds,
        median_round_trips: 0.0,
        section_mean_us: if held_count == 0 {
            0.0
        } else {
            held.as_secs_f64() * 1e6 / f64::from(held_count)
        },
        handoff,
        handoff_after_release_returned: after_return.summary(),
        handoff_to_other: to_other.summary(),
        sections_per_worker_min: per_worker.iter().copied().min().unwrap_or(0),
        sections_per_worker_max: per_worker.iter().copied().max().unwrap_or(0),
        gave_up: log.gave_up,
        overlaps: shared.overlaps.load(Ordering::SeqCst),
        trace: steps.trace(),
    }
}

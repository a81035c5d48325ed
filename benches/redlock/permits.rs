//! P7: a semaphore's permits under contention. Sixteen workers, each with its own client,
//! take a permit of one semaphore of four (retrying under the client's defaults), hold it
//! for a 2 ms critical section and release it, for the run's time. Reported: permits
//! acquired per second, the mean number of holders at once against the four the semaphore
//! admits (the sum of the critical sections over the time: how close to four concurrent
//! holders the contention lets it come), and the most at once, which must never pass four
//! (the run fails if it does). A plain lock under the same workers is the reference: at
//! most one holder. Beside ours, the design it was chosen over, a per-node limit of
//! `floor(k * q / N)` holders on each node (the bench's model with raw fred, `per_node.rs`),
//! as a winner keeps all its entries and as one that keeps only a quorum's: they admit at
//! most three at once, which the run holds to the semaphore's bound of four.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::error::BenchError;
use crate::progress;
use crate::stats::Recorder;
use crate::subjects::{Kind, Subject, PERMITS};

/// The workers, each with a client of its own.
pub const WORKERS: usize = 16;
/// Each holder's critical section.
pub const SECTION: Duration = Duration::from_millis(2);
/// A worker whose acquisition has not returned after this long counts as failed.
const LOCK_DEADLINE: Duration = Duration::from_secs(30);

/// P7's contenders, in the order it runs them (those `--subjects` names): a plain lock,
/// ours' semaphore (and in its fair queue), and the bench's per-node-limit semaphore as
/// written and trimmed.
pub const KINDS: [Kind; 5] = [
    Kind::Ours,
    Kind::OursPermit,
    Kind::OursPermitFair,
    Kind::PerNodeLimit,
    Kind::PerNodeLimitTrimmed,
];

/// P7's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Permits {
    pub workers: usize,
    pub critical_section_ms: f64,
    pub cases: Vec<PermitsCase>,
}

/// One contender under contention.
#[derive(Debug, Clone, Serialize)]
pub struct PermitsCase {
    pub subject: &'static str,
    pub label: &'static str,
    /// How many holders it admits at once.
    pub admits: u32,
    pub seconds: f64,
    pub acquired: u64,
    pub per_second: f64,
    /// The time spent in critical sections over the run's time.
    pub mean_holders: f64,
    /// The most holders at once (never above `admits`).
    pub most_holders: usize,
    pub failures: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<String>,
}

/// What the workers of one case share.
#[derive(Default)]
struct Tally {
    acquired: AtomicU64,
    busy_us: AtomicU64,
    holding: AtomicUsize,
    most: AtomicUsize,
    stop: AtomicBool,
    failures: Mutex<Recorder>,
}

impl Tally {
    fn fail(&self, why: String) {
        self.failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .fail(why);
    }
}

/// Runs each of `kinds` (of [`KINDS`]) for `warmup + time`.
pub async fn run(
    urls: &[String],
    kinds: &[Kind],
    warmup: Duration,
    time: Duration,
) -> Result<Permits, BenchError> {
    let mut cases = Vec::new();
    for &kind in kinds {
        let admits = if kind == Kind::Ours { 1 } else { PERMITS };
        let mut subjects = Vec::with_capacity(WORKERS);
        for _ in 0..WORKERS {
            subjects.push(Arc::new(Subject::connect(kind, urls).await?));
        }
        let tally = Arc::new(Tally::default());
        let tasks: Vec<_> = subjects
            .iter()
            .map(|subject| tokio::spawn(work(subject.clone(), tally.clone())))
            .collect();
        tokio::time::sleep(warmup).await;
        let start = Instant::now();
        let (acquired, busy) = (
            tally.acquired.load(Ordering::Relaxed),
            tally.busy_us.load(Ordering::Relaxed),
        );
        let failed_before = tally
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .summary()
            .failures;
        tokio::time::sleep(time).await;
        let seconds = start.elapsed().as_secs_f64();
        let acquired = tally.acquired.load(Ordering::Relaxed) - acquired;
        let busy = tally.busy_us.load(Ordering::Relaxed) - busy;
        tally.stop.store(true, Ordering::Relaxed);
        for task in tasks {
            let _ = task.await;
        }
        for subject in &subjects {
            subject.close().await;
        }
        let failed = tally
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .summary();
        let case = PermitsCase {
            subject: kind.name(),
            label: kind.label(),
            admits,
            seconds,
            acquired,
            per_second: acquired as f64 / seconds,
            mean_holders: busy as f64 / 1e6 / seconds,
            most_holders: tally.most.load(Ordering::Relaxed),
            failures: failed.failures - failed_before,
            first_failure: failed.first_failure,
        };
        progress!(
            "P7 {:<22} {:>7.0} acquired/s, {:.2} of {} holders on average, {} at most",
            kind.name(),
            case.per_second,
            case.mean_holders,
            admits,
            case.most_holders
        );
        cases.push(case);
    }
    Ok(Permits {
        workers: WORKERS,
        critical_section_ms: SECTION.as_secs_f64() * 1e3,
        cases,
    })
}

/// One worker: acquire (waiting), hold for [`SECTION`], release, until told to stop.
async fn work(subject: Arc<Subject>, tally: Arc<Tally>) {
    let key = "bench:P7";
    while !tally.stop.load(Ordering::Relaxed) {
        let held = match tokio::time::timeout(LOCK_DEADLINE, subject.lock(key)).await {
            Ok(Ok(Some(held))) => held,
            Ok(Ok(None)) => continue,
            Ok(Err(why)) => {
                tally.fail(why);
                continue;
            }
            Err(_) => {
                tally.fail(format!("no permit within {LOCK_DEADLINE:?}"));
                continue;
            }
        };
        let now = tally.holding.fetch_add(1, Ordering::SeqCst) + 1;
        tally.most.fetch_max(now, Ordering::SeqCst);
        let entered = Instant::now();
        tokio::time::sleep(SECTION).await;
        let busy = entered.elapsed();
        tally.holding.fetch_sub(1, Ordering::SeqCst);
        tally.acquired.fetch_add(1, Ordering::Relaxed);
        tally
            .busy_us
            .fetch_add(busy.as_micros() as u64, Ordering::Relaxed);
        if let Err(why) = subject.release(held).await {
            tally.fail(why);
        }
    }
}

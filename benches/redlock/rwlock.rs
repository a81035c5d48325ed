//! P8: a read-write lock under contention. Sixteen workers, each with its own client, share
//! one read-write lock: each cycle a worker draws read (nine in ten) or write from a seeded
//! generator of its own, takes that side (retrying under the client's defaults), holds it
//! for a 2 ms critical section and releases it, for the run's time. Reported: reads and
//! writes per second, the mean number of holders at once (the sum of the critical sections
//! over the time), the most holders and the most readers at once. Checked: no writer ever
//! holds beside another writer or any reader (the run fails if one does). A plain lock
//! under the same workers and draws is the reference: every cycle holds it alone. The
//! read-write lock runs with release notifications on (a writer's release and the last
//! reader's are announced to every client), then off (waiters poll on their backoff).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redlock_client::{LockGuard, RwLock};
use serde::Serialize;
use tokio::time::Instant;

use crate::error::BenchError;
use crate::progress;
use crate::stats::Recorder;
use crate::subjects::{Held, Kind, Subject};

/// The workers, each with a client of its own.
pub const WORKERS: usize = 16;
/// Each holder's critical section.
pub const SECTION: Duration = Duration::from_millis(2);
/// The share of cycles that read.
pub const READ_SHARE: f64 = 0.9;
/// The first worker's seed; worker `i` draws from `SEED + i`.
const SEED: u64 = 0x5EED_0008;
/// A worker whose acquisition has not returned after this long counts as failed.
const LOCK_DEADLINE: Duration = Duration::from_secs(30);
/// The read-write lock (and the plain lock) every worker takes.
const KEY: &str = "bench:P8";

/// P8's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ReadWrite {
    pub workers: usize,
    pub critical_section_ms: f64,
    pub read_share: f64,
    pub cases: Vec<ReadWriteCase>,
}

/// One contender under the workload.
#[derive(Debug, Clone, Serialize)]
pub struct ReadWriteCase {
    pub subject: &'static str,
    pub label: &'static str,
    /// Whether reads share the lock (false for the plain lock: every cycle holds it alone).
    pub shared_reads: bool,
    pub seconds: f64,
    pub reads: u64,
    pub writes: u64,
    pub reads_per_second: f64,
    pub writes_per_second: f64,
    /// Reads and writes together, per second.
    pub cycles_per_second: f64,
    /// The time spent in critical sections over the run's time.
    pub mean_holders: f64,
    pub most_holders: usize,
    pub most_readers: usize,
    /// Exclusive holds that began beside another holder (must be 0).
    pub overlaps: u64,
    pub failures: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<String>,
}

/// What the workers of one case share.
#[derive(Default)]
struct Tally {
    reads: AtomicU64,
    writes: AtomicU64,
    busy_us: AtomicU64,
    /// Exclusive holders now.
    writing: AtomicUsize,
    /// Shared holders now.
    reading: AtomicUsize,
    most_holders: AtomicUsize,
    most_readers: AtomicUsize,
    overlaps: AtomicU64,
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

    fn failed(&self) -> (u64, Option<String>) {
        let summary = self
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .summary();
        (summary.failures, summary.first_failure)
    }

    /// A hold begins: exclusive (a write, or any cycle of the plain lock) or shared. Counts
    /// an overlap when an exclusive hold meets another holder, whichever began first (each
    /// side announces itself before it looks at the other, so one of them sees it).
    fn enter(&self, exclusive: bool) {
        let (writers, readers) = if exclusive {
            let writers = self.writing.fetch_add(1, Ordering::SeqCst) + 1;
            (writers, self.reading.load(Ordering::SeqCst))
        } else {
            let readers = self.reading.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_readers.fetch_max(readers, Ordering::SeqCst);
            (self.writing.load(Ordering::SeqCst), readers)
        };
        if writers > 1 || (writers > 0 && readers > 0) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        self.most_holders
            .fetch_max(writers + readers, Ordering::SeqCst);
    }

    fn leave(&self, exclusive: bool) {
        if exclusive {
            self.writing.fetch_sub(1, Ordering::SeqCst);
        } else {
            self.reading.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A seeded generator of draws (splitmix64): the bench needs no more than this.
struct Draws(u64);

impl Draws {
    /// A number in `[0, 1)`.
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// How a worker takes its side.
enum Side {
    /// The plain lock: every cycle alone.
    Plain(Arc<Subject>),
    /// Ours: the read-write lock, one owner per worker.
    Rw(Arc<Subject>, RwLock),
}

enum Hold {
    Plain(Held),
    Rw(LockGuard),
}

impl Side {
    async fn take(&self, read: bool) -> Result<Option<Hold>, String> {
        let not_acquired = |e: &redlock_client::Error| {
            matches!(
                e,
                redlock_client::Error::NotAcquired { .. }
                    | redlock_client::Error::DeadlinePassed { .. }
            )
        };
        match self {
            Side::Plain(subject) => Ok(subject.lock(KEY).await?.map(Hold::Plain)),
            Side::Rw(_, rw) => {
                let side = if read {
                    rw.read().await
                } else {
                    rw.write().await
                };
                match side {
                    Ok(guard) => Ok(Some(Hold::Rw(guard))),
                    Err(e) if not_acquired(&e) => Ok(None),
                    Err(e) => Err(format!("ours-rw: {e}")),
                }
            }
        }
    }

    async fn release(&self, hold: Hold) -> Result<(), String> {
        match (self, hold) {
            (Side::Plain(subject), Hold::Plain(held)) => subject.release(held).await,
            (Side::Rw(..), Hold::Rw(guard)) => guard
                .release()
                .await
                .map(|_| ())
                .map_err(|e| format!("ours-rw: release: {e}")),
            _ => Err("a hold was released through another side (bench bug)".into()),
        }
    }

    fn subject(&self) -> &Subject {
        match self {
            Side::Plain(subject) | Side::Rw(subject, _) => subject,
        }
    }
}

/// The cases, in order: the plain lock; the read-write lock (its workers connect as
/// ours-write, one key prefix for all); the read-write lock with notifications off (as
/// ours-polling), to show what the wake-ups of writers' and last readers' releases cost;
/// the read-write lock in its fair queue (as ours-fair). P8's contenders' kinds, for
/// `--subjects`: the plain lock, the read-write lock, the read-write lock with
/// notifications off, and in the fair queue.
pub const KINDS: [Kind; 4] = [CASES[0].0, CASES[1].0, CASES[2].0, CASES[3].0];

const CASES: [(Kind, bool, &str, &str); 4] = [
    (
        Kind::Ours,
        false,
        "ours",
        "ours, a plain lock: every cycle alone (notify on, no renewal)",
    ),
    (
        Kind::OursWrite,
        true,
        "ours-rw",
        "ours, a read-write lock (notify on, no renewal)",
    ),
    (
        Kind::OursPolling,
        true,
        "ours-rw-polling",
        "ours, a read-write lock, polling only (notify off, no renewal)",
    ),
    (
        Kind::OursFair,
        true,
        "ours-rw-fair",
        "ours, a read-write lock, fair queue (notify on, no renewal)",
    ),
];

/// Runs the plain lock and the read-write lock (notifications on, then off), each for
/// `warmup + time`.
pub async fn run(
    urls: &[String],
    kinds: &[Kind],
    warmup: Duration,
    time: Duration,
) -> Result<ReadWrite, BenchError> {
    let mut cases = Vec::new();
    for (kind, shared_reads, subject, label) in CASES {
        if !kinds.contains(&kind) {
            continue;
        }
        let mut sides = Vec::with_capacity(WORKERS);
        for _ in 0..WORKERS {
            let subject = Arc::new(Subject::connect(kind, urls).await?);
            sides.push(Arc::new(match subject.redlock() {
                Some(client) if shared_reads => {
                    let rw = client.rwlock(KEY).map_err(|e| {
                        BenchError::new("naming P8's read-write lock", e, "fix the bench")
                    })?;
                    Side::Rw(subject.clone(), rw)
                }
                _ => Side::Plain(subject),
            }));
        }
        let tally = Arc::new(Tally::default());
        let tasks: Vec<_> = sides
            .iter()
            .enumerate()
            .map(|(i, side)| {
                let draws = Draws(SEED + i as u64);
                tokio::spawn(work(side.clone(), tally.clone(), draws))
            })
            .collect();
        tokio::time::sleep(warmup).await;
        let start = Instant::now();
        let before = (
            tally.reads.load(Ordering::Relaxed),
            tally.writes.load(Ordering::Relaxed),
            tally.busy_us.load(Ordering::Relaxed),
            tally.failed().0,
        );
        tokio::time::sleep(time).await;
        let seconds = start.elapsed().as_secs_f64();
        let reads = tally.reads.load(Ordering::Relaxed) - before.0;
        let writes = tally.writes.load(Ordering::Relaxed) - before.1;
        let busy = tally.busy_us.load(Ordering::Relaxed) - before.2;
        tally.stop.store(true, Ordering::Relaxed);
        for task in tasks {
            let _ = task.await;
        }
        for side in &sides {
            side.subject().close().await;
        }
        let (failures, first_failure) = tally.failed();
        let case = ReadWriteCase {
            subject,
            label,
            shared_reads,
            seconds,
            reads,
            writes,
            reads_per_second: reads as f64 / seconds,
            writes_per_second: writes as f64 / seconds,
            cycles_per_second: (reads + writes) as f64 / seconds,
            mean_holders: busy as f64 / 1e6 / seconds,
            most_holders: tally.most_holders.load(Ordering::SeqCst),
            most_readers: tally.most_readers.load(Ordering::SeqCst),
            overlaps: tally.overlaps.load(Ordering::SeqCst),
            failures: failures - before.3,
            first_failure,
        };
        progress!(
            "P8 {:<15} {:>6.0} reads/s, {:>5.0} writes/s, {:.2} holders on average, {} at most \
             ({} readers), {} overlaps",
            case.subject,
            case.reads_per_second,
            case.writes_per_second,
            case.mean_holders,
            case.most_holders,
            case.most_readers,
            case.overlaps
        );
        cases.push(case);
    }
    Ok(ReadWrite {
        workers: WORKERS,
        critical_section_ms: SECTION.as_secs_f64() * 1e3,
        read_share: READ_SHARE,
        cases,
    })
}

/// One worker: draw a side, take it (waiting), hold for [`SECTION`], release, until told
/// to stop.
async fn work(side: Arc<Side>, tally: Arc<Tally>, mut draws: Draws) {
    let shared_reads = matches!(*side, Side::Rw(..));
    while !tally.stop.load(Ordering::Relaxed) {
        let read = draws.next() < READ_SHARE;
        let hold = match tokio::time::timeout(LOCK_DEADLINE, side.take(read)).await {
            Ok(Ok(Some(hold))) => hold,
            Ok(Ok(None)) => continue,
            Ok(Err(why)) => {
                tally.fail(why);
                continue;
            }
            Err(_) => {
                tally.fail(format!("no hold within {LOCK_DEADLINE:?}"));
                continue;
            }
        };
        let exclusive = !(read && shared_reads);
        tally.enter(exclusive);
        let entered = Instant::now();
        tokio::time::sleep(SECTION).await;
        let busy = entered.elapsed();
        tally.leave(exclusive);
        if read {
            tally.reads.fetch_add(1, Ordering::Relaxed);
        } else {
            tally.writes.fetch_add(1, Ordering::Relaxed);
        }
        tally
            .busy_us
            .fetch_add(busy.as_micros() as u64, Ordering::Relaxed);
        if let Err(why) = side.release(hold).await {
            tally.fail(why);
        }
    }
}

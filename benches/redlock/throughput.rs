//! P5: many keys. 256 tasks share one client, each cycling (acquire, release) on a key of
//! its own, so 256 acquisitions are in flight at any time. Reported as cycles per second,
//! beside the servers' own limit for the same commands (see [`crate::limit`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::error::BenchError;
use crate::limit::ServerLimit;
use crate::progress;
use crate::stats::Recorder;
use crate::subjects::{Kind, Subject};

pub const IN_FLIGHT: usize = 256;
const CYCLE_DEADLINE: Duration = Duration::from_secs(10);

/// P5's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub in_flight: usize,
    pub cases: Vec<ThroughputCase>,
    pub server_limit: Option<ServerLimit>,
}

impl Throughput {
    /// The cases, each with its share of the servers' limit when that was measured.
    pub fn new(mut cases: Vec<ThroughputCase>, server_limit: Option<ServerLimit>) -> Throughput {
        if let Some(limit) = &server_limit {
            for case in &mut cases {
                case.share_of_limit = Some(case.per_second / limit.cycles_per_second);
            }
        }
        Throughput {
            in_flight: IN_FLIGHT,
            cases,
            server_limit,
        }
    }
}

/// One contender's rate.
#[derive(Debug, Clone, Serialize)]
pub struct ThroughputCase {
    pub subject: &'static str,
    pub label: &'static str,
    pub seconds: f64,
    pub cycles: u64,
    pub per_second: f64,
    pub failures: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<String>,
    /// `per_second` over the servers' limit in cycles per second.
    pub share_of_limit: Option<f64>,
}

/// Runs each contender for `warmup + time`.
pub async fn run(
    urls: &[String],
    kinds: &[Kind],
    warmup: Duration,
    time: Duration,
) -> Result<Vec<ThroughputCase>, BenchError> {
    let mut cases = Vec::new();
    for &kind in kinds {
        let case = run_one(urls, kind, "bench:P5", warmup, time).await?;
        progress!(
            "P5 {:<13} {:>8.0} cycles/s ({} failed)",
            kind.name(),
            case.per_second,
            case.failures
        );
        cases.push(case);
    }
    Ok(cases)
}

/// One contender for `warmup + time`, its [`IN_FLIGHT`] tasks each on a key of its own
/// under `prefix`.
pub async fn run_one(
    urls: &[String],
    kind: Kind,
    prefix: &str,
    warmup: Duration,
    time: Duration,
) -> Result<ThroughputCase, BenchError> {
    let subject = Arc::new(Subject::connect(kind, urls).await?);
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Recorder::default()));
    let tasks: Vec<_> = (0..IN_FLIGHT)
        .map(|i| {
            let (subject, done, stop, failures) = (
                subject.clone(),
                done.clone(),
                stop.clone(),
                failures.clone(),
            );
            let key = format!("{prefix}:{}:{i}", kind.name());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match tokio::time::timeout(CYCLE_DEADLINE, subject.cycle(&key)).await {
                        Ok(Ok(())) => {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Err(why)) => lock(&failures).fail(why),
                        Err(_) => {
                            lock(&failures).fail(format!("no answer within {CYCLE_DEADLINE:?}"))
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(warmup).await;
    let (start, before) = (Instant::now(), done.load(Ordering::Relaxed));
    let failed_before = lock(&failures).summary().failures;
    tokio::time::sleep(time).await;
    let (seconds, cycles) = (
        start.elapsed().as_secs_f64(),
        done.load(Ordering::Relaxed) - before,
    );
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    subject.close().await;
    let failed = lock(&failures).summary();
    Ok(ThroughputCase {
        subject: kind.name(),
        label: kind.label(),
        seconds,
        cycles,
        per_second: cycles as f64 / seconds,
        failures: failed.failures - failed_before,
        first_failure: failed.first_failure,
        share_of_limit: None,
    })
}

fn lock(failures: &Mutex<Recorder>) -> std::sync::MutexGuard<'_, Recorder> {
    failures.lock().unwrap_or_else(PoisonError::into_inner)
}

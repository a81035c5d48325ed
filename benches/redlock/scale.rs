//! P10: lock throughput over members that are whole clusters, as shards are added and as
//! client processes are added. Three members, each a cluster of 1, 2 or 3 masters (no
//! replicas); for each size, first one client process, then one per core, each running
//! P5's loop (256 cycles in flight on keys of their own, `try_lock` and release, ours at
//! its defaults) in a process of its own (this bench binary again, with a hidden flag).
//! One process is what caps P5 on a machine with cores to spare: the servers' limit grows
//! with the shards, and only more processes can reach it.
//!
//! Reported as cycles per second over all processes (each measures its own window after
//! the same warm-up; the windows overlap but for the processes' start, a few milliseconds
//! apart), beside the servers' own limit for the same commands on the same clusters:
//! `redis-benchmark --cluster` on every member at once (see `limit::measure_clusters`).

use std::process::{Command, Stdio};
use std::time::Duration;

use redlock_testkit::ClusterSet;
use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Context, SEE_ABOVE};
use crate::limit;
use crate::progress;
use crate::subjects::Kind;
use crate::throughput;

/// The flag that makes the bench binary one client process of P10.
pub const CHILD_FLAG: &str = "--scale-child";
/// The members: three, a quorum of two.
const MEMBERS: usize = 3;

/// P10's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Scale {
    pub in_flight_per_process: usize,
    pub cases: Vec<ScaleCase>,
}

/// One size of cluster with one number of client processes.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleCase {
    /// Masters per member.
    pub shards: usize,
    pub processes: usize,
    /// Cycles per second over all processes.
    pub per_second: f64,
    pub failures: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<String>,
    /// The servers' limit on these clusters, in cycles per second (the slowest member's),
    /// when it was measured.
    pub server_limit: Option<f64>,
    /// `per_second` over `server_limit`.
    pub share_of_limit: Option<f64>,
}

/// What a client process is told, and what it answers.
#[derive(Debug, Serialize, Deserialize)]
struct Spec {
    urls: Vec<String>,
    warmup_ms: u64,
    time_ms: u64,
    parent_secs: f64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Counted {
    cycles: u64,
    seconds: f64,
    failures: u64,
    first_failure: Option<String>,
}

/// Runs every size in `shards` with one process, then with `processes`, for `warmup +
/// time` each; the servers' limit once per size with `requests` per member and command.
pub async fn run(
    shards: &[usize],
    processes: usize,
    warmup: Duration,
    time: Duration,
    requests: u64,
) -> Result<Scale, BenchError> {
    let mut cases = Vec::new();
    for &size in shards {
        let step = format!("starting {MEMBERS} clusters of {size} masters");
        let mut clusters = Vec::with_capacity(MEMBERS);
        for _ in 0..MEMBERS {
            clusters.push(ClusterSet::start(size).await.during(&step, SEE_ABOVE)?);
        }
        let urls: Vec<String> = clusters.iter().map(ClusterSet::url).collect();
        let server_limit = match limit::measure_clusters(&clusters, requests).await {
            Ok(limit) => Some(limit),
            Err(e) => {
                progress!("P10: servers' limit not measured: {e}");
                None
            }
        };
        flush(&clusters).await?;
        let mut counts = vec![1];
        if processes > 1 {
            counts.push(processes);
        }
        for n in counts {
            let case = run_case(&urls, size, n, warmup, time, server_limit).await?;
            progress!(
                "P10 {size} shard(s), {n} process(es): {:>8.0} cycles/s ({} failed){}",
                case.per_second,
                case.failures,
                case.share_of_limit
                    .map(|s| format!(", {:.0} % of the servers' limit", s * 100.0))
                    .unwrap_or_default()
            );
            cases.push(case);
            flush(&clusters).await?;
        }
    }
    Ok(Scale {
        in_flight_per_process: throughput::IN_FLIGHT,
        cases,
    })
}

/// `FLUSHALL` on every master, between cases.
async fn flush(clusters: &[ClusterSet]) -> Result<(), BenchError> {
    for cluster in clusters {
        for master in cluster.masters() {
            master
                .redis()
                .flushall()
                .await
                .during("FLUSHALL between P10 cases", SEE_ABOVE)?;
        }
    }
    Ok(())
}

async fn run_case(
    urls: &[String],
    shards: usize,
    processes: usize,
    warmup: Duration,
    time: Duration,
    server_limit: Option<f64>,
) -> Result<ScaleCase, BenchError> {
    let spec = Spec {
        urls: urls.to_vec(),
        warmup_ms: warmup.as_millis() as u64,
        time_ms: time.as_millis() as u64,
        parent_secs: crate::clock(),
    };
    let spec = serde_json::to_string(&spec).during("encoding the P10 case", "fix the bench")?;
    let step = format!("P10 with {shards} shard(s) in {processes} client process(es)");
    let exe =
        std::env::current_exe().during(&step, "the bench binary must be able to find itself")?;
    let outputs = tokio::task::spawn_blocking(move || {
        let children = (0..processes)
            .map(|_| {
                Command::new(&exe)
                    .args([CHILD_FLAG, &spec])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
            })
            .collect::<Result<Vec<_>, _>>()?;
        children
            .into_iter()
            .map(|child| child.wait_with_output())
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .during(&step, SEE_ABOVE)?
    .during(&step, "check the process limits")?;
    let mut case = ScaleCase {
        shards,
        processes,
        per_second: 0.0,
        failures: 0,
        first_failure: None,
        server_limit,
        share_of_limit: None,
    };
    for out in outputs {
        if !out.status.success() {
            return Err(BenchError::new(
                step,
                format!("a client process exited with {}", out.status),
                "see its error message above",
            ));
        }
        let counted: Counted =
            serde_json::from_slice(&out.stdout).during(&step, "see the child's messages above")?;
        case.per_second += counted.cycles as f64 / counted.seconds;
        case.failures += counted.failures;
        case.first_failure = case.first_failure.or(counted.first_failure);
    }
    case.share_of_limit = server_limit.map(|limit| case.per_second / limit);
    Ok(case)
}

/// A client process's side: P5's loop for ours on the members `spec` names; its count as
/// JSON.
pub async fn child(spec: &str) -> Result<String, BenchError> {
    let spec: Spec = serde_json::from_str(spec).during(
        "reading the P10 case",
        "this flag is for the bench's own client processes",
    )?;
    crate::continue_clock(spec.parent_secs);
    let warmup = Duration::from_millis(spec.warmup_ms);
    let time = Duration::from_millis(spec.time_ms);
    // Keys of this process's own: the processes do not contend.
    let prefix = format!("bench:P10:{}", std::process::id());
    let case = throughput::run_one(&spec.urls, Kind::Ours, &prefix, warmup, time).await?;
    let counted = Counted {
        cycles: case.cycles,
        seconds: case.seconds,
        failures: case.failures,
        first_failure: case.first_failure,
    };
    serde_json::to_string(&counted).during("encoding the P10 count", "fix the bench")
}

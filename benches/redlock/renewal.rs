//! P6: many locks held under automatic renewal. One client acquires `locks` keys with
//! renewal on, holds them for `hold`, and releases them. Measured over the holding period:
//! the client process's CPU time (`/proc/self/stat`, all threads) as a share of one core,
//! the servers' CPU time the same way, and resident memory (`VmRSS`).
//!
//! Each case runs in a child process (this bench binary again, with a hidden flag), so that
//! its CPU time and memory are its own: not inflated by what other scenarios allocated, nor
//! deflated by memory an earlier case left behind for reuse.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use redlock_client::{LockConfig, LockGuard, LockOptions, Redlock};
use redlock_testkit::{NodeSet, RedisAt};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::error::{BenchError, Context, SEE_ABOVE};
use crate::procfs::{cpu_time, rss_bytes};
use crate::progress;
use crate::subjects::{Kind, TTL};

/// Acquisitions (and releases) in flight while setting up and tearing down.
const CONCURRENCY: usize = 256;

/// The hidden flag that makes the bench binary run one P6 case and print its figures.
pub const CHILD_FLAG: &str = "--renewal-child";

/// P6's figures for one case.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Renewal {
    pub locks: usize,
    /// Locks that could not be acquired at all (counted, not held).
    pub not_acquired: usize,
    /// Locks still valid at the end of the holding period.
    pub held: usize,
    pub ttl_ms: u64,
    pub node_timeout_ms: u64,
    pub renew_every_ms: u64,
    pub hold_seconds: f64,
    /// Renewal script calls seen by node-0 while holding (its `EVALSHA` calls; each carries
    /// up to `EXTEND_BATCH_LOCKS` locks).
    pub renewal_calls: u64,
    /// The client process's CPU time over the holding period, as a share of one core.
    pub cpu_share: f64,
    /// The CPU time spent per lock renewal, µs, counting one renewal per lock per renewal
    /// interval of the holding period.
    pub cpu_us_per_lock_renewal: f64,
    /// All servers' CPU time over the holding period, as a share of one core.
    pub servers_cpu_share: f64,
    /// VmRSS of the client process once connected, before any lock.
    pub rss_before_bytes: u64,
    /// VmRSS once every lock is acquired.
    pub rss_acquired_bytes: u64,
    /// VmRSS at the end of the holding period.
    pub rss_held_bytes: u64,
    /// The growth of VmRSS per lock over the second half of the acquisitions.
    pub rss_bytes_per_lock: f64,
    /// Locks that lost their validity while held: must be 0.
    pub lost: usize,
    /// glibc's `MALLOC_ARENA_MAX` in the case's process (`None`: the default).
    #[serde(default)]
    pub malloc_arena_max: Option<u32>,
    pub acquire_seconds: f64,
}

/// What the child process is told.
#[derive(Debug, Serialize, Deserialize)]
struct Spec {
    urls: Vec<String>,
    pids: Vec<u32>,
    node0_port: u16,
    locks: usize,
    hold_ms: u64,
    node_timeout_ms: u64,
    /// The parent's clock, for the child's progress lines.
    parent_secs: f64,
}

/// Runs one case in a child process against the nodes of `set`.
pub async fn run(
    set: &NodeSet,
    locks: usize,
    hold: Duration,
    node_timeout: Duration,
    arenas: Option<u32>,
) -> Result<Renewal, BenchError> {
    let spec = Spec {
        urls: set.urls(),
        pids: set.iter().filter_map(|n| n.pid()).collect(),
        node0_port: set.node(0).port(),
        locks,
        hold_ms: hold.as_millis() as u64,
        node_timeout_ms: node_timeout.as_millis() as u64,
        parent_secs: crate::clock(),
    };
    let spec = serde_json::to_string(&spec).during("encoding the P6 case", "fix the bench")?;
    let step = format!("P6 with {locks} locks in a child process");
    let exe =
        std::env::current_exe().during(&step, "the bench binary must be able to find itself")?;
    let out = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(exe);
        if let Some(arenas) = arenas {
            child.env("MALLOC_ARENA_MAX", arenas.to_string());
        }
        child
            .args([CHILD_FLAG, &spec])
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
    })
    .await
    .during(&step, SEE_ABOVE)?
    .during(&step, "check the process limits")?;
    if !out.status.success() {
        return Err(BenchError::new(
            step,
            format!("the child exited with {}", out.status),
            "see its error message above",
        ));
    }
    let mut renewal: Renewal =
        serde_json::from_slice(&out.stdout).during(step, "see the child's messages above")?;
    // A case that sets no limit of its own runs under the one the bench inherited, if any
    // (`MALLOC_ARENA_MAX=2 ./scripts/bench.sh --only P6`): the table says which.
    renewal.malloc_arena_max = arenas.or_else(|| {
        std::env::var("MALLOC_ARENA_MAX")
            .ok()
            .and_then(|v| v.trim().parse().ok())
    });
    Ok(renewal)
}

/// The child's side: runs the case described by `spec` and returns its figures as JSON.
pub async fn child(spec: &str) -> Result<String, BenchError> {
    let spec: Spec = serde_json::from_str(spec).during(
        "reading the P6 case",
        "this flag is for the bench itself; run the bench without it",
    )?;
    crate::continue_clock(spec.parent_secs);
    let renewal = measure(&spec).await?;
    serde_json::to_string(&renewal).during("encoding the P6 figures", "fix the bench")
}

async fn measure(spec: &Spec) -> Result<Renewal, BenchError> {
    let (locks, hold) = (spec.locks, Duration::from_millis(spec.hold_ms));
    let node_timeout = Duration::from_millis(spec.node_timeout_ms);
    let config = LockConfig::builder()
        .nodes(spec.urls.iter().cloned())
        .ttl(TTL)
        .node_timeout(node_timeout)
        .key_prefix(format!("{}:", Kind::OursDefaults.name()))
        .build()
        .during("building the P6 client's configuration", "fix the bench")?;
    let renew_every = config.renew_every();
    let client = Redlock::connect(config)
        .await
        .during("connecting the P6 client", "are the nodes running?")?;
    let rss_before = rss_bytes()?;
    let started = Instant::now();
    // Half first: its growth includes what the acquisition burst itself costs (tasks,
    // buffers the allocator keeps afterwards); the second half, acquired the same way,
    // reuses that, so its growth is the cost of holding the locks.
    let first = locks / 2;
    let (mut guards, mut failed) = acquire(&client, 0..first).await;
    let rss_first = rss_bytes()?;
    let (more, failed_more) = acquire(&client, first..locks).await;
    let rss_acquired = rss_bytes()?;
    guards.extend(more);
    failed.count += failed_more.count;
    failed.first = failed.first.or(failed_more.first);
    if let Some(first_error) = &failed.first {
        progress!(
            "P6: {} of {locks} locks not acquired, the first because: {first_error}",
            failed.count
        );
    }
    if guards.is_empty() {
        return Err(BenchError::new(
            "acquiring the P6 locks",
            failed.first.unwrap_or_default(),
            "nothing else holds these keys: check the nodes' logs",
        ));
    }
    let acquire_seconds = started.elapsed().as_secs_f64();
    progress!(
        "P6: {locks} locks acquired in {acquire_seconds:.1} s; holding them for {hold:?} \
         (renewal every {} ms, node timeout {} ms)",
        renew_every.as_millis(),
        node_timeout.as_millis()
    );

    let node0 = RedisAt::new(
        "node-0",
        SocketAddr::from((Ipv4Addr::LOCALHOST, spec.node0_port)),
    );
    let evalsha = || async {
        node0
            .command_calls("evalsha")
            .await
            .during("reading node-0's command counters", SEE_ABOVE)
    };
    let pids: Vec<String> = spec.pids.iter().map(u32::to_string).collect();
    let evalsha_before = evalsha().await?;
    let servers_before = servers_cpu(&pids)?;
    let cpu_before = cpu_time("self")?;
    let from = Instant::now();
    tokio::time::sleep(hold).await;
    let cpu = cpu_time("self")? - cpu_before;
    let servers = servers_cpu(&pids)? - servers_before;
    let hold_seconds = from.elapsed().as_secs_f64();
    let rss_held = rss_bytes()?;
    let renewal_calls = evalsha().await? - evalsha_before;
    let lost = guards.iter().filter(|g| !g.is_valid()).count();
    let guards_len = guards.len();

    stream::iter(guards)
        .for_each_concurrent(CONCURRENCY, |guard| async move {
            let _ = guard.release().await;
        })
        .await;
    client.shutdown().await;

    let intervals = hold_seconds / renew_every.as_secs_f64();
    let renewals = (intervals * locks as f64).max(1.0);
    let result = Renewal {
        locks,
        not_acquired: failed.count,
        held: guards_len - lost,
        ttl_ms: TTL.as_millis() as u64,
        node_timeout_ms: spec.node_timeout_ms,
        renew_every_ms: renew_every.as_millis() as u64,
        hold_seconds,
        renewal_calls,
        cpu_share: cpu.as_secs_f64() / hold_seconds,
        cpu_us_per_lock_renewal: cpu.as_secs_f64() * 1e6 / renewals,
        servers_cpu_share: servers.as_secs_f64() / hold_seconds,
        rss_before_bytes: rss_before,
        rss_acquired_bytes: rss_acquired,
        rss_held_bytes: rss_held,
        rss_bytes_per_lock: rss_acquired.saturating_sub(rss_first) as f64
            / (locks - first).max(1) as f64,
        lost,
        acquire_seconds,
        malloc_arena_max: None,
    };
    progress!(
        "P6: CPU {:.2} % of a core (servers {:.2} %), RSS {:.1} MiB -> {:.1} MiB ({:.0} B per lock), {} renewal script calls per node, {} lost",
        result.cpu_share * 100.0,
        result.servers_cpu_share * 100.0,
        rss_before as f64 / 1048576.0,
        rss_acquired as f64 / 1048576.0,
        result.rss_bytes_per_lock,
        renewal_calls,
        lost
    );
    Ok(result)
}

/// Acquires `bench:P6:{i}` for every `i` in `keys`, renewed, `CONCURRENCY` at a time, each
/// under the default retry policy (a round can time out in such a burst; the key is free,
/// so a retry takes it). Returns the guards and the acquisitions that failed even so.
async fn acquire(client: &Redlock, keys: std::ops::Range<usize>) -> (Vec<LockGuard>, Failures) {
    let options = Arc::new(LockOptions {
        renew: Some(true),
        ..LockOptions::default()
    });
    let results: Vec<Result<LockGuard, redlock_client::Error>> = stream::iter(keys)
        .map(|i| {
            let (client, options) = (client.clone(), options.clone());
            async move { client.lock_with(&format!("bench:P6:{i}"), &options).await }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let mut guards = Vec::with_capacity(results.len());
    let mut failures = Failures::default();
    for result in results {
        match result {
            Ok(guard) => guards.push(guard),
            Err(e) => {
                failures.count += 1;
                failures.first.get_or_insert_with(|| e.to_string());
            }
        }
    }
    (guards, failures)
}

/// Acquisitions that failed.
#[derive(Debug, Default)]
struct Failures {
    count: usize,
    first: Option<String>,
}

fn servers_cpu(pids: &[String]) -> Result<Duration, BenchError> {
    pids.iter().map(|pid| cpu_time(pid)).sum()
}

//! The redlock demo: five local redis-server nodes, several workers contending for one lock
//! to update a shared value, one node killed and another paused part-way.
//!
//! The shared value is updated the unsafe way on purpose (read, sleep, write): only the lock
//! keeps updates from being lost, and the demo checks at the end that none was.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use redlock_client::{Error, LockConfig, LockGuard, Redlock, RoundReport};
use redlock_testkit::NodeSet;
use tokio::time::Instant;

const NODES: usize = 5;
const WORKERS: usize = 6;
const RUN_FOR: Duration = Duration::from_secs(9);
const TTL: Duration = Duration::from_secs(2);
const NODE_TIMEOUT: Duration = Duration::from_millis(50);
const KEY: &str = "demo:counter";

/// The protected resource: a counter that loses updates unless access is exclusive.
#[derive(Default)]
struct Resource {
    value: AtomicU64,
    busy: AtomicBool,
    overlaps: AtomicU64,
}

impl Resource {
    async fn increment(&self) {
        if self.busy.swap(true, Ordering::SeqCst) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let read = self.value.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.value.store(read + 1, Ordering::SeqCst);
        self.busy.store(false, Ordering::SeqCst);
    }
}

/// What the workers saw, merged.
struct Stats {
    acquired: Vec<u64>,
    attempts: Vec<u64>,
    per_node: BTreeMap<(usize, String), u64>,
    acquire_latency: Histogram<u64>,
    release_latency: Histogram<u64>,
}

impl Stats {
    fn record_round(&mut self, report: &RoundReport) {
        for (i, node) in report.nodes.iter().enumerate() {
            let outcome = match &node.outcome {
                redlock_client::NodeOutcome::ConnectionError(_) => "connection error".to_string(),
                other => other.to_string(),
            };
            *self.per_node.entry((i, outcome)).or_default() += 1;
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .init();
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<bool, Box<dyn std::error::Error>> {
    println!("Starting {NODES} independent redis-server nodes on loopback...");
    let set = NodeSet::start(NODES).await?;
    for node in set.nodes() {
        println!("  {} {}", node.name(), node.url());
    }
    let config = LockConfig::builder()
        .nodes(set.urls())
        .ttl(TTL)
        .node_timeout(NODE_TIMEOUT)
        .max_wait(Duration::from_secs(2))
        .backoff(Duration::from_millis(1), Duration::from_millis(20))
        .build()?;
    println!(
        "{WORKERS} workers contend for \"{KEY}\" for {RUN_FOR:?} (TTL {TTL:?}, per-node timeout {NODE_TIMEOUT:?}, quorum {})",
        redlock_client::redlock_core::quorum(NODES)
    );

    let resource = Arc::new(Resource::default());
    let stats = Arc::new(Mutex::new(Stats {
        acquired: vec![0; WORKERS],
        attempts: vec![0; WORKERS],
        per_node: BTreeMap::new(),
        acquire_latency: Histogram::new(3)?,
        release_latency: Histogram::new(3)?,
    }));
    let start = Instant::now();
    let stop_at = start + RUN_FOR;
    let mut workers = Vec::new();
    for id in 0..WORKERS {
        // Each worker is a separate client with its own connections, as separate services
        // would be.
        let client = Redlock::connect(config.clone()).await?;
        workers.push(tokio::spawn(worker(
            id,
            client,
            resource.clone(),
            stats.clone(),
            stop_at,
        )));
    }

    tokio::time::sleep_until(start + RUN_FOR / 3).await;
    set.node(1).kill()?;
    println!(
        "[{:>5.1?}] killed {} (SIGKILL)",
        start.elapsed(),
        set.node(1).name()
    );
    tokio::time::sleep_until(start + RUN_FOR * 2 / 3).await;
    set.node(3).pause()?;
    println!(
        "[{:>5.1?}] paused {} (SIGSTOP)",
        start.elapsed(),
        set.node(3).name()
    );

    for w in workers {
        w.await?;
    }
    set.node(3).resume()?;

    let stats = stats
        .lock()
        .expect("no worker panicked while holding the stats");
    let total: u64 = stats.acquired.iter().sum();
    println!("\nAcquisitions per worker (rounds run in brackets; waiters retry on backoff or when woken by a release):");
    for id in 0..WORKERS {
        println!(
            "  worker {id}: {:>5} ({})",
            stats.acquired[id], stats.attempts[id]
        );
    }
    println!("\nPer-node outcomes of the winning and the release rounds, at the moment each was decided:");
    for ((i, outcome), count) in &stats.per_node {
        println!("  {:<7} {:<44} {count:>6}", set.node(*i).name(), outcome);
    }
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    for (name, h) in [
        ("lock() wait, retries included", &stats.acquire_latency),
        ("release round", &stats.release_latency),
    ] {
        println!(
            "\n{name}: {} calls, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            h.len(),
            us(h, 0.5),
            us(h, 0.99),
            h.max() as f64 / 1000.0
        );
    }
    let value = resource.value.load(Ordering::SeqCst);
    let overlaps = resource.overlaps.load(Ordering::SeqCst);
    println!("\nProtected value: {value}; critical sections run: {total}; overlapping sections: {overlaps}");
    let ok = value == total && overlaps == 0 && total > 0;
    if ok {
        println!("OK: no lost update, no overlap, through a node kill and a node pause.");
    } else {
        println!(
            "VIOLATION: {} lost updates, {overlaps} overlaps",
            total.saturating_sub(value)
        );
    }
    Ok(ok)
}

async fn worker(
    id: usize,
    client: Redlock,
    resource: Arc<Resource>,
    stats: Arc<Mutex<Stats>>,
    stop_at: Instant,
) {
    while Instant::now() < stop_at {
        let started = Instant::now();
        let result = client.lock(KEY).await;
        let took = started.elapsed().as_micros() as u64;
        let guard = {
            let mut s = stats.lock().expect("stats lock");
            let _ = s.acquire_latency.record(took.max(1));
            match result {
                Ok(guard) => {
                    s.attempts[id] += u64::from(guard.attempts());
                    s.record_round(guard.lock().report());
                    Some(guard)
                }
                Err(Error::InvalidConfig(e)) => panic!("the demo's configuration is wrong: {e}"),
                // Gave up waiting (max_wait) or too few nodes: count it and go again.
                Err(e) => {
                    s.attempts[id] += 1;
                    if let Some(report) = e.report() {
                        s.record_round(report);
                    }
                    None
                }
            }
        };
        if let Some(guard) = guard {
            critical_section(id, guard, &resource, &stats).await;
        }
    }
}

async fn critical_section(id: usize, guard: LockGuard, resource: &Resource, stats: &Mutex<Stats>) {
    // H4: use the resource only while the lock is valid.
    if guard.is_valid() {
        resource.increment().await;
        stats.lock().expect("stats lock").acquired[id] += 1;
    }
    let started = Instant::now();
    match guard.release().await {
        Ok(report) => {
            let took = started.elapsed().as_micros() as u64;
            let mut s = stats.lock().expect("stats lock");
            let _ = s.release_latency.record(took.max(1));
            s.record_round(&report);
        }
        Err(e) => eprintln!("worker {id}: {e}"),
    }
}

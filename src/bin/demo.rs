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
use rand::Rng;
use redlock_core::{Config, Coordinator, Error, Lock, RoundReport};
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
                redlock_core::NodeOutcome::ConnectionError(_) => "connection error".to_string(),
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
    let config = Config {
        nodes: set.urls(),
        node_timeout: NODE_TIMEOUT,
        ..Default::default()
    };
    println!(
        "{WORKERS} workers contend for \"{KEY}\" for {RUN_FOR:?} (TTL {TTL:?}, per-node timeout {NODE_TIMEOUT:?}, quorum {})",
        redlock_core::quorum(NODES)
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
        let coordinator = Coordinator::connect(config.clone()).await?;
        workers.push(tokio::spawn(worker(
            id,
            coordinator,
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
    println!("\nAcquisitions per worker (attempts in brackets):");
    for id in 0..WORKERS {
        println!(
            "  worker {id}: {:>5} ({})",
            stats.acquired[id], stats.attempts[id]
        );
    }
    println!("\nPer-node outcomes at the moment each round was decided:");
    for ((i, outcome), count) in &stats.per_node {
        println!("  {:<7} {:<44} {count:>6}", set.node(*i).name(), outcome);
    }
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    for (name, h) in [
        ("acquire", &stats.acquire_latency),
        ("release", &stats.release_latency),
    ] {
        println!(
            "\n{name} round latency over {} rounds: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
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
    c: Coordinator,
    resource: Arc<Resource>,
    stats: Arc<Mutex<Stats>>,
    stop_at: Instant,
) {
    while Instant::now() < stop_at {
        let started = Instant::now();
        let result = c.acquire(KEY, TTL).await;
        let took = started.elapsed().as_micros() as u64;
        let report = match &result {
            Ok(lock) => Some(lock.report().clone()),
            Err(e) => e.report().cloned(),
        };
        {
            let mut s = stats.lock().expect("stats lock");
            s.attempts[id] += 1;
            let _ = s.acquire_latency.record(took.max(1));
            if let Some(report) = &report {
                s.record_round(report);
            }
        }
        match result {
            Ok(lock) => critical_section(id, &c, lock, &resource, &stats).await,
            Err(Error::Config(e)) => panic!("the demo's configuration is wrong: {e}"),
            // Held by another worker, or too few nodes: back off with jitter and retry.
            Err(_) => {
                let pause = rand::thread_rng().gen_range(0..10);
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        }
    }
}

async fn critical_section(
    id: usize,
    c: &Coordinator,
    lock: Lock,
    resource: &Resource,
    stats: &Mutex<Stats>,
) {
    // H4: use the resource only while the validity lasts.
    if lock.is_valid() {
        resource.increment().await;
        stats.lock().expect("stats lock").acquired[id] += 1;
    }
    let started = Instant::now();
    if let Err(e) = c.release(&lock).await {
        eprintln!("worker {id}: {e}");
    }
    let took = started.elapsed().as_micros() as u64;
    let _ = stats
        .lock()
        .expect("stats lock")
        .release_latency
        .record(took.max(1));
}

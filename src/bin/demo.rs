//! The redlock demo: five local redis-server nodes, several workers contending for one lock
//! to update a shared value, one node killed and another paused part-way.
//!
//! The workers run the fault lab's workload (`redlock_lab::contend_each`), the same loop
//! its scenarios run: lock, update the value if enough validity is left, release. The value
//! is updated the unsafe way on purpose (read, sleep, write): only the lock keeps updates
//! from being lost, and the demo checks at the end that none was.

use std::error::Error;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use redlock_client::{LockConfig, Redlock};
use redlock_lab::{contend_each, init_tracing, History, Resource, Tally};
use redlock_testkit::NodeSet;
use tokio::time::Instant;

const NODES: usize = 5;
const WORKERS: usize = 6;
const RUN_FOR: Duration = Duration::from_secs(9);
const TTL: Duration = Duration::from_secs(2);
const NODE_TIMEOUT: Duration = Duration::from_millis(50);
const KEY: &str = "demo:counter";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    init_tracing();
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<bool, Box<dyn Error>> {
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

    let mut clients = Vec::with_capacity(WORKERS);
    for _ in 0..WORKERS {
        // Each worker is a separate client with its own connections, as separate services
        // would be.
        clients.push(Redlock::connect(config.clone()).await?);
    }
    let history = History::new();
    let resource = Arc::new(Resource::default());
    let start = Instant::now();
    let (tallies, faults) = tokio::join!(
        contend_each(&history, &resource, &clients, KEY, start + RUN_FOR),
        inject_faults(&set, start),
    );
    faults?;
    set.node(3).resume()?;
    Ok(report(&set, &tallies, &resource))
}

/// Kills node 1 a third of the way through the run and pauses node 3 at two thirds.
async fn inject_faults(set: &NodeSet, start: Instant) -> Result<(), Box<dyn Error>> {
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
    Ok(())
}

/// Prints what the workers saw and whether the value lost an update; true when it did not.
fn report(set: &NodeSet, tallies: &[Tally], resource: &Resource) -> bool {
    println!("\nAcquisitions per worker (rounds run in brackets; waiters retry on backoff or when woken by a release):");
    for (id, tally) in tallies.iter().enumerate() {
        println!("  worker {id}: {:>5} ({})", tally.acquired, tally.rounds);
    }
    let total: Tally = tallies.iter().sum();
    if total.skipped_writes > 0 {
        println!(
            "  ({} holders skipped their write: too little validity left)",
            total.skipped_writes
        );
    }
    println!("\nPer-node outcomes of the winning and the release rounds, at the moment each was decided:");
    for ((i, outcome), count) in &total.outcomes {
        println!("  {:<7} {:<44} {count:>6}", set.node(*i).name(), outcome);
    }
    for (name, samples) in [
        ("lock() wait, retries included", &total.lock_waits),
        ("release round", &total.release_rounds),
    ] {
        let h = histogram(samples);
        let ms = |us: u64| us as f64 / 1000.0;
        println!(
            "\n{name}: {} calls, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            h.len(),
            ms(h.value_at_quantile(0.5)),
            ms(h.value_at_quantile(0.99)),
            ms(h.max())
        );
    }
    let value = resource.value();
    let sections = total.writes();
    let overlaps = resource.overlaps();
    println!("\nProtected value: {value}; critical sections run: {sections}; overlapping sections: {overlaps}");
    let ok = value == sections && overlaps == 0 && sections > 0;
    if ok {
        println!("OK: no lost update, no overlap, through a node kill and a node pause.");
    } else {
        println!(
            "VIOLATION: {} lost updates, {overlaps} overlaps",
            sections.saturating_sub(value)
        );
    }
    ok
}

/// The samples in microseconds (at least 1, so that none reads as missing).
fn histogram(samples: &[Duration]) -> Histogram<u64> {
    // Auto-resizing: it grows to the largest sample (`saturating_record` would clamp to the
    // initial range instead), and only a value beyond any real latency could fail to record.
    let mut h = Histogram::new(3).expect("3 significant digits is a valid precision");
    for sample in samples {
        let _ = h.record(u64::try_from(sample.as_micros()).unwrap_or(u64::MAX).max(1));
    }
    h
}

//! Scoped work under a lock with `with_lock`: acquire, renew while the work runs, release
//! at the end (also on error or panic), and stop the work if the lock is lost.
//!
//! Starts three `redis-server` processes on free loopback ports, runs two workers that
//! contend for one lock (they take turns), then shows what happens to work that outlives
//! its lock.
//!
//! Run it: `cargo run --example with_lock`

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redlock_client::{Error, LockConfig, Redlock};
use redlock_testkit::NodeSet;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes = NodeSet::start(3).await?;
    // A short TTL so that renewal is visible: the lock is renewed every TTL / 3 (200 ms).
    let client = Redlock::connect(
        LockConfig::builder()
            .nodes(nodes.urls())
            .ttl(Duration::from_millis(600))
            .build()?,
    )
    .await?;

    // 1. Two workers share one counter that only the lock protects: each reads it, waits,
    //    then writes it back. Without mutual exclusion, updates would be lost.
    let counter = Arc::new(AtomicU32::new(0));
    let workers = (0..2).map(|worker| {
        let (client, counter) = (client.clone(), counter.clone());
        tokio::spawn(async move {
            for _ in 0..3 {
                // The closure gets a handle to check validity. It runs for 700 ms, longer
                // than the TTL, and keeps the lock because it is renewed meanwhile.
                client
                    .with_lock("report", |lock| {
                        let counter = counter.clone();
                        async move {
                            let read = counter.load(Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(700)).await;
                            assert!(lock.is_valid(), "renewed while the work runs");
                            counter.store(read + 1, Ordering::SeqCst);
                            println!("worker {worker} wrote {}", read + 1);
                        }
                    })
                    .await?;
            }
            Ok::<_, Error>(())
        })
    });
    for worker in workers.collect::<Vec<_>>() {
        worker.await??;
    }
    let total = counter.load(Ordering::SeqCst);
    println!("counter: {total} (6 updates, none lost)");
    if total != 6 {
        return Err("an update was lost".into());
    }

    // 2. If the lock is lost while the work runs (here: its key deleted on every node, as
    //    a flushed node set would), the renewal notices, the work is cancelled at its next
    //    await, and `with_lock` returns `Error::LockLost` instead of its value.
    let outcome = client
        .with_lock("report", |_lock| async {
            for node in nodes.nodes() {
                node.del("redlock:report").await.expect("the node answers");
            }
            tokio::time::sleep(Duration::from_secs(5)).await; // never finishes
            "finished"
        })
        .await;
    match outcome {
        Err(Error::LockLost { key, reason }) => println!("lost {key}: {reason}"),
        other => return Err(format!("expected the lock to be lost, got {other:?}").into()),
    }
    client.shutdown().await;
    println!("OK");
    Ok(())
}

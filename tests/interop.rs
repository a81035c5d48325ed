//! Sharing keys with the clients of another Redlock library (rslock, a dev-dependency):
//! both store `SET key <token> NX PX <ttl>` and release by compare-and-delete, so they
//! exclude each other on one key when they name it alike (`key_prefix("")` here, since
//! rslock adds no prefix), and not at all when they do not, which the negative control
//! shows with the default prefix.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{client, eventually};
use redlock_client::{Error, Holder};
use redlock_testkit::NodeSet;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(2);

/// An rslock manager for `set`, one attempt per `lock` call.
fn rslock(set: &NodeSet) -> rslock::LockManager {
    let mut manager = rslock::LockManager::new(set.urls());
    manager.set_retry(1, Duration::from_millis(10));
    manager
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_through_rslock_is_refused_to_ours_and_the_reverse() {
    let set = NodeSet::start(3).await.unwrap();
    let ours = client(&set, |b| b.key_prefix("")).await;
    let theirs = rslock(&set);

    let held = theirs.lock("shared", TTL).await.unwrap();
    match ours.try_lock("shared").await {
        Err(Error::NotAcquired { .. }) => {}
        other => panic!("ours took a key rslock holds: {other:?}"),
    }
    // rslock's token is random bytes, which ours reads as a value it did not write.
    let seen = ours.inspect("shared").await.unwrap();
    assert_eq!(seen.held, Some(true), "{seen:?}");
    assert!(
        seen.holders
            .iter()
            .all(|h| matches!(h, Some(Holder::Other))),
        "{seen:?}"
    );
    theirs.unlock(&held).await;

    let guard = ours.lock("shared").await.unwrap();
    // Won at a quorum: the last node's answer may still be on its way.
    guard.lock().report().settled().await;
    assert!(
        matches!(
            theirs.lock("shared", TTL).await,
            Err(rslock::LockError::Unavailable)
        ),
        "rslock took a key ours holds"
    );
    // A release through rslock with its own (stale) token leaves ours in place.
    theirs.unlock(&held).await;
    assert_eq!(set.nodes_holding("shared").await.len(), 3);
    guard.release().await.unwrap();

    // Our release deleted the key: rslock takes it at once.
    let again = theirs.lock("shared", TTL).await.unwrap();
    theirs.unlock(&again).await;
    ours.shutdown().await;
    assert!(set.nodes_holding("shared").await.is_empty());
}

/// Two workers of ours (one client) and two of rslock take the key in a loop for
/// `duration`, each holding it for 2 ms; returns how many times a worker entered while
/// another was inside, and how many sections each library ran.
async fn contend(set: &NodeSet, key_prefix: &str, duration: Duration) -> (usize, usize, usize) {
    let ours = client(set, |b| {
        b.key_prefix(key_prefix)
            .backoff(Duration::from_millis(1), Duration::from_millis(5))
    })
    .await;
    let theirs = Arc::new(rslock(set));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + duration;
    let section = {
        let (inside, overlaps) = (inside.clone(), overlaps.clone());
        move || {
            let (inside, overlaps) = (inside.clone(), overlaps.clone());
            async move {
                if inside.fetch_add(1, Ordering::SeqCst) > 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
            }
        }
    };
    let mut workers = Vec::new();
    for _ in 0..2 {
        let (ours, inside_ours) = (ours.clone(), section.clone());
        workers.push(tokio::spawn(async move {
            let mut sections = 0;
            while Instant::now() < until {
                if let Ok(guard) = ours.lock("shared").await {
                    inside_ours().await;
                    guard.release().await.unwrap();
                    sections += 1;
                }
            }
            (sections, 0)
        }));
        let (theirs, inside_theirs) = (theirs.clone(), section.clone());
        workers.push(tokio::spawn(async move {
            let mut sections = 0;
            while Instant::now() < until {
                match theirs.lock("shared", TTL).await {
                    Ok(lock) => {
                        inside_theirs().await;
                        theirs.unlock(&lock).await;
                        sections += 1;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                }
            }
            (0, sections)
        }));
    }
    let (mut by_ours, mut by_theirs) = (0, 0);
    for worker in workers {
        let (o, t) = worker.await.unwrap();
        by_ours += o;
        by_theirs += t;
    }
    ours.shutdown().await;
    (overlaps.load(Ordering::SeqCst), by_ours, by_theirs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_and_rslock_exclude_each_other_only_when_they_name_the_key_alike() {
    let set = NodeSet::start(3).await.unwrap();
    let (overlaps, by_ours, by_theirs) = contend(&set, "", Duration::from_millis(1500)).await;
    assert!(by_ours > 0 && by_theirs > 0, "{by_ours} and {by_theirs}");
    assert_eq!(
        overlaps, 0,
        "{by_ours} sections by ours, {by_theirs} by rslock"
    );
    let freed = eventually(Duration::from_secs(5), || async {
        set.nodes_holding("shared").await.is_empty()
    })
    .await;
    assert!(freed, "a key was left behind");
    // Negative control: with the default prefix, ours locks `redlock:shared` and rslock
    // `shared`, two different keys: the checker sees them inside together.
    let (overlaps, by_ours, by_theirs) =
        contend(&set, "redlock:", Duration::from_millis(500)).await;
    assert!(
        overlaps > 0,
        "no overlap seen in {by_ours} and {by_theirs} sections on two keys"
    );
}

//! An extension never moves a node's expiry before a validity that some guard reports:
//! not another holder's of a shared reentrant hold, not a longer manual extension's that
//! renewal follows, and not the validity a failed extension leaves in place.

mod common;

use std::time::Duration;

use common::{client, eventually};
use redlock_client::{Error, LockGuard, LockOptions, LostReason, Owner};
use redlock_testkit::NodeSet;

/// Asserts that a quorum of nodes keep `key` at least as long as `guard` reports it valid
/// (a node whose extension timed out may lag; a quorum may not). The nodes are read
/// first: their TTLs only shrink while the validity is read.
async fn nodes_outlive(set: &NodeSet, key: &str, guard: &LockGuard) {
    let mut ttls = Vec::new();
    for node in set.iter() {
        ttls.push(node.pttl(key).await.unwrap());
    }
    let remaining = guard.remaining().expect("the guard reports the lock valid");
    let outliving = ttls
        .iter()
        .filter(|&&ttl| ttl >= 0 && ttl as u128 >= remaining.as_millis())
        .count();
    assert!(
        outliving > set.len() / 2,
        "only {outliving} node(s) keep {key} for the guard's validity ({remaining:?}): {ttls:?} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_extension_of_a_shared_reentrant_hold_does_not_end_the_other_hold() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.ttl(Duration::from_secs(3)).no_renewal()).await;
    let owner = Owner::new();
    let options = LockOptions::default();
    let first = c.lock_reentrant("shared", &owner, &options).await.unwrap();
    let second = c.lock_reentrant("shared", &owner, &options).await.unwrap();

    // The second holder asks for less than the first still relies on.
    let short = Duration::from_millis(600);
    second.extend(Some(short)).await.unwrap();
    nodes_outlive(&set, "redlock:shared", &first).await;
    // Neither guard's validity moved back either.
    nodes_outlive(&set, "redlock:shared", &second).await;
    assert!(second.remaining().unwrap() > short * 2);

    // Past the shorter TTL, nobody else can take the key while the first guard is valid.
    tokio::time::sleep(short + Duration::from_millis(300)).await;
    assert!(first.is_valid());
    let other = client(&set, |b| b.max_attempts(1)).await;
    match other.try_lock("shared").await {
        Err(Error::NotAcquired { .. }) => {}
        other => panic!("a third client must not get a held lock: {other:?}"),
    }
    second.release().await.unwrap();
    first.release().await.unwrap();
    assert!(set.nodes_holding("redlock:shared").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_does_not_take_back_a_longer_manual_extension() {
    let set = NodeSet::start(3).await.unwrap();
    // Renewed every 300 ms with the configured 1 s TTL.
    let c = client(&set, |b| b.ttl(Duration::from_secs(1))).await;
    let guard = c.lock("long-job").await.unwrap();
    guard.extend(Some(Duration::from_secs(10))).await.unwrap();
    let extended_until = guard.valid_until();

    // Several renewals run meanwhile (checked on the nodes, not by the clock).
    let evalsha = |set: &NodeSet| {
        let node = set.node(0).redis();
        async move { node.command_calls("evalsha").await.unwrap() }
    };
    let before = evalsha(&set).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            evalsha(&set).await >= before + 3
        })
        .await,
        "renewal did not run"
    );
    assert!(
        guard.valid_until() >= extended_until,
        "a renewal with the configured TTL moved the validity back"
    );
    nodes_outlive(&set, "redlock:long-job", &guard).await;
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_shorter_extension_applied_late_leaves_the_validity_backed() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.ttl(Duration::from_secs(5)).no_renewal()).await;
    let guard = c.lock("late").await.unwrap();
    let valid_until = guard.valid_until();

    let calls = |i: usize| {
        let node = set.node(i).redis();
        async move { node.command_calls("evalsha").await.unwrap() }
    };
    let before = [calls(1).await, calls(2).await];
    set.node(1).pause().unwrap();
    set.node(2).pause().unwrap();
    // Node 0 applies it at once; nodes 1 and 2 have it queued when the round gives up.
    let short = Duration::from_millis(800);
    let err = guard.extend(Some(short)).await.unwrap_err();
    assert!(matches!(err, Error::Round(_)), "{err}");
    set.node(1).resume().unwrap();
    set.node(2).resume().unwrap();
    // The queued extensions run now, after the client has given up on them.
    assert!(
        eventually(Duration::from_secs(5), || async {
            calls(1).await > before[0] && calls(2).await > before[1]
        })
        .await,
        "the queued extensions did not run"
    );

    assert!(guard.is_valid(), "a failed extension keeps the validity");
    assert_eq!(guard.valid_until(), valid_until);
    nodes_outlive(&set, "redlock:late", &guard).await;
    tokio::time::sleep(short + Duration::from_millis(300)).await;
    let other = client(&set, |b| b.max_attempts(1)).await;
    assert!(
        other.try_lock("late").await.is_err(),
        "the key expired under a guard that reports it valid"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_refused_by_a_majority_marks_the_guard_lost() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.ttl(Duration::from_secs(30)).no_renewal()).await;
    let guard = c.lock("gone").await.unwrap();
    set.node(0).del("redlock:gone").await.unwrap();
    set.node(1).del("redlock:gone").await.unwrap();
    assert!(guard.extend(None).await.is_err());
    assert!(!guard.is_valid(), "the nodes no longer hold it for us");
    assert_eq!(guard.lost().await, LostReason::Refused);
}

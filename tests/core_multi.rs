//! Multi-key locks, reentrant holds, batched extension and inspection, on real nodes.

mod common;

use std::time::Duration;

use common::coordinator;
use redlock_core::{ArgumentError, Error, NodeOutcome, Token};
use redlock_testkit::NodeSet;

const TTL: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_keys_are_acquired_all_or_nothing() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let keys = ["multi:a", "multi:b", "multi:c"];

    // One key taken by someone else on every node: nothing is acquired, nothing is left.
    let blocker = c.acquire("multi:b", TTL).await.unwrap();
    let err = c
        .acquire_many(&keys, Token::random(), TTL)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    err.report().unwrap().settled().await;
    for key in ["multi:a", "multi:c"] {
        assert!(
            set.nodes_holding(key).await.is_empty(),
            "{key} was left behind"
        );
    }
    c.release(&blocker).await.unwrap().settled().await;

    let lock = c.acquire_many(&keys, Token::random(), TTL).await.unwrap();
    assert_eq!(lock.keys().collect::<Vec<_>>(), keys);
    // Decided at a quorum: read every node once the last one answered.
    lock.report().settled().await;
    for key in keys {
        assert_eq!(set.nodes_holding(key).await, vec![0, 1, 2]);
    }
    let lock = c.extend(&lock, Duration::from_secs(60)).await.unwrap();
    lock.report().settled().await;
    assert!(set.node(0).pttl("multi:c").await.unwrap() > 10_000);
    c.release(&lock).await.unwrap().settled().await;
    for key in keys {
        assert!(set.nodes_holding(key).await.is_empty());
    }

    let dup = c
        .acquire_many(&["x", "x"], Token::random(), TTL)
        .await
        .unwrap_err();
    assert!(
        matches!(dup, Error::Argument(ArgumentError::DuplicateKey { .. })),
        "{dup}"
    );
    let none = c
        .acquire_many::<&str>(&[], Token::random(), TTL)
        .await
        .unwrap_err();
    assert!(
        matches!(none, Error::Argument(ArgumentError::NoKeys)),
        "{none}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrant_holds_are_counted_and_the_key_goes_with_the_last() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;

    let outer = c
        .acquire_reentrant("re", "owner-a", Token::random(), TTL)
        .await
        .unwrap();
    let inner = c
        .acquire_reentrant("re", "owner-a", Token::random(), TTL)
        .await
        .unwrap();
    let other = c
        .acquire_reentrant("re", "owner-b", Token::random(), TTL)
        .await
        .unwrap_err();
    assert!(
        matches!(other, Error::NoQuorum { .. }),
        "another owner must wait: {other}"
    );
    // A plain lock on a reentrant key sees it as taken.
    assert!(c.acquire("re", TTL).await.is_err());

    c.release(&inner).await.unwrap().settled().await;
    // Rounds return at the quorum: let the stragglers of the earlier rounds land too.
    c.quiesce().await;
    assert_eq!(set.nodes_holding("re").await.len(), 3, "one hold is left");
    // Releasing the same hold again changes nothing.
    let again = c.release(&inner).await.unwrap().settled().await;
    assert!(
        again
            .nodes
            .iter()
            .all(|n| n.outcome == NodeOutcome::NotHeld),
        "{again}"
    );
    assert_eq!(set.nodes_holding("re").await.len(), 3);

    let outer = c.extend(&outer, Duration::from_secs(60)).await.unwrap();
    c.release(&outer).await.unwrap().settled().await;
    assert!(set.nodes_holding("re").await.is_empty());
    c.acquire_reentrant("re", "owner-b", Token::random(), TTL)
        .await
        .expect("free again");
    c.quiesce().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_extends_each_lock_on_its_own() {
    let set = NodeSet::start(5).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let plain = c.acquire("batch:plain", TTL).await.unwrap();
    let many = c
        .acquire_many(&["batch:m1", "batch:m2"], Token::random(), TTL)
        .await
        .unwrap();
    let re = c
        .acquire_reentrant("batch:re", "me", Token::random(), TTL)
        .await
        .unwrap();
    let gone = c.acquire("batch:gone", TTL).await.unwrap();
    // Someone deletes one lock's key on a majority: that lock alone fails to extend.
    for i in 0..3 {
        set.node(i).del("batch:gone").await.unwrap();
    }
    let long = Duration::from_secs(60);
    let results = c
        .extend_many(&[
            (&plain, long),
            (&many, long),
            (&re, long),
            (&gone, long),
            (&plain, Duration::ZERO),
        ])
        .await;
    assert_eq!(results.len(), 5);
    for r in &results[..3] {
        let lock = r.as_ref().unwrap();
        assert!(lock.valid_until() > plain.valid_until());
    }
    assert!(
        matches!(&results[3], Err(Error::NoQuorum { .. })),
        "{:?}",
        results[3]
    );
    assert!(matches!(
        &results[4],
        Err(Error::Argument(ArgumentError::ZeroTtl))
    ));
    // Each lock was extended on a quorum (the batch returns once every lock is decided).
    for key in ["batch:plain", "batch:m1", "batch:m2", "batch:re"] {
        let mut extended = 0;
        for node in set.nodes() {
            extended += usize::from(node.pttl(key).await.unwrap() > 10_000);
        }
        assert!(extended >= 3, "{key}: extended on {extended} nodes");
    }
    // The key that was deleted is not recreated where it was gone.
    for i in 0..3 {
        assert!(set.node(i).get("batch:gone").await.unwrap().is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_batch_is_split_into_bounded_script_calls_and_keeps_its_order() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let count = 2 * redlock_core::EXTEND_BATCH_LOCKS + 50;
    let keys: Vec<String> = (0..count).map(|i| format!("big:{i}")).collect();
    let locks = futures::future::try_join_all(keys.iter().map(|key| c.acquire(key, TTL)))
        .await
        .unwrap();
    // One lock in each batch is deleted on a majority: exactly those fail, in their places.
    let gone = [3, redlock_core::EXTEND_BATCH_LOCKS + 7, count - 1];
    for &i in &gone {
        for node in 0..2 {
            set.node(node).del(&keys[i]).await.unwrap();
        }
    }
    let calls_before = set.node(2).command_calls("evalsha").await.unwrap();
    let long = Duration::from_secs(60);
    let requests: Vec<_> = locks.iter().map(|l| (l, long)).collect();
    let results = c.extend_many(&requests).await;
    assert_eq!(results.len(), count);
    for (i, (result, lock)) in results.iter().zip(&locks).enumerate() {
        if gone.contains(&i) {
            assert!(
                matches!(result, Err(Error::NoQuorum { .. })),
                "{i}: {result:?}"
            );
        } else {
            let extended = result.as_ref().unwrap();
            assert_eq!(extended.key(), lock.key(), "results keep the order");
            assert!(extended.valid_until() > lock.valid_until());
        }
    }
    // Three script calls per node (256 + 256 + 50 locks), not one carrying all of them
    // (counted once node 2 answered them all: each batch is decided at a quorum).
    c.quiesce().await;
    let calls = set.node(2).command_calls("evalsha").await.unwrap() - calls_before;
    assert_eq!(calls, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_many_moves_each_deadline_on_without_a_report_per_lock() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let count = redlock_core::EXTEND_BATCH_LOCKS + 10;
    let keys: Vec<String> = (0..count).map(|i| format!("renew:{i}")).collect();
    let mut locks = futures::future::try_join_all(keys.iter().map(|key| c.acquire(key, TTL)))
        .await
        .unwrap();
    let gone = [5, count - 1];
    for &i in &gone {
        for node in 0..2 {
            set.node(node).del(&keys[i]).await.unwrap();
        }
    }
    let long = Duration::from_secs(60);
    let requests: Vec<_> = locks.iter().map(|l| (l, long)).collect();
    let results = c.renew_many(&requests).await;
    assert_eq!(results.len(), count);
    for (i, (result, lock)) in results.iter().zip(&locks).enumerate() {
        if gone.contains(&i) {
            // A failed renewal keeps its report, in its error.
            let Err(Error::NoQuorum { report }) = result else {
                panic!("{i}: {result:?}")
            };
            assert_eq!(report.key.as_ref(), keys[i].as_str());
        } else {
            let renewed = result.as_ref().unwrap();
            assert!(renewed.valid_until() > lock.valid_until(), "{i}");
            assert_eq!(renewed.ttl(), long);
        }
    }
    // Applied, a renewal moves its own lock's deadline on and keeps the acquisition's
    // report; applied to another lock, it does nothing.
    let renewed = results[0].as_ref().unwrap().clone();
    let report = locks[0].report() as *const _;
    let before = locks[1].valid_until();
    locks[1].apply(&renewed);
    assert_eq!(locks[1].valid_until(), before, "another lock's renewal");
    locks[0].apply(&renewed);
    assert_eq!(locks[0].valid_until(), renewed.valid_until());
    assert_eq!(locks[0].ttl(), long);
    assert!(std::ptr::eq(locks[0].report(), report));
    // On the nodes, every lock that was not deleted now lives about a minute; a deleted
    // one is not recreated. Read once node 2 answered too: each lock's renewal is decided
    // at a quorum, so node 2's part could still be on its way.
    c.quiesce().await;
    for (i, key) in keys.iter().enumerate() {
        if gone.contains(&i) {
            assert!(set.node(0).get(key).await.unwrap().is_none(), "{key}");
        } else {
            let pttl = set.node(2).pttl(key).await.unwrap();
            assert!(pttl > 10_000, "{key}: {pttl}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspection_reads_a_quorum() {
    let set = NodeSet::start(5).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    assert_eq!(c.inspect("insp").await.unwrap().held, Some(false));
    let _lock = c.acquire("insp", TTL).await.unwrap();
    let seen = c.inspect("insp").await.unwrap();
    assert_eq!(seen.held, Some(true));
    assert!(seen.remaining.unwrap() <= TTL);
    set.node(0).kill().unwrap();
    set.node(1).kill().unwrap();
    for i in 2..4 {
        set.node(i).del("insp").await.unwrap();
    }
    // Two dead, two without the key, one with it: the dead nodes might still hold it, so
    // a quorum might too; the read cannot tell.
    assert_eq!(c.inspect("insp").await.unwrap().held, None);
    // Three nodes without the key: no quorum can hold it.
    set.node(4).del("insp").await.unwrap();
    assert_eq!(c.inspect("insp").await.unwrap().held, Some(false));
}

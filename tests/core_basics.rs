//! Acquire, extend and release against five real redis-server processes.

mod common;

use std::time::Duration;

use common::coordinator;
use redlock_core::{ArgumentError, Error, NodeOutcome, RoundKind};
use redlock_testkit::NodeSet;

const TTL: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_extend_release_on_five_nodes() {
    let set = NodeSet::start(5).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    assert_eq!(c.quorum(), 3);

    let lock = c.acquire("basics", TTL).await.unwrap();
    assert!(lock.is_valid());
    assert!(lock.remaining().unwrap() <= TTL - c.drift(TTL));
    assert!(lock.report().accepted >= 3);
    let settled = lock.report().settled().await;
    assert!(
        settled
            .nodes
            .iter()
            .all(|n| n.outcome == NodeOutcome::Acquired),
        "{settled}"
    );
    for node in set.nodes() {
        assert_eq!(
            node.get("basics").await.unwrap().as_deref(),
            Some(lock.token().as_str()),
            "{}",
            node.name()
        );
    }

    // A second owner is refused by every node, and its rollback leaves our key alone.
    let err = c.acquire("basics", TTL).await.unwrap_err();
    let Error::NoQuorum { report } = &err else {
        panic!("expected NoQuorum, got {err}")
    };
    assert!(
        report
            .nodes
            .iter()
            .filter(|n| n.outcome == NodeOutcome::HeldByOther)
            .count()
            >= 3,
        "{report}"
    );
    assert!(err.to_string().contains("held by another owner"), "{err}");
    report.settled().await;
    assert_eq!(set.nodes_holding("basics").await.len(), 5);

    let extended = c.extend(&lock, Duration::from_secs(60)).await.unwrap();
    assert_eq!(extended.report().kind, RoundKind::Extend);
    assert!(extended.valid_until() > lock.valid_until());
    // An extension returns once a quorum extended; the others may still be in flight.
    let mut extended_nodes = 0;
    for node in set.nodes() {
        let pttl = node.pttl("basics").await.unwrap();
        assert!(pttl <= 60_000, "{}: pttl {pttl}", node.name());
        extended_nodes += usize::from(pttl > 10_000);
    }
    assert!(extended_nodes >= 3, "only {extended_nodes} nodes extended");

    let report = c.release(&extended).await.unwrap();
    assert!(report.succeeded());
    report.settled().await;
    assert!(set.nodes_holding("basics").await.is_empty());

    // Extending a released lock fails and never recreates the key.
    let err = c.extend(&extended, TTL).await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    assert!(err.to_string().contains("no longer ours"), "{err}");
    c.quiesce().await;
    assert!(set.nodes_holding("basics").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_errors_that_send_nothing() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let cases = [
        ("", TTL, "empty"),
        ("k", Duration::ZERO, "zero"),
        ("k", Duration::from_millis(50), "no validity"),
    ];
    for (key, ttl, what) in cases {
        let err = c.acquire(key, ttl).await.unwrap_err();
        assert!(matches!(err, Error::Argument(_)), "{what}: {err}");
    }
    let long = "k".repeat(redlock_core::MAX_KEY_LEN + 1);
    assert!(matches!(
        c.acquire(&long, TTL).await,
        Err(Error::Argument(ArgumentError::KeyTooLong { .. }))
    ));
    for node in set.nodes() {
        assert_eq!(node.dbsize().await.unwrap(), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_down_at_start_up_is_reconnected_when_it_comes_back() {
    let set = NodeSet::start(3).await.unwrap();
    set.node(0).kill().unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;

    let lock = c
        .acquire("late-node", TTL)
        .await
        .expect("two of three nodes are a quorum");
    let settled = lock.report().settled().await;
    assert!(
        matches!(
            settled.nodes[0].outcome,
            NodeOutcome::ConnectionError(_) | NodeOutcome::TimedOut
        ),
        "{settled}"
    );
    c.release(&lock).await.unwrap();

    set.node(0).restart().await.unwrap();
    // Reconnection runs in the background with a bounded delay; poll rounds until node 0
    // takes part again (bounded, so a client that never reconnects fails the test).
    let mut rejoined = false;
    for _ in 0..100 {
        let lock = c.acquire("late-node", TTL).await.unwrap();
        let settled = lock.report().settled().await;
        c.release(&lock).await.unwrap();
        if settled.nodes[0].outcome == NodeOutcome::Acquired {
            rejoined = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(rejoined, "node 0 never took part again after it came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_expiry_does_not_touch_the_next_holder() {
    let set = NodeSet::start(5).await.unwrap();
    let first = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let second = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let ttl = Duration::from_millis(400);

    let old = first.acquire("expiry", ttl).await.unwrap();
    // Wait until the key has expired on every node (bounded poll, no timing assertion).
    for _ in 0..100 {
        if set.nodes_holding("expiry").await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!old.is_valid());
    let new = second.acquire("expiry", TTL).await.unwrap();

    // The late holder's release and extension find nothing of theirs.
    let err = first.extend(&old, TTL).await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    let report = first
        .release(&old)
        .await
        .expect("a release of an expired lock succeeds: nothing of ours is left");
    let settled = report.settled().await;
    assert!(
        settled
            .nodes
            .iter()
            .all(|n| n.outcome == NodeOutcome::NotHeld),
        "{settled}"
    );
    first.quiesce().await;
    for node in set.nodes() {
        assert_eq!(
            node.get("expiry").await.unwrap().as_deref(),
            Some(new.token().as_str()),
            "{}",
            node.name()
        );
        assert!(
            node.pttl("expiry").await.unwrap() > 5_000,
            "{}: the next holder's TTL was touched",
            node.name()
        );
    }
}

/// A reentrant lock's Debug shows its owner only as the token is shown (the first
/// characters): the owner's identity lets its bearer enter the lock. It used to be printed
/// whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locks_debug_abbreviates_its_owner_and_token() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let owner = "owner-0123456789abcdef";
    let lock = c
        .acquire_with(redlock_core::Acquisition {
            owner: Some(owner),
            ..redlock_core::Acquisition::new(&["debug"], TTL)
        })
        .await
        .unwrap();
    let shown = format!("{lock:?}");
    assert!(!shown.contains(owner), "{shown}");
    assert!(!shown.contains(lock.token().as_str()), "{shown}");
    assert!(shown.contains("owner-01…"), "{shown}");
    c.release(&lock).await.unwrap();
    c.close().await;
}

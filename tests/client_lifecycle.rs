//! What the client promises about the end of a hold and of the client itself: released
//! guards say so, background releases are waited for, shutdown is bounded with a node
//! down, guards outlive their client, a multi-key release wakes every key's waiters, and a
//! client that is shut down or whose runtime stopped says so at once.

mod common;

use std::time::Duration;

use common::{client, coordinator, eventually, linked, subscribed};
use redlock_client::{
    Error, HoldHealth, LockConfig, LockOptions, LostReason, Redlock, RetryPolicy,
};
use redlock_core::{ClosedReason, NodeOutcome};
use redlock_testkit::{LinkFault, NodeSet};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_release_handles_and_lost_signals_say_the_lock_is_gone() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;

    let guard = c.lock("released").await.unwrap();
    let handle = guard.handle();
    let lost = handle.lost();
    assert!(handle.is_valid());
    guard.release().await.unwrap();
    assert!(!handle.is_valid());
    assert!(handle.remaining().is_none());
    let reason = tokio::time::timeout(Duration::from_secs(5), lost).await;
    assert_eq!(reason, Ok(LostReason::Released));

    let guard = c.lock("dropped").await.unwrap();
    let handle = guard.handle();
    drop(guard);
    assert!(!handle.is_valid());
    assert_eq!(handle.lost().await, LostReason::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiesce_and_shutdown_wait_for_the_background_release_of_a_dropped_guard() {
    let set = NodeSet::start(3).await.unwrap();
    let links = linked(&set).await;
    let config = LockConfig::builder()
        .nodes(links.urls(0))
        .ttl(Duration::from_secs(10))
        .node_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let c = Redlock::connect(config).await.unwrap();
    let guard = c.lock("slow-release").await.unwrap();
    // From now on every request of the client takes 300 ms to reach its node, while the
    // test reads the nodes directly, in about a millisecond.
    let slow = LinkFault::Latency {
        to_server: Duration::from_millis(300),
        to_client: Duration::ZERO,
    };
    for node in 0..set.len() {
        links.set_node(node, slow);
    }
    drop(guard);
    c.coordinator().quiesce().await;
    assert_eq!(
        set.nodes_holding("redlock:slow-release").await,
        Vec::<usize>::new(),
        "quiesce returned before the background release of a dropped guard"
    );

    let guard = c.lock("slow-release").await.unwrap();
    drop(guard);
    c.shutdown().await;
    assert_eq!(
        set.nodes_holding("redlock:slow-release").await,
        Vec::<usize>::new(),
        "shutdown returned before the background release of a dropped guard"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_does_not_wait_a_ttl_for_a_rollback_on_a_hung_node() {
    let set = NodeSet::start(3).await.unwrap();
    let node_timeout = Duration::from_millis(100);
    let core = coordinator(&set, node_timeout).await;
    set.node(0)
        .set("stuck", "someone-else", Some(60_000))
        .await
        .unwrap();
    set.node(1).pause().unwrap();
    // Node 0 refuses, node 1 hangs, node 2 accepts: lost, and rolled back on 1 and 2.
    let ttl = Duration::from_secs(30);
    assert!(core.acquire("stuck", ttl).await.is_err());
    // The documented bound is 4 node timeouts + 30 ms; a whole TTL is 30 s. The limit
    // here only stops a hang: it is 25 times the bound.
    let closed = tokio::time::timeout(Duration::from_secs(10), core.close()).await;
    set.node(1).resume().unwrap();
    assert!(
        closed.is_ok(),
        "close waited for a rollback on a hung node for the key's whole TTL"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guards_keep_renewing_after_the_client_is_dropped_and_then_close_its_connections() {
    let set = NodeSet::start(3).await.unwrap();
    let baseline = set.node(0).redis().connected_clients().await.unwrap();
    let ttl = Duration::from_millis(900);
    let c = client(&set, |b| b.ttl(ttl)).await;
    let guard = c.lock("orphan").await.unwrap();
    assert!(set.node(0).redis().connected_clients().await.unwrap() > baseline);
    drop(c);

    tokio::time::sleep(ttl * 3).await;
    assert!(
        guard.is_valid(),
        "renewal stopped when the client handle was dropped"
    );
    assert_eq!(set.nodes_holding("redlock:orphan").await.len(), 3);

    guard.release().await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            set.node(0).redis().connected_clients().await.unwrap() <= baseline
        })
        .await,
        "the client's connections stayed open after its last handle and guard were gone"
    );
}

/// A copy of the client's coordinator (`Redlock::coordinator`) outlives the client: the
/// client's drop used to close the coordinator that every copy shares, so the copy's
/// rounds failed as closed and a lock taken through it could no longer be released
/// (its key stayed for its TTL). The connections close once the copy is gone too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_copy_of_the_coordinator_outlives_the_client_and_then_closes() {
    let set = NodeSet::start(3).await.unwrap();
    let baseline = set.node(0).redis().connected_clients().await.unwrap();
    let c = client(&set, |b| b).await;
    let core = c.coordinator().clone();
    let before = core
        .acquire("redlock:kept", Duration::from_secs(30))
        .await
        .unwrap();
    drop(c);
    // Long enough for the client's drop to have closed the coordinator, had it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(core.closed(), None);
    core.release(&before)
        .await
        .expect("a lock taken before the drop is released");
    assert!(set.nodes_holding("redlock:kept").await.is_empty());
    let after = core
        .acquire("redlock:kept", Duration::from_secs(30))
        .await
        .unwrap();
    core.release(&after).await.unwrap();
    drop((core, before, after));
    assert!(
        eventually(Duration::from_secs(5), || async {
            set.node(0).redis().connected_clients().await.unwrap() <= baseline
        })
        .await,
        "the connections stayed open after the last copy was gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_key_release_wakes_the_waiters_of_every_key() {
    let set = NodeSet::start(3).await.unwrap();
    let holder = client(&set, |b| b).await;
    // A seeded backoff whose first delay is far longer than the test: only a wake-up can
    // bring either waiter back before it.
    let retry = RetryPolicy {
        max_attempts: None,
        max_wait: Some(Duration::from_secs(120)),
        base_delay: Duration::from_secs(120),
        max_delay: Duration::from_secs(120),
        seed: Some(42),
    };
    let first_delay = retry.backoff().next().unwrap();
    assert!(first_delay > Duration::from_secs(30), "{first_delay:?}");
    let waiters = client(&set, |b| b.retry(retry)).await;
    subscribed(&set, 2).await;

    let guard = holder
        .lock_many(&["a", "b"], &LockOptions::default())
        .await
        .unwrap();
    let sets_before = set.node(0).redis().command_calls("set").await.unwrap();
    let (wa, wb) = (waiters.clone(), waiters.clone());
    let on_a = tokio::spawn(async move { wa.lock("a").await });
    let on_b = tokio::spawn(async move { wb.lock("b").await });
    // Both waiters have been refused once and sleep out their backoff.
    assert!(
        eventually(Duration::from_secs(10), || async {
            set.node(0).redis().command_calls("set").await.unwrap() >= sets_before + 2
        })
        .await
    );
    guard.release().await.unwrap();

    for (key, waiter) in [("a", on_a), ("b", on_b)] {
        let got = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap_or_else(|_| panic!("the waiter on {key} was not woken by the release"))
            .unwrap()
            .unwrap();
        // The first attempt, the second that follows it at once to queue the waiter, and
        // the one the release woke (or only the first two, when the release came between
        // them).
        assert!(
            (2..=3).contains(&got.attempts()),
            "{key}: {}",
            got.attempts()
        );
        got.release().await.unwrap();
    }
}

/// Every node of `error`'s report says the client is closed, for `reason`.
fn every_node_closed(error: &Error, reason: ClosedReason) -> bool {
    error.report().is_some_and(|report| {
        report
            .nodes
            .iter()
            .all(|n| n.outcome == NodeOutcome::Closed(reason))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_was_shut_down_says_so_at_once() {
    let set = NodeSet::start(3).await.expect("nodes start");
    // A wait long enough that retrying over failing rounds would show as another error.
    let c = client(&set, |b| b.max_wait(Duration::from_secs(2))).await;
    let held = c.lock("kept").await.unwrap();
    let suspended = held.suspended();
    c.shutdown().await;
    // Renewal stops at its next tick, and says why.
    let health = tokio::time::timeout(Duration::from_secs(10), suspended)
        .await
        .expect("renewal went on after the shutdown");
    match health {
        HoldHealth::RenewalFailing { last_error, .. } => {
            assert!(last_error.contains("renewal stopped"), "{last_error}");
            assert!(last_error.contains("shut down"), "{last_error}");
        }
        other => panic!("{other:?}"),
    }
    let error = c.lock("after").await.unwrap_err();
    assert!(
        matches!(
            &error,
            Error::Closed {
                reason: ClosedReason::Shutdown,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("shut down"), "{error}");
    // A release sends nothing either, and says why on every node.
    let error = held.release().await.unwrap_err();
    assert!(every_node_closed(&error, ClosedReason::Shutdown), "{error}");
    assert!(error.to_string().contains("connect a new one"), "{error}");
}

/// A client kept past the runtime that connected it (a `static` shared by
/// `#[tokio::test]`s, each with its own runtime): fred's tasks for it are gone with that
/// runtime. Its calls used to fail on every node as a "server error" (fred's "Failed to
/// send command to router.", with advice to check the Redis version), and `lock` retried
/// them until `max_wait`.
#[test]
fn a_client_whose_runtime_stopped_says_so_at_once() {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let nodes = runtime();
    let set = nodes.block_on(NodeSet::start(3)).unwrap();
    let first = runtime();
    let c = first.block_on(client(&set, |b| b.max_wait(Duration::from_secs(2))));
    let held = first.block_on(c.lock("kept")).unwrap();
    assert_eq!(held.health(), HoldHealth::Healthy);
    // `lock` returns at a quorum (two of three): the third node's answer may still be on
    // its way, and it would go with the runtime. Let it land, so that the last check below
    // (nothing released) counts every node.
    let all_hold = nodes.block_on(eventually(Duration::from_secs(5), || async {
        set.nodes_holding("redlock:kept").await.len() == 3
    }));
    assert!(all_hold);
    drop(first);
    // Its renewal went with the runtime: the guard says so at once (it said `Healthy`
    // until its validity ran out).
    match held.health() {
        HoldHealth::RenewalFailing { last_error, .. } => {
            assert!(last_error.contains("renewal stopped"), "{last_error}");
            assert!(last_error.contains("runtime"), "{last_error}");
        }
        other => panic!("{other:?}"),
    }
    let second = runtime();
    let error = second.block_on(c.lock("after")).unwrap_err();
    assert!(
        matches!(
            &error,
            Error::Closed {
                reason: ClosedReason::RuntimeStopped,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("runtime"), "{error}");
    let error = second.block_on(held.release()).unwrap_err();
    assert!(
        every_node_closed(&error, ClosedReason::RuntimeStopped),
        "{error}"
    );
    // Nothing was released: the key waits out its TTL on the nodes.
    assert_eq!(nodes.block_on(set.nodes_holding("redlock:kept")).len(), 3);
}

/// Services that call the client from plain threads (`runtime.block_on(...)`, as the
/// crate docs show) drop guards and clients there too: a guard dropped outside any runtime
/// is released in the runtime the client was connected in, and a client dropped there
/// closes its connections. Both used to do nothing: the key stayed for its TTL, and the
/// connections (and their reconnect loops) for the runtime's life.
#[test]
fn a_guard_and_a_client_dropped_on_a_plain_thread_release_and_close() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let set = runtime.block_on(NodeSet::start(3)).unwrap();
    let c = runtime.block_on(client(&set, |b| b.ttl(Duration::from_secs(60))));
    runtime.block_on(subscribed(&set, 1));
    let guard = runtime.block_on(c.lock("plain-thread")).unwrap();
    std::thread::spawn(move || drop(guard)).join().unwrap();
    let released = runtime.block_on(eventually(Duration::from_secs(10), || async {
        set.nodes_holding("redlock:plain-thread").await.is_empty()
    }));
    assert!(released, "the key stayed on the nodes");

    std::thread::spawn(move || drop(c)).join().unwrap();
    let closed = runtime.block_on(eventually(Duration::from_secs(10), || async {
        let mut subscribers = 0;
        for node in set.iter() {
            subscribers += node.redis().subscribers("redlock:released").await.unwrap();
        }
        subscribers == 0
    }));
    assert!(closed, "the client's connections stayed open");
}

/// A guard held by a task of another runtime (a worker runtime sharing the client), which
/// shuts down: the guard is dropped there, and its release runs in the client's runtime.
/// It used to be spawned on the dying runtime, which dropped it unrun, and the key stayed
/// for its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_as_another_runtime_shuts_down_is_released() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.ttl(Duration::from_secs(60))).await;
    let guard = c.lock("worker").await.unwrap();
    let worker = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (started, running) = tokio::sync::oneshot::channel();
    worker.spawn(async move {
        let _guard = guard;
        let _ = started.send(());
        std::future::pending::<()>().await;
    });
    running.await.unwrap();
    worker.shutdown_background();
    assert!(
        eventually(Duration::from_secs(5), || async {
            set.nodes_holding("redlock:worker").await.is_empty()
        })
        .await,
        "the guard's key stayed after its runtime shut down"
    );
    c.shutdown().await;
}

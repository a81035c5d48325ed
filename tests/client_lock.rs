//! Acquiring with the client: try_lock, lock with retries and deadlines, contention.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::client;
use redlock_client::{Error, LockConfig, LockOptions, Redlock, RetryPolicy};
use redlock_testkit::NodeSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_then_release() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.key_prefix("t:")).await;
    let guard = c.try_lock("job").await.unwrap();
    assert_eq!(guard.key(), "t:job");
    assert_eq!(guard.attempts(), 1);
    assert!(guard.is_valid());
    let err = c.try_lock("job").await.unwrap_err();
    assert!(
        matches!(&err, Error::NotAcquired { attempts: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("held by another owner"), "{err}");
    let report = guard.release().await.unwrap();
    report.settled().await;
    assert!(set.nodes_holding("t:job").await.is_empty());
    c.try_lock("job").await.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_gives_up_after_its_attempts_or_its_deadline() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.notify(false)).await;
    let _held = c.lock("busy").await.unwrap();

    let three = LockOptions {
        retry: Some(RetryPolicy {
            max_attempts: Some(3),
            max_wait: None,
            ..RetryPolicy::default()
        }),
        ..Default::default()
    };
    let err = c.lock_with("busy", &three).await.unwrap_err();
    assert!(
        matches!(err, Error::NotAcquired { attempts: 3, .. }),
        "{err}"
    );

    let short = LockOptions {
        retry: Some(RetryPolicy {
            max_attempts: None,
            max_wait: Some(Duration::from_millis(300)),
            ..RetryPolicy::default()
        }),
        ..Default::default()
    };
    let err = c.lock_with("busy", &short).await.unwrap_err();
    let Error::DeadlinePassed {
        attempts, waited, ..
    } = &err
    else {
        panic!("expected DeadlinePassed, got {err}")
    };
    assert!(*attempts > 1, "it retried before giving up");
    assert!(*waited >= Duration::from_millis(300));
    c.coordinator().quiesce().await;
    assert_eq!(
        set.nodes_holding("redlock:busy").await.len(),
        3,
        "failed attempts never touch the holder's key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_nodes_down_is_reported_as_unreachable() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.max_attempts(2)).await;
    for node in set.nodes() {
        node.kill().unwrap();
    }
    let err = c.lock("anything").await.unwrap_err();
    assert!(matches!(err, Error::Unreachable { .. }), "{err}");
    assert!(
        err.to_string().contains("check that the nodes are running"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_configuration_is_an_error_not_a_panic() {
    let none = LockConfig::builder().build();
    assert!(none.is_err());
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    let zero = LockOptions {
        ttl: Some(Duration::ZERO),
        ..Default::default()
    };
    assert!(matches!(
        c.lock_with("k", &zero).await,
        Err(Error::InvalidConfig(_))
    ));
    let never = LockOptions {
        retry: Some(RetryPolicy {
            max_attempts: Some(0),
            ..RetryPolicy::default()
        }),
        ..Default::default()
    };
    assert!(matches!(
        c.lock_with("k", &never).await,
        Err(Error::InvalidConfig(_))
    ));
    let bare = client(&set, |b| b.key_prefix("")).await;
    assert!(
        matches!(bare.lock("").await, Err(Error::InvalidArgument(_))),
        "an empty key with an empty prefix"
    );
}

/// The negative control of the contention test: the same workload without the lock loses
/// updates, so the check below can fail.
async fn run_increments(tasks: usize, per_task: u64, lock: Option<Redlock>) -> (u64, u64) {
    let value = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (value, lock) = (value.clone(), lock.clone());
            tokio::spawn(async move {
                for _ in 0..per_task {
                    let guard = match &lock {
                        Some(c) => Some(c.lock("counter").await.expect("acquired within max_wait")),
                        None => None,
                    };
                    // Not atomic on purpose: read, yield, write.
                    let read = value.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    value.store(read + 1, Ordering::SeqCst);
                    if let Some(guard) = guard {
                        guard.release().await.expect("released");
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    (value.load(Ordering::SeqCst), tasks as u64 * per_task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contending_tasks_lose_no_update() {
    let set = NodeSet::start(5).await.unwrap();
    let c = client(&set, |b| b.max_wait(Duration::from_secs(30))).await;
    let (unprotected, expected) = run_increments(8, 5, None).await;
    assert!(
        unprotected < expected,
        "the workload must lose updates without a lock, or this test proves nothing"
    );
    let (protected, expected) = run_increments(8, 15, Some(c)).await;
    assert_eq!(protected, expected, "updates were lost under the lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_lock_future_rolls_back_the_attempt_in_flight() {
    let set = NodeSet::start(5).await.unwrap();
    let c = client(&set, |b| {
        b.node_timeout(Duration::from_secs(2))
            .ttl(Duration::from_secs(30))
    })
    .await;
    for i in 2..5 {
        set.node(i).pause().unwrap();
    }
    // Nodes 0 and 1 take the key; the attempt then waits on the paused majority. Drop it.
    let attempt = tokio::time::timeout(Duration::from_millis(300), c.lock("cancelled")).await;
    assert!(
        attempt.is_err(),
        "the attempt cannot finish while a majority is paused"
    );
    for i in 2..5 {
        set.node(i).resume().unwrap();
    }
    c.coordinator().quiesce().await;
    assert!(
        set.nodes_holding("redlock:cancelled").await.is_empty(),
        "a cancelled lock() left keys behind"
    );
}

/// A wait that ran out because nodes did not answer (nobody holds the key) says so, with
/// the report's own advice: it used to tell the caller to find out who holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_ran_out_on_silent_nodes_says_they_were_silent() {
    let set = NodeSet::start(3).await.unwrap();
    let links = {
        use redlock_testkit::Nodes;
        redlock_testkit::Links::start(1, &set.addrs())
            .await
            .unwrap()
    };
    let c = Redlock::connect(
        redlock_client::LockConfig::builder()
            .nodes(links.urls(0))
            .node_timeout(Duration::from_millis(100))
            .notify(false)
            .max_wait(Duration::from_millis(400))
            .backoff(Duration::from_millis(5), Duration::from_millis(50))
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    for node in [1, 2] {
        links
            .link(0, node)
            .set(redlock_testkit::LinkFault::Blackhole);
    }
    let err = c.lock("silent").await.unwrap_err();
    let Error::DeadlinePassed { .. } = &err else {
        panic!("expected DeadlinePassed, got {err}")
    };
    let message = err.to_string();
    assert!(message.contains("did not answer in time"), "{message}");
    links.heal_all();
    c.shutdown().await;
}

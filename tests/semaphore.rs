//! The semaphore over the quorum (`Coordinator::acquire_permit`) against real
//! redis-server processes: at most `permits` holders, a round split between permits rolls
//! back everything it took, and a permit is a lock like any other once won.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{client, coordinator};
use redlock_client::{Error as ClientError, LockOptions};
use redlock_core::support::FairPlace;
use redlock_core::{ArgumentError, Error, Lock, PermitAcquisition, MAX_PERMITS};
use redlock_testkit::NodeSet;

const TTL: Duration = Duration::from_secs(10);
const PERMIT: &str = "redlock:semaphore-{jobs}:";

/// What a semaphore of one permit makes of `guard`: its permit when that is the first.
fn permits_of_one(guard: &redlock_client::LockGuard) -> Option<u32> {
    guard.key().ends_with(":1").then_some(1)
}

/// Every key on every node, sorted, with its value.
async fn every_key(set: &NodeSet) -> Vec<Vec<(String, String)>> {
    let mut nodes = Vec::new();
    for node in set.nodes() {
        let mut keys = Vec::new();
        for key in node.keys("*").await.unwrap() {
            let value = node.get(&key).await.unwrap().unwrap_or_default();
            keys.push((key, value));
        }
        keys.sort();
        nodes.push(keys);
    }
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_the_permits_are_held_and_a_release_frees_one() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let first = c.acquire_permit("jobs", 2, TTL).await.unwrap();
    let second = c.acquire_permit("jobs", 2, TTL).await.unwrap();
    assert_ne!(first.key(), second.key());
    for lock in [&first, &second] {
        assert!(lock.key().starts_with(PERMIT), "{}", lock.key());
        assert!(lock.is_valid());
    }
    let err = c.acquire_permit("jobs", 2, TTL).await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    c.quiesce().await;
    // The refused round left nothing: each node holds the two permits, under their tokens.
    let mut held = vec![
        (first.key().to_string(), first.token().as_str().to_string()),
        (
            second.key().to_string(),
            second.token().as_str().to_string(),
        ),
    ];
    held.sort();
    for keys in every_key(&set).await {
        assert_eq!(keys, held);
    }
    // Another semaphore's permits are its own.
    let other = c.acquire_permit("mail", 1, TTL).await.unwrap();
    // A permit extends and releases as a lock of one key.
    let extended = c.extend(&first, Duration::from_secs(60)).await.unwrap();
    assert!(extended.valid_until() > first.valid_until());
    c.release(&extended).await.unwrap().settled().await;
    assert!(set.nodes_holding(first.key()).await.is_empty());
    let third = c.acquire_permit("jobs", 2, TTL).await.unwrap();
    assert_eq!(third.key(), first.key());
    for lock in [&second, &third, &other] {
        c.release(lock).await.unwrap().settled().await;
    }
    c.quiesce().await;
    assert!(every_key(&set).await.iter().all(Vec::is_empty));
}

/// Each node has a different permit free: every node takes one for the round, no permit
/// reaches a quorum, and the rollback leaves every node as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_split_between_permits_rolls_back_everything_it_took() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    for (i, node) in set.nodes().iter().enumerate() {
        for permit in 1..=3 {
            if permit != i + 1 {
                node.set(&format!("{PERMIT}{permit}"), "other", Some(60_000))
                    .await
                    .unwrap();
            }
        }
    }
    let before = every_key(&set).await;
    for fenced in [false, true, false, true, false] {
        let what = PermitAcquisition {
            fenced,
            ..PermitAcquisition::new("jobs", 3, TTL)
        };
        let err = c.acquire_permit_with(what).await.unwrap_err();
        let Error::NoQuorum { report } = &err else {
            panic!("expected NoQuorum, got {err}");
        };
        assert!(report.accepted < report.quorum, "{report}");
        c.quiesce().await;
        assert_eq!(every_key(&set).await, before, "the round left a key behind");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_holders_never_exceed_the_permits() {
    const PERMITS: u32 = 2;
    let set = NodeSet::start(3).await.unwrap();
    // A second per node: on a loaded machine every release must still reach its quorum.
    let c = coordinator(&set, Duration::from_secs(1)).await;
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let won = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let (c, holding, most, won) = (c.clone(), holding.clone(), most.clone(), won.clone());
            tokio::spawn(async move {
                for _ in 0..15 {
                    let Ok(lock) = c.acquire_permit("jobs", PERMITS, TTL).await else {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        continue;
                    };
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    won.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    holding.fetch_sub(1, Ordering::SeqCst);
                    c.release(&lock).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= PERMITS as usize,
        "{most} holders of {PERMITS} permits"
    );
    assert!(won.load(Ordering::SeqCst) > 0);
    c.quiesce().await;
    assert!(every_key(&set).await.iter().all(Vec::is_empty));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_typed_error_and_sends_nothing() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    for permits in [0, MAX_PERMITS + 1] {
        let err = c.acquire_permit("jobs", permits, TTL).await.unwrap_err();
        assert!(
            matches!(err, Error::Argument(ArgumentError::Permits { max, .. }) if max == MAX_PERMITS),
            "{err}"
        );
        assert!(err.to_string().contains("give it from 1 to"), "{err}");
    }
    let err = c.acquire_permit("", 2, TTL).await.unwrap_err();
    assert!(
        matches!(err, Error::Argument(ArgumentError::EmptyKey)),
        "{err}"
    );
    let err = c
        .acquire_permit("jobs", 2, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Argument(ArgumentError::ZeroTtl)),
        "{err}"
    );
    // No plain lock takes a permit's key.
    let err = c.acquire(&format!("{PERMIT}1"), TTL).await.unwrap_err();
    assert!(
        matches!(err, Error::Argument(ArgumentError::ReservedKey { .. })),
        "{err}"
    );
    assert!(every_key(&set).await.iter().all(Vec::is_empty));
}

/// The client's semaphore: permits as guards, renewed while held, released on drop, and
/// at most its number of permits at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_permits_are_guards_and_never_more_than_the_permits() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.ttl(Duration::from_millis(600))).await;
    let encoders = c.semaphore("encoders", 2).unwrap();
    assert_eq!(encoders.permits(), 2);
    let first = encoders.acquire().await.unwrap();
    let second = encoders.try_acquire().await.unwrap();
    assert_ne!(first.key(), second.key());
    assert!(first.key().starts_with("redlock:semaphore-{encoders}:"));
    let mut permits = [encoders.permit(&first), encoders.permit(&second)];
    permits.sort();
    assert_eq!(permits, [Some(1), Some(2)]);
    assert_eq!(
        c.semaphore("encoders", 1).unwrap().permit(&second),
        permits_of_one(&second)
    );
    assert_eq!(c.semaphore("other", 2).unwrap().permit(&first), None);
    let err = encoders.try_acquire().await.unwrap_err();
    assert!(matches!(err, ClientError::NotAcquired { .. }), "{err}");
    assert!(
        err.to_string().contains("redlock:semaphore-{encoders}"),
        "{err}"
    );
    // Renewed past their TTL.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(first.is_valid() && second.is_valid());
    // A dropped guard gives its permit back, and a waiter takes it.
    let freed = first.key();
    drop(first);
    let third = encoders.acquire().await.unwrap();
    assert_eq!(third.key(), freed);
    second.release().await.unwrap();
    third.release().await.unwrap();
    c.coordinator().quiesce().await;
    assert!(every_key(&set).await.iter().all(Vec::is_empty));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_semaphore_refuses_what_it_does_not_offer() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    for permits in [0, MAX_PERMITS + 1] {
        let err = c.semaphore("jobs", permits).unwrap_err();
        assert!(
            matches!(
                err,
                ClientError::InvalidArgument(ArgumentError::Permits { .. })
            ),
            "{err}"
        );
    }
    let err = c.semaphore("", 2).unwrap_err();
    assert!(
        matches!(err, ClientError::InvalidArgument(ArgumentError::EmptyKey)),
        "{err}"
    );
    assert!(every_key(&set).await.iter().all(Vec::is_empty));
}

/// Fenced permits: each gets a token from the node set's one counter, above every token
/// handed out before it, so a resource that keeps the highest token per permit (its key)
/// refuses a stale holder of that permit while the other permits' holders go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_permits_get_increasing_tokens_checked_per_permit() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let fenced = |permits| PermitAcquisition {
        fenced: true,
        ..PermitAcquisition::new("jobs", permits, TTL)
    };
    let first = c.acquire_permit_with(fenced(2)).await.unwrap();
    let second = c.acquire_permit_with(fenced(2)).await.unwrap();
    let (t1, t2) = (
        first.fencing_token().expect("fenced"),
        second.fencing_token().expect("fenced"),
    );
    assert!(t2 > t1, "{t1} then {t2}");
    // A lock of the same node set draws from the same counter.
    let lock = c
        .acquire_with(redlock_core::Acquisition {
            fenced: true,
            ..redlock_core::Acquisition::new(&["other"], TTL)
        })
        .await
        .unwrap();
    assert!(lock.fencing_token().unwrap() > t2);
    // The first permit's holder stalls; its permit is released and taken again.
    c.release(&first).await.unwrap().settled().await;
    let again = c.acquire_permit_with(fenced(2)).await.unwrap();
    assert_eq!(again.key(), first.key());
    let t3 = again.fencing_token().unwrap();
    assert!(t3 > t1);
    // The resource's rule: the highest token seen per permit.
    let mut highest = std::collections::HashMap::new();
    let mut accept = |key: &str, token: redlock_core::FencingToken| {
        let seen = highest.entry(key.to_string()).or_insert(token);
        let ok = token >= *seen;
        *seen = (*seen).max(token);
        ok
    };
    assert!(accept(first.key(), t1));
    assert!(accept(second.key(), t2));
    assert!(accept(again.key(), t3));
    assert!(
        !accept(first.key(), t1),
        "the stale holder's write must be refused"
    );
    assert!(accept(second.key(), t2), "another permit's holder goes on");
    for held in [&second, &again, &lock] {
        c.release(held).await.unwrap().settled().await;
    }
    c.quiesce().await;
    for keys in every_key(&set).await {
        // Only the fencing counter and its companions are left.
        assert!(
            keys.iter()
                .all(|(k, _)| k.starts_with("redlock:fencing-counter")),
            "{keys:?}"
        );
    }
}

/// The client's fenced permits: the guard carries its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_fenced_permits_carry_tokens() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.fencing(true)).await;
    let jobs = c.semaphore("jobs", 2).unwrap();
    let first = jobs.acquire().await.unwrap();
    let second = jobs.acquire().await.unwrap();
    let (t1, t2) = (
        first.fencing_token().unwrap(),
        second.fencing_token().unwrap(),
    );
    assert!(t2 > t1);
    first.release().await.unwrap();
    second.release().await.unwrap();
}

/// A fair acquisition of a permit of semaphore "jobs" of two permits, by `waiter`.
fn fair(waiter: &'static str, ticket: u64) -> PermitAcquisition<'static> {
    PermitAcquisition {
        fair: Some(FairPlace {
            waiter,
            ticket,
            patience: Duration::from_secs(30),
            handover: None,
        }),
        ..PermitAcquisition::new("jobs", 2, TTL)
    }
}

/// The semaphore's fair queue: on each node only the oldest waiters try, as many as it has
/// free permits, so that a later waiter neither overtakes an older one nor takes the permit
/// it could win; each win leaves the queue, and nothing is left at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fair_queue_lets_the_oldest_waiters_try_as_many_as_permits_are_free() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let lost = |result: Result<Lock, Error>| match result {
        Err(Error::NoQuorum { .. }) => {}
        other => panic!("not the waiter's turn, yet {other:?}"),
    };
    // A place the queue cannot take is a typed error, and nothing is sent.
    let err = c
        .acquire_permit_with(PermitAcquisition {
            fair: Some(FairPlace {
                waiter: "a b",
                ..fair("f0", 0).fair.unwrap()
            }),
            ..fair("f0", 0)
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Argument(ArgumentError::FairPlace { .. })),
        "{err}"
    );
    assert!(every_key(&set).await.iter().all(Vec::is_empty));
    let first = c.acquire_permit("jobs", 2, TTL).await.unwrap();
    let second = c.acquire_permit("jobs", 2, TTL).await.unwrap();
    for (waiter, ticket) in [("f1", 1), ("f2", 2), ("f3", 3), ("f4", 4)] {
        lost(c.acquire_permit_with(fair(waiter, ticket)).await);
    }
    // One permit free: only the oldest waiter's turn has come.
    c.release(&first).await.unwrap().settled().await;
    for (waiter, ticket) in [("f2", 2), ("f3", 3)] {
        lost(c.acquire_permit_with(fair(waiter, ticket)).await);
    }
    // (The negative control: outside the queue, a caller takes the free permit at once.)
    let outside = c.acquire_permit("jobs", 2, TTL).await.unwrap();
    c.release(&outside).await.unwrap().settled().await;
    let f1 = c.acquire_permit_with(fair("f1", 1)).await.unwrap();
    // Two free: the two oldest waiters may try, in either order, and the third may not.
    c.release(&second).await.unwrap().settled().await;
    lost(c.acquire_permit_with(fair("f3", 3)).await);
    c.release(&f1).await.unwrap().settled().await;
    lost(c.acquire_permit_with(fair("f4", 4)).await);
    let f3 = c.acquire_permit_with(fair("f3", 3)).await.unwrap();
    let f2 = c.acquire_permit_with(fair("f2", 2)).await.unwrap();
    assert_ne!(f2.key(), f3.key());
    lost(c.acquire_permit_with(fair("f4", 4)).await);
    for permit in [&f2, &f3] {
        c.release(permit).await.unwrap().settled().await;
    }
    let f4 = c.acquire_permit_with(fair("f4", 4)).await.unwrap();
    c.release(&f4).await.unwrap().settled().await;
    c.quiesce().await;
    assert!(every_key(&set).await.iter().all(Vec::is_empty));
}

/// The client's fair semaphore, end to end: waiters that queued one after the other get
/// the one permit in that order, each woken when its turn comes (a release, or the
/// leave of the waiter ahead of it), not by its backoff; nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_fair_semaphore_serves_waiters_in_order() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.fair(true)).await;
    let holder = c.semaphore("jobs", 1).unwrap().acquire().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut calls = Vec::new();
    let options = LockOptions {
        retry: Some(common::slow_retry()),
        ..Default::default()
    };
    for who in ["first", "second", "third"] {
        let (jobs, order) = (c.semaphore("jobs", 1).unwrap(), order.clone());
        let options = options.clone();
        calls.push(tokio::spawn(async move {
            let permit = jobs.acquire_with(&options).await.unwrap();
            order.lock().unwrap().push(who);
            tokio::time::sleep(Duration::from_millis(200)).await;
            permit.release().await.unwrap();
        }));
        // Each call queues before the next comes.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    holder.release().await.unwrap();
    for call in calls {
        tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("each waiter gets its turn")
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["first", "second", "third"]);
    c.coordinator().quiesce().await;
    assert!(every_key(&set).await.iter().all(Vec::is_empty));
}

/// A fair waiter that dies holds its place only for its patience: the waiter behind it is
/// let in once the entry has expired on the nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_fair_waiter_holds_the_semaphores_queue_only_for_its_patience() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let [a, b] = [(); 2].map(|_| PermitAcquisition::new("jobs", 2, TTL));
    let (a, b) = (
        c.acquire_permit_with(a).await.unwrap(),
        c.acquire_permit_with(b).await.unwrap(),
    );
    let short = |waiter, ticket| PermitAcquisition {
        fair: Some(FairPlace {
            waiter,
            ticket,
            patience: Duration::from_millis(300),
            handover: None,
        }),
        ..PermitAcquisition::new("jobs", 2, TTL)
    };
    // "dead" queues first, then never comes back.
    assert!(c.acquire_permit_with(short("dead", 1)).await.is_err());
    assert!(c.acquire_permit_with(short("alive", 2)).await.is_err());
    c.release(&a).await.unwrap().settled().await;
    assert!(
        c.acquire_permit_with(short("alive", 2)).await.is_err(),
        "the dead waiter's turn, while its entry lives"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let alive = c.acquire_permit_with(short("alive", 2)).await.unwrap();
    for permit in [&alive, &b] {
        c.release(permit).await.unwrap().settled().await;
    }
    c.quiesce().await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(every_key(&set).await.iter().all(Vec::is_empty));
}

/// A fenced permit taken through the fair queue gets its token as any fenced permit does,
/// and the queue still decides whose turn it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_permit_in_the_fair_queue_gets_its_token_in_its_turn() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let fenced = |waiter, ticket| PermitAcquisition {
        fenced: true,
        ..fair(waiter, ticket)
    };
    let lost = |result: Result<Lock, Error>| match result {
        Err(Error::NoQuorum { .. }) => {}
        other => panic!("not the waiter's turn, yet {other:?}"),
    };
    let first = c.acquire_permit_with(fenced("f1", 1)).await.unwrap();
    let second = c.acquire_permit_with(fenced("f2", 2)).await.unwrap();
    let (t1, t2) = (
        first.fencing_token().expect("fenced"),
        second.fencing_token().expect("fenced"),
    );
    assert!(t2 > t1, "{t1} then {t2}");
    lost(c.acquire_permit_with(fenced("f3", 3)).await);
    lost(c.acquire_permit_with(fenced("f4", 4)).await);
    c.release(&first).await.unwrap().settled().await;
    lost(c.acquire_permit_with(fenced("f4", 4)).await);
    let third = c.acquire_permit_with(fenced("f3", 3)).await.unwrap();
    assert!(third.fencing_token().expect("fenced") > t2);
    for permit in [&second, &third] {
        c.release(permit).await.unwrap().settled().await;
    }
}

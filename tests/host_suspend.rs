//! A host suspend (a laptop's sleep, a virtual machine paused and resumed) stops the
//! monotonic clock that validity is measured on, while the nodes' clocks run on and their
//! keys expire. A holder that resumes must not see its lock as valid for the rest of its
//! validity: the suspend counts as time passed. Simulated with
//! `redlock_core::simulate_host_suspend` (feature `test-util`), which moves every validity
//! of the process: this file is its own test binary, with one test.

mod common;

use std::time::Duration;

use common::client;
use redlock_client::{HoldHealth, LostReason};
use redlock_core::simulate_host_suspend;
use redlock_testkit::NodeSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_suspend_counts_as_time_passed_for_every_validity() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.ttl(Duration::from_secs(20)).no_renewal()).await;
    let guard = c.lock("job").await.unwrap();
    let handle = guard.handle();
    let left = guard.remaining().expect("valid");
    assert!(left > Duration::from_secs(15), "{left:?}");

    // Suspended 8 s: 8 s less left, everywhere the validity shows.
    simulate_host_suspend(Duration::from_secs(8));
    let left = guard.remaining().expect("still valid");
    assert!(
        left <= Duration::from_secs(12),
        "the suspend did not count: {left:?}"
    );
    assert!(guard.is_valid() && handle.is_valid());
    let core = guard.lock();
    assert!(core.remaining().expect("still valid") <= Duration::from_secs(12));
    assert!(core.valid_until() <= tokio::time::Instant::now() + Duration::from_secs(12));
    assert_eq!(guard.health(), HoldHealth::Healthy);

    // Suspended past the validity: the lock is gone for its holder too.
    simulate_host_suspend(Duration::from_secs(15));
    assert!(!guard.is_valid(), "valid after a suspend past its validity");
    assert!(!handle.is_valid());
    assert_eq!(guard.remaining(), None);
    assert_eq!(handle.remaining(), None);
    assert!(!core.is_valid() && core.remaining().is_none());
    assert!(guard.valid_until() <= tokio::time::Instant::now());
    assert_eq!(guard.health(), HoldHealth::Lost(LostReason::Expired));
    let lost = tokio::time::timeout(Duration::from_secs(1), guard.lost()).await;
    assert_eq!(lost.ok(), Some(LostReason::Expired));

    // A lock taken after the suspend keeps its whole validity.
    let _ = guard.release().await;
    let again = c.lock("job").await.unwrap();
    let left = again.remaining().expect("valid");
    assert!(left > Duration::from_secs(15), "{left:?}");
    again.release().await.unwrap();

    // An extension after the resume, while the key is still the holder's on the nodes (the
    // suspend was shorter than the keys' TTL there), gives the lock a validity that counts
    // from the extension: a suspend before a validity began does not shorten it.
    let guard = c.lock("ext").await.unwrap();
    simulate_host_suspend(Duration::from_secs(12));
    let left = guard.remaining().expect("still valid");
    assert!(left <= Duration::from_secs(8), "{left:?}");
    guard.extend(None).await.unwrap();
    let left = guard.remaining().expect("extended");
    assert!(left > Duration::from_secs(15), "{left:?}");
    guard.release().await.unwrap();

    // Watchers already waiting when the host is suspended: a sleep until the validity's end
    // as it stood, on the monotonic clock, fired up to the whole suspend late, and a holder
    // racing its work against `lost()` worked on past its validity.
    let guard = c.lock("watched").await.unwrap();
    let lost = tokio::spawn(guard.lost());
    let suspended = tokio::spawn(guard.handle().suspended());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!lost.is_finished() && !suspended.is_finished());
    simulate_host_suspend(Duration::from_secs(25));
    let lost = tokio::time::timeout(Duration::from_secs(3), lost).await;
    assert_eq!(
        lost.ok().map(Result::unwrap),
        Some(LostReason::Expired),
        "lost() did not complete soon after a suspend past the validity"
    );
    let suspended = tokio::time::timeout(Duration::from_secs(3), suspended).await;
    assert_eq!(
        suspended.ok().map(Result::unwrap),
        Some(HoldHealth::Lost(LostReason::Expired)),
        "suspended() did not complete soon after a suspend past the validity"
    );
    let _ = guard.release().await;
    c.shutdown().await;

    // Renewal plans on the clock that counts suspend too: a renewal that fell due while
    // the host slept runs right after the resume, while the nodes still hold the keys. It
    // ran at the monotonic instant it had planned, after the validity (suspend counted) had
    // run out, and the lock was lost with every node healthy. TTL 20 s, renewed every
    // 6.7 s; suspended 15 s, so 5 s of validity are left and the planned renewal is 6.7 s
    // away on the monotonic clock.
    let renewing = client(&set, |b| b.ttl(Duration::from_secs(20))).await;
    let guard = renewing.lock("renewed").await.unwrap();
    // The scheduler plans the renewal when it receives the lock: before the suspend.
    tokio::time::sleep(Duration::from_millis(300)).await;
    simulate_host_suspend(Duration::from_secs(15));
    let renewed = common::eventually(Duration::from_secs(3), || async {
        guard
            .remaining()
            .is_some_and(|left| left > Duration::from_secs(15))
    })
    .await;
    assert!(
        renewed,
        "no renewal soon after the resume: {:?}, {:?}",
        guard.remaining(),
        guard.health()
    );
    assert_eq!(guard.health(), HoldHealth::Healthy);
    guard.release().await.unwrap();
    renewing.shutdown().await;

    // A suspend during a round counts too: a round that it outlasted is not won (the core
    // used to return a lock already past its validity), and its keys are rolled back.
    let links = common::linked(&set).await;
    let core = common::coordinator_at(links.urls(0), Duration::from_secs(2)).await;
    links.set_client(
        0,
        redlock_testkit::LinkFault::Latency {
            to_server: Duration::ZERO,
            to_client: Duration::from_millis(300),
        },
    );
    let round = core.acquire("redlock:round", Duration::from_secs(3));
    let suspend = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        simulate_host_suspend(Duration::from_secs(5));
    };
    let (won, ()) = tokio::join!(round, suspend);
    match won {
        Err(redlock_core::Error::ValidityExhausted { .. }) => {}
        other => panic!("a round outlasted by a suspend: {other:?}"),
    }
    links.heal_all();
    let gone = common::eventually(Duration::from_secs(5), || async {
        set.nodes_holding("redlock:round").await.is_empty()
    })
    .await;
    assert!(gone, "the round's keys were not rolled back");
    core.close().await;
}

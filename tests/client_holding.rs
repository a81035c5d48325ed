//! Holding with the client: renewal, the lost signal, with_lock, dropped guards, batching.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{client, eventually};
use redlock_client::{Error, LockOptions, LostReason};
use redlock_core::RoundKind;
use redlock_testkit::NodeSet;

const TTL: Duration = Duration::from_millis(900);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_lock_for_several_ttls() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.ttl(TTL)).await;
    let guard = c.lock("renewed").await.unwrap();
    let first_deadline = guard.valid_until();
    tokio::time::sleep(TTL * 4).await;
    assert!(guard.is_valid(), "renewal should have kept the lock valid");
    assert!(guard.valid_until() > first_deadline + TTL * 2);
    assert_eq!(set.nodes_holding("redlock:renewed").await.len(), 3);
    // Without renewal the same wait loses it: the check above can fail.
    let plain = c
        .lock_with(
            "plain",
            &LockOptions {
                renew: Some(false),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    tokio::time::sleep(TTL * 2).await;
    assert!(!plain.is_valid());
    assert_eq!(plain.lost().await, LostReason::Expired);
    guard.release().await.unwrap();
}

/// Renewal moves the lock's validity on but keeps the report of its acquisition (a held lock
/// keeps no report per renewal tick); a manual `extend` replaces it. Before, every renewal
/// replaced the lock and its report, so ten thousand held locks re-allocated their reports
/// on every tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_moves_the_validity_on_and_keeps_the_acquisitions_report() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.ttl(TTL)).await;
    let guard = c.lock("renewed-report").await.unwrap();
    let acquired = guard.lock();
    assert_eq!(acquired.report().kind, RoundKind::Acquire);
    let renewed = eventually(TTL * 3, || async {
        guard.lock().valid_until() > acquired.valid_until()
    })
    .await;
    assert!(renewed, "not renewed within three TTLs");
    let lock = guard.lock();
    assert_eq!(lock.report().kind, RoundKind::Acquire, "{}", lock.report());
    assert_eq!(lock.token(), acquired.token());
    assert!(guard.valid_until() >= lock.valid_until());

    guard.extend(None).await.unwrap();
    assert_eq!(guard.lock().report().kind, RoundKind::Extend);
    guard.release().await.unwrap();
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_key_on_a_majority_fires_the_lost_signal_from_renewal() {
    let set = NodeSet::start(5).await.unwrap();
    // A long TTL: had the signal come from the validity running out instead of from the
    // renewal being refused, the reason would be Expired.
    let c = client(&set, |b| {
        b.ttl(Duration::from_secs(30))
            .renew_after(Duration::from_millis(300))
    })
    .await;
    let guard = c.lock("doomed").await.unwrap();
    for i in 0..3 {
        set.node(i).del("redlock:doomed").await.unwrap();
    }
    let reason = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("lost signal fired");
    assert_eq!(reason, LostReason::Refused);
    assert!(!guard.is_valid());
    assert!(guard.remaining().is_none());
    // The lock the guard hands out says so too: code given `guard.lock()` must not go on
    // writing while a majority says the key is no longer ours (it used to keep its 30 s).
    let now = tokio::time::Instant::now();
    assert!(!guard.lock().is_valid(), "{:?}", guard.lock().remaining());
    assert!(guard.valid_until() <= now);
    assert!(guard.handle().valid_until() <= now);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_cancels_its_closure_when_the_lock_is_lost() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| {
        b.ttl(Duration::from_secs(30))
            .renew_after(Duration::from_millis(200))
    })
    .await;
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = dropped.clone();
    let (result, _) = tokio::join!(
        c.with_lock("scoped", |handle| async move {
            struct OnDrop(Arc<AtomicBool>);
            impl Drop for OnDrop {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::SeqCst);
                }
            }
            let _on_drop = OnDrop(flag);
            assert!(handle.is_valid());
            // Works "forever": only losing the lock ends it.
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }),
        async {
            // Once the closure is running, someone deletes the key on a majority.
            tokio::time::sleep(Duration::from_millis(300)).await;
            for i in 0..2 {
                set.node(i).del("redlock:scoped").await.unwrap();
            }
        }
    );
    let result: Result<(), Error> = result;
    assert!(
        matches!(
            result,
            Err(Error::LockLost {
                reason: LostReason::Refused,
                ..
            })
        ),
        "{result:?}"
    );
    assert!(
        dropped.load(Ordering::SeqCst),
        "the closure's future was dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_returns_the_value_and_releases_also_on_panic() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    let value = c
        .with_lock("scoped-ok", |handle| async move { handle.is_valid() })
        .await
        .unwrap();
    assert!(value);
    // The release returns at the quorum; let the last node finish too.
    c.coordinator().quiesce().await;
    assert!(set.nodes_holding("redlock:scoped-ok").await.is_empty());

    let c2 = c.clone();
    let panicked = tokio::spawn(async move {
        c2.with_lock("scoped-panic", |_| async { panic!("work failed") })
            .await
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    c.coordinator().quiesce().await;
    assert!(
        set.nodes_holding("redlock:scoped-panic").await.is_empty(),
        "released despite the panic"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_is_released_in_the_background() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.ttl(Duration::from_secs(30))).await;
    let guard = c.lock("forgotten").await.unwrap();
    // Won at a quorum: wait for the last node's answer before reading the nodes.
    guard.lock().report().settled().await;
    assert_eq!(set.nodes_holding("redlock:forgotten").await.len(), 3);
    drop(guard);
    // A 30 s TTL: only the background release can free it within this bound.
    let freed = eventually(Duration::from_secs(5), || async {
        set.nodes_holding("redlock:forgotten").await.is_empty()
    })
    .await;
    assert!(freed, "the dropped guard's key is still there");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_of_many_locks_share_one_command_per_node() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| {
        b.ttl(Duration::from_secs(3))
            .renew_after(Duration::from_millis(500))
    })
    .await;
    let mut guards = Vec::new();
    for i in 0..40 {
        guards.push(c.lock(&format!("many-{i}")).await.unwrap());
    }
    let before = set.node(0).command_calls("evalsha").await.unwrap();
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let renewals = set.node(0).command_calls("evalsha").await.unwrap() - before;
    // About four renewal ticks in that time: one script call per tick for all 40 locks.
    // One command per lock would be about 160.
    assert!(renewals >= 1, "nothing was renewed");
    assert!(
        renewals < 40,
        "{renewals} extension calls for 40 locks: renewals are not batched"
    );
    assert!(guards.iter().all(|g| g.is_valid()));
    for g in guards {
        g.release().await.unwrap();
    }
}

/// A client through fault links whose locks are renewed as late as the configuration
/// allows. With [`slow_rounds`], every round takes about 250 ms. TTL 4 s, drift allowance
/// 42 ms, node timeout 400 ms: a renewal must start by 3,558 ms after `t0`; 3,550 ms leaves
/// 408 ms for it, more than its round (margin 150 ms) but less than two rounds.
async fn renewing_as_late_as_allowed() -> (NodeSet, redlock_testkit::Links, redlock_client::Redlock)
{
    use redlock_client::{LockConfig, RenewalPolicy};
    let set = NodeSet::start(3).await.unwrap();
    let links = common::linked(&set).await;
    let config = LockConfig::builder()
        .nodes(links.urls(0))
        .ttl(Duration::from_secs(4))
        .node_timeout(Duration::from_millis(400))
        .renewal(RenewalPolicy {
            renew_after: Some(Duration::from_millis(3550)),
            ..Default::default()
        })
        .build()
        .expect("renew_after is within the rule");
    let c = redlock_client::Redlock::connect(config).await.unwrap();
    (set, links, c)
}

/// 125 ms each way on every link of client 0.
fn slow_rounds(links: &redlock_testkit::Links) {
    links.set_client(
        0,
        redlock_testkit::LinkFault::Latency {
            to_server: Duration::from_millis(125),
            to_client: Duration::from_millis(125),
        },
    );
}

/// A lock renewed as late as the configuration allows (`renew_after` just under the TTL
/// minus the drift allowance minus a node timeout) stays held over slow links: that rule
/// counts from the acquisition's `t0`, and so does the renewal's schedule now. It used to
/// count from the round's answer, a round trip later, and the renewal, another round trip
/// long, ended after the validity: the lock was lost with every node healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_as_late_as_allowed_keeps_a_lock_over_slow_links() {
    use redlock_client::HoldHealth;
    let (set, links, c) = renewing_as_late_as_allowed().await;
    // Slow from here on (a connection's set-up takes several round trips).
    slow_rounds(&links);
    let guard = c.lock("late-renewal").await.unwrap();
    let first_validity = guard.valid_until();
    // Watches the validity (a renewal that comes after it ran out must not count).
    let lost = tokio::spawn(guard.lost());
    // Past the first validity's end, and after the renewal.
    tokio::time::sleep_until(first_validity + Duration::from_millis(300)).await;
    assert!(!lost.is_finished(), "the lock lapsed before its renewal");
    assert!(
        guard.valid_until() > first_validity,
        "not renewed: {:?}",
        guard.health()
    );
    assert!(guard.is_valid(), "{:?}", guard.health());
    assert!(matches!(guard.health(), HoldHealth::Healthy));
    links.heal_all();
    guard.release().await.unwrap();
    assert!(set.nodes_holding("redlock:late-renewal").await.is_empty());
}

/// [`a_renewal_as_late_as_allowed_keeps_a_lock_over_slow_links`] for 257 locks falling due
/// together: a tick renews 128 locks per call, and its three calls used to go one after
/// another, the second starting a round late, after the rule's room for one round: its
/// locks were lost with every node healthy. The calls of a tick now go together, the most
/// urgent locks first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_locks_renewed_as_late_as_allowed_are_all_kept_over_slow_links() {
    let (_set, links, c) = renewing_as_late_as_allowed().await;
    // Acquired together (grouped rounds), so they fall due together.
    let keys: Vec<String> = (0..257).map(|i| format!("many-late:{i}")).collect();
    let guards: Vec<_> = futures::future::join_all(keys.iter().map(|k| c.lock(k)))
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    slow_rounds(&links);
    let last_validity = guards.iter().map(|g| g.valid_until()).max().unwrap();
    tokio::time::sleep_until(last_validity + Duration::from_millis(300)).await;
    let lapsed = guards.iter().filter(|g| !g.is_valid()).count();
    assert_eq!(
        lapsed, 0,
        "{lapsed} of 257 locks lapsed before their renewal"
    );
    links.heal_all();
    for guard in guards {
        guard.release().await.unwrap();
    }
    c.shutdown().await;
}

/// A lock whose validity ran out while its renewals failed stays lost, even when nobody
/// awaited `lost()` and the nodes come back while they still hold the key: it used to be
/// renewed again then, and `is_valid()` went from false back to true. It is no longer
/// renewed either (a renewal every quarter interval for ever while the nodes stayed away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_that_ran_out_of_validity_stays_lost_when_the_nodes_come_back() {
    use redlock_client::HoldHealth;
    use redlock_testkit::LinkFault;
    let set = NodeSet::start(3).await.unwrap();
    let links = common::linked(&set).await;
    // TTL 2 s with a drift allowance of 602 ms: the holder's validity ends about 600 ms
    // before the keys expire on the nodes, the window in which a late renewal still finds
    // them. The default renewal interval is 667 ms, retried every 167 ms once failing.
    let c = redlock_client::Redlock::connect(
        redlock_client::LockConfig::builder()
            .nodes(links.urls(0))
            .ttl(Duration::from_secs(2))
            .drift_factor(0.3)
            .node_timeout(Duration::from_millis(200))
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    let guard = c.lock("ran-out").await.unwrap();
    links.set_client(0, LinkFault::Blackhole);
    let valid_until = guard.valid_until();
    tokio::time::sleep_until(valid_until + Duration::from_millis(150)).await;
    assert!(!guard.is_valid());
    links.heal_all();
    // Long enough for a few renewal retries, all before the keys' own TTL ends.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!guard.is_valid(), "valid again after it ran out");
    assert_eq!(guard.health(), HoldHealth::Lost(LostReason::Expired));
    guard.release().await.ok();
    assert!(
        eventually(Duration::from_secs(5), || async {
            set.nodes_holding("redlock:ran-out").await.is_empty()
        })
        .await
    );
}

/// `max_hold` caps the hold counted from the acquisition, not from the call: a lock won
/// after a long wait is still renewed (the wait used to use up the cap: never renewed, it
/// expired after one TTL), and no renewal makes it valid past the cap (the last one used to
/// add a whole TTL beyond it). Renewal then stops, and the health says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_caps_the_hold_from_the_acquisition() {
    use redlock_client::HoldHealth;
    let set = NodeSet::start(3).await.unwrap();
    let max_hold = Duration::from_millis(1500);
    let c = client(&set, |b| b.ttl(Duration::from_secs(1)).max_hold(max_hold)).await;
    // Another holder keeps the key for 1.2 s: most of the cap, were it counted from the call.
    for node in set.iter() {
        node.set("redlock:capped", "someone-else", Some(1200))
            .await
            .unwrap();
    }
    let guard = c.lock("capped").await.unwrap();
    let acquired = tokio::time::Instant::now();
    let lost = tokio::spawn(guard.lost());
    tokio::time::sleep_until(acquired + Duration::from_millis(1200)).await;
    assert!(
        guard.is_valid(),
        "not renewed within max_hold: {:?}",
        guard.health()
    );
    assert!(
        guard.valid_until() <= acquired + max_hold,
        "renewed past max_hold: valid {:?} after the acquisition",
        guard.valid_until() - acquired
    );
    let reason = tokio::time::timeout(Duration::from_secs(5), lost)
        .await
        .expect("the lock ends at the cap")
        .unwrap();
    assert_eq!(reason, LostReason::Expired);
    assert_eq!(guard.health(), HoldHealth::Lost(LostReason::Expired));
    drop(guard);
}

/// An extension of a lock whose validity already ran out (a drift allowance of half the
/// TTL: the keys outlive the validity by that much) wins on the nodes, but the lock stays
/// lost: `extend` says so, and neither the guard nor its lock turns valid again. It used
/// to return `Ok(())` while `is_valid()` was false, and `guard.lock().is_valid()` true.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_after_the_validity_ran_out_leaves_the_lock_lost() {
    let set = NodeSet::start(3).await.unwrap();
    let ttl = Duration::from_secs(2);
    let c = client(&set, |b| b.ttl(ttl).drift_factor(0.5).no_renewal()).await;
    let guard = c.lock("ran-out").await.unwrap();
    // The validity ends at about 1 s (2 s less the 1 s drift allowance), the keys at 2 s.
    tokio::time::sleep_until(guard.valid_until() + Duration::from_millis(100)).await;
    assert_eq!(set.nodes_holding("redlock:ran-out").await.len(), 3);
    let err = guard.extend(None).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LockLost {
                reason: LostReason::Expired,
                ..
            }
        ),
        "{err}"
    );
    assert!(!guard.is_valid());
    assert!(
        !guard.lock().is_valid(),
        "the guard's lock took the extension on"
    );
    guard.release().await.unwrap();
    assert!(set.nodes_holding("redlock:ran-out").await.is_empty());
    c.shutdown().await;
}

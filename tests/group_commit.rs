//! Group commit: plain acquisitions started while one is in flight share the next round's
//! command per node, each still decided on its own, against real redis-server nodes.

mod common;

use std::time::Duration;

use futures::future::join_all;
use futures::FutureExt;
use redlock_core::{Error, NodeOutcome};
use redlock_testkit::NodeSet;

const TTL: Duration = Duration::from_secs(10);

/// The script calls every node of `set` has run (`EVALSHA`: no other script runs in these
/// tests before the count). Commands a script runs count in `INFO commandstats` too, so a
/// grouped round shows as one `EVALSHA` and its `SET`s.
async fn script_calls(set: &NodeSet) -> Vec<u64> {
    let mut counts = Vec::new();
    for node in set.iter() {
        counts.push(node.command_calls("evalsha").await.unwrap());
    }
    counts
}

/// The script calls (`EVALSHA`) and `DELIFEQ`s every node of `set` has run: a release
/// without notifications is `DELIFEQ` on a server that has it, else a script call.
async fn release_calls(set: &NodeSet) -> Vec<u64> {
    let mut counts = Vec::new();
    for node in set.iter() {
        let scripts = node.command_calls("evalsha").await.unwrap();
        counts.push(scripts + node.command_calls("delifeq").await.unwrap());
    }
    counts
}

#[tokio::test]
async fn concurrent_acquisitions_of_distinct_keys_share_one_command_per_node() {
    let set = NodeSet::start(3).await.unwrap();
    let core = common::coordinator(&set, Duration::from_millis(500)).await;
    let before = script_calls(&set).await;
    let keys: Vec<String> = (0..64).map(|i| format!("group:{i}")).collect();
    let locks = join_all(keys.iter().map(|key| core.acquire(key, TTL))).await;
    let after = script_calls(&set).await;

    for (key, lock) in keys.iter().zip(&locks) {
        let lock = lock.as_ref().unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(lock.key(), key.as_str());
        // Each lock gets its own validity, within what its TTL allows.
        let left = lock.remaining().expect("valid");
        assert!(left <= TTL && left > TTL / 2, "{key}: {left:?}");
        let report = lock.report();
        assert!(report.accepted >= report.quorum, "{report}");
        assert!(report
            .nodes
            .iter()
            .all(|n| matches!(n.outcome, NodeOutcome::Acquired | NodeOutcome::Pending)));
    }
    // The first acquisition leads with SET NX; the 63 started while it was in flight go
    // out together: one script call per node (at most 128 locks a call; two if the lead
    // round was decided before all 63 had started). Without grouping, every node would
    // have run 64 SETs and no script.
    for (node, (before, after)) in before.iter().zip(&after).enumerate() {
        let calls = after - before;
        assert!(
            (1..=2).contains(&calls),
            "node {node} ran {calls} script calls for 63 grouped locks"
        );
    }
    // Every key holds its own token on every node, and each release removes exactly it.
    for (key, lock) in keys.iter().zip(&locks) {
        let lock = lock.as_ref().unwrap();
        for node in set.iter() {
            let value = node.get(key).await.unwrap();
            assert_eq!(value.as_deref(), Some(lock.token().as_str()), "{key}");
        }
    }
    for lock in locks.iter().flatten() {
        core.release(lock).await.unwrap();
    }
    core.quiesce().await;
    for node in set.iter() {
        assert!(node.keys("group:*").await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn one_key_wanted_by_many_in_one_group_has_one_winner() {
    let set = NodeSet::start(3).await.unwrap();
    let core = common::coordinator(&set, Duration::from_millis(500)).await;
    let results = join_all((0..20).map(|_| core.acquire("group:contended", TTL))).await;
    let won: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(won.len(), 1, "{results:?}");
    for lost in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(matches!(lost, Error::NoQuorum { .. }), "{lost}");
    }
    core.release(won[0]).await.unwrap();
    core.quiesce().await;
    for node in set.iter() {
        assert!(!node.exists("group:contended").await.unwrap());
    }
}

#[tokio::test]
async fn grouped_acquisitions_whose_callers_give_up_leave_no_key() {
    let set = NodeSet::start(3).await.unwrap();
    let core = common::coordinator(&set, Duration::from_millis(500)).await;
    let keys: Vec<String> = (0..40).map(|i| format!("group:dropped:{i}")).collect();
    // Every second caller gives up at once: after its first poll, while it waits for the
    // group or its grouped round is in flight. (Polled once and dropped: a zero
    // `tokio::time::timeout` fires only at the timer's next millisecond tick, by which time
    // the call may have won.)
    let calls = keys.iter().enumerate().map(|(i, key)| {
        let core = core.clone();
        async move {
            let acquire = core.acquire(key, TTL);
            if i % 2 == 1 {
                let gave_up = acquire.now_or_never();
                assert!(
                    gave_up.is_none(),
                    "a call cut at once cannot have finished: {gave_up:?}"
                );
                None
            } else {
                Some(acquire.await.expect("kept calls win"))
            }
        }
    });
    let kept: Vec<_> = join_all(calls).await.into_iter().flatten().collect();
    assert_eq!(kept.len(), 20);
    core.quiesce().await;
    for (i, key) in keys.iter().enumerate() {
        for node in set.iter() {
            assert_eq!(node.exists(key).await.unwrap(), i % 2 == 0, "{key}");
        }
    }
    for lock in &kept {
        core.release(lock).await.unwrap();
    }
}

#[tokio::test]
async fn concurrent_releases_share_script_calls_and_each_deletes_only_its_own_key() {
    let set = NodeSet::start(3).await.unwrap();
    let core = common::coordinator(&set, Duration::from_millis(500)).await;
    let mut locks = Vec::new();
    for i in 0..64 {
        locks.push(
            core.acquire(&format!("group:release:{i}"), TTL)
                .await
                .unwrap(),
        );
    }
    // A key held by someone else, released in the same group with a token that is not its
    // own: it must stay.
    for node in set.iter() {
        node.set("group:release:other", "someone-else", Some(60_000))
            .await
            .unwrap();
    }
    let before = script_calls(&set).await;
    let stale = redlock_core::Token::from_string("stale-token".to_string());
    let (released, other) = futures::join!(
        join_all(locks.iter().map(|lock| core.release(lock))),
        core.release_token("group:release:other", &stale)
    );
    let after = script_calls(&set).await;
    for report in released {
        let report = report.expect("released at a quorum");
        assert!(report.accepted >= report.quorum, "{report}");
    }
    let other = other.expect("a release of a key not ours still decides");
    assert!(other
        .nodes
        .iter()
        .all(|n| matches!(n.outcome, NodeOutcome::NotHeld | NodeOutcome::Pending)));
    // The first release leads with its own script call; the other 64 go out together (at
    // most 128 a call). Without grouping every node would have run 65 script calls.
    for (node, (before, after)) in before.iter().zip(&after).enumerate() {
        let calls = after - before;
        assert!(
            calls <= 3,
            "node {node} ran {calls} script calls for 65 releases"
        );
    }
    core.quiesce().await;
    for node in set.iter() {
        assert_eq!(
            node.keys("group:release:*").await.unwrap(),
            vec!["group:release:other".to_string()]
        );
    }
}

/// Fenced locks' waiters queue as plain ones' do, so their releases are the same script
/// and go out together as well.
#[tokio::test]
async fn concurrent_releases_of_fenced_locks_share_script_calls() {
    let set = NodeSet::start(3).await.unwrap();
    let core = common::coordinator(&set, Duration::from_millis(500)).await;
    let mut locks = Vec::new();
    for i in 0..16 {
        let key = format!("group:fenced:{i}");
        let keys = [key.as_str()];
        let fenced = redlock_core::Acquisition {
            fenced: true,
            ..redlock_core::Acquisition::new(&keys, TTL)
        };
        let lock = core.acquire_with(fenced).await.unwrap();
        assert!(lock.fencing_token().is_some());
        locks.push(lock);
    }
    let before = script_calls(&set).await;
    for report in join_all(locks.iter().map(|lock| core.release(lock))).await {
        let report = report.expect("released at a quorum");
        assert!(report.accepted >= report.quorum, "{report}");
    }
    let after = script_calls(&set).await;
    // The first release leads alone, the other 15 go out together: 16 calls each before.
    for (node, (before, after)) in before.iter().zip(&after).enumerate() {
        let calls = after - before;
        assert!(
            calls <= 3,
            "node {node} ran {calls} script calls for 16 releases"
        );
    }
    core.quiesce().await;
    for node in set.iter() {
        assert!(node.keys("group:fenced:*").await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn with_group_commit_off_every_acquisition_is_a_set_of_its_own() {
    let set = NodeSet::start(3).await.unwrap();
    let core = redlock_core::Coordinator::connect(redlock_core::Config {
        nodes: set.urls(),
        node_timeout: Duration::from_millis(500),
        group_commit: false,
        ..Default::default()
    })
    .await
    .unwrap();
    let before = release_calls(&set).await;
    let keys: Vec<String> = (0..16).map(|i| format!("group:off:{i}")).collect();
    let locks = join_all(keys.iter().map(|key| core.acquire(key, TTL))).await;
    let released = join_all(locks.iter().flatten().map(|lock| core.release(lock))).await;
    assert_eq!(released.iter().filter(|r| r.is_ok()).count(), 16);
    let after = release_calls(&set).await;
    // 16 SETs and 16 releases per node, none grouped.
    assert_eq!(
        after
            .iter()
            .zip(&before)
            .map(|(a, b)| a - b)
            .collect::<Vec<_>>(),
        vec![16; 3]
    );
}

/// The task that sends a group's waves ends with its runtime (a client kept and used
/// beyond the runtime that connected it). The group is then freed: a later acquisition
/// returns (an error here, its connections went with that runtime) instead of joining a
/// group that stayed busy with nobody to hand on to, and waiting for ever.
#[test]
fn a_group_whose_wave_died_with_its_runtime_holds_up_no_later_call() {
    use redlock_testkit::LinkFault;
    let outer = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (_set, links) = outer.block_on(async {
        let set = NodeSet::start(3).await.unwrap();
        let links = common::linked(&set).await;
        (set, links)
    });
    let inner = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let core = inner.block_on(common::coordinator_at(
        links.urls(0),
        Duration::from_secs(5),
    ));
    // Every round takes 600 ms from here on: the lead's round, then its wave's.
    links.set_client(
        0,
        LinkFault::Latency {
            to_server: Duration::from_millis(300),
            to_client: Duration::from_millis(300),
        },
    );
    for i in 0..8 {
        let core = core.clone();
        inner.spawn(async move {
            let _ = core.acquire(&format!("died:{i}"), TTL).await;
        });
    }
    // The lead's round is decided at about 600 ms; the wave is in flight until 1,200 ms.
    std::thread::sleep(Duration::from_millis(900));
    inner.shutdown_background();
    let later = outer.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), core.acquire("later", TTL)).await
    });
    assert!(
        later.is_ok(),
        "a later acquisition waited for a wave that is gone"
    );
}

/// A leader whose future is kept but not polled (pinned in a `select!` loop busy
/// elsewhere) no longer holds back the calls that wait for its round: each waits at most a
/// node timeout (and a margin), then sends a round of its own. They used to wait for ever:
/// only the leader's future decides its round and hands the group on.
#[tokio::test]
async fn an_unpolled_leader_holds_back_no_acquisition_or_release() {
    let set = NodeSet::start(3).await.unwrap();
    let core = common::coordinator(&set, Duration::from_millis(500)).await;
    let held = core.acquire("group:held", TTL).await.unwrap();

    let leader = core.acquire("group:leader", TTL);
    let mut leader = std::pin::pin!(leader);
    assert!(futures::poll!(leader.as_mut()).is_pending());
    let waiter = tokio::time::timeout(Duration::from_secs(3), core.acquire("group:b", TTL))
        .await
        .expect("the acquisition waited for an unpolled leader")
        .expect("the acquisition's own round wins");

    let release = core.release(&waiter);
    let mut release = std::pin::pin!(release);
    assert!(futures::poll!(release.as_mut()).is_pending());
    tokio::time::timeout(Duration::from_secs(3), core.release(&held))
        .await
        .expect("the release waited for an unpolled leader")
        .expect("the release's own round wins");
    assert!(set.nodes_holding("group:held").await.is_empty());

    // The leaders, polled again, finish as usual.
    let lead = leader.await.unwrap();
    release.await.unwrap();
    core.release(&lead).await.unwrap();
    core.quiesce().await;
    for key in ["group:held", "group:leader", "group:b"] {
        assert!(set.nodes_holding(key).await.is_empty(), "{key} left");
    }
}

/// A grouped round lost on every lock, with one node holding its replies, rolls the locks
/// back on that node together, not one after another: each rollback there waits out its
/// tries (three node timeouts and pauses), so 63 in a row kept `quiesce` (documented to wait
/// eight node timeouts and a little) busy for about 20 s, and a slow node's keys stayed
/// that much longer. The warning for a rollback that did not get through names its key:
/// a grouped round's span says only how many locks it carries.
#[tokio::test]
async fn a_lost_group_rolls_back_on_a_silent_node_at_once_and_names_each_key() {
    use redlock_testkit::LinkFault;
    use tracing_subscriber::filter::LevelFilter;

    let (logs, _capture) = common::logs::capture(LevelFilter::WARN);
    let set = NodeSet::start(3).await.unwrap();
    let links = common::linked(&set).await;
    let node_timeout = Duration::from_millis(100);
    let core = common::coordinator_at(links.urls(0), node_timeout).await;
    let keys: Vec<String> = (0..64).map(|i| format!("group:silent:{i}")).collect();
    // Node 1 holds every key for someone else; node 2 answers nothing: every lock is lost,
    // and its key set on node 0 and perhaps on node 2.
    for key in &keys {
        set.node(1).set(key, "someone-else", None).await.unwrap();
    }
    links.link(0, 2).set(LinkFault::HoldReplies);
    let results = join_all(keys.iter().map(|key| core.acquire(key, TTL))).await;
    for (key, result) in keys.iter().zip(&results) {
        assert!(
            matches!(result, Err(Error::NoQuorum { .. })),
            "{key}: {result:?}"
        );
    }
    let quiet = tokio::time::timeout(Duration::from_secs(5), core.quiesce()).await;
    assert!(
        quiet.is_ok(),
        "the rollbacks on the silent node ran one after another"
    );
    links.heal_all();
    for key in &keys {
        assert!(
            !set.node(0).exists(key).await.unwrap(),
            "{key} left on node 0"
        );
    }
    let text = logs.text();
    for key in &keys {
        let named = format!("key={key} ");
        assert!(
            text.lines()
                .any(|l| l.contains("rollback on an unresponsive node") && l.contains(&named)),
            "no warning names {key}:\n{text}"
        );
    }
}

/// Each lock of a grouped round goes to its caller as soon as its own quorum is in: a
/// contended key in the batch whose decision needs a silent node's answer (one node yes,
/// one no, the third silent) used to hold every other lock of its batch up until the node
/// timeout, and take that much of their validity (or all of it, for a TTL not much longer
/// than the node timeout). Here the contended call is the batch's first, so without early
/// answers it was answered first.
#[tokio::test]
async fn a_grouped_lock_is_answered_at_its_own_quorum_not_at_its_batchs_slowest() {
    use futures::stream::{FuturesUnordered, StreamExt};
    use redlock_testkit::LinkFault;

    let set = NodeSet::start(3).await.unwrap();
    let links = common::linked(&set).await;
    let node_timeout = Duration::from_millis(500);
    let core = common::coordinator_at(links.urls(0), node_timeout).await;
    set.node(1)
        .set("group:hot", "someone-else", None)
        .await
        .unwrap();
    links.link(0, 2).set(LinkFault::HoldReplies);
    // The first call leads alone; the rest, started while it is in flight, go out together.
    let keys: Vec<String> = std::iter::once("group:lead".to_string())
        .chain(std::iter::once("group:hot".to_string()))
        .chain((0..20).map(|i| format!("group:cold:{i}")))
        .collect();
    let mut calls: FuturesUnordered<_> = keys
        .iter()
        .map(|key| {
            let core = core.clone();
            async move { (key.clone(), core.acquire(key, TTL).await) }
        })
        .collect();
    let mut order = Vec::new();
    let mut locks = Vec::new();
    while let Some((key, result)) = calls.next().await {
        match result {
            Ok(lock) => locks.push(lock),
            Err(e) => assert_eq!(key, "group:hot", "{e}"),
        }
        order.push(key);
    }
    assert_eq!(locks.len(), 21, "{order:?}");
    assert_eq!(
        order.last().map(String::as_str),
        Some("group:hot"),
        "{order:?}"
    );
    links.heal_all();
    for lock in &locks {
        core.release(lock).await.unwrap();
    }
    core.quiesce().await;
    for node in set.iter() {
        assert!(node.keys("group:cold:*").await.unwrap().is_empty());
    }
}

//! A whole Redis Cluster as one quorum member (`redis-cluster://`), beside single servers:
//! every lock path against real cluster processes.

mod common;

use std::time::Duration;

use common::coordinator_at;
use redlock_client::{Error, LockOptions, Owner, Redlock};
use redlock_core::{ArgumentError, HealthProblem, NodeOutcome};
use redlock_testkit::{ClusterSet, Failover, NodeSet};

const TTL: Duration = Duration::from_secs(10);
const NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// Keys in every master's slots of a three-master cluster.
const KEYS: [&str; 6] = ["a", "b", "c", "job:1", "job:2", "{tenant}:job"];

/// Two clusters of three masters and one single server: a quorum of two of three members.
async fn members() -> (ClusterSet, ClusterSet, NodeSet) {
    let (one, two, single) = tokio::join!(
        ClusterSet::start(3),
        ClusterSet::start(3),
        NodeSet::start(1)
    );
    (one.unwrap(), two.unwrap(), single.unwrap())
}

fn urls(one: &ClusterSet, two: &ClusterSet, single: &NodeSet) -> Vec<String> {
    vec![one.url(), two.url(), single.urls().remove(0)]
}

/// Checks that `keys` fall on every master of `cluster` (of three), as the tests of locks
/// over several slots need.
fn on_every_master(cluster: &ClusterSet, keys: &[&str]) {
    let masters: std::collections::BTreeSet<u16> =
        keys.iter().map(|k| cluster.master_of(k).port()).collect();
    assert_eq!(masters.len(), 3, "the test keys must fall on every master");
}

/// Checks that every node acquired `lock` once its round settled, and that each of `keys`
/// holds its token on the master of its slot in each cluster.
async fn held_everywhere(lock: &redlock_core::Lock, keys: &[&str], clusters: [&ClusterSet; 2]) {
    let settled = lock.report().settled().await;
    assert!(
        settled
            .nodes
            .iter()
            .all(|n| n.outcome == NodeOutcome::Acquired),
        "{settled}"
    );
    for key in keys {
        for cluster in clusters {
            assert_eq!(
                cluster.master_of(key).get(key).await.unwrap().as_deref(),
                Some(lock.token().as_str()),
                "{key}"
            );
        }
    }
}

/// Releases `held` (the locks of `keys`, in order) all at once, waits until every node has
/// settled, and checks that no key is left on any member.
async fn release_all_leaving_nothing(
    c: &redlock_core::Coordinator,
    keys: &[String],
    held: &[redlock_core::Lock],
    (one, two, single): (&ClusterSet, &ClusterSet, &NodeSet),
) {
    let released = futures::future::join_all(held.iter().map(|lock| c.release(lock))).await;
    for (key, report) in keys.iter().zip(released) {
        report
            .unwrap_or_else(|e| panic!("{key}: {e}"))
            .settled()
            .await;
    }
    c.quiesce().await;
    for cluster in [one, two] {
        assert_eq!(cluster.dbsize().await.unwrap(), 0, "a key was left behind");
    }
    let server = single.iter().next().unwrap();
    assert_eq!(
        server.redis().dbsize().await.unwrap(),
        0,
        "a key was left behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_member_takes_extends_and_releases_every_key_on_the_master_of_its_slot() {
    let (one, two, single) = members().await;
    on_every_master(&one, &KEYS);
    let c = coordinator_at(urls(&one, &two, &single), NODE_TIMEOUT).await;
    assert_eq!(c.quorum(), 2);
    for key in KEYS {
        let lock = c.acquire(key, TTL).await.unwrap();
        held_everywhere(&lock, &[key], [&one, &two]).await;
        // Held: a second owner is refused by every member.
        let err = c.acquire(key, TTL).await.unwrap_err();
        assert!(
            err.to_string().contains("held by another owner"),
            "{key}: {err}"
        );
        let extended = c.extend(&lock, Duration::from_secs(60)).await.unwrap();
        assert!(
            one.master_of(key).pttl(key).await.unwrap() > 10_000,
            "{key}"
        );
        c.release(&extended).await.unwrap().settled().await;
    }
    c.quiesce().await;
    for cluster in [&one, &two] {
        assert_eq!(cluster.dbsize().await.unwrap(), 0, "a key was left behind");
    }
    assert!(single.nodes_holding("a").await.is_empty());
}

/// Each master of a cluster member keeps its own settings, and a lock key can live on any
/// of them: the health check reads every master's, and reports the member by its master
/// with the most problems. One master at a time evicts keys (`allkeys-lru`): whichever it
/// is, the member is reported evicting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_master_of_a_cluster_member_is_checked_for_its_settings() {
    let cluster = ClusterSet::start(3).await.unwrap();
    let c = coordinator_at(vec![cluster.url()], NODE_TIMEOUT).await;
    let evicting = HealthProblem::Evicting("allkeys-lru".into());
    assert!(!c.health().await[0].problems.contains(&evicting));
    for i in 0..3 {
        let policy = |p: &'static str| {
            let master = cluster.master(i).redis();
            async move {
                master
                    .command(&["CONFIG", "SET", "maxmemory-policy", p])
                    .await
                    .unwrap();
            }
        };
        policy("allkeys-lru").await;
        let health = c.health().await;
        assert!(
            health[0].problems.contains(&evicting),
            "master {i}: {}",
            health[0]
        );
        assert_eq!(health[0].maxmemory_policy.as_deref(), Some("allkeys-lru"));
        policy("noeviction").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_member_is_healthy_until_a_master_is_lost() {
    let (one, two, single) = members().await;
    let c = coordinator_at(urls(&one, &two, &single), NODE_TIMEOUT).await;
    let health = c.health().await;
    // Without persistence (the test cluster has none) that is the only problem.
    assert_eq!(
        health[0].problems,
        [HealthProblem::NoAppendOnly],
        "{}",
        health[0]
    );
    assert_eq!(health[0].mode.as_deref(), Some("cluster"));
    assert!(health[0].cluster.as_ref().is_some_and(|c| !c.is_degraded()));
    assert!(health[2].cluster.is_none());
    // Acknowledgement asked of replicas these clusters do not have: said at once.
    let acked = redlock_core::Coordinator::connect(redlock_core::Config {
        nodes: urls(&one, &two, &single),
        node_timeout: NODE_TIMEOUT,
        replica_acks: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    let short = acked.health().await;
    assert!(
        short[0].problems.contains(&HealthProblem::TooFewReplicas {
            fewest: 0,
            replica_acks: 1
        }),
        "{}",
        short[0]
    );
    assert!(short[2]
        .problems
        .iter()
        .all(|p| !matches!(p, HealthProblem::TooFewReplicas { .. })));
    acked.close().await;
    // Master 2 of cluster one gives up its slots: the cluster no longer serves them, and
    // the member reports it.
    let (first, last) = one.slots(2);
    one.master(2)
        .redis()
        .command(&[
            "CLUSTER",
            "DELSLOTSRANGE",
            &first.to_string(),
            &last.to_string(),
        ])
        .await
        .unwrap();
    let degraded = common::eventually(Duration::from_secs(15), || async {
        c.health().await[0]
            .problems
            .iter()
            .any(|p| matches!(p, HealthProblem::ClusterDegraded { .. }))
    })
    .await;
    assert!(degraded, "{}", c.health().await[0]);
    let shown = c.health().await[0].to_string();
    assert!(shown.contains("cluster state `fail`"), "{shown}");
    // A cluster that misses slots refuses every key (`cluster-require-full-coverage`): the
    // member votes no, names why, and the other two make the quorum.
    let lock = c.acquire("a", TTL).await.unwrap();
    let settled = lock.report().settled().await;
    assert!(settled.to_string().contains("CLUSTERDOWN"), "{settled}");
    c.release(&lock).await.unwrap().settled().await;
    assert!(two.master_of("a").get("a").await.unwrap().is_none());
}

/// A client for two cluster members (a quorum of both), as `common::client` configures one.
async fn cluster_client(
    clusters: [&ClusterSet; 2],
    tweak: impl FnOnce(redlock_client::LockConfigBuilder) -> redlock_client::LockConfigBuilder,
) -> Redlock {
    let builder = redlock_client::LockConfig::builder()
        .nodes(clusters.map(ClusterSet::url).to_vec())
        .ttl(Duration::from_secs(5))
        .node_timeout(NODE_TIMEOUT)
        .backoff(Duration::from_millis(5), Duration::from_millis(50));
    Redlock::connect(tweak(builder).build().unwrap())
        .await
        .unwrap()
}

async fn nothing_left(clusters: [&ClusterSet; 2]) {
    for cluster in clusters {
        assert_eq!(cluster.dbsize().await.unwrap(), 0, "a key was left behind");
    }
}

/// The client's shapes on cluster members: concurrent plain locks of keys on every master
/// (which group commit would put in one script), reentrant holds, several keys of one hash
/// tag, of several slots, plain and fair, a semaphore, a read-write lock and an inspection;
/// and the typed refusal of fencing with a fence key that has no hash tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_locks_work_on_cluster_members() {
    let (one, two) = tokio::join!(ClusterSet::start(3), ClusterSet::start(2));
    let (one, two) = (one.unwrap(), two.unwrap());
    let clusters = [&one, &two];
    let c = cluster_client(clusters, |b| b.key_prefix("t:")).await;

    let guards = futures::future::join_all((0..24).map(|i| {
        let c = c.clone();
        async move { c.try_lock(&format!("job-{i}")).await }
    }))
    .await;
    for guard in guards {
        guard.unwrap().release().await.unwrap().settled().await;
    }
    nothing_left(clusters).await;

    let me = Owner::new();
    let first = c
        .lock_reentrant("re", &me, &LockOptions::default())
        .await
        .unwrap();
    let second = c
        .lock_reentrant("re", &me, &LockOptions::default())
        .await
        .unwrap();
    second.release().await.unwrap();
    assert!(one.exists("t:re").await.unwrap());
    first.release().await.unwrap().settled().await;

    let order = ["{order-7}:a", "{order-7}:b", "{order-7}:c"];
    let many = c.lock_many(&order, &LockOptions::default()).await.unwrap();
    assert!(one.exists("t:{order-7}:b").await.unwrap());
    let shown = c.inspect("{order-7}:a").await.unwrap();
    assert_eq!(shown.held, Some(true), "{shown:?}");
    many.release().await.unwrap().settled().await;

    let jobs = c.semaphore("jobs", 2).unwrap();
    let (a, b) = (
        jobs.try_acquire().await.unwrap(),
        jobs.try_acquire().await.unwrap(),
    );
    assert!(jobs.try_acquire().await.is_err());
    a.release().await.unwrap().settled().await;
    b.release().await.unwrap().settled().await;

    let doc = c.rwlock("doc").unwrap();
    let (r1, r2) = (doc.try_read().await.unwrap(), doc.try_read().await.unwrap());
    assert!(doc.try_write().await.is_err());
    r1.release().await.unwrap().settled().await;
    r2.release().await.unwrap().settled().await;
    doc.try_write()
        .await
        .unwrap()
        .release()
        .await
        .unwrap()
        .settled()
        .await;
    c.coordinator().quiesce().await;
    nothing_left(clusters).await;

    // A plain lock over keys of several slots goes to each cluster member in one script
    // per slot (see `a_lock_over_keys_of_several_slots_is_taken_in_one_script_per_slot`).
    let across = c
        .lock_many(&["a", "b", "c"], &LockOptions::default())
        .await
        .unwrap();
    assert!(one.exists("t:c").await.unwrap() && two.exists("t:a").await.unwrap());
    across.release().await.unwrap().settled().await;
    c.coordinator().quiesce().await;
    nothing_left(clusters).await;

    // A fair lock over keys of several slots queues in each slot (see
    // `a_fair_lock_over_keys_of_several_slots_queues_in_each_slot`).
    let fair = LockOptions {
        fair: Some(true),
        ..Default::default()
    };
    let across = c.lock_many(&["a", "b"], &fair).await.unwrap();
    assert!(one.exists("t:a").await.unwrap() && two.exists("t:b").await.unwrap());
    across.release().await.unwrap().settled().await;
    c.coordinator().quiesce().await;
    nothing_left(clusters).await;

    // Fencing with a fence key without a hash tag: refused before anything is sent.
    let fenced = LockOptions {
        fenced: Some(true),
        ..Default::default()
    };
    let err = c.lock_with("f", &fenced).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument(ArgumentError::FencingOnCluster { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("hash tag"), "{err}");
    nothing_left(clusters).await;
    c.shutdown().await;

    // With a fence key that has a hash tag, fenced locks work, fair ones too.
    let c = cluster_client(clusters, |b| {
        b.fence_key("{redlock:fencing-counter}")
            .fencing(true)
            .fair(true)
    })
    .await;
    let first = c.lock("f").await.unwrap();
    let token = first.fencing_token().unwrap();
    first.release().await.unwrap().settled().await;
    let second = c.lock("g").await.unwrap();
    assert!(second.fencing_token().unwrap() > token);
    second.release().await.unwrap().settled().await;
    c.coordinator().quiesce().await;
    c.shutdown().await;
}

/// A plain lock over keys of several hash slots goes to a cluster member as one script per
/// slot, and the member votes yes only if every slot took its keys. Taken, extended (alone
/// and in a batch beside another lock) and released on every master of each slot; a second
/// lock over one of its keys is refused, and what that refused lock took on the other slots
/// is rolled back. Where one member has one key held by someone else, the lock is won on
/// the other two, the refusing member's other keys are the lock's, and its release frees
/// them and leaves the foreign key alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_over_keys_of_several_slots_is_taken_in_one_script_per_slot() {
    let (one, two, single) = members().await;
    let keys = ["a", "b", "c"];
    on_every_master(&one, &keys);
    let c = coordinator_at(urls(&one, &two, &single), NODE_TIMEOUT).await;
    let token = || redlock_core::Token::random();

    let lock = c.acquire_many(&keys, token(), TTL).await.unwrap();
    held_everywhere(&lock, &keys, [&one, &two]).await;

    // Another lock over "c" and a key of another slot: refused by every member, and the
    // other key, which each cluster member took in its own slot, is rolled back.
    let other = "job:1";
    assert_ne!(one.master_of(other).port(), one.master_of("c").port());
    let err = c
        .acquire_many(&["c", other], token(), TTL)
        .await
        .unwrap_err();
    let redlock_core::Error::NoQuorum { report } = &err else {
        panic!("{err}");
    };
    let refused = report.settled().await;
    let outcomes: Vec<_> = refused.nodes.iter().map(|n| n.outcome.clone()).collect();
    assert_eq!(
        outcomes,
        [
            NodeOutcome::PartlyHeldByOther,
            NodeOutcome::PartlyHeldByOther,
            NodeOutcome::HeldByOther
        ],
        "{refused}"
    );
    c.quiesce().await;
    for cluster in [&one, &two] {
        assert!(
            !cluster.exists(other).await.unwrap(),
            "{other} was left behind"
        );
    }

    // Extended alone, then in a batch beside a lock of one key.
    let lock = c.extend(&lock, Duration::from_secs(60)).await.unwrap();
    let single_key = c.acquire(other, TTL).await.unwrap();
    let batch = [
        (&lock, Duration::from_secs(90)),
        (&single_key, Duration::from_secs(90)),
    ];
    let extended: Vec<_> = c.extend_many(&batch).await.into_iter().collect();
    let extended: Vec<_> = extended.into_iter().map(Result::unwrap).collect();
    for key in keys {
        for cluster in [&one, &two] {
            let left = cluster.master_of(key).pttl(key).await.unwrap();
            assert!(left > 60_000, "{key}: {left} ms");
        }
    }
    release_all_leaving_nothing(
        &c,
        &[keys.join(","), other.to_string()],
        &extended,
        (&one, &two, &single),
    )
    .await;

    // One member holds "c" for someone else: won on the other two. The refusing member's
    // "a" and "b" are the lock's, and its release frees them, not the foreign "c".
    one.master_of("c")
        .set("c", "someone-else", None)
        .await
        .unwrap();
    let lock = c.acquire_many(&keys, token(), TTL).await.unwrap();
    let won = lock.report().settled().await;
    assert_eq!(
        won.nodes[0].outcome,
        NodeOutcome::PartlyHeldByOther,
        "{won}"
    );
    assert_eq!(
        one.master_of("a").get("a").await.unwrap().as_deref(),
        Some(lock.token().as_str())
    );
    c.release(&lock).await.unwrap().settled().await;
    c.quiesce().await;
    assert_eq!(
        one.master_of("c").get("c").await.unwrap().as_deref(),
        Some("someone-else")
    );
    assert_eq!(
        one.dbsize().await.unwrap(),
        1,
        "only the foreign key is left"
    );
    assert_eq!(two.dbsize().await.unwrap(), 0, "a key was left behind");
}

/// A fair waiter on cluster members is woken by the release, which a master publishes to
/// the whole cluster: its backoff is a minute, so only the wake-up lets it in in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_on_cluster_members_is_woken_by_the_release() {
    let (one, two) = tokio::join!(ClusterSet::start(3), ClusterSet::start(2));
    let (one, two) = (one.unwrap(), two.unwrap());
    let c = cluster_client([&one, &two], |b| b.fair(true)).await;
    let subscribed = common::eventually(Duration::from_secs(10), || async {
        for cluster in [&one, &two] {
            if cluster.subscribers("redlock:released").await.unwrap() < 1 {
                return false;
            }
        }
        true
    })
    .await;
    assert!(subscribed, "the wake-up subscribers did not subscribe");
    let holder = c.lock("job").await.unwrap();
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move {
            let options = LockOptions {
                retry: Some(common::slow_retry()),
                ..Default::default()
            };
            c.lock_with("job", &options).await
        })
    };
    // The waiter has queued (its first attempt failed) before the release.
    let queue = format!("redlock:fair-queue:{{{}}}", c.full_key("job"));
    let queued = common::eventually(Duration::from_secs(10), || async {
        one.exists(&queue).await.unwrap_or(false)
    })
    .await;
    assert!(queued, "the waiter did not queue");
    holder.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("woken by the release, not by its backoff")
        .unwrap()
        .unwrap();
    assert!(guard.is_valid());
    guard.release().await.unwrap().settled().await;
    c.coordinator().quiesce().await;
    nothing_left([&one, &two]).await;
    c.shutdown().await;
}

/// A slot moved to another master (a resharding): the client learns it from the `MOVED`
/// answer. A command that may run twice (an extension, a release) is sent once more and
/// goes through; an acquisition is not sent twice, so that member counts as failed for
/// that round only, says why, and the next round goes to the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_slot_is_followed_by_extensions_and_releases_and_by_the_next_acquisition() {
    let (one, two) = tokio::join!(ClusterSet::start(3), ClusterSet::start(2));
    let (one, two) = (one.unwrap(), two.unwrap());
    let c = coordinator_at(vec![one.url(), two.url()], NODE_TIMEOUT).await;
    assert_eq!(c.quorum(), 2);
    let lock = c.acquire("a", TTL).await.unwrap();
    let to = (one.shard_of("a") + 1) % 3;
    one.move_slot("a", to).await.unwrap();
    assert_eq!(one.master_of("a").port(), one.master(to).port());
    assert_eq!(
        one.master_of("a").get("a").await.unwrap().as_deref(),
        Some(lock.token().as_str()),
        "the key moved with its slot"
    );

    let extended = c.extend(&lock, Duration::from_secs(60)).await.unwrap();
    assert!(one.master_of("a").pttl("a").await.unwrap() > 10_000);

    // Another slot moved: the first acquisition there is not sent twice.
    one.move_slot("b", (to + 1) % 3).await.unwrap();
    let err = c.acquire("b", TTL).await.unwrap_err();
    assert!(
        err.to_string().contains("redirected to another master"),
        "{err}"
    );
    if let redlock_core::Error::NoQuorum { report } = &err {
        report.settled().await;
    }
    let b = c.acquire("b", TTL).await.unwrap();
    assert!(one.master_of("b").exists("b").await.unwrap());

    // Moved once more before its release: the release too is sent again (as a
    // compare-and-delete, with nothing else to do), and nothing is left.
    one.move_slot("a", (to + 2) % 3).await.unwrap();
    let released = c.release(&extended).await.unwrap();
    assert!(released.succeeded(), "{released}");
    released.settled().await;
    assert!(
        !one.exists("a").await.unwrap(),
        "the release reached the slot's new master"
    );
    c.release(&b).await.unwrap().settled().await;
    c.quiesce().await;
    nothing_left([&one, &two]).await;
}

/// With `replica_acks`, a cluster member's vote counts only once a replica acknowledged
/// the write (`WAIT`): with the replica stopped it does not, and nothing is left; a forced
/// failover then keeps the lock on the promoted replica, and the lock extends and releases
/// on it. The control: without `replica_acks` the same acquisition, which no replica has,
/// is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acks_a_cluster_members_locks_survive_a_failover() {
    // Every member with a replica: one without could never acknowledge.
    let (one, two) = tokio::join!(
        ClusterSet::start_with_replicas(2, 1),
        ClusterSet::start_with_replicas(1, 1)
    );
    let (one, two) = (one.unwrap(), two.unwrap());
    let config = |replica_acks| redlock_core::Config {
        nodes: vec![one.url(), two.url()],
        node_timeout: NODE_TIMEOUT,
        replica_acks,
        ..Default::default()
    };
    let acked = redlock_core::Coordinator::connect(config(1)).await.unwrap();
    let lock = acked.acquire("a", TTL).await.unwrap();
    let shard = one.shard_of("a");
    let replica = one.replica(shard).unwrap();

    replica.pause().unwrap();
    let err = acked.acquire("{a}:2", TTL).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("not acknowledged by enough replicas"),
        "{err}"
    );
    if let redlock_core::Error::NoQuorum { report } = &err {
        report.settled().await;
    }
    assert!(
        !one.exists("{a}:2").await.unwrap(),
        "the lost acquisition was rolled back"
    );
    // The control: without acknowledgement the member grants it.
    let unacked = redlock_core::Coordinator::connect(config(0)).await.unwrap();
    let granted = unacked.acquire("{a}:3", TTL).await.unwrap();
    unacked.release(&granted).await.unwrap().settled().await;
    replica.resume().unwrap();

    one.fail_over(shard, Failover::Force).await.unwrap();
    assert_eq!(one.master(shard).port(), replica.port());
    assert_eq!(
        one.master_of("a").get("a").await.unwrap().as_deref(),
        Some(lock.token().as_str()),
        "the promoted replica has the lock"
    );
    let err = acked.acquire("a", TTL).await.unwrap_err();
    assert!(err.to_string().contains("held by another owner"), "{err}");
    // The demoted master closed its clients' connections: a command in flight then
    // failed; the next ones go to the promoted replica.
    let mut extended = None;
    for _ in 0..20 {
        match acked.extend(&lock, Duration::from_secs(60)).await {
            Ok(lock) => {
                extended = Some(lock);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let extended = extended.expect("the lock extends on the promoted replica");
    acked.release(&extended).await.unwrap().settled().await;
    acked.quiesce().await;
    unacked.quiesce().await;
    nothing_left([&one, &two]).await;
}

/// A cluster member's URL may set its own `replica_acks=`, over `Config::replica_acks`:
/// here a member without replicas (which could never acknowledge) is set to 0 beside one
/// with a replica, under `replica_acks = 1`. The member with the replica still waits for
/// it (with the replica paused its vote does not count); the one without votes at once.
/// The control: without its own setting, the member without replicas never counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_members_url_sets_its_own_replica_acks() {
    let (with, without, single) = tokio::join!(
        ClusterSet::start_with_replicas(1, 1),
        ClusterSet::start(1),
        NodeSet::start(1)
    );
    let (with, without, single) = (with.unwrap(), without.unwrap(), single.unwrap());
    // `own`: the member without replicas' own setting, as a query parameter.
    let connect = |own: &str| {
        let mut without_url = without.url();
        if !own.is_empty() {
            without_url.push(if without_url.contains('?') { '&' } else { '?' });
            without_url.push_str(own);
        }
        redlock_core::Coordinator::connect(redlock_core::Config {
            nodes: vec![with.url(), without_url, single.urls().remove(0)],
            node_timeout: NODE_TIMEOUT,
            replica_acks: 1,
            ..Default::default()
        })
    };
    let outcomes = |report: &redlock_core::RoundReport| -> Vec<NodeOutcome> {
        report.nodes.iter().map(|n| n.outcome.clone()).collect()
    };
    let own = connect("replica_acks=0").await.unwrap();
    let lock = own.acquire("a", TTL).await.unwrap();
    let settled = lock.report().settled().await;
    assert!(
        outcomes(&settled)
            .iter()
            .all(|o| *o == NodeOutcome::Acquired),
        "every member counts: {settled}"
    );
    own.release(&lock).await.unwrap().settled().await;

    let replica = with.replica(with.shard_of("a")).unwrap();
    replica.pause().unwrap();
    let lock = own.acquire("a", TTL).await.unwrap();
    let settled = lock.report().settled().await;
    let got = outcomes(&settled);
    assert!(
        not_replicated(&got[0]),
        "the member with the replica waits for it: {settled}"
    );
    assert_eq!(
        got[1..],
        [NodeOutcome::Acquired, NodeOutcome::Acquired],
        "{settled}"
    );
    own.release(&lock).await.unwrap().settled().await;
    replica.resume().unwrap();

    // The control: the member without replicas, without a setting of its own.
    let global = connect("").await.unwrap();
    let lock = global.acquire("b", TTL).await.unwrap();
    let settled = lock.report().settled().await;
    assert!(
        not_replicated(&outcomes(&settled)[1]),
        "the member without replicas never counts: {settled}"
    );
    global.release(&lock).await.unwrap().settled().await;
    own.quiesce().await;
    global.quiesce().await;
    nothing_left([&with, &without]).await;
}

/// Whether a member's vote did not count for want of replicas' acknowledgement.
fn not_replicated(outcome: &NodeOutcome) -> bool {
    matches!(outcome, NodeOutcome::ServerError(e) if e.kind == redlock_core::ServerErrorKind::NotReplicated)
}

/// Waiter `waiter`'s ticket in the fair queue of `key` on the master of its slot in
/// `cluster` (`None`: not queued there).
async fn queued_ticket(cluster: &ClusterSet, key: &str, waiter: &str) -> Option<i64> {
    let queue = format!("redlock:fair-queue:{{{key}}}");
    let score = cluster
        .master_of(key)
        .redis()
        .command(&["ZSCORE", &queue, waiter])
        .await
        .unwrap();
    score
        .as_str()
        .and_then(|s| s.parse::<f64>().ok())
        .map(|f| f as i64)
}

/// A fair lock over keys of several hash slots queues in every key's queue on the master
/// of its slot, one script per slot. Refused because one key is held, what its shares took
/// is rolled back and its waiter is put back in those keys' queues, each in its slot: so a
/// younger waiter of one of them is still behind it (not its turn), and once the held key
/// is free the older waiter takes every key and leaves the queues. Its release frees every
/// key, and the younger waiter's turn comes. A queued rollback sent whole (one script over
/// several slots) would fail there and leave the keys behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_lock_over_keys_of_several_slots_queues_in_each_slot() {
    let (one, two, single) = members().await;
    let keys = ["a", "b", "c"];
    on_every_master(&one, &keys);
    let c = coordinator_at(urls(&one, &two, &single), NODE_TIMEOUT).await;
    let place = |waiter, ticket| redlock_core::support::FairPlace {
        waiter,
        ticket,
        patience: Duration::from_secs(10),
        handover: None,
    };
    let fair = |keys, waiter, ticket| redlock_core::Acquisition {
        fair: Some(place(waiter, ticket)),
        ..redlock_core::Acquisition::new(keys, TTL)
    };

    // "b" is held: the older waiter is refused, and queued in every key's queue.
    let held = c.acquire("b", TTL).await.unwrap();
    let err = c.acquire_with(fair(&keys, "old", 1)).await.unwrap_err();
    assert!(err.to_string().contains("held by another owner"), "{err}");
    c.quiesce().await;
    for cluster in [&one, &two] {
        for key in ["a", "c"] {
            assert!(!cluster.exists(key).await.unwrap(), "{key} was left behind");
        }
        for key in keys {
            assert_eq!(queued_ticket(cluster, key, "old").await, Some(1), "{key}");
        }
    }
    assert!(single.nodes_holding("a").await.is_empty());
    // A younger waiter of one of its keys is not let through.
    let err = c.acquire_with(fair(&["a"], "young", 2)).await.unwrap_err();
    assert!(err.to_string().contains("held by another owner"), "{err}");
    assert!(!one.exists("a").await.unwrap() && !two.exists("a").await.unwrap());

    // Once "b" is free the older waiter takes every key, and leaves every queue.
    c.release(&held).await.unwrap().settled().await;
    let lock = c.acquire_with(fair(&keys, "old", 1)).await.unwrap();
    held_everywhere(&lock, &keys, [&one, &two]).await;
    for cluster in [&one, &two] {
        for key in keys {
            assert_eq!(queued_ticket(cluster, key, "old").await, None, "{key}");
        }
    }
    // Released: every key is free, and the younger waiter's turn has come.
    c.release(&lock).await.unwrap().settled().await;
    let young = c.acquire_with(fair(&["a"], "young", 2)).await.unwrap();
    c.release(&young).await.unwrap().settled().await;
    c.quiesce().await;
    for cluster in [&one, &two] {
        assert_eq!(cluster.dbsize().await.unwrap(), 0, "a key was left behind");
    }
    let server = single.iter().next().unwrap();
    assert_eq!(
        server.redis().dbsize().await.unwrap(),
        0,
        "a key was left behind"
    );
}

/// Fencing with cluster members, whose fence key has a hash tag: each cluster member keeps
/// one counter, on the master of its slot, and a fenced acquisition reads it beside the
/// lock's keys in the same flight. Tokens increase across locks of every slot and every
/// kind (plain, over several keys of one slot and of several, a permit, a writer), and
/// each member's counter is at the last token. A fenced lock over keys of several slots
/// is held on each key's master; refused where one of its keys is held, it leaves nothing
/// of its own. With the default key (no tag) fencing is refused, naming the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_locks_on_cluster_members_get_increasing_tokens() {
    let (one, two, single) = members().await;
    let fence_key = "{redlock:fencing-counter}";
    let c = redlock_core::Coordinator::connect(redlock_core::Config {
        nodes: urls(&one, &two, &single),
        node_timeout: NODE_TIMEOUT,
        fence_key: fence_key.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let fenced = |keys| redlock_core::Acquisition {
        fenced: true,
        ..redlock_core::Acquisition::new(keys, TTL)
    };
    let mut tokens = Vec::new();
    for keys in [&["a"][..], &["b"], &["job:1"], &["{o}:x", "{o}:y"], &["a"]] {
        let lock = c.acquire_with(fenced(keys)).await.unwrap();
        tokens.push(lock.fencing_token().unwrap().get());
        c.release(&lock).await.unwrap().settled().await;
    }
    // Over keys of every master's slots: one share per slot, each reading the counter.
    let across = ["a", "b", "c"];
    on_every_master(&one, &across);
    let lock = c.acquire_with(fenced(&across)).await.unwrap();
    held_everywhere(&lock, &across, [&one, &two]).await;
    tokens.push(lock.fencing_token().unwrap().get());
    // Held: the same keys fenced are refused by every member, and roll nothing of ours.
    let err = c.acquire_with(fenced(&across)).await.unwrap_err();
    assert!(err.to_string().contains("held by another owner"), "{err}");
    c.release(&lock).await.unwrap().settled().await;
    // One key held by someone else: refused, and its other keys are rolled back.
    let other = c.acquire("b", TTL).await.unwrap();
    let err = c.acquire_with(fenced(&across)).await.unwrap_err();
    assert!(err.to_string().contains("held by another owner"), "{err}");
    c.quiesce().await;
    for key in ["a", "c"] {
        for cluster in [&one, &two] {
            assert!(!cluster.exists(key).await.unwrap(), "{key} was left behind");
        }
        assert!(
            single.nodes_holding(key).await.is_empty(),
            "{key} was left behind"
        );
    }
    c.release(&other).await.unwrap().settled().await;
    let permit = c
        .acquire_permit_with(redlock_core::PermitAcquisition {
            fenced: true,
            ..redlock_core::PermitAcquisition::new("jobs", 2, TTL)
        })
        .await
        .unwrap();
    tokens.push(permit.fencing_token().unwrap().get());
    c.release(&permit).await.unwrap().settled().await;
    let writer = c
        .acquire_rw(redlock_core::RwAcquisition {
            fenced: true,
            ..redlock_core::RwAcquisition::write("doc", TTL)
        })
        .await
        .unwrap();
    tokens.push(writer.fencing_token().unwrap().get());
    c.release(&writer).await.unwrap().settled().await;
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let last = tokens.last().unwrap().to_string();
    for cluster in [&one, &two] {
        let counter = cluster.master_of(fence_key).get(fence_key).await.unwrap();
        assert_eq!(counter.as_deref(), Some(last.as_str()));
    }
    c.quiesce().await;

    let untagged = coordinator_at(urls(&one, &two, &single), NODE_TIMEOUT).await;
    let err = untagged.acquire_with(fenced(&["a"])).await.unwrap_err();
    assert!(
        matches!(
            &err,
            redlock_core::Error::Argument(ArgumentError::FencingOnCluster { .. })
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("`{redlock:fencing-counter}`"),
        "{err}"
    );
}

/// Renewing many locks at once (`extend_many`, what the client's renewal does) on cluster
/// members: a batch of locks of forty slots is one round, one script on the single server
/// and one per slot on a cluster member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_locks_renew_together_on_cluster_members() {
    let (one, two, single) = members().await;
    let c = coordinator_at(urls(&one, &two, &single), NODE_TIMEOUT).await;
    let keys: Vec<String> = (0..40).map(|i| format!("renew-{i}")).collect();
    let mut locks = Vec::new();
    for key in &keys {
        locks.push(c.acquire(key, TTL).await.unwrap());
    }
    let asked: Vec<(&redlock_core::Lock, Duration)> =
        locks.iter().map(|l| (l, Duration::from_secs(60))).collect();
    let server = single.iter().next().unwrap();
    let scripts_before = server.command_calls("evalsha").await.unwrap();
    let extended = c.extend_many(&asked).await;
    let scripts = server.command_calls("evalsha").await.unwrap() - scripts_before;
    assert_eq!(scripts, 1, "the single server ran {scripts} batches");
    for (key, result) in keys.iter().zip(&extended) {
        let lock = result.as_ref().unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(lock.key(), key);
        assert!(
            one.master_of(key).pttl(key).await.unwrap() > 10_000,
            "{key}"
        );
    }
    for lock in extended.into_iter().flatten() {
        c.release(&lock).await.unwrap().settled().await;
    }
    c.quiesce().await;
    for cluster in [&one, &two] {
        assert_eq!(cluster.dbsize().await.unwrap(), 0, "a key was left behind");
    }
}

/// Group commit with cluster members: concurrent acquisitions and releases share rounds
/// whatever their keys' hash slots, and a cluster member runs each round as one command per
/// slot. Eighty keys at once, of five hash tags and of sixteen slots of one key each: every
/// member grants every lock, the single server runs them in a script or two (the lead goes
/// alone, as `SET NX`), the keys of one tag go as one script on their master, and the
/// grouped releases leave nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_locks_on_cluster_members_share_rounds_across_slots() {
    let (one, two, single) = members().await;
    let c = coordinator_at(urls(&one, &two, &single), NODE_TIMEOUT).await;
    let tagged = one.master_of("{tenant}");
    let scripts_before = tagged.command_calls("evalsha").await.unwrap();
    let server = single.iter().next().unwrap();
    let rounds_before = server.command_calls("evalsha").await.unwrap();
    // Five hash tags, each a slot of several keys, and keys of a slot each.
    let keys: Vec<String> = (0..32)
        .map(|i| format!("{{tenant}}:job-{i}"))
        .chain((0..32).map(|i| format!("{{team-{}}}:job-{i}", i % 4)))
        .chain((0..16).map(|i| format!("spread-{i}")))
        .collect();
    let locks = futures::future::join_all(keys.iter().map(|key| c.acquire(key, TTL))).await;
    let mut held = Vec::new();
    for (key, lock) in keys.iter().zip(locks) {
        let lock = lock.unwrap_or_else(|e| panic!("{key}: {e}"));
        held_everywhere(&lock, &[key], [&one, &two]).await;
        held.push(lock);
    }
    // The first acquisition leads alone (`SET NX`); the tagged ones that waited for it
    // went as one grouped script (two if the leader was one of them and others came late).
    let scripts = tagged.command_calls("evalsha").await.unwrap() - scripts_before;
    assert!((1..=2).contains(&scripts), "{scripts} script calls");
    // The others went in one grouped round (two if some came late): one script each on
    // the single server, where a round per slot would have made one per hash tag.
    let rounds = server.command_calls("evalsha").await.unwrap() - rounds_before;
    assert!((1..=2).contains(&rounds), "{rounds} grouped rounds");
    release_all_leaving_nothing(&c, &keys, &held, (&one, &two, &single)).await;
}

/// A grouped round over keys of many slots, with the master of some of them paused: the
/// cluster member counts as failed for the locks of that master's slots only (each slot's
/// command is its own), every lock is still won by the quorum, and once the master is back
/// the releases leave nothing, the commands it ran late included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_fails_only_its_own_slots_locks_in_a_grouped_round() {
    let (one, two, single) = members().await;
    let c = coordinator_at(urls(&one, &two, &single), NODE_TIMEOUT).await;
    let keys: Vec<String> = (0..30).map(|i| format!("paused-{i}")).collect();
    let paused = one.master_of(&keys[0]);
    let on_paused: Vec<bool> = keys
        .iter()
        .map(|k| one.master_of(k).port() == paused.port())
        .collect();
    assert!(
        on_paused.iter().any(|&p| p) && on_paused.iter().any(|&p| !p),
        "the keys must fall on the paused master and on others"
    );
    paused.pause().unwrap();
    let locks = futures::future::join_all(keys.iter().map(|key| c.acquire(key, TTL))).await;
    let mut held = Vec::new();
    for ((key, lock), on_paused) in keys.iter().zip(locks).zip(on_paused) {
        let lock = lock.unwrap_or_else(|e| panic!("{key}: {e}"));
        let settled = lock.report().settled().await;
        let expected = if on_paused {
            NodeOutcome::TimedOut
        } else {
            NodeOutcome::Acquired
        };
        assert_eq!(settled.nodes[0].outcome, expected, "{key}: {settled}");
        assert!(
            settled.nodes[1..]
                .iter()
                .all(|n| n.outcome == NodeOutcome::Acquired),
            "{key}: {settled}"
        );
        held.push(lock);
    }
    paused.resume().unwrap();
    release_all_leaving_nothing(&c, &keys, &held, (&one, &two, &single)).await;
}

//! A cluster in containers (`docker-compose.cluster.yml`: three masters with a replica
//! each) as one quorum member beside two local servers, with `replica_acks = 1`: locks on
//! every shard, then the container faults (a master cut off from the network, a replica
//! paused, a shard failed over while a lock is held). Opt-in: set `REDLOCK_LAB_DOCKER=1`
//! (CI does; a missing Docker then fails the test rather than skipping it).

mod common;

use std::io::Write;
use std::time::Duration;

use common::eventually;
use redlock_core::{Config, Coordinator, Lock, NodeOutcome};
use redlock_testkit::{DockerCluster, DockerSet, Failover, NodeSet};

const OPT_IN: &str = "REDLOCK_LAB_DOCKER";
const TTL: Duration = Duration::from_secs(30);

/// What the cluster member (the first node) answered a lock's acquisition, once every node
/// answered.
async fn cluster_outcome(lock: &Lock) -> NodeOutcome {
    lock.report().settled().await.nodes[0].outcome.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_in_containers_is_a_member_through_its_faults() {
    if std::env::var_os(OPT_IN).is_none() {
        let _ = writeln!(
            std::io::stderr(),
            "docker cluster member skipped: set {OPT_IN}=1 to run it"
        );
        return;
    }
    if let Err(e) = DockerSet::available() {
        panic!("{OPT_IN} is set but the docker backend cannot run: {e}");
    }
    let cluster = DockerCluster::up()
        .await
        .expect("the docker cluster starts");
    let singles = NodeSet::start(2).await.unwrap();
    let mut urls = vec![cluster.url()];
    urls.extend(singles.urls());
    let c = Coordinator::connect(Config {
        nodes: urls,
        node_timeout: Duration::from_millis(500),
        replica_acks: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    let health = c.health().await;
    assert!(
        health[0].cluster.as_ref().is_some_and(|s| !s.is_degraded()),
        "{}",
        health[0]
    );

    // Keys on every shard: the client follows the cluster to each master's published port,
    // and each acquisition is acknowledged by that master's replica.
    let keys = ["a", "b", "c", "job:1", "job:2"];
    let shards: std::collections::BTreeSet<usize> =
        keys.iter().map(|k| cluster.shard_of(k)).collect();
    assert_eq!(shards.len(), 3, "the keys must fall on every shard");
    for key in keys {
        let lock = c.acquire(key, TTL).await.unwrap();
        assert_eq!(cluster_outcome(&lock).await, NodeOutcome::Acquired, "{key}");
        assert!(cluster.exists(key).await.unwrap(), "{key}");
        c.release(&lock).await.unwrap().settled().await;
    }

    // The master that serves `a` cut off from the network: the member cannot grant `a`,
    // the two single servers make the quorum; once it is back the member grants it again.
    let master = cluster.master_of("a");
    cluster.disconnect(master).await.unwrap();
    let lock = c.acquire("a", TTL).await.unwrap();
    assert_ne!(cluster_outcome(&lock).await, NodeOutcome::Acquired);
    c.release(&lock).await.unwrap().settled().await;
    cluster.connect(master).await.unwrap();
    let back = eventually(Duration::from_secs(30), || async {
        match c.acquire("a", TTL).await {
            Ok(lock) => {
                let granted = cluster_outcome(&lock).await == NodeOutcome::Acquired;
                c.release(&lock).await.unwrap().settled().await;
                granted
            }
            Err(_) => false,
        }
    })
    .await;
    assert!(back, "the member grants `a` again once its master is back");

    // The replica of `b`'s shard paused: no replica acknowledges, so the member's vote on
    // `b` does not count (and it is rolled back there); the single servers make the quorum.
    let shard = cluster.shard_of("b");
    let replica = cluster.replica(shard).unwrap();
    cluster.pause(replica).await.unwrap();
    let lock = c.acquire("b", TTL).await.unwrap();
    let outcome = cluster_outcome(&lock).await;
    assert!(
        outcome
            .to_string()
            .contains("not acknowledged by enough replicas"),
        "{outcome}"
    );
    c.release(&lock).await.unwrap().settled().await;
    cluster.resume(replica).await.unwrap();

    // `c` held while its shard fails over: the promoted replica has it (it acknowledged
    // it), a second owner is refused, and the lock extends and releases there.
    let held = c.acquire("c", TTL).await.unwrap();
    assert_eq!(cluster_outcome(&held).await, NodeOutcome::Acquired);
    let shard = cluster.shard_of("c");
    let promoted = cluster.replica(shard).unwrap();
    cluster
        .fail_over(shard, Failover::Coordinated)
        .await
        .unwrap();
    assert_eq!(cluster.master(shard), promoted);
    assert!(
        cluster.exists("c").await.unwrap(),
        "the promoted replica holds `c`"
    );
    let err = c.acquire("c", TTL).await.unwrap_err();
    assert!(err.to_string().contains("held by another owner"), "{err}");
    // The demoted master closed its clients' connections: a command in flight then fails.
    let mut extended = None;
    for _ in 0..20 {
        match c.extend(&held, Duration::from_secs(60)).await {
            Ok(lock) => {
                extended = Some(lock);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let extended = extended.expect("the lock extends on the promoted replica");
    c.release(&extended).await.unwrap().settled().await;
    c.quiesce().await;
    assert_eq!(cluster.dbsize().await.unwrap(), 0, "a key was left behind");
}

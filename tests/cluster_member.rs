//! A whole Redis Cluster as one quorum member (`redis-cluster://`), beside single servers:
//! every lock path against real cluster processes.

mod common;

use std::time::Duration;

use common::coordinator_at;
use redlock_core::{HealthProblem, NodeOutcome};
use redlock_testkit::{ClusterSet, NodeSet};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_member_takes_extends_and_releases_every_key_on_the_master_of_its_slot() {
    let (one, two, single) = members().await;
    // The keys spread over every master of each cluster.
    let owners: std::collections::BTreeSet<u16> =
        KEYS.iter().map(|k| one.master_of(k).port()).collect();
    assert_eq!(owners.len(), 3, "the test keys must fall on every master");
    let c = coordinator_at(urls(&one, &two, &single), NODE_TIMEOUT).await;
    assert_eq!(c.quorum(), 2);
    for key in KEYS {
        let lock = c.acquire(key, TTL).await.unwrap();
        let settled = lock.report().settled().await;
        assert!(
            settled
                .nodes
                .iter()
                .all(|n| n.outcome == NodeOutcome::Acquired),
            "{key}: {settled}"
        );
        for cluster in [&one, &two] {
            assert_eq!(
                cluster.master_of(key).get(key).await.unwrap().as_deref(),
                Some(lock.token().as_str()),
                "{key}"
            );
        }
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
    // Master 2 of cluster one gives up its slots: the cluster no longer serves them, and
    // the member reports it.
    let (first, last) = one.slots(2);
    one.masters()
        .node(2)
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

//! Faults that make keys vanish before their TTL (Redlock assumption H2): real eviction, a
//! delayed restart without persistence, and the control case, a restart with `appendfsync
//! always`.
//!
//! No timing assertions: the only waits are the documented restart delay and a generous
//! `bounded` limit that turns a hang into a failure.

use std::future::Future;
use std::time::Duration;

use redlock_testkit::{HarnessError, NodeOptions, NodeSet};

/// Fails the test instead of hanging forever.
async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

#[tokio::test]
async fn evict_all_evicts_every_key_and_restores_the_memory_config() {
    let nodes = bounded("start", NodeSet::start(2))
        .await
        .expect("start 2 nodes");
    let (victim, control) = (nodes.node(0), nodes.node(1));
    for i in 0..5 {
        let ttl = (i % 2 == 0).then_some(60_000);
        victim
            .set(&format!("lock:{i}"), "token", ttl)
            .await
            .unwrap();
    }
    control.set("lock:0", "token", Some(60_000)).await.unwrap();
    let redis = victim.redis();
    let maxmemory = redis.config_get("maxmemory").await.unwrap();
    let policy = redis.config_get("maxmemory-policy").await.unwrap();
    assert_eq!(policy.as_deref(), Some("noeviction"));

    let evicted = bounded("evict_all", victim.evict_all()).await.unwrap();

    assert_eq!(evicted, 5, "every key counts as an eviction");
    assert_eq!(victim.dbsize().await.unwrap(), 0);
    assert!(!victim.exists("lock:0").await.unwrap());
    assert_eq!(redis.config_get("maxmemory").await.unwrap(), maxmemory);
    assert_eq!(redis.config_get("maxmemory-policy").await.unwrap(), policy);
    // With maxmemory still at 1 byte this write would fail with OOM.
    victim.set("after", "v", None).await.unwrap();
    assert_eq!(
        nodes.nodes_holding("lock:0").await,
        vec![1],
        "control untouched"
    );
}

#[tokio::test]
async fn evict_all_restores_a_non_default_memory_config() {
    let opts = NodeOptions {
        extra_args: ["--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru"]
            .map(String::from)
            .to_vec(),
        ..NodeOptions::default()
    };
    let nodes = bounded("start", NodeSet::start_with(1, opts))
        .await
        .expect("start a node");
    let node = nodes.node(0);
    node.set("a", "1", None).await.unwrap();
    node.set("b", "2", Some(60_000)).await.unwrap();

    // volatile-lru alone would spare `a` (no TTL); evict_all uses allkeys-random meanwhile.
    assert_eq!(bounded("evict_all", node.evict_all()).await.unwrap(), 2);

    let redis = node.redis();
    assert_eq!(node.dbsize().await.unwrap(), 0);
    assert_eq!(
        redis.config_get("maxmemory").await.unwrap().as_deref(),
        Some("104857600")
    );
    assert_eq!(
        redis
            .config_get("maxmemory-policy")
            .await
            .unwrap()
            .as_deref(),
        Some("volatile-lru")
    );
    assert_eq!(node.evict_all().await.unwrap(), 0, "nothing left to evict");
}

#[tokio::test]
async fn lose_key_deletes_one_key_without_counting_an_eviction() {
    let nodes = bounded("start", NodeSet::start(1))
        .await
        .expect("start a node");
    let node = nodes.node(0);
    node.set("lock:a", "t", Some(60_000)).await.unwrap();
    node.set("lock:b", "t", Some(60_000)).await.unwrap();

    assert!(node.lose_key("lock:a").await.unwrap());
    assert!(!node.lose_key("lock:a").await.unwrap());

    assert_eq!(
        node.keys("lock:*").await.unwrap(),
        vec!["lock:b".to_owned()]
    );
    assert_eq!(node.evict_all().await.unwrap(), 1, "only lock:b was left");
}

#[tokio::test]
async fn keys_scans_every_page() {
    let nodes = bounded("start", NodeSet::start(1))
        .await
        .expect("start a node");
    let node = nodes.node(0);
    for i in 0..250 {
        node.set(&format!("k:{i:03}"), "v", None).await.unwrap();
    }
    node.set("other", "v", None).await.unwrap();

    let keys = node.keys("k:*").await.unwrap();
    let expected: Vec<String> = (0..250).map(|i| format!("k:{i:03}")).collect();
    assert_eq!(keys, expected);
    assert_eq!(node.keys("*").await.unwrap().len(), 251);
    assert!(node.keys("nothing:*").await.unwrap().is_empty());
}

#[tokio::test]
async fn restart_after_stays_down_for_the_delay_then_returns_empty_on_the_same_port() {
    let nodes = bounded("start", NodeSet::start(2))
        .await
        .expect("start 2 nodes");
    let (node, control) = (nodes.node(0), nodes.node(1));
    let port = node.port();
    node.set("lock:a", "token", Some(60_000)).await.unwrap();
    control.set("lock:a", "token", Some(60_000)).await.unwrap();

    let delay = Duration::from_millis(1500);
    let (restarted, during) = bounded("restart_after", async {
        tokio::join!(node.restart_after(delay), async {
            // Well inside the delay: the kill happens on the first poll of restart_after.
            tokio::time::sleep(delay / 3).await;
            (node.is_running(), node.get("lock:a").await)
        })
    })
    .await;
    restarted.expect("restart_after");

    let (running, read) = during;
    assert!(!running, "down during the delay");
    assert!(
        matches!(read, Err(HarnessError::NotRunning { .. })),
        "{read:?}"
    );
    assert!(node.is_running());
    assert_eq!(node.port(), port, "same port");
    assert_eq!(
        node.dbsize().await.unwrap(),
        0,
        "data gone without persistence"
    );
    assert_eq!(nodes.nodes_holding("lock:a").await, vec![1]);
}

#[tokio::test]
async fn restart_with_appendfsync_always_keeps_a_key_written_just_before_sigkill() {
    let persistent = NodeOptions {
        appendonly_always: true,
        ..NodeOptions::default()
    };
    let (durable, volatile) = bounded("start", async {
        tokio::join!(NodeSet::start_with(1, persistent), NodeSet::start(1))
    })
    .await;
    let (durable, volatile) = (durable.expect("start"), volatile.expect("start"));
    for node in [durable.node(0), volatile.node(0)] {
        node.set("lock:a", "token", Some(60_000)).await.unwrap();
        node.kill().unwrap();
        bounded("restart", node.restart()).await.unwrap();
    }

    assert_eq!(
        durable.node(0).get("lock:a").await.unwrap().as_deref(),
        Some("token")
    );
    let ttl = durable.node(0).pttl("lock:a").await.unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "TTL kept: {ttl}");
    assert_eq!(volatile.node(0).get("lock:a").await.unwrap(), None);
}

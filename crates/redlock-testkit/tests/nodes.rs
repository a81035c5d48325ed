//! The [`Nodes`] interface, written once and run on both node sets: on local redis-server
//! processes always, and on the docker-compose set too when `REDLOCK_LAB_DOCKER=1` (a missing
//! Docker is then a failure, not a skip).
//!
//! No timing assertions beyond "an error comes back": the machine is small and shared.
//! `bounded` only turns a hang into a failure after a generous limit.

use std::future::Future;
use std::io::Write;
use std::time::Duration;

use redlock_testkit::{DockerOptions, DockerSet, HarnessError, Links, NodeSet, Nodes, RedisAt};

const DOCKER_OPT_IN: &str = "REDLOCK_LAB_DOCKER";

/// Fails the test instead of hanging forever.
async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(300), f)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

#[tokio::test]
async fn the_interface_on_local_nodes() {
    let nodes = NodeSet::start(3).await.expect("start 3 nodes");
    let links = Links::start(1, &nodes.addrs()).await.expect("links");
    bounded("local nodes", written_once(&nodes, &links)).await;
}

#[tokio::test]
async fn the_interface_on_containers() {
    if std::env::var_os(DOCKER_OPT_IN).is_none() {
        // Straight to stderr: the test harness captures the output of passing tests.
        let _ = writeln!(
            std::io::stderr(),
            "docker backend skipped: set {DOCKER_OPT_IN}=1 to run it"
        );
        return;
    }
    if let Err(e) = DockerSet::available() {
        panic!("{DOCKER_OPT_IN} is set but the docker backend cannot run: {e}");
    }
    let set = DockerSet::up(DockerOptions::default()).await.expect("up");
    let links = Links::start(1, &set.addrs()).await.expect("links");
    bounded("containers", written_once(&set, &links)).await;
}

/// Every part of the interface, by index, as a test of one's own would use it.
async fn written_once(nodes: &dyn Nodes, links: &Links) {
    let n = nodes.len();
    assert!(n >= 3 && !nodes.is_empty());
    let urls = nodes.urls();
    for (i, addr) in nodes.addrs().into_iter().enumerate() {
        assert_eq!(nodes.addr(i), addr);
        assert_eq!(urls[i], format!("redis://{addr}"));
        assert_eq!(nodes.redis(i).name(), nodes.name(i));
        assert!(nodes.clock(i).is_none(), "no fake clock unless asked for");
        assert!(nodes.is_up(i).await);
    }
    assert!(!nodes.is_up(n).await, "no node {n}");
    let out_of_range = nodes.kill(n).await;
    assert!(
        matches!(out_of_range, Err(HarnessError::NoSuchNode { index, len, .. }) if index == n && len == n),
        "{out_of_range:?}"
    );

    kill_then_restart_comes_back_empty(nodes).await;
    pause_times_out_until_resume(nodes).await;
    partition_cuts_the_links_until_heal(nodes, links).await;
    restart_after_stays_down(nodes).await;
    key_loss(nodes).await;
}

async fn kill_then_restart_comes_back_empty(nodes: &dyn Nodes) {
    let node = nodes.redis(0);
    node.set("lock:a", "token", Some(60_000)).await.unwrap();
    nodes.kill(0).await.expect("kill");
    nodes.kill(0).await.expect("killing a dead node is a no-op");
    assert!(!nodes.is_up(0).await, "down after kill");
    nodes.restart(0).await.expect("restart");
    assert!(nodes.is_up(0).await);
    assert_eq!(node.dbsize().await.unwrap(), 0, "no persistence by default");
}

async fn pause_times_out_until_resume(nodes: &dyn Nodes) {
    let node = nodes.redis(1);
    node.set("k", "v", None).await.unwrap();
    nodes.pause(1).await.expect("pause");
    let read = node.get("k").await;
    assert!(
        matches!(read, Err(HarnessError::Timeout { .. })),
        "{read:?}"
    );
    nodes.resume(1).await.expect("resume");
    nodes
        .resume(1)
        .await
        .expect("resuming a running node is a no-op");
    assert_eq!(node.get("k").await.unwrap().as_deref(), Some("v"));
}

async fn partition_cuts_the_links_until_heal(nodes: &dyn Nodes, links: &Links) {
    nodes.redis(2).set("k", "v", None).await.unwrap();
    // What client 0 sees: node 2 through its link.
    let through_link = RedisAt::new("client-0->node-2", links.link(0, 2).addr());
    nodes.partition(2, links).await.expect("partition");
    nodes
        .partition(2, links)
        .await
        .expect("partitioning twice is a no-op");
    assert!(
        through_link.get("k").await.is_err(),
        "cut off from client 0"
    );
    nodes.heal(2, links).await.expect("heal");
    nodes
        .heal(2, links)
        .await
        .expect("healing twice is a no-op");
    assert_eq!(through_link.get("k").await.unwrap().as_deref(), Some("v"));
}

async fn restart_after_stays_down(nodes: &dyn Nodes) {
    let node = nodes.redis(1);
    node.set("lock:a", "token", Some(60_000)).await.unwrap();
    let delay = Duration::from_secs(3);
    let (restarted, during) = tokio::join!(nodes.restart_after(1, delay), async {
        // Well inside the delay; a kill itself takes a fraction of a second.
        tokio::time::sleep(delay * 2 / 3).await;
        node.ping().await
    });
    restarted.expect("restart_after");
    assert!(during.is_err(), "down during the delay: {during:?}");
    assert_eq!(node.dbsize().await.unwrap(), 0);
}

async fn key_loss(nodes: &dyn Nodes) {
    let node = nodes.redis(2);
    node.flushall().await.unwrap();
    for i in 0..3 {
        node.set(&format!("lock:{i}"), "t", Some(60_000))
            .await
            .unwrap();
    }
    assert!(nodes.lose_key(2, "lock:0").await.unwrap());
    assert!(!nodes.lose_key(2, "lock:0").await.unwrap(), "already gone");
    assert_eq!(nodes.evict_all(2).await.unwrap(), 2);
    assert_eq!(node.dbsize().await.unwrap(), 0);
}

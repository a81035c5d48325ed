//! Integration tests of the harness against real redis-server processes.
//!
//! No timing assertions: the machine is small and shared. `bounded` only turns a hang into a
//! failure after a generous limit.

use std::future::Future;
use std::time::Duration;

use redlock_testkit::{HarnessError, NodeOptions, NodeSet};

/// Fails the test instead of hanging forever.
async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

/// Whether the server process `pid` is gone: no `/proc` entry, or (pid reused) the entry
/// is not the server's (by the binary's name, whichever server it is), alive or zombie.
fn redis_gone(pid: u32) -> bool {
    let name = redlock_testkit::server_binary()
        .expect("the server binary")
        .process_name();
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => !stat.contains(&format!("({name})")),
    }
}

#[tokio::test]
async fn start_set_get_and_nodes_holding() {
    let nodes = NodeSet::start(3).await.expect("start 3 nodes");
    assert_eq!(nodes.len(), 3);
    assert!(!nodes.is_empty());

    let urls = nodes.urls();
    let mut ports: Vec<u16> = nodes.nodes().iter().map(|n| n.port()).collect();
    for (i, node) in nodes.nodes().iter().enumerate() {
        assert_eq!(node.name(), format!("node-{i}"));
        assert_eq!(urls[i], format!("redis://127.0.0.1:{}", node.port()));
        assert_eq!(node.url(), urls[i]);
        assert!(node.is_running() && !node.is_paused());
        assert_eq!(node.dbsize().await.unwrap(), 0);
    }
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3, "ports must be distinct");

    nodes.node(0).set("k", "v0", Some(60_000)).await.unwrap();
    nodes.node(2).set("k", "v2", None).await.unwrap();
    assert_eq!(nodes.node(0).get("k").await.unwrap().as_deref(), Some("v0"));
    assert_eq!(nodes.node(1).get("k").await.unwrap(), None);
    assert_eq!(nodes.node(2).get("k").await.unwrap().as_deref(), Some("v2"));

    let ttl = nodes.node(0).pttl("k").await.unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "pttl {ttl}");
    assert_eq!(nodes.node(2).pttl("k").await.unwrap(), -1);
    assert_eq!(nodes.node(1).pttl("k").await.unwrap(), -2);

    assert_eq!(nodes.nodes_holding("k").await, vec![0, 2]);
    assert!(nodes.nodes_holding("other").await.is_empty());

    nodes.node(2).del("k").await.unwrap();
    nodes.node(2).del("k").await.unwrap();
    assert_eq!(nodes.nodes_holding("k").await, vec![0]);

    nodes.node(0).set("k2", "x", None).await.unwrap();
    assert_eq!(nodes.node(0).dbsize().await.unwrap(), 2);
    nodes.node(0).flushall().await.unwrap();
    assert_eq!(nodes.node(0).dbsize().await.unwrap(), 0);
}

#[tokio::test]
async fn pause_errors_instead_of_hanging_and_resume_recovers() {
    let nodes = NodeSet::start(3).await.expect("start 3 nodes");
    for node in nodes.nodes() {
        node.set("k", "v", None).await.unwrap();
    }

    let paused = nodes.node(1);
    paused.pause().unwrap();
    assert!(paused.is_paused() && paused.is_running());

    let err = bounded("GET on a paused node", paused.get("k"))
        .await
        .expect_err("a paused node must not answer");
    assert!(
        matches!(
            err,
            HarnessError::Timeout { .. } | HarnessError::Redis { .. }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("resume()"), "{err}");
    // Paused nodes are skipped, not waited for.
    assert_eq!(
        bounded("nodes_holding", nodes.nodes_holding("k")).await,
        vec![0, 2]
    );

    paused.resume().unwrap();
    assert!(!paused.is_paused() && paused.is_running());
    assert_eq!(paused.get("k").await.unwrap().as_deref(), Some("v"));
    assert_eq!(nodes.nodes_holding("k").await, vec![0, 1, 2]);
}

#[tokio::test]
async fn kill_then_restart_on_the_same_port_loses_data() {
    let nodes = NodeSet::start(3).await.expect("start 3 nodes");
    let node = nodes.node(0);
    let port = node.port();
    node.set("k", "v", None).await.unwrap();
    nodes.node(1).set("k", "v", None).await.unwrap();

    node.kill().unwrap();
    node.kill().expect("kill is idempotent");
    assert!(!node.is_running() && !node.is_paused());
    assert_eq!(node.pid(), None);
    let err = node.get("k").await.expect_err("dead node");
    assert!(matches!(err, HarnessError::NotRunning { .. }), "{err}");
    assert!(err.to_string().contains("restart()"), "{err}");
    assert!(matches!(node.pause(), Err(HarnessError::NotRunning { .. })));
    assert!(matches!(
        node.resume(),
        Err(HarnessError::NotRunning { .. })
    ));
    assert_eq!(nodes.nodes_holding("k").await, vec![1]);

    node.restart().await.expect("restart");
    assert_eq!(node.port(), port);
    assert!(node.is_running());
    assert_eq!(
        node.get("k").await.unwrap(),
        None,
        "no persistence by default"
    );
    assert_eq!(node.dbsize().await.unwrap(), 0);
    node.set("k", "again", None).await.unwrap();
    assert_eq!(nodes.nodes_holding("k").await, vec![0, 1]);

    // Restarting a running (even paused) node works too.
    node.pause().unwrap();
    node.restart().await.expect("restart a paused node");
    assert!(!node.is_paused());
    assert_eq!(node.port(), port);
    assert_eq!(node.get("k").await.unwrap(), None);
}

#[tokio::test]
async fn appendonly_always_keeps_data_across_kill_and_restart() {
    let opts = NodeOptions {
        appendonly_always: true,
        ..NodeOptions::default()
    };
    let nodes = NodeSet::start_with(1, opts).await.expect("start");
    let node = nodes.node(0);
    node.set("k", "durable", None).await.unwrap();
    node.kill().unwrap();
    node.restart().await.expect("restart");
    assert_eq!(node.get("k").await.unwrap().as_deref(), Some("durable"));
}

#[tokio::test]
async fn bad_extra_args_report_the_log_tail() {
    let opts = NodeOptions {
        extra_args: vec!["--no-such-directive".into(), "1".into()],
        ..NodeOptions::default()
    };
    let err = NodeSet::start_with(2, opts).await.expect_err("bad config");
    let msg = err.to_string();
    assert!(matches!(err, HarnessError::StartFailed { .. }), "{msg}");
    assert!(msg.contains("no-such-directive"), "{msg}");
}

#[tokio::test]
async fn dropping_the_set_reaps_every_process() {
    let nodes = NodeSet::start(3).await.expect("start 3 nodes");
    let pids: Vec<u32> = nodes.nodes().iter().map(|n| n.pid().unwrap()).collect();
    let dirs: Vec<_> = nodes.nodes().iter().map(|n| n.dir().to_owned()).collect();
    assert!(pids.iter().all(|&pid| !redis_gone(pid)));
    nodes.node(1).pause().unwrap(); // a stopped process must be reaped too
    nodes.node(2).kill().unwrap();
    drop(nodes);
    for pid in pids {
        assert!(redis_gone(pid), "redis-server {pid} survived the NodeSet");
    }
    assert!(dirs.iter().all(|d| !d.exists()), "data dirs removed");
}

#[test]
fn a_panicking_test_still_reaps_its_nodes() {
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let nodes = NodeSet::start(2).await.expect("start");
            let pids: Vec<u32> = nodes.nodes().iter().filter_map(|n| n.pid()).collect();
            tx.send(pids).unwrap();
            panic!("simulated test failure");
        })
    })
    .join();
    assert!(outcome.is_err(), "the thread panicked");
    let pids = rx.recv().unwrap();
    assert_eq!(pids.len(), 2);
    for pid in pids {
        assert!(redis_gone(pid), "redis-server {pid} survived a panic");
    }
}

#[tokio::test]
async fn inspection_futures_are_send() {
    let nodes = std::sync::Arc::new(NodeSet::start(1).await.expect("start"));
    let shared = nodes.clone();
    let holding = tokio::spawn(async move {
        shared.node(0).set("k", "v", None).await.unwrap();
        shared.nodes_holding("k").await
    })
    .await
    .unwrap();
    assert_eq!(holding, vec![0]);
}

#[tokio::test]
async fn empty_set() {
    let nodes = NodeSet::start(0).await.unwrap();
    assert!(nodes.is_empty());
    assert!(nodes.urls().is_empty());
    assert!(nodes.nodes_holding("k").await.is_empty());
}

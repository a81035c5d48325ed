//! The `redlock` command with a member that is a whole cluster (`redis-cluster://`).

mod common;

use common::{assert_exit, bare, counters, output};
use redlock_testkit::ClusterSet;
use serde_json::Value;

/// `nodes` shows each cluster member's state, and `run` and `inspect` work through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_run_and_inspect_work_with_cluster_members() {
    let (one, two) = tokio::join!(ClusterSet::start(2), ClusterSet::start(1));
    let (one, two) = (one.unwrap(), two.unwrap());
    let redlock = || {
        let mut cmd = bare();
        cmd.env("REDLOCK_NODES", format!("{},{}", one.url(), two.url()));
        cmd
    };
    let out = output(redlock().args(["nodes", "--json"])).await;
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(v["quorum"], 2);
    for node in v["nodes"].as_array().unwrap() {
        assert_eq!(node["mode"], "cluster", "{node}");
        assert_eq!(node["cluster_state"], "ok", "{node}");
        assert_eq!(node["cluster_slots_ok"], 16384, "{node}");
        assert_eq!(node["cluster_fewest_replicas"], 0, "{node}");
    }
    let out = output(redlock().arg("nodes")).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.matches("cluster (state ok, 16384 of 16384 slots served)")
            .count(),
        2,
        "{text}"
    );

    let out = output(redlock().args(["run", "job", "--", "sh", "-c", "exit 3"])).await;
    assert_exit(&out, 3);
    let out = output(redlock().args(["inspect", "job", "--json"])).await;
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(v["held"], false, "{v}");
    for cluster in [&one, &two] {
        assert_eq!(cluster.dbsize().await.unwrap(), 0, "a key was left behind");
    }
}

/// `fence` with a cluster member: the member keeps one counter, on the master of the fence
/// key's slot, and shows as one node; `run --fenced` takes tokens from it, and `--raise-to`
/// raises it as a single server's. The fence key needs a hash tag there (set in the
/// configuration file); without one a fenced `run` is refused as a usage error that names
/// the key to use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_shows_and_raises_a_cluster_members_counter() {
    const COUNTER: &str = "{redlock:fencing-counter}";
    let (cluster, singles) = tokio::join!(ClusterSet::start(2), redlock_testkit::NodeSet::start(2));
    let (cluster, singles) = (cluster.unwrap(), singles.unwrap());
    let mut nodes = vec![cluster.url()];
    nodes.extend(singles.urls());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("redlock.toml");
    std::fs::write(&config, format!("fence_key = \"{COUNTER}\"\n")).unwrap();
    let redlock = |tagged: bool| {
        let mut cmd = bare();
        cmd.env("REDLOCK_NODES", nodes.join(","));
        if tagged {
            cmd.arg("--config").arg(&config);
        }
        cmd
    };
    let token =
        |out: &std::process::Output| String::from_utf8_lossy(&out.stdout).trim().to_string();
    let echo = [
        "run",
        "--fenced",
        "job",
        "--",
        "sh",
        "-c",
        "echo $REDLOCK_FENCING_TOKEN",
    ];

    let out = output(redlock(true).args(["fence", "--json"])).await;
    assert_exit(&out, 0);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(v["state"], "new", "{v}");
    let out = output(redlock(true).args(echo)).await;
    assert_exit(&out, 0);
    assert_eq!(token(&out), "1");
    // The member's counter is on the master of the key's slot, and shows as the member's.
    let master = cluster.master_of(COUNTER);
    assert_eq!(master.get(COUNTER).await.unwrap().as_deref(), Some("1"));
    let out = output(redlock(true).args(["fence", "--raise-to", "41", "--json"])).await;
    assert_exit(&out, 0);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(
        (v["state"].as_str(), v["next_token"].as_u64()),
        (Some("ok"), Some(42)),
        "{v}"
    );
    assert_eq!(counters(&v), [Some(41), Some(41), Some(41)]);
    assert_eq!(master.get(COUNTER).await.unwrap().as_deref(), Some("41"));
    let out = output(redlock(true).args(echo)).await;
    assert_exit(&out, 0);
    assert_eq!(token(&out), "42");

    // The default fence key has no hash tag: refused before anything is sent.
    let out = output(redlock(false).args(echo)).await;
    assert_exit(&out, 64);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("{redlock:fencing-counter}"), "{stderr}");
}

//! The `redlock` command with a member that is a whole cluster (`redis-cluster://`).

mod common;

use common::{assert_exit, bare, output};
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

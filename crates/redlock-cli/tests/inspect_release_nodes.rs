//! The operator's commands: `inspect` (who holds a key, as JSON), `release --token` (clean up
//! after a crashed holder) and `nodes` (each node's health).

mod common;

use common::{assert_exit, counters, first_line, output, redlock};
use redlock_testkit::NodeSet;
use serde_json::Value;

fn json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_json_shape() {
    let set = NodeSet::start(3).await.expect("nodes start");
    // Held on two nodes of three: a quorum.
    for i in [0, 1] {
        set.node(i)
            .set("redlock:report", "some-token", Some(60_000))
            .await
            .unwrap();
    }
    let out = output(redlock(&set).args(["inspect", "report", "--json"])).await;
    assert_exit(&out, 0);
    let v = json(&out);
    assert_eq!(v["key"], "redlock:report");
    assert_eq!(v["held"], true);
    assert_eq!(v["quorum"], 2);
    let remaining = v["remaining_ms"].as_u64().expect("remaining_ms");
    assert!(remaining > 0 && remaining <= 60_000, "{v}");
    let nodes = v["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 3);
    for (i, node) in nodes.iter().enumerate() {
        assert_eq!(node["node"], set.urls()[i]);
        assert_eq!(node["held"], i < 2, "{node}");
        assert_eq!(node["ttl_ms"].is_u64(), i < 2, "{node}");
        assert!(node["error"].is_null(), "{node}");
    }

    // Not held: exit 1, and the text form says so.
    let out = output(redlock(&set).args(["inspect", "nobody"])).await;
    assert_exit(&out, 1);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("redlock:nobody: not held"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_with_the_token_frees_a_key_left_by_a_crashed_holder() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    // The holder crashes: its command records the token, then SIGKILLs redlock, which so
    // never releases. The key stays for its TTL of a minute.
    let script = format!(
        "echo \"$REDLOCK_TOKEN\" > {}; kill -KILL $PPID",
        token_file.display()
    );
    let out = output(
        redlock(&set)
            .args(["run", "--ttl", "60s", "crashed", "--", "sh", "-c"])
            .arg(&script),
    )
    .await;
    assert_eq!(out.status.code(), None, "redlock was killed");
    let token = first_line(&token_file).await;
    assert_eq!(set.nodes_holding("redlock:crashed").await, [0, 1, 2]);

    // Another token removes nothing.
    let out = output(redlock(&set).args(["release", "crashed", "--token", "not-the-token"])).await;
    assert_exit(&out, 1);
    assert_eq!(set.nodes_holding("redlock:crashed").await, [0, 1, 2]);

    let out = output(redlock(&set).args(["release", "crashed", "--token", &token, "--json"])).await;
    assert_exit(&out, 0);
    let v = json(&out);
    assert_eq!(v["key"], "redlock:crashed");
    assert_eq!(v["removed"], 3);
    assert!(v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|n| n["outcome"] == "released"));
    assert!(set.nodes_holding("redlock:crashed").await.is_empty());

    // Free again at once, without waiting for the TTL.
    let out = output(redlock(&set).args(["run", "--wait", "0s", "crashed", "--", "true"])).await;
    assert_exit(&out, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_reports_each_node_and_the_quorum() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let out = output(redlock(&set).args(["nodes", "--json"])).await;
    let v = json(&out);
    assert_eq!(v["quorum"], 2);
    assert_eq!(v["reachable"], 3);
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);
    let binary = redlock_testkit::server_binary().unwrap();
    for node in nodes {
        assert_eq!(node["reachable"], true, "{node}");
        assert_eq!(node["server"], binary.name.as_str(), "{node}");
        assert_eq!(node["version"], binary.version.as_str(), "{node}");
        assert!(node["latency_ms"].as_f64().unwrap() >= 0.0);
        assert_eq!(node["role"], "master");
        assert_eq!(node["mode"], "standalone");
        assert_eq!(
            node["healthy"],
            node["problems"].as_array().unwrap().is_empty()
        );
    }
    // The test nodes run without persistence (a problem the check names): healthy or not,
    // the exit code follows the count.
    let all_healthy = v["healthy"] == 3;
    assert_exit(&out, if all_healthy { 0 } else { 1 });

    // The text names each server: "valkey 9.1.2, standalone, master, ...".
    let out = output(redlock(&set).args(["nodes"])).await;
    let text = String::from_utf8_lossy(&out.stdout);
    let named = format!("{} {}, standalone, master, ", binary.name, binary.version);
    assert_eq!(text.matches(&named).count(), 3, "{text}");

    set.node(1).kill().unwrap();
    set.node(2).kill().unwrap();
    let out = output(redlock(&set).args(["--node-timeout", "200ms", "nodes"])).await;
    assert_exit(&out, 69);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("DOWN"), "{text}");
    assert!(
        text.contains("1 of 3 nodes reachable (a lock needs 2)"),
        "{text}"
    );
}

/// A user that may not run the scripts (`+@all -@scripting`) could take a plain lock but
/// never release it: `nodes` names the commands refused and the permission to grant, on
/// each node, before any lock is taken. Before, it reported nothing about it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_names_a_missing_permission() {
    let set = NodeSet::start_with(
        3,
        redlock_testkit::NodeOptions {
            acl_users: vec!["noscripts on >pw ~* &* +@all -@scripting".into()],
            ..Default::default()
        },
    )
    .await
    .expect("nodes start");
    let nodes = || {
        let mut cmd = common::bare();
        cmd.env("REDLOCK_NODES", set.urls_as("noscripts", "pw").join(","));
        cmd
    };
    let out = output(nodes().arg("nodes")).await;
    assert_exit(&out, 1);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.matches("refuses EVALSHA, EVAL (NOPERM").count(),
        3,
        "{text}"
    );
    assert!(
        text.contains("grant the node's user `+evalsha` `+eval`"),
        "{text}"
    );
    let v = json(&output(nodes().args(["nodes", "--json"])).await);
    for node in v["nodes"].as_array().unwrap() {
        assert_eq!(node["healthy"], false, "{node}");
        assert!(
            node["problems"][0]
                .as_str()
                .unwrap()
                .contains("refuses EVALSHA, EVAL"),
            "{node}"
        );
    }
}

/// `fence` shows each node's fencing counter; after a quorum lost theirs it says so (exit
/// 1) and `--raise-to` mends it, raise-only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_shows_the_counters_and_raises_them_after_a_quorum_lost_theirs() {
    const COUNTER: &str = "redlock:fencing-counter";
    let set = NodeSet::start(3).await.expect("nodes start");
    // A new node set: tokens start at 1.
    let out = output(redlock(&set).args(["fence", "--json"])).await;
    assert_exit(&out, 0);
    let v = json(&out);
    assert_eq!(
        (v["state"].as_str(), v["next_token"].as_u64()),
        (Some("new"), Some(1)),
        "{v}"
    );
    // Node 2 kept counter 7; nodes 0 and 1 lost theirs.
    set.node(2).set(COUNTER, "7", None).await.unwrap();
    let out = output(redlock(&set).arg("fence")).await;
    assert_exit(&out, 1);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no token can be issued"), "{text}");
    assert!(text.contains("redlock fence --raise-to N"), "{text}");
    // Not retried for the 10 s wait: only an operator can mend it.
    let out = output(redlock(&set).args(["run", "--fenced", "job", "--", "true"])).await;
    assert_exit(&out, 69);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("redlock fence --raise-to"), "{stderr}");
    // The same with no wait at all: too short to tell lost counters from a first
    // write-back on its way, it says both, not "gave up waiting" (exit 75, a busy lock).
    let out =
        output(redlock(&set).args(["run", "--fenced", "--wait", "0s", "job", "--", "true"])).await;
    assert_exit(&out, 69);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("redlock fence --raise-to"), "{stderr}");
    assert!(!stderr.contains("gave up waiting"), "{stderr}");
    // Raised to 5: never below a counter a node has (a quorum of 5s would hand out 6
    // after 7), so every node gets 7; the next token is 8.
    let out = output(redlock(&set).args(["fence", "--raise-to", "5", "--json"])).await;
    assert_exit(&out, 0);
    let v = json(&out);
    assert_eq!(
        (v["state"].as_str(), v["next_token"].as_u64()),
        (Some("ok"), Some(8)),
        "{v}"
    );
    assert_eq!(counters(&v), [Some(7), Some(7), Some(7)]);
    let out = output(redlock(&set).args([
        "run",
        "--fenced",
        "job",
        "--",
        "sh",
        "-c",
        "echo $REDLOCK_FENCING_TOKEN",
    ]))
    .await;
    assert_exit(&out, 0);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "8");
    // A raise to 0, or past 2^53 (scripts compare numbers as doubles), is a usage error.
    for wrong in ["0", "9007199254740993"] {
        let out = output(redlock(&set).args(["fence", "--raise-to", wrong])).await;
        assert_exit(&out, 64);
    }
}

/// `fence --raise-to` on a node whose counter is above the maximum says that raising cannot
/// mend it (it never lowers a counter) and exits 1: it used to count the node as one that
/// did not answer, exit 69 and say to run it again once the node was back, which never
/// helps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_raise_to_says_a_counter_above_the_maximum_needs_a_hand() {
    const COUNTER: &str = "redlock:fencing-counter";
    let set = NodeSet::start(3).await.expect("nodes start");
    set.node(0)
        .set(COUNTER, "100000000000000000", None)
        .await
        .unwrap();
    let out = output(redlock(&set).args(["fence", "--raise-to", "5"])).await;
    assert_exit(&out, 1);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("set it by hand"), "{text}");
    assert!(
        !text.contains("run this again once they are back"),
        "{text}"
    );
    // The other nodes were raised.
    for i in [1, 2] {
        assert_eq!(
            set.node(i).get(COUNTER).await.unwrap().as_deref(),
            Some("5")
        );
    }
}

/// `fence` shows a node restarted from an older snapshot as stale (not counted), then the
/// repair that a fenced `run` starts while its command runs, and the node's counter after
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_shows_a_stale_counter_and_its_repair() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let run = |command: &'static str| {
        let set = &set;
        async move {
            let out =
                output(redlock(set).args(["run", "--fenced", "job", "--", "sh", "-c", command]))
                    .await;
            assert_exit(&out, 0);
        }
    };
    for _ in 0..3 {
        run("true").await;
    }
    set.node(0).save().await.unwrap();
    for _ in 0..2 {
        run("true").await;
    }
    set.node(0).restart().await.unwrap();
    let out = output(redlock(&set).args(["fence", "--json"])).await;
    assert_exit(&out, 0);
    let v = json(&out);
    assert_eq!(
        (v["state"].as_str(), v["next_token"].as_u64()),
        (Some("ok"), Some(6)),
        "{v}"
    );
    assert_eq!(v["nodes"][0]["stale"].as_u64(), Some(3), "{v}");
    assert!(v["nodes"][0]["counter"].is_null(), "{v}");
    let out = output(redlock(&set).arg("fence")).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("stale counter 3"), "{text}");
    // A fenced run finds it and repairs it while its command runs (the run that hears
    // node 0 before its decision: node 0 may answer last, and go unheard, in one run).
    let mut shown = false;
    for _ in 0..5 {
        let watch = async {
            redlock_testkit::eventually(std::time::Duration::from_millis(1500), || async {
                let out = output(redlock(&set).args(["fence", "--json"])).await;
                json(&out)["nodes"][0]["repair_ms"].as_u64().is_some()
            })
            .await
        };
        let ((), seen) = tokio::join!(run("sleep 2"), watch);
        shown |= seen;
        let out = output(redlock(&set).args(["fence", "--json"])).await;
        if json(&out)["nodes"][0]["counter"].is_u64() {
            break;
        }
    }
    assert!(shown, "no repair in progress was shown");
    let out = output(redlock(&set).args(["fence", "--json"])).await;
    let v = json(&out);
    // Repaired to the highest token of the others (6 or more: one per run).
    assert!(v["nodes"][0]["counter"].as_u64() >= Some(6), "{v}");
    assert_eq!(v["nodes"][0]["counter"], v["nodes"][1]["counter"], "{v}");
    assert!(v["nodes"][0]["repair_ms"].is_null(), "{v}");
}

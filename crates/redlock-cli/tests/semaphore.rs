//! `redlock run --permits K` and `redlock inspect --permits K`: a semaphore's permits from
//! the command line; `redlock run --read` and `--write`: a read-write lock's sides.

mod common;

use common::{assert_exit, output, redlock};
use redlock_testkit::NodeSet;

const PERMIT: &str = "redlock:semaphore-{jobs}:";

/// Holds permit `i` of `jobs` on every node under another token, as another holder would.
async fn hold(set: &NodeSet, i: u32) {
    for node in set.nodes() {
        node.set(&format!("{PERMIT}{i}"), "other", Some(60_000))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_runs_under_a_free_permit_and_waits_when_none_is() {
    let set = NodeSet::start(3).await.expect("nodes start");
    hold(&set, 1).await;
    let out = output(redlock(&set).args([
        "run",
        "--permits",
        "2",
        "jobs",
        "--",
        "sh",
        "-c",
        "echo \"$REDLOCK_PERMIT|$REDLOCK_KEY\"",
    ]))
    .await;
    assert_exit(&out, 0);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("2|{PERMIT}2")
    );
    // Released after the command: only the other holder's permit is left.
    for node in set.nodes() {
        assert_eq!(node.keys("*").await.unwrap(), [format!("{PERMIT}1")]);
    }

    let out = output(redlock(&set).args(["inspect", "--permits", "2", "jobs"])).await;
    assert_exit(&out, 0);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("redlock:semaphore-{jobs}: 1 of 2 permits held"),
        "{text}"
    );

    hold(&set, 2).await;
    let out = output(redlock(&set).args([
        "run",
        "--permits",
        "2",
        "--wait",
        "0s",
        "jobs",
        "--",
        "true",
    ]))
    .await;
    assert_exit(&out, 75);
    let out = output(redlock(&set).args(["inspect", "--permits", "2", "--json", "jobs"])).await;
    assert_exit(&out, 0);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["held"], 2);
    assert_eq!(json["each"][1]["key"], format!("{PERMIT}2"));

    for node in set.nodes() {
        for i in 1..=2 {
            node.set(&format!("{PERMIT}{i}"), "other", Some(1))
                .await
                .unwrap();
        }
    }
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let out = output(redlock(&set).args(["inspect", "--permits", "2", "jobs"])).await;
    assert_exit(&out, 1);
    // Zero permits is a usage error.
    let out = output(redlock(&set).args(["run", "--permits", "0", "jobs", "--", "true"])).await;
    assert_exit(&out, 64);
}

/// `redlock run --read` and `--write`: readers run together, a writer alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_run_together_and_a_writer_waits_for_them() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let out = output(redlock(&set).args([
        "run",
        "--read",
        "doc",
        "--",
        "sh",
        "-c",
        "echo \"$REDLOCK_KEY\"",
    ]))
    .await;
    assert_exit(&out, 0);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "redlock:rwlock-{doc}:read"
    );
    // A writer held by another process keeps readers and writers out.
    for node in set.nodes() {
        node.set("redlock:rwlock-{doc}:write", "other", Some(60_000))
            .await
            .unwrap();
    }
    let out = output(redlock(&set).args(["inspect", "--rw", "doc"])).await;
    assert_exit(&out, 0);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("redlock:rwlock-{doc}: 0 reader(s) on a quorum")
            && text.contains("redlock:rwlock-{doc}:write: held"),
        "{text}"
    );
    for side in ["--read", "--write"] {
        let out =
            output(redlock(&set).args(["run", side, "--wait", "0s", "doc", "--", "true"])).await;
        assert_exit(&out, 75);
    }
    let out = output(redlock(&set).args(["run", "--read", "--write", "doc", "--", "true"])).await;
    assert_exit(&out, 64);
}

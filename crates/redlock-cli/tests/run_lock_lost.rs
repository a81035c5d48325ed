//! A lock lost while the command runs stops the command, and what it started, and
//! `redlock` exits 76.

mod common;

use common::{assert_exit, first_line, output, redlock, running};
use redlock_testkit::NodeSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_deleted_on_every_node_stop_the_command() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let bg_file = dir.path().join("bg");
    // The command records its pid, starts a background sleep (a process it started), and
    // becomes a `sleep 60` itself.
    let script = format!(
        "echo $$ > {pid}; sleep 60 & echo $! > {bg}; exec sleep 60",
        pid = pid_file.display(),
        bg = bg_file.display()
    );
    let mut cmd = redlock(&set);
    // A short TTL: renewal every second, so the loss is noticed soon after the keys go.
    cmd.args([
        "run", "--ttl", "3s", "--grace", "10s", "doomed", "--", "sh", "-c",
    ])
    .arg(&script);
    let run = tokio::spawn(async move { output(&mut cmd).await });

    let pid: i32 = first_line(&pid_file).await.parse().unwrap();
    let bg: i32 = first_line(&bg_file).await.parse().unwrap();
    assert!(running(pid) && running(bg));
    // Someone removes the lock behind the holder's back (FLUSHALL, an operator's DEL).
    for node in set.iter() {
        node.del("redlock:doomed").await.unwrap();
    }

    let out = run.await.unwrap();
    assert_exit(&out, 76);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lost"), "{stderr}");
    assert!(stderr.contains("the command was stopped"), "{stderr}");
    // `redlock` waited for the command before exiting; the background sleep got the
    // signal with it (same process group) and is gone too.
    assert!(!running(pid), "the command survived");
    assert!(
        common::eventually(|| async move { !running(bg) }).await,
        "what the command started survived"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let script = format!(
        "trap '' TERM; echo $$ > {ready}; while :; do sleep 0.1; done",
        ready = ready.display()
    );
    let mut cmd = redlock(&set);
    cmd.args([
        "run", "--ttl", "3s", "--grace", "1s", "stubborn", "--", "sh", "-c",
    ])
    .arg(&script);
    let run = tokio::spawn(async move { output(&mut cmd).await });
    let pid: i32 = first_line(&ready).await.parse().unwrap();
    for node in set.iter() {
        node.del("redlock:stubborn").await.unwrap();
    }
    let out = run.await.unwrap();
    assert_exit(&out, 76);
    assert!(!running(pid));
}

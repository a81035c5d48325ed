//! A lock lost while the command runs stops the command, and what it started, and
//! `redlock` exits 76; a lock that cannot be renewed stops it before its validity ends.

mod common;

use common::{assert_exit, bare, first_line, linked, output, redlock, running};
use redlock_testkit::{LinkFault, NodeSet};

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
        "run", "--ttl", "3s", "--grace", "1s", "doomed", "--", "sh", "-c",
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

/// The command must not outlive the lock: when renewal fails (every node cut off), the
/// command gets SIGTERM a grace period before the validity ends and SIGKILL when it ends,
/// so it is gone while the keys are still on the nodes, before anyone else can take the
/// lock. It used to be stopped only once the validity had run out, and killed a grace
/// period after that: a command that ignores SIGTERM ran a whole grace period unlocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_lock_cannot_be_renewed_is_gone_before_the_lock_expires() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let links = linked(&set).await;
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let script = format!(
        "trap '' TERM; echo $$ > {ready}; while :; do sleep 0.1; done",
        ready = ready.display()
    );
    let mut cmd = bare();
    cmd.env("REDLOCK_NODES", links.urls(0).join(","));
    // A drift allowance of 0.6 s (a fifth of the TTL): the keys outlive the holder's
    // validity by at least that much on every node, a margin that no scheduling delay of
    // the SIGKILL on a loaded machine comes near.
    cmd.args([
        "run",
        "--ttl",
        "3s",
        "--drift-factor",
        "0.2",
        "--grace",
        "1s",
        "cut-off",
        "--",
        "sh",
        "-c",
    ])
    .arg(&script);
    let run = tokio::spawn(async move { output(&mut cmd).await });
    let pid: i32 = first_line(&ready).await.parse().unwrap();

    links.set_client(0, LinkFault::Blackhole);
    assert!(
        common::eventually(|| async move { !running(pid) }).await,
        "the command was never stopped"
    );
    let holding = set.nodes_holding("redlock:cut-off").await;
    assert!(
        holding.len() >= 2,
        "the command ran until the keys were gone from all but {holding:?}: it outlived the lock"
    );
    links.heal_all();
    let out = run.await.unwrap();
    assert_exit(&out, 76);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("the command was stopped"), "{stderr}");
    // Why: the last renewal's report, which names the nodes that did not answer.
    assert!(stderr.contains("renewal did not extend it"), "{stderr}");
    assert!(stderr.contains(&links.urls(0)[0]), "{stderr}");
}

/// A lock whose renewal stopped at `renewal.max_hold` stops its command before its validity
/// ends, and the error says so: it used to say the key was removed ("find out what removed
/// the key"), though nothing had removed it and every node was healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_stopped_at_max_hold_is_told_why() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("redlock.toml");
    let nodes: Vec<String> = set.urls().iter().map(|u| format!("\"{u}\"")).collect();
    std::fs::write(
        &file,
        format!(
            "nodes = [{}]\n[renewal]\nmax_hold = \"3s\"\n",
            nodes.join(", ")
        ),
    )
    .unwrap();
    let out = output(bare().arg("-c").arg(&file).args([
        "run",
        "--ttl",
        "3s",
        "--grace",
        "300ms",
        "held-long",
        "--",
        "sleep",
        "30",
    ]))
    .await;
    assert_exit(&out, 76);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("max_hold"), "{stderr}");
    assert!(!stderr.contains("removed the key"), "{stderr}");
}

/// A `--grace` that does not fit between two renewals would stop every command while its
/// lock is healthy: it is refused before anything connects, saying what to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grace_longer_than_the_lock_leaves_is_a_config_error() {
    let set = NodeSet::start(1).await.expect("nodes start");
    let mut cmd = redlock(&set);
    cmd.args(["run", "--ttl", "3s", "--grace", "2s", "k", "--", "true"]);
    let out = output(&mut cmd).await;
    assert_exit(&out, 78);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--grace (2s)"), "{stderr}");
    assert!(stderr.contains("lower --grace or raise --ttl"), "{stderr}");
    assert_eq!(set.nodes_holding("redlock:k").await, Vec::<usize>::new());
}

/// `redlock` stopped (SIGSTOP, a VM pause, a starved machine) past the lock's validity:
/// when it runs again, both the timer of the grace period's start and the loss signal are
/// due at once, and the command must be killed at once, nothing of the validity being left.
/// It used to depend on which of the two `tokio::select!` happened to poll first: the loss
/// signal, most often, gave the command a whole grace period (6 s here) without the lock.
/// Two runs at once, so that the old race lost in either shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_is_killed_at_once_when_redlock_resumes_after_its_lock_expired() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let (a, b) = tokio::join!(stalled(&set, "stalled-a"), stalled(&set, "stalled-b"));
    for (key, (after, out)) in [("stalled-a", a), ("stalled-b", b)] {
        assert_exit(&out, 76);
        assert!(
            after < std::time::Duration::from_secs(3),
            "{key}: the command ran {after:?} after redlock resumed with its lock expired; \
             it should have been killed at once, not given the 6 s grace period"
        );
    }
}

/// Runs a command that ignores SIGTERM under `key` (TTL 10 s, grace 6 s), stops `redlock`
/// for 11 s, resumes it and returns how long the command ran on after that, and `redlock`'s
/// output.
async fn stalled(set: &NodeSet, key: &str) -> (std::time::Duration, std::process::Output) {
    use nix::sys::signal::{kill, Signal};
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let script = format!(
        "trap '' TERM; echo $$ > {ready}; while :; do sleep 0.1; done",
        ready = ready.display()
    );
    let mut cmd = redlock(set);
    cmd.args([
        "run", "--ttl", "10s", "--grace", "6s", key, "--", "sh", "-c",
    ])
    .arg(&script)
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    let redlock_pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    let run = tokio::spawn(async move {
        tokio::time::timeout(common::PATIENCE, child.wait_with_output())
            .await
            .unwrap()
            .unwrap()
    });
    let pid: i32 = first_line(&ready).await.parse().unwrap();
    kill(redlock_pid, Signal::SIGSTOP).unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(11)).await;
    assert!(
        set.nodes_holding(&format!("redlock:{key}"))
            .await
            .is_empty(),
        "the keys outlived their TTL"
    );
    kill(redlock_pid, Signal::SIGCONT).unwrap();
    let resumed = std::time::Instant::now();
    assert!(
        common::eventually(|| async move { !running(pid) }).await,
        "the command was never stopped"
    );
    let after = resumed.elapsed();
    (after, run.await.unwrap())
}

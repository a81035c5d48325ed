//! Each way `redlock run` ends has its own exit code (the table in the crate README).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::{
    assert_exit, bare, closed_ports, code_with_stderr_closed, first_line, linked, output, redlock,
};
use redlock_testkit::{LinkFault, NodeSet};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commands_own_code_and_signal_pass_through_and_the_lock_is_released() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let out = output(redlock(&set).args(["run", "job", "--", "sh", "-c", "exit 3"])).await;
    assert_exit(&out, 3);
    let out = output(redlock(&set).args(["run", "job", "--", "sh", "-c", "kill -TERM $$"])).await;
    assert_exit(&out, 128 + 15);
    let out = output(redlock(&set).args(["run", "job", "--", "true"])).await;
    assert_exit(&out, 0);
    // Quiet in scripts: nothing on stderr when all went well.
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    assert!(set.nodes_holding("redlock:job").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_by_another_is_not_acquired_within_the_wait() {
    let set = NodeSet::start(3).await.expect("nodes start");
    for node in set.iter() {
        node.set("redlock:busy", "another-holder", Some(60_000))
            .await
            .unwrap();
    }
    let out = output(redlock(&set).args(["run", "--wait", "300ms", "busy", "--", "true"])).await;
    assert_exit(&out, 75);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("held by another owner"), "{stderr}");
    // The other holder's lock is untouched.
    assert_eq!(set.nodes_holding("redlock:busy").await, [0, 1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_signal_is_passed_on_and_the_lock_released() {
    use nix::sys::signal::Signal;
    let set = NodeSet::start(3).await.expect("nodes start");
    // Each signal has its own trap and exit code, so the code tells which one arrived.
    // Outside a terminal's foreground (as here) the command has a process group of its own,
    // so SIGINT and SIGQUIT are passed on too (child.rs). SIGQUIT, SIGUSR1, SIGUSR2 and
    // SIGALRM used to be left at their default action, which ended `redlock` itself and
    // left the command running with nobody renewing its lock.
    for (signal, code) in [
        (Signal::SIGINT, 10),
        (Signal::SIGTERM, 11),
        (Signal::SIGHUP, 12),
        (Signal::SIGQUIT, 13),
        (Signal::SIGUSR1, 14),
        (Signal::SIGUSR2, 15),
        (Signal::SIGALRM, 16),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let script = format!(
            "trap 'exit 10' INT; trap 'exit 11' TERM; trap 'exit 12' HUP; trap 'exit 13' QUIT; \
             trap 'exit 14' USR1; trap 'exit 15' USR2; trap 'exit 16' ALRM; \
             echo up > {}; while :; do sleep 0.1; done",
            ready.display()
        );
        let key = format!("signalled-{}", signal.as_str());
        let mut cmd = redlock(&set);
        cmd.args(["run", &key, "--", "sh", "-c"])
            .arg(&script)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let child = cmd.spawn().unwrap();
        let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
        let run = tokio::spawn(async move {
            tokio::time::timeout(common::PATIENCE, child.wait_with_output())
                .await
                .unwrap()
                .unwrap()
        });
        first_line(&ready).await;
        nix::sys::signal::kill(pid, signal).unwrap();
        let out = run.await.unwrap();
        // The command's trap for that signal ran (it got the signal) and its code came back.
        assert_exit(&out, code);
        assert!(
            set.nodes_holding(&format!("redlock:{key}"))
                .await
                .is_empty(),
            "{signal}: the lock was not released"
        );
    }
}

/// `nohup redlock run ...`: a signal `redlock` was started with ignored stays ignored, for
/// `redlock` and for the command, which inherits it. `redlock` used to listen for it
/// anyway (undoing the ignoring) and pass it on to the command, which then started with
/// it at its default action: the logout's SIGHUP ended a `nohup` job (exit 129).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_ignored_at_start_stays_ignored() {
    use nix::sys::signal::{kill, Signal};
    let set = NodeSet::start(3).await.expect("nodes start");
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let done = dir.path().join("done");
    // The command has no trap: SIGHUP at its default action would end it with 129.
    let script = format!(
        "echo up > {ready}; while [ ! -e {done} ]; do sleep 0.1; done; exit 3",
        ready = ready.display(),
        done = done.display()
    );
    // `trap '' HUP` in the shell that execs `redlock`: what `nohup` does.
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg("trap '' HUP; exec \"$@\"")
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_redlock"))
        .args(["run", "nohup-job", "--", "sh", "-c"])
        .arg(&script)
        .env("REDLOCK_NODES", set.urls().join(","))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    common::default_signals(&mut cmd);
    let child = cmd.spawn().unwrap();
    // `exec`: the shell's pid is `redlock`'s.
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    let run = tokio::spawn(async move {
        tokio::time::timeout(common::PATIENCE, child.wait_with_output())
            .await
            .unwrap()
            .unwrap()
    });
    first_line(&ready).await;
    kill(pid, Signal::SIGHUP).unwrap();
    // Time for a SIGHUP passed on to reach the command and end it, if it were.
    tokio::time::sleep(Duration::from_millis(500)).await;
    std::fs::write(&done, "").unwrap();
    let out = run.await.unwrap();
    assert_exit(&out, 3);
    assert!(set.nodes_holding("redlock:nohup-job").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_unexecutable_command_is_127_or_126_and_releases() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let out = output(redlock(&set).args(["run", "nocmd", "--", "/nonexistent/command"])).await;
    assert_exit(&out, 127);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not found"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = output(redlock(&set).args(["run", "nocmd", "--"]).arg(&script)).await;
    assert_exit(&out, 126);
    assert!(set.nodes_holding("redlock:nocmd").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_nodes_are_69() {
    let nodes: Vec<String> = closed_ports(3)
        .into_iter()
        .map(|port| format!("redis://127.0.0.1:{port}"))
        .collect();
    let out = output(bare().args([
        "--nodes",
        &nodes.join(","),
        "--node-timeout",
        "200ms",
        "run",
        "--wait",
        "300ms",
        "k",
        "--",
        "true",
    ]))
    .await;
    assert_exit(&out, 69);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("reachable"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_and_usage_errors() {
    let set = NodeSet::start(3).await.expect("nodes start");
    // A TTL the library refuses: 78, with the library's reason.
    let out = output(redlock(&set).args(["run", "--ttl", "0s", "k", "--", "true"])).await;
    assert_exit(&out, 78);
    assert!(String::from_utf8_lossy(&out.stderr).contains("TTL is zero"));
    // No nodes anywhere: 78.
    let out = output(bare().args(["run", "k", "--", "true"])).await;
    assert_exit(&out, 78);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no Redis nodes configured"));
    // A file with an unknown field: 78, naming the file and the field.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("redlock.toml");
    std::fs::write(&file, "ttl_ms = 30000\n").unwrap();
    let out = output(
        redlock(&set)
            .arg("--config")
            .arg(&file)
            .args(["run", "k", "--", "true"]),
    )
    .await;
    assert_exit(&out, 78);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("redlock.toml") && stderr.contains("unknown field"),
        "{stderr}"
    );
    // A password in a node URL never shows.
    let out = output(bare().args([
        "--nodes",
        "redis://:s3cret@127.0.0.1:1,redis://:s3cret@127.0.0.1:1",
        "run",
        "k",
        "--",
        "true",
    ]))
    .await;
    assert_exit(&out, 78);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("s3cret"));
    // Usage: no command, an unknown flag, a bad duration: 64.
    for args in [
        &["run", "k"][..],
        &["run", "--bogus", "k", "--", "true"][..],
        &["run", "--wait", "soon", "k", "--", "true"][..],
    ] {
        let out = output(redlock(&set).args(args)).await;
        assert_exit(&out, 64);
    }
    // An argument the library refuses (an empty key): 64, with the library's reason; a
    // configuration error (above) is 78.
    let out = output(redlock(&set).args(["run", "", "--", "true"])).await;
    assert_exit(&out, 64);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the lock key is empty") && stderr.contains("fix the argument"),
        "{stderr}"
    );
    // Help is no error, and does not show the password in REDLOCK_NODES.
    let out = output(
        bare()
            .env("REDLOCK_NODES", "redis://:s3cret@127.0.0.1:1")
            .arg("--help"),
    )
    .await;
    assert_exit(&out, 0);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("Exit codes:") && help.contains("Examples:"),
        "{help}"
    );
    assert!(!help.contains("s3cret"), "{help}");
}

/// Nothing `redlock` writes to stderr (errors, warnings, `-v` logs) may change how it ends:
/// with stderr closed it used to panic at its first message (exit 101), before a `run`
/// could release its lock or a failure report its own code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stderr_changes_no_exit_code_and_leaves_no_lock() {
    let set = NodeSet::start(3).await.expect("nodes start");
    // An error message: the configuration's code.
    let code =
        code_with_stderr_closed(redlock(&set).args(["run", "--ttl", "0s", "k", "--", "true"]))
            .await;
    assert_eq!(code, Some(78));
    // Logs on every step of a whole run: the command's code, and the lock released.
    let code = code_with_stderr_closed(
        redlock(&set).args(["-vvv", "run", "job", "--", "sh", "-c", "exit 3"]),
    )
    .await;
    assert_eq!(code, Some(3));
    assert!(set.nodes_holding("redlock:job").await.is_empty());
    // A lock not acquired within the wait, with logs: 75, the other holder untouched.
    for node in set.iter() {
        node.set("redlock:busy", "another-holder", Some(60_000))
            .await
            .unwrap();
    }
    let code = code_with_stderr_closed(
        redlock(&set).args(["-vv", "run", "--wait", "300ms", "busy", "--", "true"]),
    )
    .await;
    assert_eq!(code, Some(75));
    assert_eq!(set.nodes_holding("redlock:busy").await, [0, 1, 2]);
    // Unreachable nodes, with fred's own logs too: 69.
    let nodes: Vec<String> = closed_ports(3)
        .into_iter()
        .map(|port| format!("redis://127.0.0.1:{port}"))
        .collect();
    let code =
        code_with_stderr_closed(bare().args(["-vv", "--nodes", &nodes.join(","), "nodes"])).await;
    assert_eq!(code, Some(69));
}

/// A lock won with less validity than the configured minimum, on nodes that all answered,
/// is "not acquired within the wait" (75), not "nodes unavailable" (69, which it used to
/// be): scripts that page someone for 69 must not for slow rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_won_below_the_minimum_validity_is_not_acquired() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let links = linked(&set).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("redlock.toml");
    // A round leaves at most 988 ms of a 1 s TTL; every round through these links takes
    // at least 20 ms, so none leaves the 985 ms asked for.
    std::fs::write(&config, "ttl = \"1s\"\nmin_validity = \"985ms\"\n").unwrap();
    links.set_client(
        0,
        LinkFault::Latency {
            to_server: Duration::from_millis(10),
            to_client: Duration::from_millis(10),
        },
    );
    let mut cmd = bare();
    cmd.env("REDLOCK_NODES", links.urls(0).join(","))
        .arg("--config")
        .arg(&config)
        .args(["run", "--wait", "0s", "slow", "--", "true"]);
    let out = output(&mut cmd).await;
    assert_exit(&out, 75);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("less than the minimum"), "{stderr}");
    links.heal_all();
    assert!(
        common::eventually(|| async { set.nodes_holding("redlock:slow").await.is_empty() }).await,
        "the short win was left on the nodes"
    );
}

/// Nodes that refuse the commands (an ACL user without `set` or the scripts) are
/// "unavailable" (69), found at connect before any lock is taken, and the message says
/// what the nodes answered and which commands the lock needs, not only to check that they
/// are running and reachable, which they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_refuse_the_commands_are_69_and_say_why() {
    let set = NodeSet::start_with(
        3,
        redlock_testkit::NodeOptions {
            acl_users: vec!["nowrite on >pw resetchannels ~* -@all +ping +info +client|id +subscribe +psubscribe".into()],
            ..Default::default()
        },
    )
    .await
    .expect("nodes start");
    let out = output(
        bare()
            .env("REDLOCK_NODES", set.urls_as("nowrite", "pw").join(","))
            .args(["run", "--wait", "0s", "refused", "--", "true"]),
    )
    .await;
    assert_exit(&out, 69);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refuse EVALSHA, EVAL (NOPERM"), "{stderr}");
    assert!(stderr.contains("`+evalsha` `+eval`"), "{stderr}");
    assert!(
        stderr.contains("`redlock nodes` shows each node"),
        "{stderr}"
    );
    assert!(!stderr.contains("pw@"), "{stderr}");
}

/// A command that succeeded, but whose lock's release failed on a quorum (here the user
/// lost the scripts while the command ran, as an operator's ACL change would do), exits 69,
/// not 0: the key stays until its TTL, and a caller that reads 0 as "done, the lock is
/// free" would be wrong. Before, `redlock run` exited 0 with a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refused_by_a_quorum_is_not_a_success() {
    let set = NodeSet::start_with(
        3,
        redlock_testkit::NodeOptions {
            acl_users: vec!["locker on >pw ~* &* +@all".into()],
            ..Default::default()
        },
    )
    .await
    .expect("nodes start");
    let cli = redlock_testkit::find_redis_cli().expect("redis-cli");
    let revoke = set
        .iter()
        .map(|node| {
            format!(
                "'{}' -p {} ACL SETUSER locker -@scripting >/dev/null",
                cli.display(),
                node.port()
            )
        })
        .collect::<Vec<_>>()
        .join(" && ");
    let out = output(
        bare()
            .env("REDLOCK_NODES", set.urls_as("locker", "pw").join(","))
            .args(["run", "--ttl", "60s", "revoked", "--", "sh", "-c", &revoke]),
    )
    .await;
    assert_exit(&out, 69);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("could not confirm the release of \"redlock:revoked\""),
        "{stderr}"
    );
    assert!(stderr.contains("NOPERM"), "{stderr}");
    assert!(!stderr.contains("pw@"), "{stderr}");
    // Said once, as the error (not also as a warning).
    assert_eq!(stderr.matches("could not confirm").count(), 1, "{stderr}");
    assert_eq!(set.nodes_holding("redlock:revoked").await, [0, 1, 2]);
}

//! What the CLI tests share: the built `redlock` binary pointed at a node set, and waiting
//! for what only the mechanism under test can make true.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use redlock_testkit::NodeSet;
use tokio::process::Command;

/// Long enough for anything these tests wait for on a loaded 2-core machine: a guard
/// against hanging, never a statement about speed.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// `redlock` with the nodes of `set` in `REDLOCK_NODES` and every other `REDLOCK_*`
/// variable of the test's own environment removed, so that only what a test sets counts.
pub fn redlock(set: &NodeSet) -> Command {
    let mut cmd = bare();
    cmd.env("REDLOCK_NODES", set.urls().join(","));
    cmd
}

/// One client's fault-proxy links to every node of `set` (their URLs: `links.urls(0)`).
pub async fn linked(set: &NodeSet) -> redlock_testkit::Links {
    use redlock_testkit::Nodes;
    redlock_testkit::Links::start(1, &set.addrs())
        .await
        .expect("fault proxies start")
}

/// `redlock` with no nodes configured and a clean `REDLOCK_*` environment.
pub fn bare() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_redlock"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("REDLOCK_") {
            cmd.env_remove(name);
        }
    }
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    default_signals(&mut cmd);
    cmd
}

/// Starts `cmd` with every signal `redlock` passes on at its default action. A test run in
/// the background of a script (`cargo test &`, `nohup`) inherits SIGINT, SIGQUIT or SIGHUP
/// ignored, and `redlock` leaves a signal ignored at its start ignored (as it should): the
/// tests that send those signals would then wait for nothing.
pub fn default_signals(cmd: &mut Command) {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: between fork and exec only `sigaction` (async-signal-safe) runs, and it
    // touches no memory of the parent's.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [
                Signal::SIGINT,
                Signal::SIGTERM,
                Signal::SIGHUP,
                Signal::SIGQUIT,
                Signal::SIGUSR1,
                Signal::SIGUSR2,
                Signal::SIGALRM,
            ] {
                signal(sig, SigHandler::SigDfl).map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
}

/// Runs `cmd` to the end (within [`PATIENCE`]) and returns what it printed.
pub async fn output(cmd: &mut Command) -> Output {
    tokio::time::timeout(PATIENCE, cmd.output())
        .await
        .expect("redlock finished")
        .expect("redlock started")
}

/// Runs `cmd` to the end (within [`PATIENCE`]) with its stderr a pipe whose reading end is
/// already closed (a log reader that went away), so that every write to stderr fails, and
/// its stdout discarded. Returns the exit code.
pub async fn code_with_stderr_closed(cmd: &mut Command) -> Option<i32> {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(writer)
        .spawn()
        .expect("redlock started");
    // The writing end was moved into the child's set-up; the command holds no copy now.
    tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("redlock finished")
        .expect("redlock's status")
        .code()
}

/// The exit code, with stdout and stderr in the message when it is not `expected`.
pub fn assert_exit(out: &Output, expected: i32) {
    assert_eq!(
        out.status.code(),
        Some(expected),
        "exit status {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
}

/// Polls `check` every 20 ms until it holds, for at most [`PATIENCE`]. Returns whether it
/// held.
pub async fn eventually<F, Fut>(check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    redlock_testkit::eventually(PATIENCE, check).await
}

/// Waits until `path` exists and has a line, and returns its first line.
pub async fn first_line(path: &Path) -> String {
    let mut line = String::new();
    let found = eventually(|| {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let done = text.ends_with('\n');
        line = text.lines().next().unwrap_or_default().to_string();
        async move { done }
    })
    .await;
    assert!(found, "{} was never written", path.display());
    line
}

/// Whether process `pid` is still running (a zombie has stopped running).
pub fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses: "pid (comm) S ...".
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// `n` distinct loopback ports where nothing listens (bound together, so distinct, then
/// closed).
pub fn closed_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("its address").port())
        .collect()
}

/// Each node's fencing counter in `fence --json`'s output (`None` for a node without one).
pub fn counters(fence: &serde_json::Value) -> Vec<Option<u64>> {
    fence["nodes"]
        .as_array()
        .map(|nodes| nodes.iter().map(|n| n["counter"].as_u64()).collect())
        .unwrap_or_default()
}

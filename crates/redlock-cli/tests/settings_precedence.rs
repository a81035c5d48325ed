//! Settings come from flags, then the environment, then the configuration file.

mod common;

use std::time::{Duration, Instant};

use common::{assert_exit, bare, first_line, output, redlock, running};
use redlock_testkit::NodeSet;

/// A configuration file (in a directory removed with the returned guard) with `set`'s
/// nodes and `rest`.
fn config_file(set: &NodeSet, rest: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("redlock.toml");
    let nodes: Vec<String> = set.urls().iter().map(|u| format!("\"{u}\"")).collect();
    std::fs::write(&file, format!("nodes = [{}]\n{rest}", nodes.join(", "))).unwrap();
    (dir, file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_override_the_environment_which_overrides_the_file() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let (_dir, file) = config_file(&set, "key_prefix = \"file:\"\n");
    let key_of = |out: std::process::Output| {
        assert_exit(&out, 0);
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let print_key = ["run", "k", "--", "sh", "-c", "echo $REDLOCK_KEY"];
    // The file alone: its nodes and prefix.
    let out = output(bare().env("REDLOCK_CONFIG", &file).args(print_key)).await;
    assert_eq!(key_of(out), "file:k");
    // The environment over the file.
    let out = output(
        bare()
            .env("REDLOCK_CONFIG", &file)
            .env("REDLOCK_KEY_PREFIX", "env:")
            .args(print_key),
    )
    .await;
    assert_eq!(key_of(out), "env:k");
    // A flag over the environment.
    let out = output(
        bare()
            .env("REDLOCK_CONFIG", &file)
            .env("REDLOCK_KEY_PREFIX", "env:")
            .args(["--key-prefix", "flag:"])
            .args(print_key),
    )
    .await;
    assert_eq!(key_of(out), "flag:k");
}

/// `run`'s own settings each have a variable: REDLOCK_TTL, REDLOCK_WAIT, REDLOCK_FENCED and
/// REDLOCK_GRACE, each seen in what the run does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_settings_are_read_from_the_environment() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let redlock_bin = env!("CARGO_BIN_EXE_redlock");
    // The command prints its fencing token, then what `redlock inspect` says of its own
    // lock: the TTL the lock was taken with shows as each node's PTTL.
    let fence_and_inspect = format!(
        "echo \"[${{REDLOCK_FENCING_TOKEN-unset}}]\"; '{redlock_bin}' inspect env-run --json"
    );
    let run = |ttl: Option<&str>, fenced: &str| {
        let mut cmd = redlock(&set);
        if let Some(ttl) = ttl {
            cmd.env("REDLOCK_TTL", ttl);
        }
        cmd.env("REDLOCK_FENCED", fenced)
            .args(["run", "env-run", "--", "sh", "-c"])
            .arg(&fence_and_inspect);
        cmd
    };
    let parse = |out: std::process::Output| {
        assert_exit(&out, 0);
        let stdout = String::from_utf8(out.stdout).unwrap();
        let (fence, json) = stdout.split_once('\n').expect("two parts");
        let json: serde_json::Value = serde_json::from_str(json).expect("inspect's JSON");
        let ttls: Vec<u64> = json["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["ttl_ms"].as_u64().expect("held on every node"))
            .collect();
        (fence.to_string(), ttls)
    };

    // REDLOCK_TTL=7s and REDLOCK_FENCED=1: a 7 s lock (the default is 30 s), and a fencing
    // token for the command.
    let (fence, ttls) = parse(output(&mut run(Some("7s"), "1")).await);
    let token: u64 = fence.trim_matches(['[', ']']).parse().expect(&fence);
    assert!(token >= 1, "{fence}");
    assert!(ttls.iter().all(|&t| t > 0 && t <= 7_000), "{ttls:?}");
    // Without them: the default TTL, and REDLOCK_FENCED=0 gives no token.
    let (fence, ttls) = parse(output(&mut run(None, "0")).await);
    assert_eq!(fence, "[unset]");
    assert!(ttls.iter().all(|&t| t > 7_000 && t <= 30_000), "{ttls:?}");

    // REDLOCK_WAIT=300ms on a key another holder has: not acquired (75) well before the
    // default wait (10 s) would have ended.
    for node in set.iter() {
        node.set("redlock:busy", "another-holder", Some(60_000))
            .await
            .unwrap();
    }
    let started = Instant::now();
    let out = output(
        redlock(&set)
            .env("REDLOCK_WAIT", "300ms")
            .args(["run", "busy", "--", "true"]),
    )
    .await;
    assert_exit(&out, 75);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    // REDLOCK_GRACE=200ms: a command that ignores SIGTERM is killed 200 ms after the lock is
    // lost, not the default 5 s.
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let script = format!(
        "trap '' TERM; echo $$ > {}; while :; do sleep 0.1; done",
        ready.display()
    );
    let mut cmd = redlock(&set);
    cmd.env("REDLOCK_GRACE", "200ms")
        .args(["-v", "run", "--ttl", "3s", "stubborn", "--", "sh", "-c"])
        .arg(&script);
    let run = tokio::spawn(async move { output(&mut cmd).await });
    let pid: i32 = first_line(&ready).await.parse().unwrap();
    for node in set.iter() {
        node.del("redlock:stubborn").await.unwrap();
    }
    let lost = Instant::now();
    let out = run.await.unwrap();
    assert_exit(&out, 76);
    assert!(!running(pid));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("grace=200ms"), "{stderr}");
    // Found lost at the next renewal (every third of the TTL: 1 s), then 200 ms of grace;
    // with the default grace the SIGKILL alone would come 5 s after the SIGTERM.
    assert!(
        lost.elapsed() < Duration::from_secs(5),
        "{:?}",
        lost.elapsed()
    );
}

/// `fencing = true` in the file is turned off by `REDLOCK_FENCED=false` or
/// `--fenced=false`, as every other setting is by the environment or a flag: the flag and
/// the variable could only turn fencing on before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_from_the_file_can_be_turned_off_by_the_environment_or_a_flag() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let (_dir, file) = config_file(&set, "fencing = true\n");
    let token = |out: std::process::Output| {
        assert_exit(&out, 0);
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let print = ["sh", "-c", "echo \"[${REDLOCK_FENCING_TOKEN-unset}]\""];
    let out = output(
        bare()
            .env("REDLOCK_CONFIG", &file)
            .args(["run", "f", "--"])
            .args(print),
    )
    .await;
    assert_ne!(token(out), "[unset]", "the file's fencing = true");
    let out = output(
        bare()
            .env("REDLOCK_CONFIG", &file)
            .env("REDLOCK_FENCED", "false")
            .args(["run", "f", "--"])
            .args(print),
    )
    .await;
    assert_eq!(token(out), "[unset]", "REDLOCK_FENCED=false");
    let out = output(
        bare()
            .env("REDLOCK_CONFIG", &file)
            .args(["run", "--fenced=false", "f", "--"])
            .args(print),
    )
    .await;
    assert_eq!(token(out), "[unset]", "--fenced=false");
    // And on: the flag alone, and the variable.
    let out = output(
        redlock(&set)
            .args(["run", "--fenced", "f", "--"])
            .args(print),
    )
    .await;
    assert_ne!(token(out), "[unset]", "--fenced");
    let out = output(
        redlock(&set)
            .env("REDLOCK_FENCED", "1")
            .args(["run", "f", "--"])
            .args(print),
    )
    .await;
    assert_ne!(token(out), "[unset]", "REDLOCK_FENCED=1");
}

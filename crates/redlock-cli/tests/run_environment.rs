//! What the command run under the lock finds in its environment.

mod common;

use common::{assert_exit, output, redlock};
use redlock_testkit::NodeSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_gets_the_key_and_tokens() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let out = output(redlock(&set).args([
        "run",
        "--fenced",
        "--key-prefix",
        "app:",
        "env-job",
        "--",
        "sh",
        "-c",
        "echo \"$REDLOCK_KEY|$REDLOCK_TOKEN|$REDLOCK_FENCING_TOKEN\"",
    ]))
    .await;
    assert_exit(&out, 0);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let [key, token, fence] = stdout.trim().split('|').collect::<Vec<_>>()[..] else {
        panic!("{stdout}");
    };
    assert_eq!(key, "app:env-job");
    assert!(!token.is_empty() && !token.contains(' '), "{token}");
    assert!(fence.parse::<u64>().unwrap() >= 1, "{fence}");

    // Without --fenced there is no fencing token.
    let out = output(redlock(&set).args([
        "run",
        "env-job",
        "--",
        "sh",
        "-c",
        "echo \"[${REDLOCK_FENCING_TOKEN-unset}]\"",
    ]))
    .await;
    assert_exit(&out, 0);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[unset]");
}

/// The command's arguments are passed on byte for byte, as a shell would: a file name
/// need not be UTF-8 (`redlock` used to refuse such an argument with a usage error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_that_are_not_utf8_reach_the_command() {
    use std::os::unix::ffi::OsStrExt;
    let set = NodeSet::start(3).await.expect("nodes start");
    let mut cmd = redlock(&set);
    cmd.args([
        "run",
        "bytes",
        "--",
        "sh",
        "-c",
        "printf '%s' \"$1\" | od -An -tx1",
        "sh",
    ])
    .arg(std::ffi::OsStr::from_bytes(b"a\xffb"));
    let out = output(&mut cmd).await;
    assert_exit(&out, 0);
    let hex: String = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect();
    assert_eq!(hex, "61ff62");
}

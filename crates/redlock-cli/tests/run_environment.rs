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

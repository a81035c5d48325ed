//! Settings come from flags, then the environment, then the configuration file.

mod common;

use common::{assert_exit, bare, output};
use redlock_testkit::NodeSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_override_the_environment_which_overrides_the_file() {
    let set = NodeSet::start(3).await.expect("nodes start");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("redlock.toml");
    let nodes: Vec<String> = set.urls().iter().map(|u| format!("\"{u}\"")).collect();
    std::fs::write(
        &file,
        format!("nodes = [{}]\nkey_prefix = \"file:\"\n", nodes.join(", ")),
    )
    .unwrap();
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

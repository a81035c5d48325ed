//! The command reaches TLS nodes with the configuration file's `[tls]` section, as a
//! service does with the same file.

mod common;

use common::{assert_exit, bare, output};
use redlock_testkit::{NodeOptions, NodeSet, TlsNodeOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_nodes_reach_tls_nodes_through_the_files_tls_section() {
    if redlock_testkit::skip_without_tls(
        "run_and_nodes_reach_tls_nodes_through_the_files_tls_section",
    ) {
        return;
    }
    let set = NodeSet::start_with(
        3,
        NodeOptions {
            tls: Some(TlsNodeOptions::default()),
            ..NodeOptions::default()
        },
    )
    .await
    .expect("TLS nodes start");
    let pki = set.pki().expect("a TLS set has a CA");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("redlock.toml");
    let nodes: Vec<String> = set
        .tls_urls()
        .expect("TLS URLs")
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect();
    std::fs::write(
        &file,
        format!(
            "nodes = [{}]\n[tls]\nca_file = \"{}\"\n",
            nodes.join(", "),
            pki.ca_path().display()
        ),
    )
    .unwrap();

    // Every node answers (the set's nodes run without `appendonly`: `nodes` lists that as
    // a problem, which is not what this test is about).
    let out = output(bare().arg("-c").arg(&file).arg("nodes")).await;
    let listed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        listed.matches(", standalone, master,").count(),
        3,
        "{listed}"
    );
    let out = output(bare().arg("-c").arg(&file).args([
        "run",
        "tls-job",
        "--",
        "sh",
        "-c",
        "echo $REDLOCK_KEY",
    ]))
    .await;
    assert_exit(&out, 0);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "redlock:tls-job"
    );
    assert!(set.nodes_holding("redlock:tls-job").await.is_empty());
}

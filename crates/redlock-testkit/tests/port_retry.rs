//! A first start whose port gets taken retries on a fresh port.
//!
//! Its own test binary (one process) because it points `REDIS_SERVER` at a wrapper script,
//! which must not leak into other tests.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use redlock_testkit::{NodeSet, REDIS_SERVER_ENV};

fn real_redis_server() -> PathBuf {
    if let Some(path) = std::env::var_os(REDIS_SERVER_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("redis-server"))
        .find(|p| p.is_file())
        .expect("redis-server on PATH (apt-get install -y redis-server)")
}

#[tokio::test]
async fn a_taken_port_on_first_start_is_retried_on_a_new_port() {
    let scratch = tempfile::tempdir().unwrap();
    let marker = scratch.path().join("failed-once");
    let wrapper = scratch.path().join("redis-server-wrapper");
    // The first launch behaves like redis-server losing the race for its port.
    let script = format!(
        "#!/bin/sh\n\
         if [ ! -e '{marker}' ]; then\n  : > '{marker}'\n  \
         echo '# Could not create server TCP listening socket: bind: Address already in use'\n  \
         exit 1\nfi\nexec '{real}' \"$@\"\n",
        marker = marker.display(),
        real = real_redis_server().display(),
    );
    std::fs::write(&wrapper, script).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::env::set_var(REDIS_SERVER_ENV, &wrapper);

    let nodes = NodeSet::start(1)
        .await
        .expect("start retries on a new port");
    assert!(
        marker.exists(),
        "the first attempt went through the failing path"
    );
    let node = nodes.node(0);
    node.set("k", "v", None).await.unwrap();
    assert_eq!(node.get("k").await.unwrap().as_deref(), Some("v"));
}

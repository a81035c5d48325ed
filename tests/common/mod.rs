//! What the client tests share: a client for a node set, with overrides.

#![allow(dead_code)]

pub mod logs;

use std::time::Duration;

use redlock_client::{LockConfigBuilder, Redlock};
use redlock_core::{Config, Coordinator};
use redlock_testkit::NodeSet;

/// A client for `set`, configured by `tweak` on top of test defaults (a 2 s TTL, 200 ms node
/// timeout, short backoff).
pub async fn client(
    set: &NodeSet,
    tweak: impl FnOnce(LockConfigBuilder) -> LockConfigBuilder,
) -> Redlock {
    let builder = redlock_client::LockConfig::builder()
        .nodes(set.urls())
        .ttl(Duration::from_secs(2))
        .node_timeout(Duration::from_millis(200))
        .backoff(Duration::from_millis(5), Duration::from_millis(50));
    Redlock::connect(tweak(builder).build().expect("valid test config"))
        .await
        .expect("client connects")
}

/// Polls a condition until it holds or `within` passes (shared with the other test crates).
pub use redlock_testkit::eventually;

/// A core coordinator for `set` with the given per-node timeout (default settings otherwise).
pub async fn coordinator(set: &NodeSet, node_timeout: Duration) -> Coordinator {
    coordinator_at(set.urls(), node_timeout).await
}

/// A core coordinator for the nodes at `urls` (a set's, or its fault proxies') with the
/// given per-node timeout (default settings otherwise).
pub async fn coordinator_at(urls: Vec<String>, node_timeout: Duration) -> Coordinator {
    let config = Config {
        nodes: urls,
        node_timeout,
        ..Default::default()
    };
    Coordinator::connect(config).await.expect("valid config")
}

/// Waits until every node of `set` has at least `clients` subscribers on the release
/// channel of the default key prefix, so that a release published next reaches them.
pub async fn subscribed(set: &NodeSet, clients: u64) {
    let ready = eventually(Duration::from_secs(10), || async {
        for node in set.iter() {
            if node.redis().subscribers("redlock:released").await.unwrap() < clients {
                return false;
            }
        }
        true
    })
    .await;
    assert!(ready, "the wake-up subscribers did not subscribe");
}

/// A plain fred client for `url`, connected: for tests that write to a node (or a resource)
/// what the library never would.
pub async fn raw(url: &str) -> fred::prelude::Client {
    use fred::prelude::ClientLike;
    let config = fred::types::config::Config::from_url(url).expect("a valid node URL");
    let client = fred::types::Builder::from_config(config)
        .build()
        .expect("a fred client");
    client.init().await.expect("the node answers");
    client
}

/// One client's fault-proxy links to every node of `set`, and the URLs through them.
pub async fn linked(set: &NodeSet) -> redlock_testkit::Links {
    use redlock_testkit::Nodes;
    redlock_testkit::Links::start(1, &set.addrs())
        .await
        .expect("fault proxies start")
}

/// A seed whose first two backoff delays are long, so that only a notification can end the
/// wait early (with notifications on, a waiter that queues for a lock of one key has its
/// first delay cut to a node timeout: its second attempt queues it; the second delay is
/// the wait for the release).
pub fn slow_retry() -> redlock_client::RetryPolicy {
    let base = redlock_client::RetryPolicy {
        max_attempts: None,
        max_wait: Some(Duration::from_secs(120)),
        base_delay: Duration::from_secs(60),
        max_delay: Duration::from_secs(60),
        seed: None,
    };
    let seed = (0..)
        .find(|&s| {
            redlock_client::RetryPolicy {
                seed: Some(s),
                ..base.clone()
            }
            .backoff()
            .take(2)
            .all(|delay| delay > Duration::from_secs(40))
        })
        .unwrap();
    redlock_client::RetryPolicy {
        seed: Some(seed),
        ..base
    }
}

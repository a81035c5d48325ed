//! A reentrant acquisition on a key that holds something other than a reentrant lock (a
//! plain lock, a hash of the application's, a list) is refused as "held by another
//! owner" and leaves the key exactly as it was.

mod common;

use std::collections::HashMap;

use common::{client, raw};
use fred::prelude::{ClientLike, HashesInterface, KeysInterface};
use fred::types::{CustomCommand, Value};
use redlock_client::{Error, LockOptions, NodeOutcome, Owner, Redlock, RetryPolicy};
use redlock_testkit::NodeSet;

fn once() -> LockOptions {
    LockOptions {
        retry: Some(RetryPolicy::no_retry()),
        ..Default::default()
    }
}

/// Tries a reentrant acquisition and asserts that every node refused it as taken.
async fn refused_everywhere(c: &Redlock, key: &str) {
    match c.lock_reentrant(key, &Owner::new(), &once()).await {
        Err(Error::NotAcquired { report, .. }) => {
            // The round is decided at the quorum; the rest answer in the background.
            let report = report.settled().await;
            for node in &report.nodes {
                assert_eq!(node.outcome, NodeOutcome::HeldByOther, "{report}");
            }
        }
        other => panic!("a reentrant lock on {key} must be refused: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_hash_is_not_taken_for_a_free_reentrant_lock() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    let mut raws = Vec::new();
    for url in set.urls() {
        let r = raw(&url).await;
        let _: () = r.hset("redlock:profile", ("name", "alice")).await.unwrap();
        raws.push(r);
    }
    refused_everywhere(&c, "profile").await;
    for r in &raws {
        let fields: HashMap<String, String> = r.hgetall("redlock:profile").await.unwrap();
        assert_eq!(fields, HashMap::from([("name".into(), "alice".into())]));
        let ttl: i64 = r.pttl("redlock:profile").await.unwrap();
        assert_eq!(ttl, -1, "the hash got an expiry");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_or_a_list_refuses_a_reentrant_lock_without_a_server_error() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    let plain = c.lock("plain").await.unwrap();
    refused_everywhere(&c, "plain").await;
    for node in set.iter() {
        assert_eq!(
            node.get("redlock:plain").await.unwrap().as_deref(),
            Some(plain.lock().token().as_str())
        );
    }
    plain.release().await.unwrap();

    for url in set.urls() {
        let r = raw(&url).await;
        let _: Value = r
            .custom(
                CustomCommand::new_static("RPUSH", None, false),
                vec!["redlock:queue", "job-1"],
            )
            .await
            .unwrap();
    }
    refused_everywhere(&c, "queue").await;
    // A plain lock on the list is refused the same way.
    assert!(matches!(
        c.try_lock("queue").await,
        Err(Error::NotAcquired { .. })
    ));
    for url in set.urls() {
        let r = raw(&url).await;
        let len: Value = r
            .custom(
                CustomCommand::new_static("LLEN", None, false),
                vec!["redlock:queue"],
            )
            .await
            .unwrap();
        assert_eq!(len, Value::Integer(1));
    }
}

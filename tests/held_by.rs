//! "Is it held by me": an inspection reads each node's holder as well as the TTL, and
//! `held_by` and `LockGuard::check` count the nodes that hold the key for one token.

mod common;

use std::time::Duration;

use common::{client, raw};
use fred::prelude::HashesInterface;
use redlock_client::{Holder, LockOptions, Owner, Token};
use redlock_testkit::NodeSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_is_held_by_its_token_and_by_no_other() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    let guard = c.lock("job").await.unwrap();
    let token = guard.lock().token().clone();

    let i = c.inspect("job").await.unwrap();
    assert_eq!(i.held, Some(true));
    assert_eq!(i.held_by(&token), Some(true));
    assert_eq!(i.held_by(&Token::random()), Some(false));
    assert_eq!(i.holders.len(), 3);
    for holder in &i.holders {
        assert_eq!(holder.as_ref(), Some(&Holder::Token(token.clone())));
    }
    assert!(guard.check().await.unwrap());

    // Another holder's token on two of three nodes (as after a key lost on them and taken
    // by someone else): still held, but no longer for this guard.
    for node in &set.nodes()[..2] {
        node.set("redlock:job", "someone-else", Some(2_000))
            .await
            .unwrap();
    }
    let i = c.inspect("job").await.unwrap();
    assert_eq!(i.held, Some(true));
    assert_eq!(i.held_by(&token), Some(false));
    assert!(!guard.check().await.unwrap());
    assert!(guard.is_valid(), "check reads the nodes; it marks nothing");

    guard.release().await.unwrap().settled().await;
    for node in &set.nodes()[..2] {
        node.del("redlock:job").await.unwrap();
    }
    let i = c.inspect("job").await.unwrap();
    assert_eq!(i.held, Some(false));
    assert_eq!(i.held_by(&token), Some(false));
    assert!(i.holders.iter().all(Option::is_none));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_lock_shows_its_owner_and_each_hold() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    let owner = Owner::named("worker-7");
    let outer = c
        .lock_reentrant("ledger", &owner, &LockOptions::default())
        .await
        .unwrap();
    let inner = c
        .lock_reentrant("ledger", &owner, &LockOptions::default())
        .await
        .unwrap();
    let (t1, t2) = (outer.lock().token().clone(), inner.lock().token().clone());

    let i = c.inspect("ledger").await.unwrap();
    for holder in i.holders.iter().flatten() {
        let Holder::Reentrant { owner: o, holds } = holder else {
            panic!("expected a reentrant holder, got {holder:?}");
        };
        assert_eq!(o, "worker-7");
        assert_eq!(holds.len(), 2);
    }
    assert_eq!(i.held_by(&t1), Some(true));
    assert_eq!(i.held_by(&t2), Some(true));
    assert!(outer.check().await.unwrap());

    inner.release().await.unwrap().settled().await;
    let i = c.inspect("ledger").await.unwrap();
    assert_eq!(i.held_by(&t1), Some(true));
    assert_eq!(i.held_by(&t2), Some(false), "the released hold is gone");
    assert!(!i.remaining.unwrap_or_default().is_zero());
    outer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_key_guard_checks_every_key_and_foreign_values_are_other() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    let guard = c
        .lock_many(&["a", "b"], &LockOptions::default())
        .await
        .unwrap();
    assert!(guard.check().await.unwrap());
    for node in set.nodes() {
        node.del("redlock:b").await.unwrap();
    }
    assert!(!guard.check().await.unwrap(), "key b is gone everywhere");

    // An application's hash (no `owner` field) is held, by nobody this library knows.
    for url in set.urls() {
        let _: () = raw(&url)
            .await
            .hset("redlock:profile", ("name", "alice"))
            .await
            .unwrap();
    }
    let i = c.inspect("profile").await.unwrap();
    assert_eq!(i.held, Some(true));
    assert_eq!(i.remaining, None, "no expiry");
    assert!(i
        .nodes
        .iter()
        .all(|(_, ttl)| *ttl == Ok(Some(Duration::MAX))));
    assert!(i.holders.iter().all(|h| *h == Some(Holder::Other)));
    assert_eq!(i.held_by(guard.lock().token()), Some(false));
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_node_down_the_answer_needs_a_quorum_of_the_rest() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    let guard = c.lock("job").await.unwrap();
    let token = guard.lock().token().clone();
    set.node(0).kill().unwrap();
    let i = c.inspect("job").await.unwrap();
    assert_eq!(i.held_by(&token), Some(true), "two of three still hold it");
    assert!(i.nodes[0].1.is_err());
    assert_eq!(i.holders[0], None);
    set.node(1).kill().unwrap();
    let i = c.inspect("job").await.unwrap();
    assert_eq!(i.held_by(&token), None, "one answer cannot tell");
    assert!(!guard.check().await.unwrap(), "not confirmed is not held");
}

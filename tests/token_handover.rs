//! Releasing and extending a lock from another process, by its stored token
//! (`Redlock::release_token`, `Redlock::extend_token`): only the key that holds the token is
//! touched, an extension never shortens or recreates a key, and bad input is a typed error.

mod common;

use std::time::Duration;

use common::client;
use redlock_client::{Error, LockOptions, NodeOutcome, Token};
use redlock_core::ArgumentError;
use redlock_testkit::NodeSet;

const SECOND: Duration = Duration::from_secs(1);

/// The shortest TTL the nodes report for `key`, in ms (-2 when absent on some node).
async fn shortest_pttl(set: &NodeSet, key: &str) -> i64 {
    let mut shortest = i64::MAX;
    for node in set.nodes() {
        shortest = shortest.min(node.pttl(key).await.unwrap());
    }
    shortest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_extends_and_releases_by_the_stored_token() {
    let set = NodeSet::start(3).await.unwrap();
    let holder = client(&set, |b| b).await;
    let guard = holder
        .lock_with(
            "export",
            &LockOptions {
                renew: Some(false),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    // What a process would store (a file, a database row) to hand the lock over.
    let stored = guard.lock().token().as_str().to_string();
    // The holder goes away without releasing (no background release: forgotten).
    std::mem::forget(guard);

    let other = client(&set, |b| b).await;
    let token = Token::from_string(stored);
    let validity = other
        .extend_token("export", &token, 5 * SECOND)
        .await
        .unwrap();
    assert!(
        validity > 4 * SECOND && validity <= 5 * SECOND,
        "{validity:?}"
    );
    assert!(shortest_pttl(&set, "redlock:export").await > 4_000);

    // A shorter extension is accepted and changes nothing on the nodes.
    other.extend_token("export", &token, SECOND).await.unwrap();
    assert!(
        shortest_pttl(&set, "redlock:export").await > 3_000,
        "an extension never shortens a key"
    );

    // A token that does not hold the key releases and extends nothing.
    let stranger = Token::random();
    // Releasing is idempotent, as for a guard: done where the key does not hold the token.
    // The report tells that nothing was deleted.
    let report = other.release_token("export", &stranger).await.unwrap();
    let report = report.settled().await;
    assert!(
        report
            .nodes
            .iter()
            .all(|n| n.outcome == NodeOutcome::NotHeld),
        "{report}"
    );
    let err = other
        .extend_token("export", &stranger, 9 * SECOND)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Round(_)), "{err}");
    other.coordinator().quiesce().await;
    assert_eq!(set.nodes_holding("redlock:export").await.len(), 3);
    assert!(shortest_pttl(&set, "redlock:export").await < 6_000);

    let report = other.release_token("export", &token).await.unwrap();
    let report = report.settled().await;
    assert!(
        report
            .nodes
            .iter()
            .all(|n| n.outcome == NodeOutcome::Released),
        "{report}"
    );
    assert!(set.nodes_holding("redlock:export").await.is_empty());
    assert!(other.try_lock("export").await.is_ok(), "free again");

    // Extending a released key never recreates it.
    other.coordinator().quiesce().await;
    for node in set.nodes() {
        node.del("redlock:export").await.unwrap();
    }
    let err = other
        .extend_token("export", &token, 5 * SECOND)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Round(_)), "{err}");
    other.coordinator().quiesce().await;
    assert!(set.nodes_holding("redlock:export").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_tokens_and_ttls_are_typed_errors_and_send_nothing() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    let token = Token::random();
    let core = |e: Error| match e {
        Error::InvalidArgument(e) => e,
        other => panic!("expected an argument error, got {other}"),
    };

    assert_eq!(
        core(c.release_token("", &token).await.unwrap_err()),
        ArgumentError::EmptyKey
    );
    let spaced = Token::from_string("two words");
    assert!(matches!(
        core(c.release_token("job", &spaced).await.unwrap_err()),
        ArgumentError::InvalidToken { .. }
    ));
    assert!(matches!(
        core(
            c.extend_token("job", &Token::from_string(""), SECOND)
                .await
                .unwrap_err()
        ),
        ArgumentError::InvalidToken { .. }
    ));
    assert_eq!(
        core(
            c.extend_token("job", &token, Duration::ZERO)
                .await
                .unwrap_err()
        ),
        ArgumentError::ZeroTtl
    );
    // The fencing counter holds a number: a number as token must not delete or expire it.
    for err in [
        c.release_token("fencing-counter", &Token::from_string("7"))
            .await
            .unwrap_err(),
        c.extend_token("fencing-counter", &Token::from_string("7"), SECOND)
            .await
            .unwrap_err(),
        // The fair queues' keys too (sorted sets: a release would only meet WRONGTYPE).
        c.release_token("fair-queue:job", &token).await.unwrap_err(),
        c.extend_token("fair-expiry:job", &token, SECOND)
            .await
            .unwrap_err(),
    ] {
        assert!(
            matches!(core(err), ArgumentError::ReservedKey { .. }),
            "the fencing counter and the fair queues are reserved"
        );
    }
    c.coordinator().quiesce().await;
    for node in set.nodes() {
        assert_eq!(
            node.redis().dbsize().await.unwrap(),
            0,
            "nothing was written"
        );
    }
}

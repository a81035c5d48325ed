//! A minimum validity (`min_validity`): a round won with less validity left is released at
//! once and counts as a lost attempt; a minimum no round can meet is rejected up front when
//! it is at or above `ttl - drift`.

mod common;

use std::time::Duration;

use common::client;
use redlock_client::{Error, InvalidConfig, LockOptions, RetryPolicy};
use redlock_testkit::NodeSet;

const TTL: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimum_no_round_can_leave_fails_and_leaves_no_key() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    // The most a round can leave is ttl - drift (here 2 s - 22 ms), and only a round that
    // took no time at all would: just below it passes the check and is never met.
    let most = TTL - c.coordinator().drift(TTL);
    let options = LockOptions {
        min_validity: Some(most - Duration::from_micros(1)),
        retry: Some(RetryPolicy {
            max_attempts: Some(3),
            max_wait: None,
            ..RetryPolicy::default()
        }),
        ..Default::default()
    };
    let err = c.lock_with("report", &options).await.unwrap_err();
    let Error::BelowMinValidity {
        attempts,
        validity,
        min_validity,
        ..
    } = &err
    else {
        panic!("expected BelowMinValidity, got {err}");
    };
    assert_eq!(*attempts, 3, "each short round counts as a lost attempt");
    assert!(validity < min_validity);
    assert!(err.to_string().contains("less than the minimum"), "{err}");
    c.coordinator().quiesce().await;
    assert!(
        set.nodes_holding("redlock:report").await.is_empty(),
        "every short round was released"
    );

    // A minimum the rounds can meet: acquired on the first attempt.
    let guard = c
        .lock_with(
            "report",
            &LockOptions {
                min_validity: Some(TTL / 2),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(guard.attempts(), 1);
    assert!(guard.remaining().unwrap() >= TTL / 2 - Duration::from_millis(50));
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimum_at_or_above_the_ttl_minus_drift_is_invalid() {
    let set = NodeSet::start(3).await.unwrap();
    let rejected = redlock_client::LockConfig::builder()
        .nodes(set.urls())
        .ttl(TTL)
        .min_validity(TTL)
        .build()
        .unwrap_err();
    assert!(
        matches!(rejected, InvalidConfig::MinValidity { .. }),
        "{rejected}"
    );
    assert!(
        rejected.to_string().contains("min_validity (2s)"),
        "{rejected}"
    );

    // Configured, it applies to every call; a per-call TTL is checked against it too.
    let c = client(&set, |b| b.min_validity(Duration::from_secs(1))).await;
    c.lock("a").await.unwrap().release().await.unwrap();
    let err = c
        .lock_with(
            "a",
            &LockOptions {
                ttl: Some(Duration::from_millis(1_000)),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidConfig(InvalidConfig::MinValidity { .. })),
        "{err}"
    );
    c.coordinator().quiesce().await;
    assert!(set.nodes_holding("redlock:a").await.is_empty());
}

//! Extreme settings and bad arguments: each is a typed error or works, never a panic, and
//! a lock taken with them leaves nothing behind.

mod common;

use std::time::Duration;

use common::client;
use redlock_client::{Error, InvalidConfig, LockConfig, LockOptions, Owner, RenewalPolicy};
use redlock_core::{ArgumentError, Config, ConfigError, Coordinator, Token, MAX_NODE_TIMEOUT};
use redlock_testkit::NodeSet;

fn ttl_error(e: &Error) -> &ArgumentError {
    match e {
        Error::InvalidConfig(InvalidConfig::Ttl(a)) => a,
        other => panic!("expected a TTL the configuration refuses, got {other:?}"),
    }
}

fn argument_error(e: &Error) -> &ArgumentError {
    match e {
        Error::InvalidArgument(a) => a,
        other => panic!("expected an argument error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_node_timeout_is_a_typed_error() {
    let set = NodeSet::start(3).await.unwrap();
    let config = Config {
        nodes: set.urls(),
        node_timeout: Duration::MAX,
        ..Default::default()
    };
    assert_eq!(
        config.validate(),
        Err(ConfigError::NodeTimeoutTooLong {
            timeout: Duration::MAX,
            max: MAX_NODE_TIMEOUT
        })
    );
    assert!(Coordinator::connect(config).await.is_err());
    let built = LockConfig::builder()
        .nodes(set.urls())
        .node_timeout(Duration::MAX)
        .build();
    assert!(matches!(
        built,
        Err(InvalidConfig::Core(ConfigError::NodeTimeoutTooLong { .. }))
    ));
    // The longest accepted one works (with a TTL long enough for it).
    let core = Coordinator::connect(Config {
        nodes: set.urls(),
        node_timeout: MAX_NODE_TIMEOUT,
        reconnect_max_delay: Duration::MAX,
        ..Default::default()
    })
    .await
    .unwrap();
    let lock = core.acquire("k", Duration::from_secs(120)).await.unwrap();
    core.release(&lock).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_wait_and_hold_work_and_leave_nothing_behind() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| {
        b.max_wait(Duration::MAX)
            .max_hold(Duration::MAX)
            .backoff(Duration::from_millis(5), Duration::MAX)
    })
    .await;
    let guard = c.lock("extreme").await.unwrap();
    assert!(guard.is_valid());
    // A waiter under the same settings gives up by its attempt count.
    let options = LockOptions {
        retry: Some(redlock_client::RetryPolicy {
            max_attempts: Some(2),
            ..c.config().retry.clone()
        }),
        ..Default::default()
    };
    assert!(matches!(
        c.lock_with("extreme", &options).await,
        Err(Error::NotAcquired { attempts: 2, .. })
    ));
    guard.release().await.unwrap();
    c.shutdown().await;
    assert!(set.nodes_holding("redlock:extreme").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_ttls_are_typed_errors_and_send_nothing() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    for ttl in [Duration::ZERO, Duration::MAX] {
        let options = LockOptions {
            ttl: Some(ttl),
            ..Default::default()
        };
        let err = c.lock_with("ttl", &options).await.unwrap_err();
        assert!(
            matches!(
                ttl_error(&err),
                ArgumentError::ZeroTtl | ArgumentError::TtlTooLong { .. }
            ),
            "{err}"
        );
    }
    let guard = c.lock("ttl").await.unwrap();
    assert!(guard.extend(Some(Duration::MAX)).await.is_err());
    assert!(guard.is_valid(), "a rejected extension changes nothing");
    guard.release().await.unwrap();
    let renewal = LockConfig::builder()
        .nodes(set.urls())
        .renewal(RenewalPolicy {
            renew_after: Some(Duration::MAX),
            ..Default::default()
        })
        .build();
    assert!(matches!(renewal, Err(InvalidConfig::Renewal { .. })));
    assert!(set.nodes_holding("redlock:ttl").await.is_empty());
    // A hand-over's TTL too (it used to overflow an instant, a panic).
    let core = common::coordinator(&set, Duration::from_millis(100)).await;
    let handover = redlock_core::support::Handover {
        key: "ttl",
        waiter: "w",
        number: 1,
        ttl: Duration::MAX,
        since: tokio::time::Instant::now(),
        suspended: redlock_core::support::host_suspended(),
        nodes: &[0, 1, 2],
    };
    assert!(matches!(
        core.waiters().handed_over(handover),
        Err(redlock_core::Error::Argument(
            ArgumentError::TtlTooLong { .. }
        ))
    ));
    // A hand-over whose attempt started "in the future" (a caller's wrong instant): its
    // validity is counted from now at the latest, never past what the TTL gives from now.
    // It used to run from that instant: an hour's validity from a 10 s TTL.
    let ttl = Duration::from_secs(10);
    let before = tokio::time::Instant::now();
    let future = redlock_core::support::Handover {
        key: "ttl",
        waiter: "w",
        number: 1,
        ttl,
        since: before + Duration::from_secs(3600),
        suspended: redlock_core::support::host_suspended(),
        nodes: &[0, 1, 2],
    };
    let lock = core
        .waiters()
        .handed_over(future)
        .expect("a quorum handed it over");
    let remaining = lock.remaining().expect("validity left");
    assert!(
        remaining <= ttl,
        "{remaining:?} of validity from a TTL of {ttl:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_call_ttl_gets_the_renewal_rule_of_the_configuration() {
    let set = NodeSet::start(3).await.unwrap();
    // 200 ms node timeout (the test default): a 250 ms TTL passes the core's check, but its
    // renewal (every 83 ms) must start before 250 - 4.5 - 200 = 45.5 ms.
    let c = client(&set, |b| b).await;
    let short = LockOptions {
        ttl: Some(Duration::from_millis(250)),
        ..Default::default()
    };
    let err = c.lock_with("per-call", &short).await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidConfig(InvalidConfig::Renewal { .. })),
        "{err}"
    );
    // The same TTL in the configuration is rejected the same way.
    let configured = LockConfig::builder()
        .nodes(set.urls())
        .node_timeout(Duration::from_millis(200))
        .ttl(Duration::from_millis(250))
        .build();
    assert!(matches!(configured, Err(InvalidConfig::Renewal { .. })));
    // Without renewal the TTL is fine.
    let unrenewed = LockOptions {
        renew: Some(false),
        ..short.clone()
    };
    c.lock_with("per-call", &unrenewed)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // An explicit interval longer than a per-call TTL is rejected, not silently replaced.
    let c = client(&set, |b| b.renew_after(Duration::from_secs(1))).await;
    let shorter_than_interval = LockOptions {
        ttl: Some(Duration::from_millis(900)),
        ..Default::default()
    };
    let err = c
        .lock_with("per-call", &shorter_than_interval)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidConfig(InvalidConfig::Renewal { .. })),
        "{err}"
    );
    assert!(set.nodes_holding("redlock:per-call").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_keys_and_unusable_tokens_are_typed_errors() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    let empty = |e: Error| assert_eq!(argument_error(&e), &ArgumentError::EmptyKey);
    empty(c.lock("").await.unwrap_err());
    empty(c.try_lock("").await.unwrap_err());
    empty(
        c.lock_many(&["a", ""], &LockOptions::default())
            .await
            .unwrap_err(),
    );
    empty(
        c.lock_reentrant("", &Owner::new(), &LockOptions::default())
            .await
            .unwrap_err(),
    );
    empty(c.inspect("").await.unwrap_err());

    let core = c.coordinator();
    let ttl = Duration::from_secs(2);
    // "worker-1~7" is what a release writes when it hands a key to fair waiter `worker-1`,
    // whose next attempt takes such a key on as its own: a caller's lock under it would
    // have two holders.
    for bad in ["", "two words", "line\nbreak", "worker-1~7"] {
        let token = Token::from_string(bad);
        let err = core
            .acquire_with_token("token", token.clone(), ttl)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                redlock_core::Error::Argument(ArgumentError::InvalidToken { .. })
            ),
            "{bad:?}: {err}"
        );
        assert!(core.acquire_many(&["t1", "t2"], token, ttl).await.is_err());
    }
    // A handed-over lock's token has a '~': releasing by it is allowed.
    let handed = Token::from_string("worker-1~7");
    if let Err(e) = c.release_token("token", &handed).await {
        assert!(
            !matches!(
                e,
                Error::InvalidArgument(ArgumentError::InvalidToken { .. })
            ),
            "{e}"
        );
    }
    // Nothing reached the nodes (the prefix alone was never locked either).
    for node in set.iter() {
        assert_eq!(node.dbsize().await.unwrap(), 0);
    }
}

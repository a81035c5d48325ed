//! Bad input and hostile node state: each case is a typed error whose message says what to
//! change, never a panic, and nothing is lost: no key is left behind on any node, and a
//! valid lock still works afterwards.
//!
//! The cases that never reach a node (configuration values, TOML text) are tables of
//! `(name, case)` run in a loop; the cases that need nodes (per-call values, a key of
//! another type, a node out of memory, a node that never answers) have tests of their own.

mod common;

use std::future::Future;
use std::net::TcpListener;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use common::{client, raw};
use fred::prelude::ClientLike;
use fred::types::{CustomCommand, Value};
use futures::FutureExt;
use redlock_client::{
    Error, InvalidConfig, LockConfig, LockGuard, LockOptions, NodeOutcome, Redlock, RetryPolicy,
    RoundReport, ServerErrorKind,
};
use redlock_core::{ArgumentError, ConfigError, MAX_KEY_LEN, MAX_NODE_TIMEOUT, MAX_TTL};
use redlock_testkit::NodeSet;

/// A hang guard for the rounds against a node that never answers, not a performance claim:
/// they are bounded by a 200 ms node timeout.
const HANG_GUARD: Duration = Duration::from_secs(10);

/// Runs one case, turning a panic into a failure that names the case.
async fn no_panic<T>(name: &str, case: impl Future<Output = T>) -> T {
    match AssertUnwindSafe(case).catch_unwind().await {
        Ok(value) => value,
        Err(_) => panic!("case `{name}` panicked (its message is above)"),
    }
}

/// Every node of `set` is empty: nothing was written, or everything was cleaned up.
async fn nothing_left(set: &NodeSet, case: &str) {
    for node in set.iter() {
        let keys = node.keys("*").await.unwrap();
        assert!(keys.is_empty(), "{case}: {} keeps {keys:?}", node.name());
    }
}

/// A valid lock still works on `c`, and its release leaves nothing behind.
async fn still_works(c: &Redlock, set: &NodeSet, case: &str) {
    let guard = c
        .try_lock("still-works")
        .await
        .unwrap_or_else(|e| panic!("{case}: a valid lock failed afterwards: {e}"));
    // Won at a quorum: the last node's answer may still be on its way on a loaded machine.
    let _ = guard.lock().report().settled().await;
    assert_eq!(
        set.nodes_holding("redlock:still-works").await.len(),
        set.len(),
        "{case}"
    );
    guard.release().await.unwrap();
    assert!(
        set.nodes_holding("redlock:still-works").await.is_empty(),
        "{case}"
    );
}

/// A command a lock client never sends, on the node at `url`.
async fn command(url: &str, name: &'static str, args: &[&str]) -> Value {
    let client = raw(url).await;
    let reply = client
        .custom(
            CustomCommand::new_static(name, None, false),
            args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        )
        .await
        .unwrap_or_else(|e| panic!("{name} {args:?}: {e}"));
    client.quit().await.unwrap();
    reply
}

fn one_attempt() -> LockOptions {
    LockOptions {
        retry: Some(RetryPolicy::no_retry()),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------
// Configuration values: rejected by `validate` and by `connect`, before anything connects.

/// What to change in a valid configuration, the error it must give, and words of its
/// message that say what to change.
struct ConfigCase {
    change: fn(&mut LockConfig),
    expect: fn(&InvalidConfig) -> bool,
    advice: &'static str,
}

fn nodes(config: &mut LockConfig, urls: &[&str]) {
    config.nodes = urls.iter().map(|u| u.to_string()).collect();
}

/// Three node URLs that are never contacted: every case fails before connecting.
fn valid_config() -> LockConfig {
    LockConfig {
        nodes: (7001..=7003)
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect(),
        ..LockConfig::default()
    }
}

fn config_cases() -> Vec<(&'static str, ConfigCase)> {
    use ConfigError::*;
    vec![
        (
            "empty node URL",
            ConfigCase {
                change: |c| nodes(c, &["", "redis://127.0.0.1:7002"]),
                expect: |e| matches!(e, InvalidConfig::Core(InvalidUrl { url, .. }) if url.is_empty()),
                advice: "the URL is empty; write it as redis://",
            },
        ),
        (
            "unparsable node URL",
            ConfigCase {
                change: |c| nodes(c, &["not a url"]),
                expect: |e| matches!(e, InvalidConfig::Core(InvalidUrl { url, .. }) if url == "not a url"),
                advice: "write it as redis://[user:password@]host:port[/db]",
            },
        ),
        (
            "the same node URL twice",
            ConfigCase {
                change: |c| nodes(c, &["redis://127.0.0.1:7001", "redis://127.0.0.1:7001"]),
                expect: |e| {
                    matches!(
                        e,
                        InvalidConfig::Core(DuplicateNode { node }) if node == "redis://127.0.0.1:7001"
                    )
                },
                advice: "listed twice: each node must be a distinct, independent master",
            },
        ),
        (
            "database /0 and no database: the same node",
            ConfigCase {
                change: |c| nodes(c, &["redis://127.0.0.1:7001", "redis://127.0.0.1:7001/0"]),
                expect: |e| matches!(e, InvalidConfig::Core(DuplicateNode { .. })),
                advice: "one server would cast two votes",
            },
        ),
        (
            "http:// scheme",
            ConfigCase {
                change: |c| nodes(c, &["http://127.0.0.1:7001"]),
                expect: |e| matches!(e, InvalidConfig::Core(InvalidUrl { .. })),
                advice: "unsupported scheme `http`: a member is a standalone master",
            },
        ),
        (
            "redis-sentinel:// scheme",
            ConfigCase {
                change: |c| nodes(c, &["redis-sentinel://127.0.0.1:26379"]),
                expect: |e| matches!(e, InvalidConfig::Core(InvalidUrl { .. })),
                advice: "unsupported scheme `redis-sentinel`",
            },
        ),
        (
            "cluster seeds under a single node's scheme",
            ConfigCase {
                change: |c| nodes(c, &["redis://127.0.0.1:7001?node=127.0.0.1:7002"]),
                expect: |e| matches!(e, InvalidConfig::Core(InvalidUrl { .. })),
                advice: "write the URL as redis-cluster://",
            },
        ),
        (
            "port 70000",
            ConfigCase {
                change: |c| nodes(c, &["redis://127.0.0.1:70000"]),
                expect: |e| matches!(e, InvalidConfig::Core(InvalidUrl { .. })),
                advice: "invalid port number; write it as redis://",
            },
        ),
        (
            "port 0",
            ConfigCase {
                change: |c| nodes(c, &["redis://127.0.0.1:7001", "redis://127.0.0.1:0"]),
                expect: |e| {
                    matches!(
                        e,
                        InvalidConfig::Core(InvalidUrl { url, .. }) if url == "redis://127.0.0.1:0"
                    )
                },
                advice: "port 0 is no server's port: give the port the Redis master listens on",
            },
        ),
        (
            "no nodes",
            ConfigCase {
                change: |c| nodes(c, &[]),
                expect: |e| matches!(e, InvalidConfig::Core(NoNodes)),
                advice: "give the URLs of N independent masters",
            },
        ),
        (
            "ttl 0",
            ConfigCase {
                change: |c| c.ttl = Duration::ZERO,
                expect: |e| matches!(e, InvalidConfig::Ttl(ArgumentError::ZeroTtl)),
                advice: "give the lock a lifetime",
            },
        ),
        (
            "ttl 1 ms, shorter than the node timeout",
            ConfigCase {
                change: |c| c.ttl = Duration::from_millis(1),
                expect: |e| matches!(e, InvalidConfig::Ttl(ArgumentError::TtlTooShort { .. })),
                advice: "use a TTL many times the node timeout, or a shorter node timeout",
            },
        ),
        (
            "ttl twice MAX_TTL",
            ConfigCase {
                change: |c| c.ttl = MAX_TTL * 2,
                expect: |e| matches!(e, InvalidConfig::Ttl(ArgumentError::TtlTooLong { max, .. }) if *max == MAX_TTL),
                advice: "use a shorter TTL and extend it while you work",
            },
        ),
        (
            "drift factor NaN",
            ConfigCase {
                change: |c| c.drift_factor = f64::NAN,
                expect: |e| matches!(e, InvalidConfig::Core(DriftFactor { factor }) if factor.is_nan()),
                advice: "drift factor NaN is outside [0, 1): use a small fraction such as 0.01",
            },
        ),
        (
            "drift factor negative",
            ConfigCase {
                change: |c| c.drift_factor = -0.01,
                expect: |e| matches!(e, InvalidConfig::Core(DriftFactor { factor }) if *factor == -0.01),
                advice: "use a small fraction such as 0.01",
            },
        ),
        (
            "drift factor 1.0",
            ConfigCase {
                change: |c| c.drift_factor = 1.0,
                expect: |e| matches!(e, InvalidConfig::Core(DriftFactor { .. })),
                advice: "drift factor 1.0 is outside [0, 1)",
            },
        ),
        (
            "drift factor infinite",
            ConfigCase {
                change: |c| c.drift_factor = f64::INFINITY,
                expect: |e| matches!(e, InvalidConfig::Core(DriftFactor { .. })),
                advice: "drift factor inf is outside [0, 1)",
            },
        ),
        (
            "zero retry delay",
            ConfigCase {
                change: |c| c.retry.base_delay = Duration::ZERO,
                expect: |e| matches!(e, InvalidConfig::Retry { .. }),
                advice: "base_delay is zero, so the first retries would hammer the nodes",
            },
        ),
        (
            "retry delays inverted (base above max)",
            ConfigCase {
                change: |c| {
                    c.retry.base_delay = Duration::from_secs(2);
                    c.retry.max_delay = Duration::from_millis(100);
                },
                expect: |e| matches!(e, InvalidConfig::Retry { .. }),
                advice: "max_delay (100ms) is shorter than base_delay (2s): raise max_delay",
            },
        ),
        (
            "zero node timeout",
            ConfigCase {
                change: |c| c.node_timeout = Duration::ZERO,
                expect: |e| matches!(e, InvalidConfig::Core(ZeroNodeTimeout)),
                advice: "set it to a few times the network round trip",
            },
        ),
        (
            "node timeout beyond MAX_NODE_TIMEOUT",
            ConfigCase {
                change: |c| c.node_timeout = MAX_NODE_TIMEOUT + Duration::from_millis(1),
                expect: |e| {
                    matches!(
                        e,
                        InvalidConfig::Core(NodeTimeoutTooLong { max, .. }) if *max == MAX_NODE_TIMEOUT
                    )
                },
                advice: "use a few times the network round trip",
            },
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_values_are_typed_errors_that_say_what_to_change() {
    assert_eq!(valid_config().validate(), Ok(()), "the base case is valid");
    let cases = config_cases();
    assert!(cases.len() >= 20);
    for (name, case) in cases {
        let mut config = valid_config();
        (case.change)(&mut config);
        let validated = no_panic(name, async { config.validate() }).await;
        let err = validated.expect_err(name);
        assert!((case.expect)(&err), "{name}: unexpected error {err:?}");
        assert!(
            err.to_string().contains(case.advice),
            "{name}: the message does not say `{}`: {err}",
            case.advice
        );
        // `connect` refuses it the same way, before connecting to anything.
        let connected = no_panic(name, Redlock::connect(config)).await;
        match connected {
            Err(Error::InvalidConfig(e)) => {
                assert!((case.expect)(&e), "{name}: connect gave {e:?}");
                let shown = Error::InvalidConfig(e).to_string();
                assert!(shown.contains(case.advice), "{name}: {shown}");
            }
            Err(other) => panic!("{name}: connect gave {other:?}"),
            Ok(_) => panic!("{name}: connect accepted it"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// TOML: a serde error that points at the field.

#[test]
fn bad_toml_is_a_parse_error_that_points_at_the_field() {
    let cases: [(&str, &str, &str, &str); 4] = [
        // (name, text, the field, words of the message)
        (
            "ttl is no duration",
            "ttl = \"banana\"",
            "ttl",
            "invalid value: string \"banana\", expected a duration",
        ),
        (
            "ttl negative",
            "ttl = \"-5s\"",
            "ttl",
            "invalid value: string \"-5s\", expected a duration",
        ),
        (
            "an unknown field",
            "nodes = []\ncolour = \"red\"",
            "colour",
            "unknown field `colour`, expected one of `nodes`, `ttl`",
        ),
        (
            "nodes of the wrong type",
            "nodes = 5",
            "nodes",
            "invalid type: integer `5`, expected a sequence",
        ),
    ];
    for (name, text, field, words) in cases {
        let parsed = std::panic::catch_unwind(|| toml::from_str::<LockConfig>(text))
            .unwrap_or_else(|_| panic!("case `{name}` panicked"));
        let err = parsed.expect_err(name);
        assert!(
            err.message().contains(words),
            "{name}: the message does not say `{words}`: {err}"
        );
        // The error points at the line of the field, which its text quotes.
        let span = err
            .span()
            .unwrap_or_else(|| panic!("{name}: no span: {err}"));
        let line_start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
        assert!(
            text[line_start..].starts_with(field),
            "{name}: the error points at {:?}, not at `{field}`",
            &text[span]
        );
        assert!(err.to_string().contains(field), "{name}: {err}");
    }
}

// ---------------------------------------------------------------------------------------
// Per-call values, against real nodes: a typed error, nothing sent, and the client still
// works.

/// What a caller asks for.
enum Request {
    /// `lock_with(key, options)`.
    Lock(String, LockOptions),
    /// `lock_many(keys)`.
    Many(Vec<String>),
}

struct RequestCase {
    request: Request,
    expect: fn(&Error) -> bool,
    advice: &'static str,
}

impl Request {
    async fn run(&self, c: &Redlock) -> Result<LockGuard, Error> {
        match self {
            Request::Lock(key, options) => c.lock_with(key, options).await,
            Request::Many(keys) => {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                c.lock_many(&keys, &one_attempt()).await
            }
        }
    }

    fn keys(&self) -> Vec<String> {
        match self {
            Request::Lock(key, _) => vec![key.clone()],
            Request::Many(keys) => keys.clone(),
        }
    }
}

fn with_ttl(ttl: Duration) -> Request {
    Request::Lock(
        "per-call-ttl".into(),
        LockOptions {
            ttl: Some(ttl),
            ..one_attempt()
        },
    )
}

/// A per-call TTL is an option over the configured one: checked as the configuration is.
fn ttl(e: &Error) -> Option<&ArgumentError> {
    match e {
        Error::InvalidConfig(InvalidConfig::Ttl(a)) => Some(a),
        _ => None,
    }
}

fn argument(e: &Error) -> Option<&ArgumentError> {
    match e {
        Error::InvalidArgument(a) => Some(a),
        _ => None,
    }
}

fn request_cases() -> Vec<(&'static str, RequestCase)> {
    use ArgumentError::*;
    vec![
        (
            "per-call ttl 0",
            RequestCase {
                request: with_ttl(Duration::ZERO),
                expect: |e| matches!(ttl(e), Some(ZeroTtl)),
                advice: "give the lock a lifetime",
            },
        ),
        (
            "per-call ttl 1 ms",
            RequestCase {
                request: with_ttl(Duration::from_millis(1)),
                expect: |e| matches!(ttl(e), Some(TtlTooShort { .. })),
                advice: "use a TTL many times the node timeout",
            },
        ),
        (
            "per-call ttl twice MAX_TTL",
            RequestCase {
                request: with_ttl(MAX_TTL * 2),
                expect: |e| matches!(ttl(e), Some(TtlTooLong { .. })),
                advice: "use a shorter TTL and extend it while you work",
            },
        ),
        (
            "empty key",
            RequestCase {
                request: Request::Lock(String::new(), one_attempt()),
                expect: |e| matches!(argument(e), Some(EmptyKey)),
                advice: "name the resource the lock protects",
            },
        ),
        (
            "key over MAX_KEY_LEN",
            RequestCase {
                request: Request::Lock("k".repeat(MAX_KEY_LEN + 1), one_attempt()),
                expect: |e| {
                    matches!(
                        argument(e),
                        Some(KeyTooLong { len, max }) if *len > MAX_KEY_LEN && *max == MAX_KEY_LEN
                    )
                },
                advice: "hash long resource names into a shorter key",
            },
        ),
        (
            "lock_many with no keys",
            RequestCase {
                request: Request::Many(Vec::new()),
                expect: |e| matches!(argument(e), Some(NoKeys)),
                advice: "a lock over several keys needs at least one",
            },
        ),
        (
            "lock_many with a key twice",
            RequestCase {
                request: Request::Many(vec!["a".into(), "b".into(), "a".into()]),
                expect: |e| matches!(argument(e), Some(DuplicateKey { key }) if key == "redlock:a"),
                advice: "appears twice in one lock: list each resource once",
            },
        ),
        (
            "lock_many with an empty key",
            RequestCase {
                request: Request::Many(vec!["a".into(), String::new()]),
                expect: |e| matches!(argument(e), Some(EmptyKey)),
                advice: "name the resource the lock protects",
            },
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_per_call_values_are_typed_errors_and_send_nothing() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    for (name, case) in request_cases() {
        let result = no_panic(name, case.request.run(&c)).await;
        let err = match result {
            Err(e) => e,
            Ok(guard) => {
                let keys = guard.keys();
                guard.release().await.unwrap();
                panic!("{name}: accepted, locked {keys:?}");
            }
        };
        assert!((case.expect)(&err), "{name}: unexpected error {err:?}");
        assert!(
            err.to_string().contains(case.advice),
            "{name}: the message does not say `{}`: {err}",
            case.advice
        );
        for key in case.request.keys() {
            assert!(
                set.nodes_holding(&c.full_key(&key)).await.is_empty(),
                "{name}"
            );
        }
        nothing_left(&set, name).await;
        still_works(&c, &set, name).await;
    }
    c.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// Odd but legal input.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_nul_bytes_is_a_key_like_any_other() {
    // Redis keys are binary-safe and so is Lua, so a NUL byte is no reason to refuse a key:
    // the lock must take exactly that key (not a prefix cut at the NUL) and release it.
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    let key = "nul\0in\0key";
    let full = c.full_key(key);
    let guard = no_panic("NUL key", c.try_lock(key)).await.unwrap();
    assert_eq!(guard.key(), full);
    for node in set.iter() {
        assert_eq!(node.keys("*").await.unwrap(), vec![full.clone()]);
        assert_eq!(
            node.get(&full).await.unwrap().as_deref(),
            Some(guard.lock().token().as_str())
        );
    }
    // Held means held: a second holder is refused.
    assert!(matches!(
        c.try_lock(key).await,
        Err(Error::NotAcquired { .. })
    ));
    let inspection = c.inspect(key).await.unwrap();
    assert_eq!(inspection.held_by(guard.lock().token()), Some(true));
    guard.release().await.unwrap();
    assert!(set.nodes_holding(&full).await.is_empty());
    nothing_left(&set, "NUL key").await;
    still_works(&c, &set, "NUL key").await;
    c.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// A lock used after its release.

fn all_not_held(report: &RoundReport) -> bool {
    report
        .nodes
        .iter()
        .all(|n| n.outcome == NodeOutcome::NotHeld)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_twice_and_extend_after_release() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    let guard = c.try_lock("twice").await.unwrap();
    let lock = guard.lock();
    let token = lock.token().clone();
    // `release` consumes the guard, so the API cannot release one guard twice; a stored
    // token or the core `Lock` can be. Releases are idempotent: `Ok` means "no quorum holds
    // it for this token", and the report says that this call deleted nothing.
    guard.release().await.unwrap();
    let again = no_panic(
        "release_token after release",
        c.release_token("twice", &token),
    )
    .await
    .unwrap();
    assert!(all_not_held(&again.settled().await), "{again}");
    let core_again = no_panic("core release twice", c.coordinator().release(&lock))
        .await
        .unwrap();
    assert!(all_not_held(&core_again.settled().await), "{core_again}");

    // An extension after the release is refused by every node, and recreates nothing.
    let err = no_panic(
        "core extend after release",
        c.coordinator().extend(&lock, Duration::from_secs(2)),
    )
    .await
    .unwrap_err();
    let redlock_core::Error::NoQuorum { report } = &err else {
        panic!("core extend after release: {err:?}");
    };
    assert!(all_not_held(&report.settled().await), "{err}");
    assert!(
        err.to_string()
            .contains("the lock is no longer ours (it expired or was taken over)"),
        "{err}"
    );
    let err = no_panic(
        "extend_token after release",
        c.extend_token("twice", &token, Duration::from_secs(2)),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, Error::Round(redlock_core::Error::NoQuorum { .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("acquire it again"), "{err}");

    assert!(set.nodes_holding("redlock:twice").await.is_empty());
    nothing_left(&set, "after release").await;
    still_works(&c, &set, "after release").await;
    c.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// Hostile node state.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_is_held_and_left_alone() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    for url in set.urls() {
        command(&url, "RPUSH", &["redlock:queue", "job-1", "job-2"]).await;
    }
    let list = || Value::Array(vec!["job-1".into(), "job-2".into()]);

    let err = no_panic("lock on a list", c.try_lock("queue"))
        .await
        .unwrap_err();
    let Error::NotAcquired { report, .. } = &err else {
        panic!("lock on a list: {err:?}");
    };
    let settled = report.settled().await;
    for node in &settled.nodes {
        assert_eq!(node.outcome, NodeOutcome::HeldByOther, "{node}");
    }
    assert!(err.to_string().contains("held by another owner"), "{err}");
    // A release or extension by some token reads the list as "not ours", without an error.
    let token = redlock_client::Token::random();
    let released = c.release_token("queue", &token).await.unwrap();
    assert!(all_not_held(&released.settled().await), "{released}");
    assert!(matches!(
        c.extend_token("queue", &token, Duration::from_secs(2))
            .await,
        Err(Error::Round(redlock_core::Error::NoQuorum { .. }))
    ));
    // The rollback of the lost round, the release and the extension left the list as it was.
    for url in set.urls() {
        let range = command(&url, "LRANGE", &["redlock:queue", "0", "-1"]).await;
        assert_eq!(range, list(), "{url}");
        let ttl = command(&url, "PTTL", &["redlock:queue"]).await;
        assert_eq!(ttl, Value::Integer(-1), "{url}: the list got an expiry");
    }
    for node in set.iter() {
        node.del("redlock:queue").await.unwrap();
    }
    nothing_left(&set, "list key").await;
    still_works(&c, &set, "list key").await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_out_of_memory_answer_with_a_typed_server_error() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    for url in set.urls() {
        command(&url, "CONFIG", &["SET", "maxmemory", "1"]).await;
    }
    let err = no_panic("out of memory", c.lock_with("oom", &one_attempt()))
        .await
        .unwrap_err();
    let Error::NotAcquired { report, .. } = &err else {
        panic!("out of memory: {err:?}");
    };
    for node in &report.settled().await.nodes {
        let NodeOutcome::ServerError(e) = &node.outcome else {
            panic!("out of memory: {node}");
        };
        assert_eq!(e.kind, ServerErrorKind::OutOfMemory, "{node}");
    }
    assert!(err.to_string().contains("raise `maxmemory`"), "{err}");
    assert!(set.nodes_holding("redlock:oom").await.is_empty());
    for url in set.urls() {
        command(&url, "CONFIG", &["SET", "maxmemory", "0"]).await;
    }
    nothing_left(&set, "out of memory").await;
    still_works(&c, &set, "out of memory").await;
    c.shutdown().await;
}

/// A "node" that accepts connections and never reads or writes: a hung server, or a
/// firewall that lets the handshake through. Its thread holds every connection open for
/// the rest of the test process.
fn silent_node() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            match stream {
                Ok(stream) => held.push(stream),
                Err(_) => return,
            }
        }
    });
    url
}

/// A node that never answers shows as timed out: `TimedOut` when a command waited out its
/// node timeout, or, once the connection's own handshake timed out and it was marked down, a
/// connection error that says so (commands then fail at once instead of waiting).
fn timed_out(outcome: &NodeOutcome) -> bool {
    match outcome {
        NodeOutcome::TimedOut => true,
        NodeOutcome::ConnectionError(e) => e.contains("timed out"),
        _ => false,
    }
}

fn outcome_of<'a>(report: &'a RoundReport, url: &str) -> &'a NodeOutcome {
    &report
        .nodes
        .iter()
        .find(|n| n.node.as_str() == url)
        .unwrap_or_else(|| panic!("{url} is not in the report: {report}"))
        .outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_never_answers_counts_as_timed_out() {
    let set = NodeSet::start(2).await.unwrap();
    let silent = silent_node();
    let config = |urls: Vec<String>| {
        LockConfig::builder()
            .nodes(urls)
            .ttl(Duration::from_secs(2))
            .node_timeout(Duration::from_millis(200))
            .backoff(Duration::from_millis(5), Duration::from_millis(50))
            .build()
            .unwrap()
    };

    // One silent node of three: connecting works, and the other two make the quorum.
    let urls = vec![set.node(0).url(), silent.clone(), set.node(1).url()];
    let c = tokio::time::timeout(HANG_GUARD, Redlock::connect(config(urls)))
        .await
        .expect("connect hung on a silent node")
        .unwrap();
    let guard = tokio::time::timeout(HANG_GUARD, c.try_lock("silent"))
        .await
        .expect("try_lock hung on a silent node")
        .unwrap();
    assert_eq!(set.nodes_holding("redlock:silent").await, vec![0, 1]);
    let settled = guard.lock().report().settled().await;
    assert!(timed_out(outcome_of(&settled, &silent)), "{settled}");
    tokio::time::timeout(HANG_GUARD, guard.release())
        .await
        .expect("release hung on a silent node")
        .unwrap();
    assert!(set.nodes_holding("redlock:silent").await.is_empty());
    tokio::time::timeout(HANG_GUARD, c.shutdown())
        .await
        .expect("shutdown hung on a silent node");

    // Two silent nodes of three: no quorum, a typed error naming both as timed out, and
    // the one key that was set is rolled back.
    let other = silent_node();
    let urls = vec![silent.clone(), set.node(0).url(), other.clone()];
    let c = tokio::time::timeout(HANG_GUARD, Redlock::connect(config(urls)))
        .await
        .expect("connect hung on silent nodes")
        .unwrap();
    let err = tokio::time::timeout(HANG_GUARD, c.try_lock("silent"))
        .await
        .expect("try_lock hung on silent nodes")
        .unwrap_err();
    // Which of the two depends on whether the node set's answer came before the round was
    // decided: both carry the report, and neither is a panic or an untyped error.
    let (Error::NotAcquired { report, .. } | Error::Unreachable { report, .. }) = &err else {
        panic!("two silent nodes: {err:?}");
    };
    let settled = tokio::time::timeout(HANG_GUARD, report.settled())
        .await
        .expect("the rollback hung on silent nodes");
    for url in [&silent, &other] {
        assert!(timed_out(outcome_of(&settled, url)), "{settled}");
    }
    let shown = err.to_string();
    assert!(shown.contains(&format!("{silent}: ")), "{shown}");
    assert!(shown.contains(&format!("{other}: ")), "{shown}");
    assert!(shown.contains("timed out"), "{shown}");
    assert!(set.nodes_holding("redlock:silent").await.is_empty());
    tokio::time::timeout(HANG_GUARD, c.shutdown())
        .await
        .expect("shutdown hung on silent nodes");
    nothing_left(&set, "silent nodes").await;
}

//! Issue 17's findings, each confirmed (or ruled out) against real redis-server nodes:
//!
//! - the deadline of `lock` (`RetryPolicy::max_wait`) starts no round after it;
//! - a wake-up subscriber that is down is visible (gauge, one warning per change) and
//!   `lock` falls back to its backoff;
//! - a lock whose renewals fail is `RenewalFailing` before it is lost, and `Healthy` again
//!   once a renewal succeeds;
//! - a node that hangs mid-round: the node timeout wins, and the answer counts as late;
//! - a node restarted between rounds (`NOSCRIPT`) answers every script path in that round;
//! - a node that comes up right after `connect` joins the rounds.
//!
//! The spread of a woken waiter (finding 1) is a pure function of the seed, unit-tested
//! in `redlock-client`'s `retry` module.
//!
//! Tests that capture tracing events or metrics run on the current-thread runtime, where
//! every task of the client (and of fred) runs on the test's thread and sees its
//! thread-local subscriber and recorder.

mod common;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{client, eventually, linked};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use redlock_client::{Error, HoldHealth, LockConfig, LostReason, Redlock, RetryPolicy};
use redlock_core::{Config, Coordinator, NodeOutcome, RoundReport, Token};
use redlock_testkit::{LinkFault, NodeSet};
use tokio::time::Instant;
use tracing::field::{Field, Visit};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

const MS: Duration = Duration::from_millis(1);

// ---------------------------------------------------------------------------------------
// Shared helpers

/// A client configuration for `urls` with the test defaults of `common::client`.
fn config(urls: Vec<String>) -> redlock_client::LockConfigBuilder {
    LockConfig::builder()
        .nodes(urls)
        .ttl(Duration::from_secs(2))
        .node_timeout(200 * MS)
        .backoff(5 * MS, 50 * MS)
}

/// The value of the unlabelled gauge `name`, as rendered (0 when never set).
fn gauge(prometheus: &PrometheusHandle, name: &str) -> f64 {
    prometheus.run_upkeep();
    prometheus
        .render()
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name} "))?.parse().ok())
        .unwrap_or(0.0)
}

/// The report with every late answer and rollback in.
async fn settled(report: &RoundReport) -> RoundReport {
    tokio::time::timeout(Duration::from_secs(10), report.settled())
        .await
        .expect("the round settles")
}

// ---------------------------------------------------------------------------------------
// Finding 2: `max_wait` is checked before every round and every sleep.

/// When each acquisition round of a `lock` call started, and when the call started (the
/// creation of its `redlock.lock` span, which precedes the call's own start by the few
/// instructions in between: a round counted as "after the deadline" below started at or
/// after `span + max_wait`, so it is at most that close to the real deadline).
#[derive(Clone, Default)]
struct RoundStarts(Arc<Mutex<(Option<Instant>, Vec<Instant>)>>);

struct Kind(Option<String>);

impl Visit for Kind {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "kind" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for RoundStarts {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _ctx: Context<'_, S>,
    ) {
        let now = Instant::now();
        let mut log = self.0.lock().unwrap();
        match attrs.metadata().name() {
            "redlock.lock" => {
                log.0.get_or_insert(now);
            }
            "redlock.round" => {
                let mut kind = Kind(None);
                attrs.record(&mut kind);
                if kind.0.as_deref() == Some("acquire") {
                    log.1.push(now);
                }
            }
            _ => {}
        }
    }
}

/// Runs `lock(key)` with its rounds timed; returns the result, how long it took, the
/// rounds started, and those started at or after the deadline.
async fn timed_lock(
    client: &Redlock,
    key: &str,
    max_wait: Duration,
) -> (Result<(), Error>, Duration, usize, usize) {
    let starts = RoundStarts::default();
    let subscriber = tracing_subscriber::registry().with(starts.clone());
    let _capture = tracing::subscriber::set_default(subscriber);
    let began = Instant::now();
    let result = client.lock(key).await.map(drop);
    let took = began.elapsed();
    let (lock_span, rounds) = starts.0.lock().unwrap().clone();
    let deadline = lock_span.expect("the lock span was created") + max_wait;
    let late = rounds.iter().filter(|&&t| t >= deadline).count();
    (result, took, rounds.len(), late)
}

#[tokio::test]
async fn lock_starts_no_round_past_its_deadline_and_cuts_its_sleep_to_it() {
    let set = NodeSet::start(3).await.unwrap();
    let links = linked(&set).await;
    for node in set.iter() {
        node.set("redlock:deadline", "another-holder", Some(60_000))
            .await
            .unwrap();
    }
    let node_timeout = 500 * MS;
    let max_wait = 300 * MS;
    let waiter = Redlock::connect(
        config(links.urls(0))
            .node_timeout(node_timeout)
            .notify(false)
            .retry(RetryPolicy {
                max_attempts: None,
                max_wait: Some(max_wait),
                // With this seed the first delay (about half a second) is longer than
                // what is left after the first round: the sleep must be cut to the
                // deadline, and the call must end there instead of starting a round.
                base_delay: 1000 * MS,
                max_delay: 1000 * MS,
                seed: Some(42),
            })
            .build()
            .unwrap(),
    )
    .await
    .unwrap();

    // Slow links: each round takes about 80 ms, well inside the deadline.
    let slow = LinkFault::Latency {
        to_server: 40 * MS,
        to_client: 40 * MS,
    };
    links.set_client(0, slow);
    let (result, took, rounds, late) = timed_lock(&waiter, "deadline", max_wait).await;
    assert!(
        matches!(result, Err(Error::DeadlinePassed { .. })),
        "{result:?}"
    );
    assert!(rounds >= 1);
    assert_eq!(
        late, 0,
        "{late} of {rounds} rounds started past the deadline"
    );
    // Hang guard only (the structural check is above): the documented bound plus margin.
    assert!(took < max_wait + node_timeout + 1000 * MS, "{took:?}");

    // A round that straddles the deadline (about 400 ms against 300 ms) finishes, and no
    // other starts.
    links.set_client(
        0,
        LinkFault::Latency {
            to_server: 200 * MS,
            to_client: 200 * MS,
        },
    );
    let (result, took, rounds, late) = timed_lock(&waiter, "deadline", max_wait).await;
    let _ = result.expect_err("the key is held");
    assert_eq!(rounds, 1);
    assert_eq!(late, 0);
    assert!(took < max_wait + node_timeout + 1000 * MS, "{took:?}");
    links.heal_all();
}

/// The fencing step of a fenced acquisition (the token's write-back) ends by the deadline
/// the caller gives: past it, the won lock is released and the acquisition fails, instead
/// of taking another round trip (or three) past the call's bound.
#[tokio::test]
async fn a_fenced_acquisition_past_its_deadline_gets_no_token_and_leaves_no_key() {
    let set = NodeSet::start(3).await.unwrap();
    let core = common::coordinator(&set, 200 * MS).await;
    let keys = ["fenced-deadline"];
    let late = core
        .acquire_with(redlock_core::Acquisition {
            fenced: true,
            deadline: Some(Instant::now()),
            ..redlock_core::Acquisition::new(&keys, Duration::from_secs(10))
        })
        .await;
    match &late {
        Err(redlock_core::Error::NotFenced { reason, .. }) => {
            assert!(reason.contains("deadline"), "{reason}")
        }
        other => panic!("expected NotFenced past the deadline, got {other:?}"),
    }
    core.quiesce().await;
    for node in set.iter() {
        assert!(
            !node.exists("fenced-deadline").await.unwrap(),
            "{}",
            node.name()
        );
    }
    // The control: with time for the write-back, the same acquisition gets its token.
    let lock = core
        .acquire_with(redlock_core::Acquisition {
            fenced: true,
            deadline: Some(Instant::now() + Duration::from_secs(5)),
            ..redlock_core::Acquisition::new(&keys, Duration::from_secs(10))
        })
        .await
        .expect("fenced in time");
    assert!(lock.fencing_token().is_some());
    core.release(&lock).await.unwrap();
}

/// A client of fenced locks (wake-ups off, the test defaults, then `tweak`) whose links to
/// `set` delay everything by `one_way` each way.
async fn slow_fenced_client(
    set: &NodeSet,
    one_way: Duration,
    tweak: impl FnOnce(redlock_client::LockConfigBuilder) -> redlock_client::LockConfigBuilder,
) -> (redlock_testkit::Links, Redlock) {
    let links = linked(set).await;
    let client = Redlock::connect(
        tweak(config(links.urls(0)).notify(false).fencing(true))
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    links.set_client(
        0,
        LinkFault::Latency {
            to_server: one_way,
            to_client: one_way,
        },
    );
    (links, client)
}

/// `lock`'s bound, `deadline + node_timeout`, holds for fenced locks too: a round of 400 ms
/// (slow links) fits in the 600 ms node timeout, but its write-back would end about 800 ms
/// after the call started; the call fails at the bound instead of returning a lock, saying
/// that the deadline cut the token's write-back (not "gave up waiting", which sends the
/// user after a holder), and leaves no key behind.
#[tokio::test]
async fn a_fenced_lock_returns_by_its_deadline_plus_one_node_timeout() {
    let set = NodeSet::start(3).await.unwrap();
    let (links, client) =
        slow_fenced_client(&set, 200 * MS, |c| c.node_timeout(600 * MS).max_wait(MS)).await;
    let result = client.lock("fenced-bound").await;
    match &result {
        Err(Error::Round(e @ redlock_core::Error::NotFenced { .. })) => {
            assert!(e.to_string().contains("deadline passed"), "{e}")
        }
        other => panic!("a fenced lock past its bound: {other:?}"),
    }
    links.heal_all();
    client.shutdown().await;
    for node in set.iter() {
        assert!(
            !node.exists("redlock:fenced-bound").await.unwrap(),
            "{}",
            node.name()
        );
    }
}

/// A fenced attempt that won and got no token before the deadline (its validity ran out
/// during the write-back), whose backoff pause the deadline then cut, fails as that round
/// did (`NotFenced`), not as "gave up waiting" (which sends the user after a holder): only
/// the give-up before the pause used to say so.
#[tokio::test]
async fn a_fenced_call_whose_pause_the_deadline_cut_says_it_got_no_token() {
    let set = NodeSet::start(3).await.unwrap();
    // A round trip of 300 ms: the round wins with about 290 ms of validity, which the
    // token's write-back (another round trip) outlasts.
    let (links, client) = slow_fenced_client(&set, 150 * MS, |c| {
        c.ttl(600 * MS)
            .node_timeout(500 * MS)
            .no_renewal()
            .max_wait(Duration::from_secs(1))
            .backoff(Duration::from_secs(5), Duration::from_secs(5))
    })
    .await;
    let result = client.lock("fenced-pause").await;
    assert!(
        matches!(
            &result,
            Err(Error::Round(redlock_core::Error::NotFenced { .. }))
        ),
        "{result:?}"
    );
    links.heal_all();
    client.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// Finding 3: a wake-up subscriber that is down is visible, and lock() falls back.

#[tokio::test]
async fn a_subscriber_down_is_counted_logged_once_and_lock_falls_back_to_its_backoff() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let prometheus = recorder.handle();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let (logs, _logs) = common::logs::capture(LevelFilter::INFO);

    let set = NodeSet::start(3).await.unwrap();
    let links = linked(&set).await;
    let waiter = Redlock::connect(
        config(links.urls(0))
            .backoff(20 * MS, 200 * MS)
            .max_wait(Duration::from_secs(10))
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    common::subscribed(&set, 1).await;
    let up = eventually(Duration::from_secs(5), || async {
        gauge(&prometheus, "redlock_subscribers_down") == 0.0
    })
    .await;
    assert!(up, "{}", prometheus.render());

    // Node 2's subscriber (and round connection) is cut off: reset, and every reconnection
    // refused.
    links.link(0, 2).set(LinkFault::Refuse);
    let down = eventually(Duration::from_secs(5), || async {
        gauge(&prometheus, "redlock_subscribers_down") == 1.0
    })
    .await;
    assert!(down, "{}", prometheus.render());
    // Many failed reconnections later, still one warning for the one change.
    tokio::time::sleep(1000 * MS).await;
    assert_eq!(logs.count("wake-up subscriber down"), 1, "{}", logs.text());
    assert_eq!(gauge(&prometheus, "redlock_subscribers_down"), 1.0);

    // A holder that announces nothing: no wake-up can come, from any node. The waiter
    // must get the lock by its backoff (at most 200 ms apart) soon after the release.
    let holder = client(&set, |b| b.notify(false)).await;
    let guard = holder.lock("fallback").await.unwrap();
    let waiting = tokio::spawn(async move {
        let guard = waiter.lock("fallback").await;
        (guard.map(|g| g.attempts()), Instant::now(), waiter)
    });
    tokio::time::sleep(300 * MS).await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let (attempts, acquired, waiter) = waiting.await.unwrap();
    let attempts = attempts.expect("the waiter gets the lock");
    assert!(attempts > 1, "it waited for the holder");
    // Hang guard: the backoff's cap plus a round, with a wide margin.
    let after = acquired - released;
    assert!(after < 1500 * MS, "acquired {after:?} after the release");

    // Back: the gauge returns to 0 and the return is logged.
    links.heal_all();
    let back = eventually(Duration::from_secs(5), || async {
        gauge(&prometheus, "redlock_subscribers_down") == 0.0
    })
    .await;
    assert!(back, "{}", prometheus.render());
    assert_eq!(
        logs.count("wake-up subscriber subscribed again"),
        1,
        "{}",
        logs.text()
    );
    waiter.shutdown().await;
    holder.shutdown().await;
    assert_eq!(gauge(&prometheus, "redlock_subscribers_down"), 0.0);
}

// ---------------------------------------------------------------------------------------
// Finding 4: renewal failing before lost, and back.

#[tokio::test]
async fn renewal_failing_comes_before_lost_and_clears_when_renewal_succeeds() {
    let set = NodeSet::start(3).await.unwrap();
    let links = linked(&set).await;
    // Renewed every second; a failed renewal is retried every 250 ms.
    let client = Redlock::connect(
        config(links.urls(0))
            .ttl(Duration::from_secs(3))
            .node_timeout(100 * MS)
            .notify(false)
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    let guard = client.lock("health").await.unwrap();
    assert_eq!(guard.health(), HoldHealth::Healthy);

    // A minority cut off: renewals still reach a quorum.
    links.link(0, 0).set(LinkFault::Blackhole);
    let before = guard.valid_until();
    let renewed = eventually(Duration::from_secs(3), || async {
        guard.valid_until() > before
    })
    .await;
    assert!(renewed);
    assert_eq!(guard.health(), HoldHealth::Healthy);

    // A majority cut off: renewal fails, the lock is still valid.
    links.link(0, 1).set(LinkFault::Blackhole);
    let health = tokio::time::timeout(Duration::from_secs(3), guard.suspended())
        .await
        .expect("renewal fails within a renewal interval");
    let HoldHealth::RenewalFailing { since, last_error } = &health else {
        panic!("expected RenewalFailing, got {health:?}");
    };
    assert!(*since <= Instant::now());
    assert!(!last_error.is_empty());
    assert!(guard.is_valid(), "failing is not lost");

    // Healed: the next renewal succeeds and the lock is healthy again.
    links.heal_all();
    let healthy = eventually(Duration::from_secs(2), || async {
        guard.health() == HoldHealth::Healthy
    })
    .await;
    assert!(healthy, "{:?}", guard.health());
    assert!(guard.is_valid());

    // Cut off again for good: failing first, then lost when the validity runs out.
    links.link(0, 0).set(LinkFault::Blackhole);
    links.link(0, 1).set(LinkFault::Blackhole);
    let health = tokio::time::timeout(Duration::from_secs(3), guard.suspended())
        .await
        .expect("renewal fails");
    assert!(
        matches!(health, HoldHealth::RenewalFailing { .. }),
        "{health:?}"
    );
    let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the validity runs out");
    assert_eq!(lost, LostReason::Expired);
    assert_eq!(guard.health(), HoldHealth::Lost(LostReason::Expired));
    links.heal_all();
    let _ = guard.release().await;
}

// ---------------------------------------------------------------------------------------
// Finding 5a: a node that hangs mid-round.

/// Starts an acquisition of `key` while node 2's requests are delayed 150 ms, pauses node
/// 2 (SIGSTOP) while the request is on its way, resumes it after `hang`, and returns the
/// lock (won by nodes 0 and 1) with its settled report.
async fn hang_mid_round(
    set: &NodeSet,
    coordinator: &Coordinator,
    links: &redlock_testkit::Links,
    key: &str,
    hang: Duration,
) -> (redlock_core::Lock, RoundReport) {
    links.link(0, 2).set(LinkFault::Latency {
        to_server: 150 * MS,
        to_client: Duration::ZERO,
    });
    let round = tokio::spawn({
        let coordinator = coordinator.clone();
        let key = key.to_string();
        async move { coordinator.acquire(&key, Duration::from_secs(10)).await }
    });
    tokio::time::sleep(50 * MS).await;
    set.node(2).pause().unwrap();
    let lock = round
        .await
        .unwrap()
        .expect("nodes 0 and 1 decide the round");
    assert_eq!(lock.report().nodes[2].outcome, NodeOutcome::Pending);
    let resume = async {
        tokio::time::sleep(hang).await;
        set.node(2).resume().unwrap();
    };
    let (report, ()) = tokio::join!(settled(lock.report()), resume);
    links.link(0, 2).heal();
    (lock, report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_hung_mid_round_times_out_at_the_node_timeout_and_counts_as_late() {
    let set = NodeSet::start(3).await.unwrap();
    let links = linked(&set).await;
    let connect = |timeout| {
        Coordinator::connect(Config {
            nodes: links.urls(0),
            node_timeout: timeout,
            ..Default::default()
        })
    };

    // Hung for longer than the node timeout: the round's own timeout ends the wait (fred's
    // command timeout is the same value, and neither reconnects), recorded as late.
    let coordinator = connect(300 * MS).await.unwrap();
    let (lock, report) = hang_mid_round(&set, &coordinator, &links, "hung", 1200 * MS).await;
    let node = &report.nodes[2];
    assert_eq!(node.outcome, NodeOutcome::TimedOut, "{report}");
    assert!(node.late, "{report}");
    let latency = node.latency.expect("an answer time");
    assert!(latency >= 300 * MS && latency < 1000 * MS, "{latency:?}");
    // The SET ran when the node woke up, after we gave up on it; the connection was not
    // reset, and the late reply did not shift later replies: the release reads node 2's
    // own answer.
    let released = coordinator.release(&lock).await.unwrap();
    let released = settled(&released).await;
    assert_eq!(
        released.nodes[2].outcome,
        NodeOutcome::Released,
        "{released}"
    );
    assert!(set.nodes_holding("hung").await.is_empty());
    coordinator.close().await;

    // Hung for less than the node timeout: a late answer, counted as one.
    let coordinator = connect(2000 * MS).await.unwrap();
    let (lock, report) = hang_mid_round(&set, &coordinator, &links, "slow", 400 * MS).await;
    let node = &report.nodes[2];
    assert_eq!(node.outcome, NodeOutcome::Acquired, "{report}");
    assert!(node.late, "{report}");
    let latency = node.latency.expect("an answer time");
    assert!(latency >= 400 * MS && latency < 2000 * MS, "{latency:?}");
    coordinator.release(&lock).await.unwrap();
    coordinator.close().await;
}

// ---------------------------------------------------------------------------------------
// Finding 5b: NOSCRIPT after a restart, on every script path.

/// Restarts node 2 empty (no persistence: keys and script cache gone) and waits until the
/// coordinator's rounds reach it again, through `SET NX` rounds that load no script, and
/// until the scripts are loaded there again (the coordinator does that on reconnecting).
async fn restart_empty(set: &NodeSet, coordinator: &Coordinator, round: &str) {
    set.node(2).restart().await.unwrap();
    let mut n = 0;
    let back = eventually(Duration::from_secs(5), || {
        n += 1;
        let key = format!("warm-up:{round}:{n}");
        async move {
            match coordinator.acquire(&key, Duration::from_secs(1)).await {
                Ok(lock) => settled(lock.report()).await.nodes[2].outcome.is_answer(),
                Err(_) => false,
            }
        }
    })
    .await;
    assert!(back, "node 2 answers again after its restart");
    // Written together on the connection: once some ran, every later command comes after
    // all of them.
    let loaded = eventually(Duration::from_secs(5), || async {
        set.node(2).command_calls("script|load").await.unwrap() >= 10
    })
    .await;
    assert!(loaded, "the scripts were not loaded again on node 2");
}

/// Empties node 2's script cache (`SCRIPT FLUSH`) without a reconnection: the scripts stay
/// unknown there until a command loads them.
async fn forget_scripts(set: &NodeSet) {
    use fred::interfaces::ClientLike;
    use fred::types::{CustomCommand, Value};
    let raw = common::raw(&set.node(2).url()).await;
    let flush = CustomCommand::new_static("SCRIPT", None, false);
    raw.custom::<Value, _>(flush, vec!["FLUSH"]).await.unwrap();
}

/// Node 2's settled outcome in `report` must be `want`, and it must have been reached by
/// the `EVAL` fallback (its script cache was empty).
async fn answered_by_eval(set: &NodeSet, report: &RoundReport, want: NodeOutcome) {
    let report = settled(report).await;
    assert_eq!(report.nodes[2].outcome, want, "{report}");
    assert!(set.node(2).command_calls("eval").await.unwrap() >= 1);
}

/// After a restart, script acquisitions are answered in their round (the scripts are
/// loaded again on reconnection, and sent with their source as one command until then; an
/// acquisition is never sent again with its source, see `core_faults.rs`); extensions,
/// releases and rollbacks on a node whose cache was emptied are answered in their round
/// through the `EVAL` fallback.
#[tokio::test]
async fn a_node_that_forgot_the_scripts_answers_every_script_path() {
    let set = NodeSet::start(3).await.unwrap();
    let coordinator = common::coordinator(&set, 500 * MS).await;
    let ttl = Duration::from_secs(10);

    // Acquisition of several keys (a script).
    restart_empty(&set, &coordinator, "many").await;
    let lock = coordinator
        .acquire_many(&["many:a", "many:b"], Token::random(), ttl)
        .await
        .unwrap();
    assert_eq!(
        settled(lock.report()).await.nodes[2].outcome,
        NodeOutcome::Acquired
    );

    // Reentrant acquisition (a script).
    restart_empty(&set, &coordinator, "reentrant").await;
    let lock = coordinator
        .acquire_reentrant("reentrant", "owner-1", Token::random(), ttl)
        .await
        .unwrap();
    assert_eq!(
        settled(lock.report()).await.nodes[2].outcome,
        NodeOutcome::Acquired
    );

    // Extension.
    let lock = coordinator.acquire("extend", ttl).await.unwrap();
    forget_scripts(&set).await;
    let extended = coordinator.extend(&lock, ttl).await.unwrap();
    answered_by_eval(&set, extended.report(), NodeOutcome::Extended).await;

    // Release.
    let lock = coordinator.acquire("release", ttl).await.unwrap();
    forget_scripts(&set).await;
    let report = coordinator.release(&lock).await.unwrap();
    answered_by_eval(&set, &report, NodeOutcome::Released).await;

    // Rollback: nodes 0 and 1 refuse, node 2 accepts and is rolled back.
    forget_scripts(&set).await;
    for node in &set.nodes()[..2] {
        node.set("rollback", "another-holder", Some(10_000))
            .await
            .unwrap();
    }
    let err = coordinator.acquire("rollback", ttl).await.unwrap_err();
    let report = settled(err.report().expect("a round report")).await;
    assert_eq!(report.nodes[2].outcome, NodeOutcome::Acquired, "{report}");
    assert_eq!(
        report.nodes[2].cleanup,
        Some(redlock_core::CleanupOutcome::Removed),
        "{report}"
    );
    assert!(!set.node(2).exists("rollback").await.unwrap());
    coordinator.close().await;
}

// ---------------------------------------------------------------------------------------
// Finding 5c: a node that comes up right after connect.

#[tokio::test]
async fn a_node_that_comes_up_after_connect_joins_the_rounds_within_a_reconnect_delay() {
    let set = NodeSet::start(3).await.unwrap();
    set.node(2).kill().unwrap();
    // The client's (the core's default): a node that went away is retried at least this
    // often.
    let reconnect_max_delay = redlock_core::Config::default().reconnect_max_delay;
    let client = Redlock::connect(config(set.urls()).build().unwrap())
        .await
        .unwrap();
    set.node(2).restart().await.unwrap();
    let up = Instant::now();
    let mut n = 0;
    let joined = eventually(reconnect_max_delay * 3, || {
        n += 1;
        let key = format!("late-node:{n}");
        let client = &client;
        async move {
            let Ok(guard) = client.try_lock(&key).await else {
                return false;
            };
            let report = settled(guard.lock().report()).await;
            let _ = guard.release().await;
            report.nodes[2].outcome == NodeOutcome::Acquired
        }
    })
    .await;
    assert!(joined, "node 2 never joined the rounds");
    // Within one reconnect delay (plus the node timeout of the attempt that found it down
    // and the polling period).
    let took = up.elapsed();
    assert!(took < reconnect_max_delay + 500 * MS, "{took:?}");
    // Its wake-up subscriber subscribes too.
    common::subscribed(&set, 1).await;
    client.shutdown().await;
}

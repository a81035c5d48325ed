//! The metrics the crates record, as the Prometheus exporter renders them: every documented
//! name, described, with the labels and counts of what the test did (won, contended,
//! cancelled, rolled back, late, renewed, released, lost by refusal and by expiry).
//!
//! Its own test binary, with one test: the recorder is global to the process, and the
//! counts below are exact only if nothing else records meanwhile.

mod common;

use std::time::Duration;

use common::client;
use fred::prelude::{Builder, ClientLike, Config as FredConfig, ServerConfig};
use fred::types::CustomCommand;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use redlock_client::{Error, LostReason};
use redlock_core::metrics::{
    ACQUISITIONS, FAIR_STEPS_BACK, FENCING_REPAIRS, HANDOVERS, LATE_REPLIES, LOCKS_HELD,
    LOCKS_LOST, LOCK_WAIT, NODE_LATENCY, NODE_REPLIES, RENEWALS, ROLLBACKS, ROUND_DURATION,
};
use redlock_core::{Config, Coordinator};
use redlock_testkit::NodeSet;

const TTL: Duration = Duration::from_millis(900);
/// The password of the node in `node_labels_never_show_a_password`; must never be rendered.
const PASSWORD: &str = "metrics-Pa55word";

/// The value of the one sample `name{labels}` (labels in any order), if rendered.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut want = labels.to_vec();
    want.sort();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            let mut have: Vec<(&str, &str)> = rest
                .strip_suffix('}')?
                .split(',')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (k, v) = pair.split_once('=').expect("label=value");
                    (k, v.trim_matches('"'))
                })
                .collect();
            have.sort();
            (metric == name && have == want).then(|| value.parse().expect("a number"))
        })
}

/// The sum of every sample of `name` that has all of `labels` (and maybe others).
fn sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")))
        .filter(|line| {
            labels
                .iter()
                .all(|(k, v)| line.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Counts of a histogram's samples (`NAME_count`) with exactly `labels`.
fn count(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(text, &format!("{name}_count"), labels).unwrap_or(0.0)
}

fn acquisitions(text: &str, outcome: &str) -> f64 {
    sample(text, ACQUISITIONS, &[("outcome", outcome)]).unwrap_or(0.0)
}

fn render(prometheus: &PrometheusHandle) -> String {
    prometheus.run_upkeep();
    prometheus.render()
}

/// `CONFIG SET requirepass` on the node at `port`, through a plain fred client.
async fn require_password(port: u16) {
    let config = FredConfig {
        server: ServerConfig::new_centralized("127.0.0.1", port),
        ..Default::default()
    };
    let client = Builder::from_config(config).build().unwrap();
    client.init().await.unwrap();
    let () = client
        .custom(
            CustomCommand::new_static("CONFIG", None, false),
            vec!["SET", "requirepass", PASSWORD],
        )
        .await
        .unwrap();
    client.quit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_metric_counts_what_happened() {
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this test binary");
    let set = NodeSet::start(3).await.unwrap();
    let urls = set.urls();
    let node = |i: usize| urls[i].as_str();
    let a = client(&set, |b| b.ttl(TTL).renew_after(Duration::from_millis(200))).await;
    let b = client(&set, |b| b.ttl(TTL).no_renewal()).await;

    // Won, then contended: one attempt, refused by every node.
    let held = a.lock("held").await.unwrap();
    let text = render(&prometheus);
    assert_eq!(sample(&text, LOCKS_HELD, &[]), Some(1.0));
    assert!(matches!(
        b.try_lock("held").await,
        Err(Error::NotAcquired { .. })
    ));
    // Cancelled: the caller stops waiting.
    let waiting = tokio::time::timeout(Duration::from_millis(100), b.lock("held")).await;
    assert!(waiting.is_err(), "the lock is held: lock() waits");

    // Renewed a few times, then released.
    tokio::time::sleep(Duration::from_millis(700)).await;
    held.release().await.unwrap();

    // Rolled back: two nodes hold the key for someone else, the third is undone.
    for i in 0..2 {
        set.node(i)
            .set("redlock:partial", "someone-else", Some(10_000))
            .await
            .unwrap();
    }
    assert!(matches!(
        b.try_lock("partial").await,
        Err(Error::NotAcquired { .. })
    ));
    // The rollback runs in the background: let it finish before node 2 is paused below.
    b.coordinator().quiesce().await;

    // Late: a paused node answers (times out) after a quorum already decided.
    set.node(2).pause().unwrap();
    let late = a.lock("late").await.unwrap();
    a.coordinator().quiesce().await;
    set.node(2).resume().unwrap();
    late.release().await.unwrap();

    // Lost by refusal: the key vanishes from a majority, and the next renewal says so.
    let doomed = a.lock("doomed").await.unwrap();
    for i in 0..2 {
        set.node(i).del("redlock:doomed").await.unwrap();
    }
    let reason = tokio::time::timeout(Duration::from_secs(5), doomed.lost()).await;
    assert_eq!(reason.expect("renewal notices"), LostReason::Refused);
    drop(doomed);

    // Lost by expiry: not renewed, held past its validity.
    let plain = b.lock("plain").await.unwrap();
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    assert_eq!(plain.lost().await, LostReason::Expired);
    drop(plain);

    a.coordinator().quiesce().await;
    b.coordinator().quiesce().await;
    let text = render(&prometheus);

    // The hand-over and step-back counters are rendered once something was counted:
    // checked below.
    for name in redlock_core::metrics::ALL
        .into_iter()
        .filter(|&n| n != HANDOVERS && n != FAIR_STEPS_BACK && n != FENCING_REPAIRS)
    {
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "{name} described"
        );
    }

    // Acquisitions and their waits, by outcome: exactly the calls made above.
    assert_eq!(acquisitions(&text, "acquired"), 4.0, "{text}");
    assert_eq!(acquisitions(&text, "not_acquired"), 2.0);
    assert_eq!(acquisitions(&text, "cancelled"), 1.0);
    assert_eq!(count(&text, LOCK_WAIT, &[("outcome", "acquired")]), 4.0);
    assert_eq!(count(&text, LOCK_WAIT, &[("outcome", "not_acquired")]), 2.0);
    assert_eq!(count(&text, LOCK_WAIT, &[("outcome", "cancelled")]), 1.0);

    // Rounds by kind and outcome.
    let rounds = |kind, outcome| {
        count(
            &text,
            ROUND_DURATION,
            &[("kind", kind), ("outcome", outcome)],
        )
    };
    assert!(rounds("acquire", "won") >= 4.0);
    assert!(rounds("acquire", "lost") >= 2.0);
    assert!(rounds("release", "won") >= 2.0);
    assert!(
        rounds("extend", "won") >= 2.0,
        "renewals are extension rounds"
    );
    assert!(rounds("extend", "lost") >= 1.0, "the refused renewal");

    // Every node's answers, each counted once: the contended try_lock was refused by all
    // three (the last one maybe after the decision), the partial one by nodes 0 and 1.
    let replies = |i: usize, outcome| {
        sample(
            &text,
            NODE_REPLIES,
            &[("node", node(i)), ("kind", "acquire"), ("outcome", outcome)],
        )
        .unwrap_or(0.0)
    };
    assert!(replies(0, "held_by_other") >= 2.0);
    assert!(replies(2, "held_by_other") >= 1.0);
    assert!(replies(2, "timed_out") >= 1.0, "the paused node");
    assert!(replies(0, "acquired") >= 4.0);
    for i in 0..3 {
        let labels = [("node", node(i)), ("kind", "acquire")];
        let latency = count(&text, NODE_LATENCY, &labels);
        assert!(latency >= 5.0, "node {i}: {latency}");
    }
    let late_labels = [("node", node(2)), ("kind", "acquire")];
    assert!(sample(&text, LATE_REPLIES, &late_labels).unwrap_or(0.0) >= 1.0);

    // The partial acquisition was undone on node 2, the only one that had set it.
    let rollbacks = sample(
        &text,
        ROLLBACKS,
        &[("node", node(2)), ("outcome", "removed")],
    );
    assert_eq!(rollbacks, Some(1.0), "{text}");
    assert_eq!(sum(&text, ROLLBACKS, &[("outcome", "gave_up")]), 0.0);

    // Renewals, and the locks lost: one each way; nothing is held any more.
    assert!(sample(&text, RENEWALS, &[("outcome", "renewed")]).unwrap_or(0.0) >= 2.0);
    assert_eq!(
        sample(&text, RENEWALS, &[("outcome", "refused")]),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, LOCKS_LOST, &[("reason", "refused")]),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, LOCKS_LOST, &[("reason", "expired")]),
        Some(1.0)
    );
    assert_eq!(sample(&text, LOCKS_HELD, &[]), Some(0.0), "{text}");
    assert!(!text.contains("redlock:"), "no lock key is a label");

    node_labels_never_show_a_password(&prometheus).await;
    a_fair_hand_over_is_counted(&prometheus).await;
    a_fair_step_back_is_counted(&prometheus).await;
}

/// A fair head whose answers all come after its node timeout (its commands run at once)
/// steps back after three rounds that no node refused, and each step back is counted.
async fn a_fair_step_back_is_counted(prometheus: &PrometheusHandle) {
    let set = NodeSet::start(3).await.unwrap();
    let links = common::linked(&set).await;
    assert_eq!(sample(&render(prometheus), FAIR_STEPS_BACK, &[]), None);
    let config = redlock_client::LockConfig::builder()
        .nodes(links.urls(0))
        .ttl(TTL)
        .no_renewal()
        .node_timeout(Duration::from_millis(100))
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
        .max_wait(Duration::from_secs(10))
        .fair(true)
        .build()
        .unwrap();
    let head = redlock_client::Redlock::connect(config).await.unwrap();
    common::subscribed(&set, 1).await;
    links.set_client(
        0,
        redlock_testkit::LinkFault::Latency {
            to_server: Duration::ZERO,
            to_client: Duration::from_millis(400),
        },
    );
    let waiter = head.clone();
    let waiting = tokio::spawn(async move { waiter.lock("steps").await });
    let counted = common::eventually(Duration::from_secs(5), || async {
        sample(&render(prometheus), FAIR_STEPS_BACK, &[]).is_some_and(|n| n >= 1.0)
    })
    .await;
    let text = render(prometheus);
    assert!(counted, "no step back counted: {text}");
    assert!(
        text.contains(&format!("# HELP {FAIR_STEPS_BACK} ")),
        "described"
    );
    waiting.abort();
    let _ = waiting.await;
    links.heal_all();
    head.shutdown().await;
}

/// A release that hands the key to a fair waiter of another client is counted once, as
/// held (the waiter ran no round of its own).
async fn a_fair_hand_over_is_counted(prometheus: &PrometheusHandle) {
    let set = NodeSet::start(3).await.unwrap();
    let fair = |b: redlock_client::LockConfigBuilder| b.ttl(TTL).no_renewal().fair(true);
    let holder = client(&set, fair).await;
    let waiter = client(&set, |b| {
        fair(b).backoff(Duration::from_millis(10), Duration::from_secs(10))
    })
    .await;
    common::subscribed(&set, 2).await;
    let guard = holder.lock("fair").await.unwrap();
    let waiting = tokio::spawn(async move { waiter.lock("fair").await });
    // Queued on every node: where it was not yet, the release would free the key and the
    // waiter's round would take it there, with a round of its own.
    let queued = common::eventually(Duration::from_secs(5), || async {
        for node in set.iter() {
            let there: bool = node
                .redis()
                .exists("redlock:fair-queue:{redlock:fair}")
                .await
                .unwrap();
            if !there {
                return false;
            }
        }
        true
    })
    .await;
    assert!(queued, "the waiter queued");
    guard.release().await.unwrap();
    let handed = waiting.await.unwrap().unwrap();
    assert!(handed.lock().token().as_str().contains('~'));
    handed.release().await.unwrap();
    let text = render(prometheus);
    assert!(text.contains(&format!("# HELP {HANDOVERS} ")), "described");
    assert_eq!(
        sample(&text, HANDOVERS, &[("outcome", "held")]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, HANDOVERS, &[("outcome", "taken_on")]), None);
    holder.shutdown().await;
}

/// A node whose URL carries a password is labelled by its redacted name.
async fn node_labels_never_show_a_password(prometheus: &PrometheusHandle) {
    let set = NodeSet::start(1).await.unwrap();
    let port = set.node(0).port();
    require_password(port).await;
    let core = Coordinator::connect(Config {
        nodes: vec![format!("redis://:{PASSWORD}@127.0.0.1:{port}")],
        ..Default::default()
    })
    .await
    .unwrap();
    let lock = core.acquire("secured", TTL).await.unwrap();
    core.release(&lock).await.unwrap();
    core.close().await;
    let text = render(prometheus);
    assert!(!text.contains(PASSWORD), "{text}");
    let redacted = format!("redis://:***@127.0.0.1:{port}");
    let labels = [
        ("node", redacted.as_str()),
        ("kind", "release"),
        ("outcome", "released"),
    ];
    assert_eq!(sample(&text, NODE_REPLIES, &labels), Some(1.0), "{text}");
}

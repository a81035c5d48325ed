//! Fencing counters repaired without an operator: a node that lost its counter (FLUSHALL,
//! a restart without persistence) or came back with an older one (a restart from an older
//! snapshot) is given one again, so that minority losses spread over time never stop
//! fencing nor send tokens back; and a client never hands out a token at or below one it
//! handed out itself.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{coordinator_at, linked};
use redlock_core::{Acquisition, Coordinator, Error as CoreError, FencingCounter};
use redlock_testkit::{LinkFault, NodeSet};

const COUNTER: &str = "redlock:fencing-counter";

fn fenced<'a>(keys: &'a [&'a str]) -> Acquisition<'a> {
    Acquisition {
        fenced: true,
        ..Acquisition::new(keys, Duration::from_secs(5))
    }
}

/// One fenced acquisition and its release: the token, or the error.
async fn take(core: &Coordinator, key: &'static str) -> Result<u64, CoreError> {
    let keys = [key];
    let lock = core.acquire_with(fenced(&keys)).await?;
    let token = lock
        .fencing_token()
        .expect("a fenced lock has a token")
        .get();
    let _ = core.release(&lock).await;
    Ok(token)
}

/// Waits until every node has an intact counter (`At`), as the coordinator reads them.
async fn all_repaired(core: &Coordinator, within: Duration) -> bool {
    common::eventually(within, || async {
        let seen = core.fencing_counters().await;
        seen.nodes
            .iter()
            .all(|(_, c)| matches!(c, FencingCounter::At(_)))
    })
    .await
}

/// A data loss of one node, of the three kinds the repair must mend.
#[derive(Debug, Clone, Copy)]
enum Loss {
    Flush,
    /// Restart without persistence: the node comes back empty.
    Restart,
    /// Restart from the snapshot saved earlier (`SAVE` then more tokens).
    Snapshot,
}

/// The run, compressed: five nodes, two fenced clients taking turns on one key and
/// a third on two others, while one or two nodes at a time lose their data (FLUSHALL, a
/// restart without persistence, a restart from an older snapshot), each loss after the
/// last one's repair, until every node has lost its counter at least twice. Before repairs
/// existed, fencing stopped (`FencingCountersLost`) once three nodes had lost theirs, and
/// tokens started again at 1 once all five had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_minority_data_losses_leave_fencing_working_and_monotonic() {
    let set = NodeSet::start(5).await.unwrap();
    let timeout = Duration::from_millis(500);
    let a = coordinator_at(set.urls(), timeout).await;
    let b = coordinator_at(set.urls(), timeout).await;
    let c = coordinator_at(set.urls(), timeout).await;
    let stop = Arc::new(AtomicBool::new(false));
    let lost = Arc::new(AtomicU64::new(0));
    // Taking turns: each acquisition completes before the next begins, so their tokens
    // must strictly increase.
    let turns = {
        let (stop, lost) = (stop.clone(), lost.clone());
        tokio::spawn(async move {
            let mut tokens = Vec::new();
            let mut other_errors = 0u64;
            while !stop.load(Ordering::SeqCst) {
                for core in [&a, &b] {
                    match take(core, "turns").await {
                        Ok(token) => tokens.push(token),
                        Err(CoreError::FencingCountersLost { .. }) => {
                            lost.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(_) => other_errors += 1,
                    }
                }
            }
            (tokens, other_errors)
        })
    };
    // Another client on other keys at the same time (its tokens interleave with the
    // turns', and must increase among themselves).
    let side = {
        let (stop, lost) = (stop.clone(), lost.clone());
        tokio::spawn(async move {
            let mut tokens = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                for key in ["side-1", "side-2"] {
                    match take(&c, key).await {
                        Ok(token) => tokens.push(token),
                        Err(CoreError::FencingCountersLost { .. }) => {
                            lost.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(_) => {}
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokens
        })
    };
    let observer = coordinator_at(set.urls(), timeout).await;
    // Every counter is set before the first snapshot.
    assert!(all_repaired(&observer, Duration::from_secs(10)).await);
    for node in set.iter() {
        node.save().await.unwrap();
    }
    let schedule: [&[(usize, Loss)]; 8] = [
        &[(0, Loss::Flush)],
        &[(1, Loss::Restart), (2, Loss::Flush)],
        &[(3, Loss::Snapshot)],
        &[(4, Loss::Flush), (0, Loss::Snapshot)],
        &[(1, Loss::Flush)],
        &[(2, Loss::Snapshot), (3, Loss::Restart)],
        &[(4, Loss::Restart)],
        &[(0, Loss::Flush), (1, Loss::Snapshot)],
    ];
    for (step, losses) in schedule.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(300)).await;
        for (node, loss) in losses.iter() {
            let node = set.node(*node);
            match loss {
                Loss::Flush => node.flushall().await.unwrap(),
                Loss::Restart => {
                    // Without persistence: remove the snapshot first.
                    let _ = std::fs::remove_file(node.dir().join("dump.rdb"));
                    node.restart().await.unwrap();
                }
                Loss::Snapshot => node.restart().await.unwrap(),
            }
        }
        assert!(
            all_repaired(&observer, Duration::from_secs(20)).await,
            "step {step} ({losses:?}): not every node's counter was repaired: {:?}",
            observer.fencing_counters().await
        );
        // Snapshots of the repaired counters, for later restarts from them.
        for node in set.iter() {
            node.save().await.unwrap();
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let (turns, other_errors) = turns.await.unwrap();
    let side = side.await.unwrap();
    assert!(
        turns.len() > 20,
        "too few fenced acquisitions: {}",
        turns.len()
    );
    for pair in turns.windows(2) {
        assert!(
            pair[1] > pair[0],
            "token {} after {}: {turns:?}",
            pair[1],
            pair[0]
        );
    }
    for pair in side.windows(2) {
        assert!(
            pair[1] > pair[0],
            "token {} after {}: {side:?}",
            pair[1],
            pair[0]
        );
    }
    let mut all: Vec<u64> = turns.iter().chain(&side).copied().collect();
    let count = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), count, "a token was handed out twice");
    assert_eq!(lost.load(Ordering::SeqCst), 0, "fencing stopped");
    eprintln!(
        "{} + {} fenced acquisitions, {other_errors} failed otherwise, tokens up to {}",
        turns.len(),
        side.len(),
        all.last().unwrap()
    );
}

/// A node restarted from an older snapshot keeps a counter, lower than tokens handed out
/// since, and nothing on it says so but its server's `run_id`. Tokens up to 10 are on nodes
/// 1 and 2 (node 0 saw up to 3 before its snapshot, and node 2 missed the last ones): a
/// client that reaches only nodes 0 and 2 then reads 3 and 5, and without the stamp's
/// check gets token 6 recorded on both. With it, node 0 is not counted until its repair,
/// which reads node 1, and the next token is 11.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_from_an_older_snapshot_does_not_send_tokens_back() {
    let set = NodeSet::start(3).await.unwrap();
    let links = linked(&set).await;
    let core = coordinator_at(links.urls(0), Duration::from_millis(500)).await;
    for expected in 1..=3 {
        assert_eq!(take(&core, "k").await.unwrap(), expected);
    }
    core.quiesce().await;
    set.node(0).save().await.unwrap();
    for _ in 4..=5 {
        take(&core, "k").await.unwrap();
    }
    // Tokens 6 to 10 reach nodes 0 and 1 only.
    links.set_node(2, LinkFault::Blackhole);
    for _ in 6..=10 {
        take(&core, "k").await.unwrap();
    }
    core.quiesce().await;
    links.heal_all();
    set.node(0).restart().await.unwrap();
    assert_eq!(
        set.node(0).get(COUNTER).await.unwrap().as_deref(),
        Some("3")
    );
    assert_eq!(
        set.node(2).get(COUNTER).await.unwrap().as_deref(),
        Some("5")
    );
    // A client that handed out nothing yet (so its own floor cannot catch it) reaches
    // nodes 0 and 2 only: no token (node 0 is not counted), not 6.
    let core = coordinator_at(links.urls(0), Duration::from_millis(500)).await;
    links.set_node(1, LinkFault::Blackhole);
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < until {
        if let Ok(token) = take(&core, "k").await {
            panic!("token {token} handed out after 10 with node 1 unreachable");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = core.fencing_counters().await;
    assert!(
        matches!(seen.nodes[0].1, FencingCounter::Stale(3)),
        "{seen:?}"
    );
    // Node 1 back: node 0 is repaired from nodes 1 and 2 (a fenced acquisition starts
    // the repair, if the one that could not read a quorum gave up), and tokens go on
    // above 10 (the failed write-backs above raised node 2's counter meanwhile).
    links.heal_all();
    let next = take(&core, "k").await.unwrap();
    assert!(next > 10, "token {next} after 10");
    assert!(all_repaired(&core, Duration::from_secs(10)).await);
    let after = take(&core, "k").await.unwrap();
    assert!(after > next, "token {after} after {next}");
}

/// Every node lost its counter at once (more than the assumptions allow): the nodes start
/// again at 1, but a client that handed out 3 refuses to hand out 1 (and says how to mend
/// it), while a new client (which handed out nothing) gets 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_never_hands_out_a_token_at_or_below_one_it_handed_out() {
    let set = NodeSet::start(3).await.unwrap();
    let core = coordinator_at(set.urls(), Duration::from_millis(500)).await;
    for expected in 1..=3 {
        assert_eq!(take(&core, "k").await.unwrap(), expected);
    }
    core.quiesce().await;
    for node in set.iter() {
        node.flushall().await.unwrap();
    }
    match take(&core, "k").await {
        Err(
            e @ CoreError::FencingTokenBehind {
                token: 1,
                handed_out: 3,
                ..
            },
        ) => {
            assert!(e.to_string().contains("redlock fence --raise-to"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    core.quiesce().await;
    assert!(set.nodes_holding("redlock:k").await.is_empty());
    // The token's write-back did reach the nodes (they hold 1 now): the client's own
    // refusal is the only guard left. The operator's raise mends it.
    core.raise_fencing_counters(3).await.unwrap();
    assert_eq!(take(&core, "k").await.unwrap(), 4);
}

/// A node that lost its counter is repaired in the background: logged once when found,
/// once when repaired (node, what was found, the new value), counted in the metric, and
/// shown by `fencing_counters` meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_is_logged_and_shown_while_it_runs() {
    let (logs, _capture) = common::logs::capture(tracing_subscriber::filter::LevelFilter::INFO);
    let set = NodeSet::start(3).await.unwrap();
    let core = coordinator_at(set.urls(), Duration::from_millis(500)).await;
    for _ in 0..3 {
        take(&core, "k").await.unwrap();
    }
    set.node(1).flushall().await.unwrap();
    // A fenced acquisition that hears node 1 before its decision starts the repair (a
    // node that answers after every decision is not needed: it starts once it is).
    let marked = common::eventually(Duration::from_secs(2), || async {
        take(&core, "k").await.unwrap();
        !core.fencing_counters().await.repairs.is_empty()
    })
    .await;
    let during = core.fencing_counters().await;
    assert!(marked, "{during:?}");
    assert_eq!(during.nodes[1].1, FencingCounter::Missing, "{during:?}");
    assert_eq!(during.repairs[0].0, during.nodes[1].0, "{during:?}");
    let last = during.next.expect("a token can be issued").get() - 1;
    assert!(all_repaired(&core, Duration::from_secs(10)).await);
    let after = core.fencing_counters().await;
    assert!(after.repairs.is_empty(), "{after:?}");
    let counter = last.to_string();
    assert_eq!(
        set.node(1).get(COUNTER).await.unwrap(),
        Some(counter.clone())
    );
    let text = logs.text();
    let node = &set.urls()[1];
    let repaired = text
        .lines()
        .find(|l| l.contains("fencing counter repaired"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(repaired.contains(node.as_str()), "{repaired}");
    assert!(repaired.contains("missing"), "{repaired}");
    assert!(
        repaired.contains(&format!("counter={counter}")),
        "{repaired}"
    );
    assert_eq!(logs.count("has no intact fencing counter"), 1, "{text}");
}

/// Each fault-lab demonstration of the repair's safeguards (`repair_*`, which must be caught
/// by the token rule with its safeguard switched off) run with the safeguard on: the same
/// schedule, no violation. So the safeguard is what the demonstration's violation comes
/// from, not the schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_repair_safeguard_on_keeps_its_demonstrations_schedule_clean() {
    let controls = redlock_lab::repair_controls();
    assert_eq!(controls.len(), 3);
    let results = redlock_lab::run_backend(redlock_lab::BackendKind::Local, &controls).await;
    assert_eq!(results.len(), 3);
    for result in &results {
        assert!(
            result.passed(),
            "{}",
            redlock_lab::summary(std::slice::from_ref(result))
        );
        assert!(
            result.fenced > 3,
            "{}: {} fenced",
            result.name,
            result.fenced
        );
    }
}

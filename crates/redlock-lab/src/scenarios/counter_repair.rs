//! Fencing counters lost and repaired: the must-pass run of rolling minority data losses
//! (FLUSHALL, restarts that come back empty, restarts from an older snapshot) under fenced
//! acquisitions of several keys, and one demonstration per safeguard of the repair
//! (`redlock_core::fence::repair` says what each prevents): the library's own repair with
//! that safeguard switched off (`Safeguard`, a test-only switch), driven through the fault
//! proxies and real data losses, and the token rule catching the token that follows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use redlock_client::{Error, LockOptions, Redlock};
use redlock_core::{Acquisition, Error as CoreError, FencingCounter, Safeguard, REPAIR_WAIT};
use redlock_testkit::LinkFault;
use tokio::time::Instant;

use super::demos::{demo, THREE};
use crate::backend::Setup;
use crate::checker::Violation;
use crate::error::LabError;
use crate::lab::{Fencing, Lab, Timing, FENCING_COUNTER};
use crate::scenario::{Expect, Outcome, Scenario, KEY};
use crate::workload::{record_acquired, release};

/// What a token that went back shows: lower than one handed out before its acquisition
/// began, and equal to one handed out before.
const BACKWARDS_AND_REUSED: &[&str] = &["fencing token backwards", "fencing token reused"];

/// The demonstrations' timing: a TTL that outlasts their delayed write-backs, and no
/// workload of their own (`run_for` is unused).
const DEMO_TIMING: Timing = Timing {
    ttl: Duration::from_secs(3),
    node_timeout: Duration::from_millis(100),
    run_for: Duration::from_secs(1),
};

/// The keys the must-pass run's clients take, each in turn.
const KEYS: [&str; 3] = [KEY, "resource-b", "resource-c"];

/// Each demonstration's schedule with its safeguard on, as must-pass scenarios: the
/// safeguard is what keeps the token rule quiet there. Not in the suite (`all`): a soak of
/// three-token schedules would take ages; `tests/fencing_repair.rs` runs each once.
pub fn controls() -> Vec<Scenario> {
    let control = |name, shows, timing, run| Scenario {
        name,
        shows,
        expect: Expect::Safe,
        setup: THREE,
        clients: 3,
        fencing: Fencing::All,
        timing,
        soak: None,
        semaphore: None,
        rwlock: false,
        run,
    };
    vec![
        control(
            "repair_write_back_seeds_control",
            "repair_write_back_seeds with the safeguard on: the late write-back finds node 0 without a counter and is refused",
            DEMO_TIMING,
            write_back_seeds_control,
        ),
        control(
            "repair_seeds_without_its_marker_control",
            "repair_seeds_without_its_marker with the safeguard on: client 0's late seed finds its marker gone and is refused",
            DEMO_TIMING,
            seeds_without_marker_control,
        ),
        control(
            "repair_reads_without_waiting_control",
            "repair_reads_without_waiting with the safeguard on: the repair reads after the window, and finds token 4 on node 1",
            READS_TIMING,
            reads_without_waiting_control,
        ),
    ]
}

/// `repair_reads_without_waiting`'s timing: client 0's write-back to node 1 arrives 300 ms
/// late, within the node timeout.
const READS_TIMING: Timing = Timing {
    ttl: DEMO_TIMING.ttl,
    node_timeout: Duration::from_millis(500),
    run_for: DEMO_TIMING.run_for,
};

pub(super) fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "fencing_counter_losses",
            shows: "one or two of five nodes at a time lose their data (FLUSHALL, a restart that comes back empty, a restart from an older snapshot), each kept out of reach for a TTL (H2 for the locks) and each after the last loss was repaired, while three fenced clients take locks on three keys: every lost or stale counter is repaired in the background, tokens never go back, and no fenced acquisition fails with FencingCountersLost",
            expect: Expect::Safe,
            setup: Setup { nodes: 5, ..THREE },
            clients: 3,
            fencing: Fencing::All,
            timing: Timing {
                ttl: Duration::from_secs(1),
                node_timeout: Duration::from_millis(100),
                run_for: Duration::from_secs(12),
            },
            soak: None,
            semaphore: None,
            rwlock: false,
            run: counter_losses,
        },
        repair_demo(
            "repair_write_back_seeds",
            "repair: ordinary write-backs never give a counter to a node without one (a late write-back would seed a stale value)",
            BACKWARDS_AND_REUSED,
            "client 0's write-back of token 4 reaches node 0 a second late; meanwhile client 1 takes 5-8 on nodes 0 and 1, and node 0 loses its data (FLUSHALL); the late write-back, allowed to seed, gives node 0 counter 4; client 2, reaching nodes 0 and 2, reads 4 and 4 and gets token 5 after 8, a second time",
            DEMO_TIMING,
            write_back_seeds,
        ),
        repair_demo(
            "repair_seeds_without_its_marker",
            "repair: a repair seeds only while its marker on the node holds (the node may have lost its data again since)",
            BACKWARDS_AND_REUSED,
            "client 0 starts repairing node 0 (FLUSHALL) and its seed reaches the node two seconds late; node 0 loses its data again, client 1 repairs it, takes tokens 6-8 on nodes 0 and 1, and node 0 loses its data a third time; client 0's seed of 5 then lands, allowed without its marker; client 2, reaching nodes 0 and 2, gets token 6 after 8, a second time",
            DEMO_TIMING,
            seeds_without_marker,
        ),
        repair_demo(
            "repair_reads_without_waiting",
            "repair: a repair reads the other nodes only after the write-back window (a token the node acknowledged just before its loss may still be on its way to the others)",
            // The token its write-back quorum reached is the one read again.
            &["fencing token reused"],
            "client 0's token 4 is acknowledged by node 0 at once and by node 1 300 ms later; node 0 loses its data in between and client 1, not waiting out the window, repairs it from nodes 1 and 2 (3 and 3); client 0 gets token 4; client 2, reaching nodes 0 and 2, gets token 4 again",
            READS_TIMING,
            reads_without_waiting,
        ),
    ]
}

/// A demonstration of the repair: three fenced clients on three nodes.
fn repair_demo(
    name: &'static str,
    breaks: &'static str,
    caught_as: &'static [&'static str],
    shows: &'static str,
    timing: Timing,
    run: crate::scenario::Driver,
) -> Scenario {
    Scenario {
        clients: 3,
        fencing: Fencing::All,
        timing,
        ..demo(name, breaks, caught_as, shows, run)
    }
}

/// A fenced lock of `key` by client `c`, recorded and released: its token.
async fn take(lab: &Lab, client: &Redlock, c: usize, key: &str) -> Result<u64, Error> {
    let name = format!("client-{c}");
    let options = LockOptions {
        fenced: Some(true),
        ..Default::default()
    };
    let guard = client.lock_with(key, &options).await?;
    let fencing = guard.fencing_token().map_or(0, |t| t.get());
    let token = record_acquired(&lab.history, &name, &guard);
    release(&lab.history, &name, &token, guard).await;
    Ok(fencing)
}

/// [`take`], giving up after `wait` (a control's last client, which the safeguard may
/// leave without a token: then `None`).
async fn take_within(
    lab: &Lab,
    client: &Redlock,
    c: usize,
    key: &str,
    wait: Duration,
) -> Option<u64> {
    let name = format!("client-{c}");
    let options = LockOptions {
        fenced: Some(true),
        retry: Some(redlock_client::RetryPolicy {
            max_wait: Some(wait),
            ..Default::default()
        }),
        ..Default::default()
    };
    let guard = client.lock_with(key, &options).await.ok()?;
    let fencing = guard.fencing_token().map(|t| t.get());
    let token = record_acquired(&lab.history, &name, &guard);
    release(&lab.history, &name, &token, guard).await;
    fencing
}

/// The last client's token: in a demonstration it must get one (the one the checker
/// catches); in a control it may get none (the safeguard held the node out), and one it
/// gets is judged by the token rule.
async fn last_take(
    lab: &Lab,
    client: &Redlock,
    key: &str,
    off: bool,
    tokens: &mut Vec<(&'static str, u64)>,
) -> Result<(), LabError> {
    if off {
        tokens.push(("client-2", must_take(lab, client, 2, key).await?));
    } else if let Some(token) = take_within(lab, client, 2, key, Duration::from_secs(1)).await {
        tokens.push(("client-2", token));
    }
    Ok(())
}

/// [`take`], where failing is a fault of the schedule.
async fn must_take(lab: &Lab, client: &Redlock, c: usize, key: &str) -> Result<u64, LabError> {
    take(lab, client, c, key)
        .await
        .map_err(|e| LabError::Schedule(format!("client-{c}'s fenced lock of {key} failed: {e}")))
}

/// Waits until `check` holds on node `n`'s key `key` (`None`: absent), polling every 2 ms,
/// for at most `within`.
async fn wait_for_key(
    lab: &Lab,
    n: usize,
    key: &str,
    within: Duration,
    what: &str,
    check: impl Fn(Option<&str>) -> bool,
) -> Result<(), LabError> {
    let until = Instant::now() + within;
    let redis = lab.nodes().redis(n);
    loop {
        if check(redis.get(key).await?.as_deref()) {
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(LabError::Schedule(format!(
                "{what} was not seen on node {n} within {within:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Client `c` takes fenced locks of `key` until node 0 shows a repair's marker (the
/// round that starts the repair must hear node 0 before its decision, which a round may
/// not), noting each token.
async fn marked_by(
    lab: &Lab,
    client: &Redlock,
    c: usize,
    key: &str,
    marker: &str,
    tokens: &mut Vec<(&'static str, u64)>,
) -> Result<(), LabError> {
    let name = ["client-0", "client-1", "client-2"][c];
    for _ in 0..50 {
        tokens.push((name, must_take(lab, client, c, key).await?));
        if lab.nodes().redis(0).get(marker).await?.is_some() {
            return Ok(());
        }
    }
    Err(LabError::Schedule(format!(
        "no repair of node 0 by {name} was seen after 50 fenced locks"
    )))
}

/// `n` clients, connected while every link passes.
async fn connect(lab: &Lab, n: usize) -> Result<Vec<Redlock>, LabError> {
    lab.clients(n).await
}

async fn close(clients: Vec<Redlock>) {
    for client in clients {
        client.shutdown().await;
    }
}

fn notes(tokens: &[(&str, u64)]) -> Outcome {
    let list: Vec<String> = tokens
        .iter()
        .map(|(who, t)| format!("{t} ({who})"))
        .collect();
    Outcome {
        notes: vec![format!(
            "tokens in the order handed out: {}",
            list.join(", ")
        )],
        violations: Vec::new(),
    }
}

/// Trap 1: a late write-back seeds a stale value.
fn write_back_seeds(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(write_back_seeds_with(lab, true))
}

/// [`write_back_seeds`] with the safeguard on: the late write-back is refused.
fn write_back_seeds_control(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(write_back_seeds_with(lab, false))
}

async fn write_back_seeds_with(lab: &Lab, off: bool) -> Result<Outcome, LabError> {
    let clients = connect(lab, 3).await?;
    let [p, q, z] = [&clients[0], &clients[1], &clients[2]];
    if off {
        p.coordinator()
            .switch_off_fencing_safeguard(Safeguard::NoSeedOnWriteBack);
    }
    let mut tokens = Vec::new();
    for _ in 0..3 {
        tokens.push(("client-1", must_take(lab, q, 1, KEY).await?));
    }
    lab.link(1, 2, LinkFault::Blackhole);
    lab.link(2, 1, LinkFault::Blackhole);
    lab.link(
        0,
        0,
        LinkFault::Latency {
            to_server: Duration::from_secs(1),
            to_client: Duration::ZERO,
        },
    );
    // Decided by nodes 1 and 2; its write-back to node 0 lands a second later.
    tokens.push(("client-0", must_take(lab, p, 0, "resource-p").await?));
    for _ in 0..4 {
        tokens.push(("client-1", must_take(lab, q, 1, KEY).await?));
    }
    lab.flush(0).await?;
    let counter = lab.full_key(FENCING_COUNTER);
    if off {
        wait_for_key(
            lab,
            0,
            &counter,
            Duration::from_secs(3),
            "the late write-back",
            |v| v.is_some(),
        )
        .await?;
    } else {
        // The late write-back lands and is refused: node 0 stays without a counter.
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    last_take(lab, z, "resource-z", off, &mut tokens).await?;
    close(clients).await;
    Ok(notes(&tokens))
}

/// Trap 2: the node loses its data again between the repair's read and its seed.
fn seeds_without_marker(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(seeds_without_marker_with(lab, true))
}

/// [`seeds_without_marker`] with the safeguard on: client 0's late seed is refused (its
/// marker went with the node's data), and its next attempt repairs the node properly.
fn seeds_without_marker_control(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(seeds_without_marker_with(lab, false))
}

async fn seeds_without_marker_with(lab: &Lab, off: bool) -> Result<Outcome, LabError> {
    let clients = connect(lab, 3).await?;
    let [r, w, z] = [&clients[0], &clients[1], &clients[2]];
    if off {
        r.coordinator()
            .switch_off_fencing_safeguard(Safeguard::Marker);
    }
    let counter = lab.full_key(FENCING_COUNTER);
    let marker = format!("{counter}:repair");
    let mut tokens = Vec::new();
    for _ in 0..3 {
        tokens.push(("client-1", must_take(lab, w, 1, KEY).await?));
    }
    lab.flush(0).await?;
    // Client 0 finds node 0 without its counter and marks it for its repair.
    marked_by(lab, r, 0, "resource-r", &marker, &mut tokens).await?;
    // Its seed, due after the repair's wait, lands two seconds late.
    lab.link(
        0,
        0,
        LinkFault::Latency {
            to_server: Duration::from_secs(2),
            to_client: Duration::ZERO,
        },
    );
    lab.flush(0).await?;
    // Client 1 repairs node 0 properly, then takes tokens on nodes 0 and 1 only.
    marked_by(lab, w, 1, KEY, &marker, &mut tokens).await?;
    wait_for_key(
        lab,
        0,
        &counter,
        REPAIR_WAIT * 3,
        "client-1's repair",
        |v| v.is_some(),
    )
    .await?;
    lab.link(1, 2, LinkFault::Blackhole);
    for _ in 0..3 {
        tokens.push(("client-1", must_take(lab, w, 1, KEY).await?));
    }
    lab.flush(0).await?;
    // Client 0's late seed (refused with the safeguard on: then the time it lands).
    if off {
        wait_for_key(
            lab,
            0,
            &counter,
            Duration::from_secs(4),
            "client-0's late seed",
            |v| v.is_some(),
        )
        .await?;
    } else {
        tokio::time::sleep(Duration::from_millis(2500)).await;
    }
    lab.link(2, 1, LinkFault::Blackhole);
    last_take(lab, z, "resource-z", off, &mut tokens).await?;
    close(clients).await;
    Ok(notes(&tokens))
}

/// Trap 3: a token acknowledged by the node just before its loss, the other
/// acknowledgements still in flight.
fn reads_without_waiting(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(reads_without_waiting_with(lab, true))
}

/// [`reads_without_waiting`] with the safeguard on: the repair reads after the window,
/// when client 0's token is on node 1.
fn reads_without_waiting_control(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(reads_without_waiting_with(lab, false))
}

async fn reads_without_waiting_with(lab: &Lab, off: bool) -> Result<Outcome, LabError> {
    let clients = connect(lab, 3).await?;
    let [p, r, z] = [&clients[0], &clients[1], &clients[2]];
    if off {
        r.coordinator()
            .switch_off_fencing_safeguard(Safeguard::Wait);
    }
    let counter = lab.full_key(FENCING_COUNTER);
    let mut tokens = Vec::new();
    for _ in 0..3 {
        tokens.push(("client-1", must_take(lab, r, 1, KEY).await?));
    }
    // Client 2 holds another key everywhere: client 1's fenced round on it loses, and
    // reads the counters all the same (which starts its repair of node 0).
    let blocker = lab.full_key("blocker");
    let blocked = [blocker.as_str()];
    let held = z
        .coordinator()
        .acquire_with(Acquisition::new(&blocked, DEMO_TIMING.ttl))
        .await
        .map_err(|e| LabError::Schedule(format!("client-2's blocker: {e}")))?;
    lab.link(0, 2, LinkFault::Blackhole);
    lab.link(
        0,
        1,
        LinkFault::Latency {
            to_server: Duration::from_millis(300),
            to_client: Duration::ZERO,
        },
    );
    // Not the key the observer samples: node 0 loses it before the lock is recorded
    // as won, which the early-removal rule cannot tell from a theft.
    let slow = async { take(lab, p, 0, "resource-p").await };
    let loss = async {
        wait_for_key(
            lab,
            0,
            &counter,
            Duration::from_secs(2),
            "token 4 on node 0",
            |v| v == Some("4"),
        )
        .await?;
        lab.flush(0).await?;
        // A lost round is decided once nodes 1 and 2 refused: node 0's answer, which
        // starts the repair, may come after that. Try again until node 0 is marked.
        let marker = format!("{counter}:repair");
        for _ in 0..50 {
            let lost = r
                .coordinator()
                .acquire_with(Acquisition {
                    fenced: true,
                    ..Acquisition::new(&blocked, DEMO_TIMING.ttl)
                })
                .await;
            if let Ok(lock) = lost {
                let _ = r.coordinator().release(&lock).await;
                return Err(LabError::Schedule(
                    "client-1 won the key client-2 holds".into(),
                ));
            }
            if lab.nodes().redis(0).get(&marker).await?.is_some()
                || lab.nodes().redis(0).get(&counter).await?.is_some()
            {
                break;
            }
        }
        Ok(())
    };
    let (slow, loss) = tokio::join!(slow, loss);
    loss?;
    let slow =
        slow.map_err(|e| LabError::Schedule(format!("client-0's fenced lock failed: {e}")))?;
    tokens.push(("client-0", slow));
    wait_for_key(
        lab,
        0,
        &counter,
        // With the safeguard on, the repair waits the window out first.
        if off {
            Duration::from_secs(1)
        } else {
            REPAIR_WAIT * 3
        },
        "client-1's repair",
        |v| v.is_some(),
    )
    .await?;
    let _ = z.coordinator().release(&held).await;
    lab.link(2, 1, LinkFault::Blackhole);
    last_take(lab, z, "resource-z", off, &mut tokens).await?;
    close(clients).await;
    Ok(notes(&tokens))
}

/// How one node loses its data in the must-pass run. Each keeps the node out of every
/// client's reach (its links blackholed) from just before the loss until a longest TTL
/// later, as the deployment without `appendfsync always` must ("delayed restart", H2):
/// what is lost is the fencing counter, never a held lock's key while it counts.
#[derive(Debug, Clone, Copy)]
enum Loss {
    Flush,
    /// A restart that comes back empty (an empty snapshot is saved first: the node set may
    /// be a docker one, whose files the lab does not reach).
    RestartEmpty,
    /// A restart that loads the snapshot saved after the last repair: older counters.
    RestartFromSnapshot,
}

/// The must-pass run's schedule, repeated while the run lasts: one or two nodes at a time.
const SCHEDULE: [&[(usize, Loss)]; 6] = [
    &[(0, Loss::Flush)],
    &[(1, Loss::RestartFromSnapshot), (2, Loss::Flush)],
    &[(3, Loss::RestartEmpty)],
    &[(4, Loss::RestartFromSnapshot), (0, Loss::RestartEmpty)],
    &[(2, Loss::RestartFromSnapshot)],
    &[(1, Loss::Flush), (3, Loss::RestartFromSnapshot)],
];

/// How long the must-pass run waits for a loss to be repaired before it calls that a
/// violation (repairs take the repair's wait after a fenced acquisition found the node,
/// and a restarted node's reconnection).
const REPAIRED_WITHIN: Duration = Duration::from_secs(20);

fn counter_losses(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        let clients = lab.clients(lab.links.clients()).await?;
        lab.seed_fencing_counters().await?;
        let observer = lab.client(0).await?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let lost = AtomicU64::new(0);
        let behind = AtomicU64::new(0);
        let won = AtomicU64::new(0);
        let work = futures::future::join_all(clients.iter().enumerate().map(|(c, client)| {
            let (stop, lost, behind, won) = (&stop, &lost, &behind, &won);
            async move {
                let mut i = c;
                while !stop.load(Ordering::SeqCst) {
                    let key = KEYS[i % KEYS.len()];
                    i += 1;
                    match take(lab, client, c, key).await {
                        Ok(_) => {
                            won.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(Error::Round(CoreError::FencingCountersLost { .. })) => {
                            lost.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(Error::Round(CoreError::FencingTokenBehind { .. })) => {
                            behind.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(_) => {}
                    }
                }
            }
        }));
        let faults = async {
            let result = losses(lab, &observer).await;
            stop.store(true, Ordering::SeqCst);
            result
        };
        let (_, faults) = tokio::join!(work, faults);
        observer.shutdown().await;
        for client in clients {
            client.shutdown().await;
        }
        let (events, mut violations) = faults?;
        let (lost, behind) = (lost.into_inner(), behind.into_inner());
        if lost > 0 {
            violations.push(Violation::Rule(format!(
                "{lost} fenced acquisition(s) failed with FencingCountersLost: fencing stopped"
            )));
        }
        if behind > 0 {
            violations.push(Violation::Rule(format!(
                "{behind} fenced acquisition(s) got a token at or below one their client \
                 handed out (FencingTokenBehind)"
            )));
        }
        Ok(Outcome {
            notes: vec![format!(
                "{events} loss events; {} fenced locks won; 0 FencingCountersLost expected, {lost} seen",
                won.into_inner()
            )],
            violations,
        })
    })
}

/// Runs the loss schedule until the run time is over (each step at least once is not
/// promised: the run time decides): each step after every counter was repaired. Returns
/// the number of steps, and a violation for a loss not repaired in time.
async fn losses(lab: &Lab, observer: &Redlock) -> Result<(usize, Vec<Violation>), LabError> {
    let until = Instant::now() + lab.timing.run_for;
    for n in 0..lab.node_count() {
        lab.snapshot(n).await?;
    }
    let mut steps = 0;
    while Instant::now() < until {
        let step = SCHEDULE[steps % SCHEDULE.len()];
        steps += 1;
        let out_until = Instant::now() + lab.max_ttl().mul_f64(1.3);
        for &(n, loss) in step {
            lab.node_links(n, LinkFault::Blackhole);
            match loss {
                Loss::Flush => lab.flush(n).await?,
                Loss::RestartEmpty => {
                    lab.flush(n).await?;
                    lab.snapshot(n).await?;
                    lab.restart(n).await?;
                }
                Loss::RestartFromSnapshot => lab.restart(n).await?,
            }
        }
        tokio::time::sleep_until(out_until).await;
        for &(n, _) in step {
            lab.node_links(n, LinkFault::Pass);
        }
        let repaired = Instant::now() + REPAIRED_WITHIN;
        loop {
            let seen = observer.coordinator().fencing_counters().await;
            if seen
                .nodes
                .iter()
                .all(|(_, c)| matches!(c, FencingCounter::At(_)))
            {
                break;
            }
            if Instant::now() >= repaired {
                return Ok((
                    steps,
                    vec![Violation::Rule(format!(
                        "step {steps} ({step:?}) was not repaired within {REPAIRED_WITHIN:?}: \
                         {:?}",
                        seen.nodes
                    ))],
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The snapshots the next restarts load: older than the counters by then.
        for n in 0..lab.node_count() {
            lab.snapshot(n).await?;
        }
    }
    Ok((steps, Vec::new()))
}

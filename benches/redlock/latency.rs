//! P1-P3: the latency of one uncontended lock+unlock cycle, on healthy nodes (P1), with one
//! node hung by SIGSTOP (P2), and with one node behind a proxy adding latency (P3).
//!
//! Every contender cycles on a key of its own. Contenders are measured in interleaved
//! slices (a slice of each, then again), so that a burst of noise on this shared machine
//! spreads over all of them instead of landing on one.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use redlock_core::DEFAULT_NODE_TIMEOUT;
use redlock_testkit::{ClusterSet, FaultProxy, LinkFault, NodeSet};
use serde::Serialize;
use tokio::time::Instant;

use crate::error::{BenchError, Context, SEE_ABOVE};
use crate::progress;
use crate::stats::{Recorder, Summary};
use crate::subjects::{Kind, Subject};

/// Longest a single cycle may take before it counts as failed ("hung").
pub const CYCLE_DEADLINE: Duration = Duration::from_secs(10);
/// Slices per contender: enough to interleave, few enough to keep each slice meaningful.
const SLICES: u32 = 8;

/// The node that is hung (P2) or slowed (P3): the last one.
pub const FAULTY: usize = 4;

/// The latency added to each direction of the faulty node's link in P3 (+50 ms per round
/// trip).
pub const ADDED_ONE_WAY: Duration = Duration::from_millis(25);

/// How much each case measures.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub warmup: u32,
    pub cycles: u64,
    pub time: Duration,
}

/// One contender in one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyCase {
    pub scenario: &'static str,
    pub nodes: usize,
    pub subject: &'static str,
    pub label: &'static str,
    pub node_timeout: String,
    #[serde(flatten)]
    pub summary: Summary,
}

/// A connected contender with the name it is reported under and the key it cycles on.
struct Contender {
    name: &'static str,
    label: &'static str,
    node_timeout: String,
    subject: Subject,
    key: String,
}

/// The name and label of the control: ours on a healthy node set, measured in the same
/// slices as a faulty scenario, so that both see the same moments of this machine.
pub const CONTROL: (&str, &str) = (
    "ours-control",
    "ours on healthy nodes (control, same slices)",
);

/// P1: every contender on `nodes` healthy nodes.
pub async fn healthy(
    set: &NodeSet,
    kinds: &[Kind],
    budget: Budget,
) -> Result<Vec<LatencyCase>, BenchError> {
    let contenders = connect(&set.urls(), kinds, budget.warmup, "P1").await?;
    Ok(measure("P1", set.len(), contenders, budget).await)
}

/// P9: the uncontended cycle over three members that are whole clusters of two masters,
/// each case on its own three clusters: without replicas (`kinds`), then with one replica
/// per master (`kinds` and `acked`, which waits for a replica's acknowledgement).
pub async fn clusters(
    kinds: &[Kind],
    acked: &[Kind],
    budget: Budget,
) -> Result<Vec<LatencyCase>, BenchError> {
    let mut cases = Vec::new();
    for (scenario, replicas, kinds) in [
        ("P9, no replicas", 0, kinds.to_vec()),
        ("P9, a replica each", 1, [kinds, acked].concat()),
    ] {
        if kinds.is_empty() {
            continue;
        }
        let mut clusters = Vec::new();
        for _ in 0..3 {
            clusters.push(
                ClusterSet::start_with_replicas(2, replicas)
                    .await
                    .during(format!("starting a cluster for {scenario}"), SEE_ABOVE)?,
            );
        }
        let urls: Vec<String> = clusters.iter().map(ClusterSet::url).collect();
        let contenders = connect(&urls, &kinds, budget.warmup, scenario).await?;
        cases.extend(measure(scenario, urls.len(), contenders, budget).await);
    }
    Ok(cases)
}

/// P2: the last node paused (SIGSTOP) while the contenders cycle; the control cycles on
/// the healthy `control` set in between.
pub async fn one_node_hung(
    set: &NodeSet,
    control: &NodeSet,
    kinds: &[Kind],
    budget: Budget,
) -> Result<Vec<LatencyCase>, BenchError> {
    let node = set.node(FAULTY);
    // Connected and warmed up while healthy, like a service whose node hangs later.
    let mut contenders = vec![connect_control(control, budget.warmup, "P2").await?];
    contenders.extend(connect(&set.urls(), kinds, budget.warmup, "P2").await?);
    node.pause()
        .during(format!("pausing {} for P2", node.name()), SEE_ABOVE)?;
    progress!("P2: {} paused (SIGSTOP)", node.name());
    let cases = measure("P2", set.len(), contenders, budget).await;
    node.resume()
        .during(format!("resuming {} after P2", node.name()), SEE_ABOVE)?;
    Ok(cases)
}

/// P3: the last node reached through a proxy that delays each direction; the control
/// cycles on the healthy `control` set in between.
pub async fn one_node_slow(
    set: &NodeSet,
    control: &NodeSet,
    kinds: &[Kind],
    budget: Budget,
) -> Result<Vec<LatencyCase>, BenchError> {
    let node = set.node(FAULTY);
    let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, node.port()));
    let proxy = FaultProxy::start(format!("bench->{}", node.name()), upstream)
        .await
        .during(
            format!("starting the fault proxy for {}", node.name()),
            SEE_ABOVE,
        )?;
    proxy.set(LinkFault::Latency {
        to_server: ADDED_ONE_WAY,
        to_client: ADDED_ONE_WAY,
    });
    progress!(
        "P3: {} behind a proxy adding {:?} each way",
        node.name(),
        ADDED_ONE_WAY
    );
    let mut urls = set.urls();
    urls[FAULTY] = proxy.url();
    let mut contenders = vec![connect_control(control, budget.warmup, "P3").await?];
    contenders.extend(connect(&urls, kinds, budget.warmup, "P3").await?);
    Ok(measure("P3", set.len(), contenders, budget).await)
}

async fn connect(
    urls: &[String],
    kinds: &[Kind],
    warmup: u32,
    scenario: &str,
) -> Result<Vec<Contender>, BenchError> {
    let mut contenders = Vec::new();
    for &kind in kinds {
        let subject = Subject::connect(kind, urls).await?;
        contenders.push(
            warm(
                Contender {
                    name: kind.name(),
                    label: kind.label(),
                    node_timeout: kind.node_timeout(DEFAULT_NODE_TIMEOUT),
                    key: format!("bench:{scenario}:{}", kind.name()),
                    subject,
                },
                warmup,
            )
            .await,
        );
    }
    Ok(contenders)
}

async fn connect_control(
    control: &NodeSet,
    warmup: u32,
    scenario: &str,
) -> Result<Contender, BenchError> {
    let subject = Subject::connect(Kind::Ours, &control.urls()).await?;
    let contender = Contender {
        name: CONTROL.0,
        label: CONTROL.1,
        node_timeout: Kind::Ours.node_timeout(DEFAULT_NODE_TIMEOUT),
        key: format!("bench:{scenario}:{}", CONTROL.0),
        subject,
    };
    Ok(warm(contender, warmup).await)
}

async fn warm(contender: Contender, warmup: u32) -> Contender {
    for _ in 0..warmup {
        // Failures here show up again, counted, in the measurement.
        let _ = tokio::time::timeout(CYCLE_DEADLINE, contender.subject.cycle(&contender.key)).await;
    }
    contender
}

async fn measure(
    scenario: &'static str,
    n: usize,
    contenders: Vec<Contender>,
    budget: Budget,
) -> Vec<LatencyCase> {
    let mut recorders = vec![Recorder::default(); contenders.len()];
    let slice_cycles = budget.cycles.div_ceil(u64::from(SLICES));
    let slice_time = budget.time / SLICES;
    for _ in 0..SLICES {
        for (c, recorder) in contenders.iter().zip(&mut recorders) {
            slice(&c.subject, &c.key, recorder, slice_cycles, slice_time).await;
        }
    }
    for c in &contenders {
        c.subject.close().await;
    }
    contenders
        .into_iter()
        .zip(recorders)
        .map(|(c, recorder)| {
            let summary = recorder.summary();
            progress!(
                "{scenario} N={n} {:<14} {:>6} cycles, {} failed, median {:.0} µs, p99 {:.0} µs, max {:.0} µs",
                c.name,
                summary.samples,
                summary.failures,
                summary.median_us,
                summary.p99_us,
                summary.max_us
            );
            LatencyCase {
                scenario,
                nodes: n,
                subject: c.name,
                label: c.label,
                node_timeout: c.node_timeout,
                summary,
            }
        })
        .collect()
}

/// Cycles until `cycles` are done or `time` has passed, whichever comes first.
async fn slice(subject: &Subject, key: &str, recorder: &mut Recorder, cycles: u64, time: Duration) {
    let until = Instant::now() + time;
    let mut done = 0;
    while done < cycles && Instant::now() < until {
        let start = Instant::now();
        match tokio::time::timeout(CYCLE_DEADLINE, subject.cycle(key)).await {
            Ok(Ok(())) => recorder.record(start.elapsed()),
            Ok(Err(why)) => recorder.fail(why),
            Err(_) => recorder.fail(format!("no answer within {CYCLE_DEADLINE:?}")),
        }
        done += 1;
    }
}

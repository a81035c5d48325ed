//! The scenario suite: must-pass scenarios (zero violations) and demonstrations (the checker
//! must report a violation, because each breaks an assumption of Redlock).

mod clusters;
mod counter_repair;

pub use counter_repair::controls as repair_controls;
mod demos;
mod fair_head;
mod issuer;
mod lost_keys;
mod naive_fencing;
mod per_node_semaphore;
mod raw_holder;
mod reader_ignores_writer;
mod safe;
mod steal;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redlock_client::Redlock;
use tokio::time::Instant;

use crate::checker::{Observation, EVENT_SLACK};
use crate::error::LabError;
use crate::history::At;
use crate::lab::Lab;
use crate::mix::{contend_mixed, contend_mixed_each, Workload};
use crate::permits::contend_permits;
use crate::resource::Resource;
use crate::rwlocks::contend_rw;
use crate::scenario::{Outcome, Scenario, KEY};
use crate::workload::{contend, contend_each, Tally};

/// Every scenario, must-pass ones first.
pub fn all() -> Vec<Scenario> {
    let (repair_safe, repair_demos): (Vec<Scenario>, Vec<Scenario>) = counter_repair::scenarios()
        .into_iter()
        .partition(|s| s.expect == crate::scenario::Expect::Safe);
    let mut all = safe::scenarios();
    all.extend(repair_safe);
    all.extend(clusters::must_pass());
    all.extend(demos::scenarios());
    all.extend(clusters::demos());
    all.extend(lost_keys::scenarios());
    all.extend(repair_demos);
    all
}

/// Runs `clients` contending clients for the lab's run time while `faults` runs, then shuts
/// the clients down. The most common driver shape.
async fn contend_under<F>(lab: &Lab, clients: usize, faults: F) -> Result<Outcome, LabError>
where
    F: Future<Output = Result<(), LabError>>,
{
    contend_under_then(lab, clients, faults, Duration::ZERO).await
}

/// [`contend_under`] with three clients under link faults that can cut off a fair waiter's
/// leave: the clients go on until [`Lab::leave_settle`] has passed since the faults ended.
async fn contend_until_leaves_settle<F>(lab: &Lab, faults: F) -> Result<Outcome, LabError>
where
    F: Future<Output = Result<(), LabError>>,
{
    contend_under_then(lab, 3, faults, lab.leave_settle()).await
}

/// [`contend_under`], and the clients go on contending until `tail` has passed since the
/// faults ended, however long they took (a container restart can outlast the run).
async fn contend_under_then<F>(
    lab: &Lab,
    clients: usize,
    faults: F,
    tail: Duration,
) -> Result<Outcome, LabError>
where
    F: Future<Output = Result<(), LabError>>,
{
    let clients = lab.clients(clients).await?;
    let clients = &clients[..];
    let resource = Arc::new(Resource::default());
    let until = Instant::now() + lab.timing.run_for;
    let faults = async { (faults.await, Instant::now()) };
    let (tally, (faults, ended)) =
        tokio::join!(contend_lab(lab, &resource, clients, until), faults);
    let then = match (&tally, &faults) {
        (Ok(_), Ok(())) if ended + tail > Instant::now() => {
            Some(contend_lab(lab, &resource, clients, ended + tail).await)
        }
        _ => None,
    };
    shutdown(clients).await;
    faults?;
    let mut tally = tally?;
    if let Some(then) = then {
        let then = then?;
        tally.acquired += then.acquired;
        tally.failed += then.failed;
        tally.skipped_writes += then.skipped_writes;
    }
    Ok(Outcome {
        notes: vec![format!(
            "{} won, {} gave up, {} writes skipped for lack of validity",
            tally.acquired, tally.failed, tally.skipped_writes
        )],
        violations: Vec::new(),
    })
}

/// The lab's workload ([`Lab::workload`]): plain cycles, the mix, permits of a semaphore,
/// or a read-write lock's sides, until `until`.
async fn contend_lab(
    lab: &Lab,
    resource: &Arc<Resource>,
    clients: &[Redlock],
    until: Instant,
) -> Result<Tally, LabError> {
    match &lab.workload {
        Workload::Plain => Ok(contend(&lab.history, resource, clients, KEY, until).await),
        Workload::Mix(mix) => contend_mixed(lab, resource, clients, until, mix).await,
        Workload::Semaphore(permits) => Ok(contend_permits(lab, clients, until, *permits)
            .await?
            .iter()
            .sum()),
        Workload::RwLock => Ok(contend_rw(lab, clients, until).await?.iter().sum()),
    }
}

/// [`contend_lab`], returning each client's own tally, in the order of `clients`.
async fn contend_lab_each(
    lab: &Lab,
    resource: &Arc<Resource>,
    clients: &[Redlock],
    until: Instant,
) -> Result<Vec<Tally>, LabError> {
    match &lab.workload {
        Workload::Plain => Ok(contend_each(&lab.history, resource, clients, KEY, until).await),
        Workload::Mix(mix) => contend_mixed_each(lab, resource, clients, until, mix).await,
        Workload::Semaphore(permits) => contend_permits(lab, clients, until, *permits).await,
        Workload::RwLock => contend_rw(lab, clients, until).await,
    }
}

async fn shutdown(clients: &[Redlock]) {
    for client in clients {
        client.shutdown().await;
    }
}

/// `fraction` of the lab's run time.
fn at(lab: &Lab, fraction: f64) -> Duration {
    lab.timing.run_for.mul_f64(fraction)
}

/// How many nodes a lock needs.
fn quorum(lab: &Lab) -> usize {
    lab.node_count() / 2 + 1
}

/// Every node's index.
fn every_node(lab: &Lab) -> Vec<usize> {
    (0..lab.node_count()).collect()
}

/// Waits until the observer has taken, on `need` distinct nodes of `nodes`, a sample of the
/// scenario key that `wanted` accepts; returns the first such sample of each of those nodes.
/// Gives up with [`LabError::Schedule`] after two TTLs and two seconds: every wait of the
/// demonstrations is for something that follows within a TTL.
async fn seen_on(
    lab: &Lab,
    nodes: &[usize],
    need: usize,
    what: &str,
    wanted: impl Fn(&Observation) -> bool,
) -> Result<Vec<Observation>, LabError> {
    let key = lab.full_key(KEY);
    let deadline = Instant::now() + lab.timing.ttl * 2 + Duration::from_secs(2);
    let mut found: Vec<Observation> = Vec::new();
    while found.len() < need {
        let next = lab
            .observed
            .wait_for(deadline.saturating_duration_since(Instant::now()), |o| {
                o.key == key
                    && nodes.contains(&o.node)
                    && !found.iter().any(|f| f.node == o.node)
                    && wanted(o)
            })
            .await;
        match next {
            Some(sample) => found.push(sample),
            None => {
                return Err(LabError::Schedule(format!(
                    "the observer did not see {what} on {need} of nodes {nodes:?} (only on {:?})",
                    found.iter().map(|f| f.node).collect::<Vec<_>>()
                )))
            }
        }
    }
    Ok(found)
}

/// Waits until the observer has seen `token` on a quorum of the nodes (where a won lock has
/// it for sure); returns those nodes.
async fn seen_holding(lab: &Lab, token: &str) -> Result<Vec<usize>, LabError> {
    let found = seen_on(lab, &every_node(lab), quorum(lab), "the new token", |o| {
        o.token.as_deref() == Some(token)
    })
    .await?;
    Ok(found.iter().map(|o| o.node).collect())
}

/// Waits until the observer has seen `token` absent (the key missing or another token) on
/// `need` of `nodes`, in samples sent from `since` on.
async fn seen_without(
    lab: &Lab,
    token: &str,
    nodes: &[usize],
    need: usize,
    since: At,
) -> Result<(), LabError> {
    seen_on(lab, nodes, need, "the old token gone", |o| {
        o.sent >= since && o.token.as_deref() != Some(token)
    })
    .await
    .map(drop)
}

/// Waits until the observer has seen no key at all on every node, in samples sent from now
/// on: a round starts clean, whatever an earlier round left.
async fn seen_empty(lab: &Lab) -> Result<(), LabError> {
    let since = lab.history.now();
    seen_on(
        lab,
        &every_node(lab),
        lab.node_count(),
        "the key absent",
        |o| o.sent >= since && o.token.is_none(),
    )
    .await
    .map(drop)
}

/// Waits until the observer has sampled each of `nodes` with a sample sent at or after
/// `since` (so what happened before `since` is on record), then until the checker's slack
/// around events has passed after the last of those samples (so an event that follows, such
/// as the holder's own release, cannot explain away what they show).
async fn seen_after(lab: &Lab, nodes: &[usize], since: At) -> Result<(), LabError> {
    let found = seen_on(lab, nodes, nodes.len(), "a sample after the event", |o| {
        o.sent >= since
    })
    .await?;
    let last = found.iter().map(|o| o.received).max().unwrap_or(since);
    tokio::time::sleep((last + EVENT_SLACK * 2).saturating_sub(lab.history.now())).await;
    Ok(())
}

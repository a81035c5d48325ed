//! The semaphore workload: clients take permits of one semaphore instead of locks, so that
//! the checker's semaphore rule judges the library's semaphore under a scenario's faults.
//!
//! Each client runs [`PERMIT_LOOPS`] acquisition loops at once on one `Redlock`: a client
//! may hold several permits, and three clients make six contenders, more than the permits
//! of the lab's semaphores, so that holders wait for each other. A holder keeps its permit
//! a few milliseconds (the work it admits), then releases it. Nothing is written to the
//! protected value: several holders at once are the point, and a shared counter would
//! lose updates by design. Each client's second loop waits in the semaphore's fair queue
//! and its first does not, so that fair and other callers meet under the scenario's
//! faults. The lab configures the clients of this workload without fencing
//! ([`Lab::client_with`]).

use std::time::Duration;

use redlock_client::{Error, LockOptions, Redlock};
use tokio::time::Instant;

use crate::error::LabError;
use crate::history::{Event, History};
use crate::lab::Lab;
use crate::workload::{per_client_loops, record_acquired, release_round, rounds_run, Tally};

/// The lab's semaphore's name (under the scenario's prefix, in the permits' keys).
pub const SEMAPHORE: &str = "resource";
/// How many acquisition loops each client runs at once.
pub const PERMIT_LOOPS: usize = 2;
/// The operation's name in the history and the summary's operations, outside the fair
/// queue and in it.
const OPS: [&str; 2] = ["permit", "fair permit"];

/// The prefix of the keys of the lab's semaphore's permits, for a scenario's `prefix`
/// (the client's `key_prefix`): `<prefix>semaphore-{resource}:`.
pub(crate) fn permit_prefix(prefix: &str) -> String {
    format!("{prefix}semaphore-{{{SEMAPHORE}}}:")
}

/// The keys of the lab's semaphore's `permits` permits, for the observer.
pub(crate) fn permit_keys(prefix: &str, permits: u32) -> Vec<String> {
    let keys = permit_prefix(prefix);
    (1..=permits).map(|i| format!("{keys}{i}")).collect()
}

/// Declares the lab's semaphore of `permits` permits in `history`, for the checker.
pub(crate) fn declare(history: &History, prefix: &str, permits: u32) {
    history.record(Event::Semaphore {
        name: SEMAPHORE.to_owned(),
        keys: permit_prefix(prefix),
        permits,
    });
}

/// Every client's loops take permits of a semaphore of `permits` until `until`; returns
/// each client's tally (its loops summed), in the order of `clients`. Fails only when the
/// library refuses the semaphore or a permit's configuration (a lab bug, not a result).
pub(crate) async fn contend_permits(
    lab: &Lab,
    clients: &[Redlock],
    until: Instant,
    permits: u32,
) -> Result<Vec<Tally>, LabError> {
    per_client_loops(clients, PERMIT_LOOPS, |c, l, client| {
        permit_loop(
            &lab.history,
            client,
            format!("client-{c}/{l}"),
            until,
            (permits, l % 2 == 1),
        )
    })
    .await
}

/// One loop of `client`, named `name` in the history: acquire a permit (of `permits`, in
/// the fair queue when `fair`), hold it, release it, until `until`; every attempt recorded
/// as an operation with its outcome.
async fn permit_loop(
    history: &History,
    client: &Redlock,
    name: String,
    until: Instant,
    (permits, fair): (u32, bool),
) -> Result<Tally, LabError> {
    let semaphore = client.semaphore(SEMAPHORE, permits)?;
    let options = LockOptions {
        fair: Some(fair),
        ..Default::default()
    };
    let mut tally = Tally::default();
    let mut held = 0u64;
    while Instant::now() < until {
        let started = history.now();
        let begun = Instant::now();
        let result = semaphore.acquire_with(&options).await;
        tally.lock_waits.push(begun.elapsed());
        let outcome = match result {
            Ok(guard) => {
                tally.acquired += 1;
                tally.rounds += u64::from(guard.attempts());
                tally.record_round(guard.lock().report());
                let token = record_acquired(history, &name, &guard);
                // 1 to 4 ms of work under the permit, so that holders overlap.
                held += 1;
                tokio::time::sleep(Duration::from_millis(1 + held % 4)).await;
                let begun = Instant::now();
                match release_round(history, &name, &token, guard).await {
                    Some(report) => {
                        tally.release_rounds.push(begun.elapsed());
                        tally.record_round(&report);
                        "ok".to_owned()
                    }
                    None => "ok, release failed".to_owned(),
                }
            }
            Err(Error::InvalidConfig(e)) => {
                return Err(LabError::Setup(format!(
                    "{name}: the semaphore workload asked for a permit the configuration \
                     refuses: {e}"
                )))
            }
            Err(error) => {
                tally.failed += 1;
                tally.rounds += u64::from(rounds_run(&error));
                if let Some(report) = error.report() {
                    tally.record_round(report);
                }
                if matches!(error, Error::Unreachable { .. }) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                "not acquired".to_owned()
            }
        };
        history.record(Event::Op {
            client: name.clone(),
            op: OPS[usize::from(fair)],
            owner: None,
            started,
            ended: history.now(),
            outcome,
        });
    }
    Ok(tally)
}

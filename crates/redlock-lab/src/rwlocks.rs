//! The read-write workload: clients take the read side of one read-write lock most of the
//! time and its write side sometimes, so that the checker's rule of a writer alone judges
//! the library's read-write lock under a scenario's faults.
//!
//! Each client runs [`RW_LOOPS`] acquisition loops at once on one `Redlock`, each with a
//! read-write lock value of its own (one owner per loop: an owner that reads may not ask
//! for the write side). One take in [`WRITE_EVERY`] is the write side, the rest the read
//! side; a holder keeps its side 1 to 4 ms, then releases it. Each client's second loop
//! waits in the lock's fair queue and its first does not, so that fair and other callers
//! meet under the scenario's faults. Nothing is written to the protected value: readers at
//! once are the point. The lab configures the clients of this workload without fencing
//! (readers take no token) ([`Lab::client_with`]).

use std::time::Duration;

use redlock_client::{Error, LockGuard, LockOptions, Redlock};
use redlock_core::layout::rwlock_keys;
use tokio::time::Instant;

use crate::error::LabError;
use crate::history::{Event, History};
use crate::lab::Lab;
use crate::workload::{per_client_loops, record_acquired, release_round, rounds_run, Tally};

/// The lab's read-write lock's name (under the scenario's prefix, in its keys).
pub const RWLOCK: &str = "resource";
/// How many acquisition loops each client runs at once.
pub const RW_LOOPS: usize = 2;
/// One take in this many is the write side.
pub const WRITE_EVERY: u64 = 4;

/// The keys of the lab's read-write lock for a scenario's `prefix` (the client's
/// `key_prefix`): the writer's, the readers' and the intent's.
pub(crate) fn rw_keys(prefix: &str) -> [String; 3] {
    rwlock_keys(&format!("{prefix}rwlock-"), RWLOCK)
}

/// Declares the lab's read-write lock in `history`, for the checker.
pub(crate) fn declare_rwlock(history: &History, prefix: &str) {
    let [writers, readers, _] = rw_keys(prefix);
    history.record(Event::RwLock {
        name: RWLOCK.to_owned(),
        writers,
        readers,
    });
}

/// Every client's loops take the lab's read-write lock's sides until `until`; returns each
/// client's tally (its loops summed), in the order of `clients`. Fails only when the
/// library refuses the lock or a side's configuration (a lab bug, not a result).
pub(crate) async fn contend_rw(
    lab: &Lab,
    clients: &[Redlock],
    until: Instant,
) -> Result<Vec<Tally>, LabError> {
    per_client_loops(clients, RW_LOOPS, |c, l, client| {
        // Loops start at different places of the cycle: not every loop writes at once.
        let first = (c * RW_LOOPS + l) as u64;
        rw_loop(
            &lab.history,
            client,
            format!("client-{c}/{l}"),
            until,
            (first, l % 2 == 1),
        )
    })
    .await
}

/// One loop of `client`, named `name` in the history: take a side, hold it, release it,
/// until `until`, its `n`th take (from `first`) the write side when `n` is a multiple of
/// [`WRITE_EVERY`], in the fair queue when `fair`; every attempt recorded as an operation
/// with its outcome.
async fn rw_loop(
    history: &History,
    client: &Redlock,
    name: String,
    until: Instant,
    (first, fair): (u64, bool),
) -> Result<Tally, LabError> {
    let rwlock = client.rwlock(RWLOCK)?;
    let options = LockOptions {
        fair: Some(fair),
        ..Default::default()
    };
    let mut tally = Tally::default();
    let mut n = first;
    while Instant::now() < until {
        n += 1;
        let write = n.is_multiple_of(WRITE_EVERY);
        let started = history.now();
        let begun = Instant::now();
        let result = if write {
            rwlock.write_with(&options).await
        } else {
            rwlock.read_with(&options).await
        };
        tally.lock_waits.push(begun.elapsed());
        let outcome = hold(history, &name, result, n, &mut tally).await?;
        history.record(Event::Op {
            client: name.clone(),
            op: match (write, fair) {
                (true, false) => "write",
                (true, true) => "fair write",
                (false, false) => "read",
                (false, true) => "fair read",
            },
            owner: None,
            started,
            ended: history.now(),
            outcome,
        });
    }
    Ok(tally)
}

/// A side won: recorded, held 1 to 4 ms (by `n`), released; or the attempt that gave up,
/// counted. The operation's outcome.
async fn hold(
    history: &History,
    name: &str,
    result: Result<LockGuard, Error>,
    n: u64,
    tally: &mut Tally,
) -> Result<String, LabError> {
    Ok(match result {
        Ok(guard) => {
            tally.acquired += 1;
            tally.rounds += u64::from(guard.attempts());
            tally.record_round(guard.lock().report());
            let token = record_acquired(history, name, &guard);
            tokio::time::sleep(Duration::from_millis(1 + n % 4)).await;
            let begun = Instant::now();
            match release_round(history, name, &token, guard).await {
                Some(report) => {
                    tally.release_rounds.push(begun.elapsed());
                    tally.record_round(&report);
                    "ok".to_owned()
                }
                None => "ok, release failed".to_owned(),
            }
        }
        Err(error @ (Error::InvalidConfig(_) | Error::InvalidArgument(_))) => {
            return Err(LabError::Setup(format!(
                "{name}: the read-write workload asked for a side the library refuses: {error}"
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
    })
}

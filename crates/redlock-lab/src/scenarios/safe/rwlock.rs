//! The read-write lock's must-pass scenarios: the standard nemeses (a minority killed,
//! paused or partitioned per client, restarts with `appendfsync always`) with clients that
//! take the sides of one read-write lock instead of locks ([`Workload::RwLock`]). The
//! checker's rule of a writer alone judges them; tokens removed early or extended by
//! another on the writer's key, and keys left behind, are judged as for locks.
//!
//! Three clients of two loops each, one take in four the write side: six contenders, so
//! that readers share, writers wait for them and leave their intent. Two-second runs keep
//! the suite short; a soak repeats them (`--scenario rwlock_ --min-acquisitions N`).
//! `rwlock_many_clients_minority_paused` runs 16 clients (32 loops) for the run's default
//! length while two of five nodes are paused.
//!
//! [`Workload::RwLock`]: crate::Workload::RwLock

use std::time::Duration;

use super::clients::{many_clients_minority_paused, MANY_FAMILY};
use super::network::minority_partitioned_per_client;
use super::process::{minority_killed, minority_paused};
use super::restart::restart_with_appendfsync_always;
use super::{safe, FIVE};
use crate::backend::Setup;
use crate::lab::{Fencing, Timing};
use crate::scenario::{Driver, Scenario};

/// A read-write lock scenario: five nodes, three clients, no fencing (readers take none),
/// two-second runs.
fn rwlock(name: &'static str, shows: &'static str, run: Driver) -> Scenario {
    Scenario {
        fencing: Fencing::Off,
        timing: Timing {
            run_for: Duration::from_secs(2),
            ..Timing::default()
        },
        rwlock: true,
        ..safe(name, shows, run)
    }
}

pub(super) fn scenarios() -> Vec<Scenario> {
    vec![
        rwlock(
            "rwlock_minority_killed",
            "minority_killed with a read-write lock's sides instead of locks (three clients, two loops each, one take in four a write): no writer claims while a reader or another writer does",
            minority_killed,
        ),
        rwlock(
            "rwlock_minority_paused",
            "minority_paused with a read-write lock's sides: the reader and writer scripts, releases and intents queued in the paused nodes' sockets run late and leave nothing behind",
            minority_paused,
        ),
        rwlock(
            "rwlock_minority_partitioned_per_client",
            "minority_partitioned_per_client with a read-write lock's sides: each client sees another majority, and a read quorum and a write quorum still share a node",
            minority_partitioned_per_client,
        ),
        Scenario {
            clients: MANY_FAMILY,
            timing: Timing::default(),
            ..rwlock(
                "rwlock_many_clients_minority_paused",
                "many_clients_minority_paused with a read-write lock's sides (16 clients, two loops each, one take in four a write): writers' intents and readers' entries under the pause, and no writer ever beside another holder",
                many_clients_minority_paused,
            )
        },
        Scenario {
            setup: Setup {
                persistent: true,
                ..FIVE
            },
            ..rwlock(
                "rwlock_restart_with_appendfsync_always",
                "restart_with_appendfsync_always with a read-write lock's sides: the restarted nodes keep the writer's key and the readers' entries they held",
                restart_with_appendfsync_always,
            )
        },
    ]
}

//! The semaphore's must-pass scenarios: the standard nemeses (a minority killed, paused or
//! partitioned per client, restarts with `appendfsync always`) with clients that take
//! permits of one semaphore instead of locks ([`Workload::Semaphore`]). The
//! checker's semaphore rule counts the holders; overlap (two holders of one permit), tokens
//! removed early or extended by another, and keys left behind are judged as for locks.
//!
//! Three permits for three clients of two loops each: six contenders, so holders wait for
//! each other and rounds split between permits. Two-second runs keep the suite short; a
//! soak repeats them (`--scenario semaphore_ --min-acquisitions N`).
//!
//! Many clients too: `semaphore_many_clients_minority_paused` runs 16 clients (32 loops)
//! on the three permits while two of five nodes are paused, in the run's default length;
//! while the two are paused every round needs the other three to agree on one permit, and
//! few do (docs/fault-lab.md has the figures), so the run must show progress over its
//! whole length, not in the pause alone.
//!
//! [`Workload::Semaphore`]: crate::Workload::Semaphore

use std::time::Duration;

use super::clients::{many_clients_minority_paused, MANY_FAMILY};
use super::network::minority_partitioned_per_client;
use super::process::{minority_killed, minority_paused};
use super::restart::restart_with_appendfsync_always;
use super::{safe, FIVE};
use crate::backend::Setup;
use crate::lab::{Fencing, Timing};
use crate::scenario::{Driver, Scenario};

/// The permits of the semaphore scenarios' semaphore.
const PERMITS: u32 = 3;

/// A semaphore scenario of `permits` permits: five nodes, three clients, no fencing
/// (permits take none), two-second runs.
fn semaphore(name: &'static str, shows: &'static str, permits: u32, run: Driver) -> Scenario {
    Scenario {
        fencing: Fencing::Off,
        timing: Timing {
            run_for: Duration::from_secs(2),
            ..Timing::default()
        },
        semaphore: Some(permits),
        ..safe(name, shows, run)
    }
}

pub(super) fn scenarios() -> Vec<Scenario> {
    vec![
        semaphore(
            "semaphore_minority_killed",
            "minority_killed with permits of a three-permit semaphore instead of locks (three clients, two loops each): never more than three holders, nor two of one permit",
            PERMITS,
            minority_killed,
        ),
        semaphore(
            "semaphore_minority_paused",
            "minority_paused with permits of a three-permit semaphore: the permit scripts and rollbacks queued in the paused nodes' sockets run late and leave nothing behind",
            PERMITS,
            minority_paused,
        ),
        semaphore(
            "semaphore_minority_partitioned_per_client",
            "minority_partitioned_per_client with permits of a three-permit semaphore: each client sees another majority, and the permits' quorums still share a node",
            PERMITS,
            minority_partitioned_per_client,
        ),
        Scenario {
            clients: MANY_FAMILY,
            timing: Timing::default(),
            ..semaphore(
                "semaphore_many_clients_minority_paused",
                "many_clients_minority_paused with permits of a three-permit semaphore (16 clients, two loops each): 32 contenders split the three live nodes' votes while two are paused, and still never more than three holders",
                PERMITS,
                many_clients_minority_paused,
            )
        },
        Scenario {
            setup: Setup {
                persistent: true,
                ..FIVE
            },
            ..semaphore(
                "semaphore_restart_with_appendfsync_always",
                "restart_with_appendfsync_always with permits of a three-permit semaphore: the restarted nodes keep the permits they held",
                PERMITS,
                restart_with_appendfsync_always,
            )
        },
    ]
}

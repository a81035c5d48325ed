//! Must-pass scenarios: faults Redlock tolerates. Each must end with zero violations.
//!
//! One file per kind of fault: [`process`] (nodes killed, paused, or with a clock inside the
//! drift budget), [`network`] (links cut, slowed, holding or dropping replies), [`restart`]
//! (nodes restarted, the majority down), [`late_release`] (a holder that outlives its
//! validity) and [`fenced`] (the same, writing through a fenced resource). The list below is
//! the suite's order.
//!
//! Every second client takes fenced locks ([`Fencing::EvenClients`]), so the checker's
//! token rule judges the tokens of the kill, pause, partition, latency, held and dropped
//! replies and restart (with appendfsync always, and a minority after the TTL) scenarios
//! too; `majority_down` alone keeps plain locks (see there).

mod fenced;
mod late_release;
mod network;
mod process;
mod restart;
// The nemeses of issue 17: client processes, links for the whole run, clocks, many clients.
mod clients;
mod clocks;
mod holder;
mod links;
mod nemeses;
// The read-write lock's sides under the same nemeses.
mod rwlock;
// The semaphore's permits under the same nemeses.
mod semaphore;

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Setup;
use crate::lab::{Fencing, Timing};
use crate::scenario::{Expect, Scenario};

pub(super) use late_release::{late_release, Stale};

use fenced::paused_holder_writes_fenced;
use late_release::late_release_by_expired_holder;
use network::{
    minority_disconnected, minority_partitioned_per_client, one_slow_node, replies_held_past_ttl,
    reply_dropped_after_set, staggered_links_three_clients,
};
use process::{clock_rate_within_drift, minority_killed, minority_paused};
use restart::{majority_down, restart_after_ttl, restart_with_appendfsync_always};

const FIVE: Setup = Setup {
    nodes: 5,
    persistent: false,
    fake_clock: false,
    clusters: &[],
};

/// The soak timing of the scenarios whose rounds wait a TTL out: a 100 ms TTL (a 20 ms node
/// timeout keeps `ttl > node_timeout + drift`, with room on loopback and a Docker bridge)
/// and 20 s runs, so a soak reaches its acquisitions in minutes rather than hours, with
/// fewer node restarts.
const WAITS_A_TTL: Timing = Timing {
    ttl: Duration::from_millis(100),
    node_timeout: Duration::from_millis(20),
    run_for: Duration::from_secs(20),
};

/// A must-pass scenario: five nodes, three clients, the first and the third with fenced
/// locks (the token rule judges their tokens; the second keeps plain locks exercised).
fn safe(name: &'static str, shows: &'static str, run: super::super::scenario::Driver) -> Scenario {
    Scenario {
        name,
        shows,
        expect: Expect::Safe,
        setup: FIVE,
        clients: 3,
        fencing: Fencing::EvenClients,
        timing: Timing::default(),
        soak: None,
        semaphore: None,
        rwlock: false,
        run,
    }
}

pub(super) fn scenarios() -> Vec<Scenario> {
    let mut all = vec![
        safe(
            "minority_killed",
            "two of five nodes are killed (SIGKILL / docker kill) and stay down: locks are still won on the other three, never twice",
            minority_killed,
        ),
        safe(
            "minority_paused",
            "two of five nodes are paused (SIGSTOP / docker pause) and resumed: the SETs and deletes queued in their sockets run late, in order, and leave nothing behind",
            minority_paused,
        ),
        safe(
            "minority_partitioned_per_client",
            "each of three clients loses a different two of five nodes (blackholed links), so every client sees another majority",
            minority_partitioned_per_client,
        ),
        safe(
            "minority_disconnected",
            "two nodes are cut off from every client (docker network disconnect on the docker set, blackholed links locally) and come back",
            minority_disconnected,
        ),
        Scenario {
            timing: Timing {
                node_timeout: Duration::from_millis(100),
                ..Timing::default()
            },
            ..safe(
                "one_slow_node",
                "one node answers 40 ms late, then 150 ms late (past the 100 ms node timeout): rounds still decide on the fast majority",
                one_slow_node,
            )
        },
        safe(
            "replies_held_past_ttl",
            "one client's replies from three nodes are held for 1.5 TTL while its SETs are applied: its rounds end by node timeout without a lock (validity can never be positive: ttl > node_timeout + drift is enforced), its compare-and-delete rollback leaves the next holder alone, and the late replies change nothing",
            replies_held_past_ttl,
        ),
        safe(
            "reply_dropped_after_set",
            "one client's replies from three nodes are dropped after the SET was applied: the round counts them as failed and rolls back on every node",
            reply_dropped_after_set,
        ),
        Scenario {
            clients: 2,
            timing: Timing {
                ttl: Duration::from_millis(500),
                ..Timing::default()
            },
            soak: Some(WAITS_A_TTL),
            ..safe(
                "late_release_by_expired_holder",
                "a holder stalls past its validity, another client takes the lock, then the stale holder extends and releases: neither touches the new holder's key",
                late_release_by_expired_holder,
            )
        },
        safe(
            "restart_after_ttl",
            "two nodes are killed and stay down longer than the TTL before restarting empty (delayed restart): no lock they held can be taken twice",
            restart_after_ttl,
        ),
        Scenario {
            setup: Setup {
                persistent: true,
                ..FIVE
            },
            ..safe(
                "restart_with_appendfsync_always",
                "with appendfsync always, three nodes are killed and restarted at once, one after another: their keys survive, so no lock is taken twice",
                restart_with_appendfsync_always,
            )
        },
        Scenario {
            setup: Setup {
                fake_clock: true,
                ..FIVE
            },
            ..safe(
                "clock_rate_within_drift",
                "four nodes' clocks run 0.3-0.4 % fast or slow, inside the 1 % drift factor's budget",
                clock_rate_within_drift,
            )
        },
        Scenario {
            timing: Timing {
                run_for: Duration::from_secs(5),
                ..Timing::default()
            },
            // Plain locks only: the three nodes come back without their data, fencing
            // counters included. The TTL-long wait keeps lock keys safe (H2), but a
            // counter has no TTL: a quorum losing its counters at once is outside what
            // fencing's monotonicity rests on, and the token rule reports the tokens that
            // then start again at 1.
            fencing: Fencing::Off,
            ..safe(
                "majority_down",
                "three of five nodes are killed: no lock is won while they are down (no false success); they restart after the TTL and locks are won again within about one TTL",
                majority_down,
            )
        },
        Scenario {
            setup: Setup {
                nodes: 3,
                ..FIVE
            },
            clients: 2,
            fencing: Fencing::All,
            timing: Timing {
                // Each round waits this TTL out (the holder's stall).
                ttl: Duration::from_millis(300),
                ..Timing::default()
            },
            soak: Some(WAITS_A_TTL),
            ..safe(
                "paused_holder_writes_fenced",
                "paused_holder_writes with fenced locks and the value behind fenced_set: the stalled holder's late write carries a lower token than the newer holder's and is rejected, so no update is lost",
                paused_holder_writes_fenced,
            )
        },
        safe(
            "staggered_links_three_clients",
            "three clients whose links to the five nodes have staggered latencies (0, 15, 30 ms, a different pattern per client) contend for one key",
            staggered_links_three_clients,
        ),
    ];
    all.extend(nemeses::scenarios());
    all.extend(semaphore::scenarios());
    all.extend(rwlock::scenarios());
    all
}

async fn sleep_to(start: Instant, offset: Duration) {
    tokio::time::sleep_until(start + offset).await;
}

//! Must-pass scenarios: faults Redlock tolerates. Each must end with zero violations.
//!
//! One file per kind of fault: [`process`] (nodes killed, paused, or with a clock inside the
//! drift budget), [`network`] (links cut, slowed, holding or dropping replies), [`restart`]
//! (nodes restarted, the majority down) and [`late_release`] (a holder that outlives its
//! validity). The list below is the suite's order.

mod late_release;
mod network;
mod process;
mod restart;

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Setup;
use crate::lab::Timing;
use crate::scenario::{Expect, Scenario};

pub(super) use late_release::late_release;

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
};

fn safe(name: &'static str, shows: &'static str, run: super::super::scenario::Driver) -> Scenario {
    Scenario {
        name,
        shows,
        expect: Expect::Safe,
        setup: FIVE,
        clients: 3,
        timing: Timing::default(),
        run,
    }
}

pub(super) fn scenarios() -> Vec<Scenario> {
    vec![
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
            ..safe(
                "majority_down",
                "three of five nodes are killed: no lock is won while they are down (no false success); they restart after the TTL and locks are won again within about one TTL",
                majority_down,
            )
        },
        safe(
            "staggered_links_three_clients",
            "three clients whose links to the five nodes have staggered latencies (0, 15, 30 ms, a different pattern per client) contend for one key",
            staggered_links_three_clients,
        ),
    ]
}

async fn sleep_to(start: Instant, offset: Duration) {
    tokio::time::sleep_until(start + offset).await;
}

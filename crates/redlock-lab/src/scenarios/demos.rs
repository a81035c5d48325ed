//! Demonstrations: each breaks one assumption of Redlock, and the checker must report the
//! violation that follows. They prove the checker can fail, and show users what the
//! assumptions are for.

use std::time::Duration;

use futures::future::BoxFuture;
use redlock_testkit::LinkFault;
use tokio::time::Instant;

use super::{every_node, seen_empty, seen_without};
use crate::backend::Setup;
use crate::error::LabError;
use crate::lab::{Lab, Timing};
use crate::scenario::{Expect, Outcome, Scenario, KEY};
use crate::workload::{record_acquired, release, Resource, WRITE_MARGIN};

const THREE: Setup = Setup {
    nodes: 3,
    persistent: false,
    fake_clock: false,
};

/// How many hold-then-steal rounds each demonstration runs. Each round provokes the violation
/// on its own (every step waits for the event it needs), so one would do; two show that a
/// round leaves nothing behind that spoils the next.
const ROUNDS: usize = 2;

/// What a mutual-exclusion break shows: two holders at once, and the update of one lost.
const OVERLAP: &[&str] = &["overlap", "lost update"];

fn demo(
    name: &'static str,
    breaks: &'static str,
    caught_as: &'static [&'static str],
    shows: &'static str,
    run: crate::scenario::Driver,
) -> Scenario {
    Scenario {
        name,
        shows,
        expect: Expect::Violation { breaks, caught_as },
        setup: THREE,
        clients: 2,
        timing: Timing::default(),
        run,
    }
}

pub(super) fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            timing: Timing {
                // A container restart takes about a second: the holder's validity must
                // outlast it for the second holder to overlap. Nothing waits this TTL out.
                ttl: Duration::from_secs(3),
                ..Timing::default()
            },
            ..demo(
                "restart_without_persistence",
                "H2: no key vanishes before its TTL (a restarted node must keep its keys or stay down longer than the TTL)",
                OVERLAP,
                "a node of the holder's two-node quorum restarts at once without persistence; another client then wins that node and the third one while the first still holds",
                restart_without_persistence,
            )
        },
        Scenario {
            setup: Setup {
                fake_clock: true,
                ..THREE
            },
            timing: Timing {
                // Each round waits until the fast nodes have expired the holder's keys,
                // after half this TTL.
                ttl: Duration::from_millis(500),
                ..Timing::default()
            },
            ..demo(
                "clock_2x",
                "H3: server clock rates within the drift budget",
                OVERLAP,
                "two of three nodes' clocks run at 2x: the holder's keys expire there after half the TTL and another client wins while the first still holds",
                clock_2x,
            )
        },
        demo(
            "key_evicted",
            "H2: no key vanishes before its TTL (maxmemory-policy noeviction)",
            OVERLAP,
            "the holder's key is evicted (real memory pressure) on a node of its two-node quorum; another client wins that node and the third one while the first still holds",
            key_evicted,
        ),
        Scenario {
            timing: Timing {
                // Each round waits this TTL out (the stale holder's stall).
                ttl: Duration::from_millis(300),
                ..Timing::default()
            },
            ..demo(
                "naive_release_by_expired_holder",
                "G3: only the owner deletes its key (the compare-and-delete release script)",
                &["token removed early"],
                "late_release_by_expired_holder with the stale holder's release done as a plain DEL, as a client without token scripts would: the new holder's key is deleted under it",
                naive_release_by_expired_holder,
            )
        },
        Scenario {
            timing: Timing {
                // Each round waits this TTL out (the holder's stall).
                ttl: Duration::from_millis(300),
                ..Timing::default()
            },
            ..demo(
                "paused_holder_writes",
                "H4: the holder stops using the lock before its validity ends",
                &["stale write", "lost update"],
                "the holder stalls (as in a GC or SIGSTOP pause) between its read and its write, past its validity; another client takes the lock and writes; the stale write loses that update",
                paused_holder_writes,
            )
        },
    ]
}

/// What happens between the first holder's win and the second client's attempt.
#[derive(Clone, Copy)]
enum Break {
    /// Client 0 cannot reach node 2 (so its quorum is {0, 1}); node 1 restarts empty.
    RestartNode1,
    /// Client 0 cannot reach node 2; node 1's keys are evicted.
    EvictNode1,
    /// Nodes 0 and 1 run at 2x (set beforehand): wait until they have expired the keys.
    FastClocks,
    /// The holder stalls past its validity before writing.
    StallHolder,
}

/// Client 0 takes the lock and reads the value; the fault happens; client 1 takes the lock,
/// updates the value and releases; client 0 then writes what it read and releases. With the
/// assumption intact client 1 could not win before client 0 let go.
///
/// Every step waits for an event, never for a fixed time: the fault calls return once the
/// node is back or the keys are evicted; with fast clocks client 1 goes once the observer has
/// seen client 0's token gone from the fast nodes; a stalled holder waits until its validity
/// has ended and its keys are gone. So client 1 wins in every round, and (except for the
/// stall, whose point is to outlive the validity) while client 0's validity still runs. Client
/// 0 then behaves well, writing only with validity left, for H2 and H3: the violation comes
/// from the broken assumption alone.
async fn hold_then_steal(lab: &Lab, fault: Break) -> Result<Outcome, LabError> {
    let first = lab.client(0).await?;
    let second = lab.client(1).await?;
    let resource = Resource::default();
    let mut notes = Vec::new();
    let (mut stolen, mut stolen_while_valid) = (0, 0);
    if matches!(fault, Break::RestartNode1 | Break::EvictNode1) {
        // For every round, healed only after the last (by the lab, once the clients are shut
        // down). A blackhole on the open connection, not refused connections: a command that
        // the client queues while it reconnects is sent once the link lets it through, so a
        // link refused or healed between rounds lets client-0's SET land on node 2 late,
        // after the round, as a key left behind that has nothing to do with the break.
        lab.link(0, 2, LinkFault::Blackhole);
    }
    for round in 0..ROUNDS {
        // Each round starts with the key absent on every node.
        seen_empty(lab).await?;
        let held = first.lock(KEY).await?;
        let token = record_acquired(&lab.history, "client-0", &held);
        let read = resource.read(&lab.history);
        match fault {
            Break::RestartNode1 => lab.restart(1).await?,
            Break::EvictNode1 => {
                lab.evict(1).await?;
            }
            Break::FastClocks => {
                // Samples sent once the round's SETs have all landed or timed out.
                let since = lab.history.now() + lab.timing.node_timeout;
                seen_without(lab, &token, &[0, 1], 2, since).await?;
            }
            Break::StallHolder => {
                tokio::time::sleep_until(held.valid_until()).await;
                let nodes = every_node(lab);
                seen_without(lab, &token, &nodes, nodes.len(), lab.history.now()).await?;
            }
        }
        match second.lock(KEY).await {
            Ok(guard) => {
                stolen += 1;
                if Instant::now() < held.valid_until() {
                    stolen_while_valid += 1;
                }
                let stolen_token = record_acquired(&lab.history, "client-1", &guard);
                resource
                    .update(&lab.history, "client-1", &stolen_token)
                    .await;
                release(&lab.history, "client-1", &stolen_token, guard).await;
            }
            Err(error) => notes.push(format!("round {round}: client-1 did not win: {error}")),
        }
        // Client 0 finishes its critical section as if nothing happened: a well-behaved
        // holder (writing only with validity left), except where writing late is the break.
        let stalled = matches!(fault, Break::StallHolder);
        if stalled || held.remaining().is_some_and(|left| left >= WRITE_MARGIN) {
            resource.write(&lab.history, "client-0", &token, read);
        } else {
            notes.push(format!(
                "round {round}: client-0 skipped its write, too little validity left"
            ));
        }
        release(&lab.history, "client-0", &token, held).await;
    }
    notes.push(format!(
        "client-1 won in {stolen} of {ROUNDS} rounds, {stolen_while_valid} of them while \
         client-0's validity still ran"
    ));
    first.shutdown().await;
    second.shutdown().await;
    Ok(Outcome {
        notes,
        violations: Vec::new(),
    })
}

fn restart_without_persistence(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(hold_then_steal(lab, Break::RestartNode1))
}

fn clock_2x(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        lab.clock_rate(0, 2.0)?;
        lab.clock_rate(1, 2.0)?;
        hold_then_steal(lab, Break::FastClocks).await
    })
}

fn key_evicted(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(hold_then_steal(lab, Break::EvictNode1))
}

fn paused_holder_writes(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(hold_then_steal(lab, Break::StallHolder))
}

fn naive_release_by_expired_holder(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(super::safe::late_release(lab, true, Some(ROUNDS)))
}

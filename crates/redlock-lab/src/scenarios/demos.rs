//! Demonstrations: each breaks one assumption of Redlock, and the checker must report the
//! violation that follows. They prove the checker can fail, and show users what the
//! assumptions are for.

use std::time::Duration;

use futures::future::BoxFuture;
use redlock_testkit::LinkFault;
use tokio::time::sleep;

use crate::backend::Setup;
use crate::error::LabError;
use crate::lab::{Lab, Timing};
use crate::scenario::{Expect, Outcome, Scenario, KEY};
use crate::workload::{record_acquired, release, Resource};

const THREE: Setup = Setup {
    nodes: 3,
    persistent: false,
    fake_clock: false,
};

/// How many hold-then-steal rounds each demonstration runs.
const ROUNDS: usize = 2;

fn demo(
    name: &'static str,
    breaks: &'static str,
    shows: &'static str,
    run: crate::scenario::Driver,
) -> Scenario {
    Scenario {
        name,
        shows,
        expect: Expect::Violation { breaks },
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
                // outlast it for the second holder to overlap.
                ttl: Duration::from_secs(3),
                ..Timing::default()
            },
            ..demo(
                "restart_without_persistence",
                "H2: no key vanishes before its TTL (a restarted node must keep its keys or stay down longer than the TTL)",
                "a node of the holder's two-node quorum restarts at once without persistence; another client then wins that node and the third one while the first still holds",
                restart_without_persistence,
            )
        },
        Scenario {
            setup: Setup {
                fake_clock: true,
                ..THREE
            },
            ..demo(
                "clock_2x",
                "H3: server clock rates within the drift budget",
                "two of three nodes' clocks run at 2x: the holder's keys expire there after half the TTL and another client wins while the first still holds",
                clock_2x,
            )
        },
        demo(
            "key_evicted",
            "H2: no key vanishes before its TTL (maxmemory-policy noeviction)",
            "the holder's key is evicted (real memory pressure) on a node of its two-node quorum; another client wins that node and the third one while the first still holds",
            key_evicted,
        ),
        Scenario {
            timing: Timing {
                ttl: Duration::from_millis(500),
                run_for: Duration::from_secs(1),
                ..Timing::default()
            },
            ..demo(
                "naive_release_by_expired_holder",
                "G3: only the owner deletes its key (the compare-and-delete release script)",
                "late_release_by_expired_holder with the stale holder's release done as a plain DEL, as a client without token scripts would: the new holder's key is deleted under it",
                naive_release_by_expired_holder,
            )
        },
        demo(
            "paused_holder_writes",
            "H4: the holder stops using the lock before its validity ends",
            "the holder stalls (as in a GC or SIGSTOP pause) between its read and its write, past its validity; another client takes the lock and writes; the stale write loses that update",
            paused_holder_writes,
        ),
    ]
}

/// What happens between the first holder's win and the second client's attempt.
#[derive(Clone, Copy)]
enum Break {
    /// Client 0 cannot reach node 2 (so its quorum is {0, 1}); node 1 restarts empty.
    RestartNode1,
    /// Client 0 cannot reach node 2; node 1's keys are evicted.
    EvictNode1,
    /// Nothing: the clocks were set beforehand.
    None,
    /// The holder stalls past its validity before writing.
    StallHolder,
}

/// Client 0 takes the lock and reads the value; the fault happens; client 1 takes the lock
/// (retrying), updates the value and releases; client 0 then writes what it read and
/// releases. With the assumption intact client 1 could not win before client 0 let go.
async fn hold_then_steal(lab: &Lab, fault: Break) -> Result<Outcome, LabError> {
    let first = lab.client(0).await?;
    let second = lab.client(1).await?;
    let resource = Resource::default();
    let mut notes = Vec::new();
    for round in 0..ROUNDS {
        if matches!(fault, Break::RestartNode1 | Break::EvictNode1) {
            lab.link(0, 2, LinkFault::Refuse);
        }
        let held = first.lock(KEY).await?;
        let token = record_acquired(&lab.history, "client-0", &held);
        let read = resource.read(&lab.history);
        match fault {
            Break::RestartNode1 => lab.restart(1).await?,
            Break::EvictNode1 => {
                lab.evict(1).await?;
            }
            Break::None => {}
            Break::StallHolder => sleep(lab.timing.ttl + Duration::from_millis(50)).await,
        }
        match second.lock(KEY).await {
            Ok(stolen) => {
                let stolen_token = record_acquired(&lab.history, "client-1", &stolen);
                resource
                    .update(&lab.history, "client-1", &stolen_token)
                    .await;
                release(&lab.history, "client-1", &stolen_token, stolen).await;
            }
            Err(error) => notes.push(format!("round {round}: client-1 did not win: {error}")),
        }
        // Client 0 finishes its critical section as if nothing happened.
        resource.write(&lab.history, "client-0", &token, read);
        release(&lab.history, "client-0", &token, held).await;
        lab.heal_links();
    }
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
        hold_then_steal(lab, Break::None).await
    })
}

fn key_evicted(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(hold_then_steal(lab, Break::EvictNode1))
}

fn paused_holder_writes(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(hold_then_steal(lab, Break::StallHolder))
}

fn naive_release_by_expired_holder(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(super::safe::late_release(lab, true))
}

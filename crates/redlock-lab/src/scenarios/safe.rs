//! Must-pass scenarios: faults Redlock tolerates. Each must end with zero violations.

use std::time::Duration;

use futures::future::BoxFuture;
use redlock_testkit::LinkFault;
use tokio::time::{sleep, Instant};

use std::sync::Arc;

use super::{at, contend_under, every_node, seen_after, seen_holding, seen_without};
use crate::backend::Setup;
use crate::checker::Violation;
use crate::error::LabError;
use crate::history::Event;
use crate::lab::{Lab, Timing};
use crate::scenario::{Expect, Outcome, Scenario, KEY};
use crate::workload::{contend, record_acquired, release, Resource};

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

fn minority_killed(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        let start = Instant::now();
        sleep_to(start, at(lab, 0.25)).await;
        lab.kill(1).await?;
        sleep_to(start, at(lab, 0.5)).await;
        lab.kill(3).await
    }))
}

fn minority_paused(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        let start = Instant::now();
        sleep_to(start, at(lab, 0.2)).await;
        lab.pause(1).await?;
        lab.pause(3).await?;
        sleep_to(start, at(lab, 0.7)).await;
        lab.resume(1).await?;
        lab.resume(3).await
    }))
}

fn minority_partitioned_per_client(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        let start = Instant::now();
        sleep_to(start, at(lab, 0.2)).await;
        // Reachable: client-0 {2,3,4}, client-1 {0,1,4}, client-2 {0,1,2}.
        for (c, cut) in [(0, [0, 1]), (1, [2, 3]), (2, [3, 4])] {
            for n in cut {
                lab.link(c, n, LinkFault::Blackhole);
            }
        }
        sleep_to(start, at(lab, 0.75)).await;
        lab.heal_links();
        Ok(())
    }))
}

fn minority_disconnected(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        let start = Instant::now();
        sleep_to(start, at(lab, 0.2)).await;
        lab.partition(0).await?;
        lab.partition(4).await?;
        sleep_to(start, at(lab, 0.7)).await;
        lab.heal(0).await?;
        lab.heal(4).await
    }))
}

fn one_slow_node(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        let start = Instant::now();
        lab.node_links(
            2,
            LinkFault::Latency {
                to_server: Duration::ZERO,
                to_client: Duration::from_millis(40),
            },
        );
        sleep_to(start, at(lab, 0.5)).await;
        lab.node_links(
            2,
            LinkFault::Latency {
                to_server: Duration::ZERO,
                to_client: Duration::from_millis(150),
            },
        );
        Ok(())
    }))
}

fn replies_held_past_ttl(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        let start = Instant::now();
        sleep_to(start, at(lab, 0.2)).await;
        for n in 0..3 {
            lab.link(0, n, LinkFault::HoldReplies);
        }
        sleep(lab.timing.ttl.mul_f64(1.5)).await;
        for n in 0..3 {
            lab.link(0, n, LinkFault::Pass);
        }
        Ok(())
    }))
}

fn reply_dropped_after_set(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        let start = Instant::now();
        sleep_to(start, at(lab, 0.2)).await;
        for n in 0..3 {
            lab.link(0, n, LinkFault::DropReplies);
        }
        sleep_to(start, at(lab, 0.6)).await;
        for n in 0..3 {
            lab.link(0, n, LinkFault::Pass);
        }
        Ok(())
    }))
}

fn late_release_by_expired_holder(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(late_release(lab, false, None))
}

/// The stale holder's late release: through the library (compare-and-delete), or `naive`:
/// a plain `DEL` on every node, as a client without token scripts would do. Runs `rounds`
/// rounds, or (`None`) as many as fit in the lab's run time.
///
/// Each step waits for the event it needs, never for a fixed time: client-0 stalls until its
/// validity has ended and the observer has seen its key gone from every node; client-1 wins;
/// the stale extension and release go out only once the observer has seen client-1's token
/// on a quorum of nodes; client-1 goes on only once the observer has sampled those nodes
/// again after the stale release. So a deletion of client-1's key (the naive release) is on
/// record every time, and the checker reports it every time.
pub(super) async fn late_release(
    lab: &Lab,
    naive: bool,
    rounds: Option<usize>,
) -> Result<Outcome, LabError> {
    let stale = lab.client(0).await?;
    let next = lab.client(1).await?;
    let resource = Resource::default();
    let nodes = every_node(lab);
    let until = Instant::now() + lab.timing.run_for;
    let mut done = 0;
    while rounds.map_or(Instant::now() < until, |n| done < n) {
        let first = stale.lock(KEY).await?;
        let first_token = record_acquired(&lab.history, "client-0", &first);
        resource
            .update(&lab.history, "client-0", &first_token)
            .await;
        // The stall: client-0 does nothing until its validity has ended and its keys have
        // expired on the nodes.
        tokio::time::sleep_until(first.valid_until()).await;
        seen_without(lab, &first_token, &nodes, nodes.len(), lab.history.now()).await?;
        let second = next.lock(KEY).await?;
        let second_token = record_acquired(&lab.history, "client-1", &second);
        // The observer must have the new holder's token on record before the stale
        // release, or a deletion of it could fall between two samples.
        let holding = seen_holding(lab, &second_token).await?;
        // Late extension and release by the expired holder.
        let started = lab.history.now();
        let extended = first.extend(None).await;
        lab.history.record(Event::Extend {
            client: "client-0".into(),
            token: first_token.clone(),
            started,
            ended: lab.history.now(),
            valid_until: extended
                .is_ok()
                .then(|| lab.history.at(first.valid_until())),
        });
        let released = lab.history.now();
        if naive {
            lab.history.record(Event::ReleaseStarted {
                client: "client-0".into(),
                token: first_token.clone(),
                at: released,
            });
            for n in 0..lab.node_count() {
                lab.nodes().redis(n).del(&lab.full_key(KEY)).await?;
            }
            drop(first);
        } else {
            release(&lab.history, "client-0", &first_token, first).await;
        }
        // What the stale release did to the new holder's key is on record before the new
        // holder goes on (and, with the slack, before its own release could explain it).
        seen_after(lab, &holding, lab.history.now()).await?;
        resource
            .update(&lab.history, "client-1", &second_token)
            .await;
        release(&lab.history, "client-1", &second_token, second).await;
        done += 1;
    }
    stale.shutdown().await;
    next.shutdown().await;
    Ok(Outcome {
        notes: vec![format!("{done} stale extend+release pairs")],
        violations: Vec::new(),
    })
}

fn restart_after_ttl(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        let start = Instant::now();
        let down = lab.timing.ttl.mul_f64(1.3);
        sleep_to(start, at(lab, 0.15)).await;
        let first = lab.restart_after(0, down);
        let second = async {
            sleep_to(start, at(lab, 0.3)).await;
            lab.restart_after(1, down).await
        };
        let (a, b) = tokio::join!(first, second);
        a.and(b)
    }))
}

fn restart_with_appendfsync_always(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        let start = Instant::now();
        for (n, when) in [(0, 0.2), (1, 0.4), (2, 0.6)] {
            sleep_to(start, at(lab, when)).await;
            lab.restart(n).await?;
        }
        Ok(())
    }))
}

fn clock_rate_within_drift(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        for (n, rate) in [(0, 1.004), (1, 1.004), (2, 0.996), (3, 1.003)] {
            lab.clock_rate(n, rate)?;
        }
        Ok(())
    }))
}

fn majority_down(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        let clients = lab.clients(3).await?;
        let resource = Arc::new(Resource::default());
        let down = lab.timing.ttl.mul_f64(1.5);
        let faults = async {
            let start = Instant::now();
            sleep_to(start, at(lab, 0.2)).await;
            for n in 0..3 {
                lab.kill(n).await?;
            }
            let down_from = lab.history.now();
            sleep(down).await;
            let back_from = lab.history.now();
            // Concurrently: a container restart takes a second or more.
            let restarts = (0..3).map(|n| lab.restart_after(n, Duration::ZERO));
            futures::future::try_join_all(restarts).await?;
            Ok::<_, LabError>((down_from, back_from, lab.history.now()))
        };
        let until = Instant::now() + lab.timing.run_for;
        let (first, faults) = tokio::join!(
            contend(&lab.history, &resource, &clients, KEY, until),
            faults
        );
        // Keep contending for two TTLs after the majority is back, however long the
        // restarts took, to see the recovery.
        let then = contend(
            &lab.history,
            &resource,
            &clients,
            KEY,
            Instant::now() + lab.timing.ttl * 2,
        )
        .await;
        super::shutdown(&clients).await;
        let (down_from, back_from, back) = faults?;
        let mut outcome = Outcome {
            notes: vec![format!(
                "{} won, {} gave up",
                first.acquired + then.acquired,
                first.failed + then.failed
            )],
            violations: Vec::new(),
        };
        let events = lab.history.events();
        for event in &events {
            if let Event::Acquired {
                client,
                started,
                acquired,
                ..
            } = event
            {
                if *started > down_from && *acquired < back_from {
                    outcome.violations.push(Violation::Rule(format!(
                        "false success: {client} won a lock in a round started at {started:?}, \
                         while three of five nodes were down"
                    )));
                }
            }
        }
        let recovered = events.iter().find_map(|e| match e {
            Event::Acquired { acquired, .. } if *acquired >= back => Some(*acquired - back),
            _ => None,
        });
        match recovered {
            Some(after) => outcome.notes.push(format!(
                "first lock {} ms after the majority was back (TTL {} ms)",
                after.as_millis(),
                lab.timing.ttl.as_millis()
            )),
            None => outcome.violations.push(Violation::Rule(
                "no lock was won within two TTLs after the majority came back: no recovery".into(),
            )),
        }
        Ok(outcome)
    })
}

fn staggered_links_three_clients(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        for c in 0..3 {
            for n in 0..lab.node_count() {
                let delay = Duration::from_millis(15 * ((c + n) % 3) as u64);
                lab.link(
                    c,
                    n,
                    LinkFault::Latency {
                        to_server: delay / 2,
                        to_client: delay / 2,
                    },
                );
            }
        }
        Ok(())
    }))
}

//! Network faults on the client-node links: partitions, disconnected nodes, latency, and
//! replies held or dropped after the command was applied.

use std::time::Duration;

use futures::future::BoxFuture;
use redlock_testkit::LinkFault;
use tokio::time::{sleep, Instant};

use super::super::{at, contend_under, contend_until_leaves_settle};
use super::sleep_to;
use crate::error::LabError;
use crate::lab::Lab;
use crate::scenario::Outcome;

/// Each client loses its links to a different minority (blackholed) from a fifth of the run
/// to three quarters of it; the clients go on until [`Lab::leave_settle`] has passed since
/// the links healed.
pub(super) fn minority_partitioned_per_client(
    lab: &Lab,
) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_until_leaves_settle(lab, async {
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

/// Nodes 0 and 4 are cut off from every client from a fifth of the run to 70 % of it; the
/// clients go on until [`Lab::leave_settle`] has passed since they were healed.
pub(super) fn minority_disconnected(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_until_leaves_settle(lab, async {
        let start = Instant::now();
        sleep_to(start, at(lab, 0.2)).await;
        lab.partition(0).await?;
        lab.partition(4).await?;
        sleep_to(start, at(lab, 0.7)).await;
        lab.heal(0).await?;
        lab.heal(4).await
    }))
}

pub(super) fn one_slow_node(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
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

pub(super) fn replies_held_past_ttl(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
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

pub(super) fn reply_dropped_after_set(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
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

pub(super) fn staggered_links_three_clients(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
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

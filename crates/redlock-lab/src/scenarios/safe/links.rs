//! Link faults that last the whole run: links to a minority that flap, and replies that
//! never come back to one client while the others see the same nodes healthy.
//!
//! Both are faults of the fault proxies, so they are the same on both backends (a `docker
//! network disconnect` per flap would take longer than the flap itself).

use std::time::Duration;

use futures::future::BoxFuture;
use redlock_testkit::LinkFault;
use tokio::time::{sleep, Instant};

use super::super::{contend_under, contend_until_leaves_settle};
use crate::error::LabError;
use crate::lab::Lab;
use crate::scenario::Outcome;

/// How long a flapping link stays in one state.
const FLAP: Duration = Duration::from_millis(250);

/// Every client's links to nodes 3 and 4 go down and up every 250 ms for the run but its last
/// two TTLs, out of step (node 4 flaps half a period later), going down alternately as a blackhole
/// (requests and replies dropped on the open connections) and as refused connections
/// (resets). The clients go on until [`Lab::leave_settle`] has passed since the last flap:
/// a fair waiter whose leave a flap cut off may be handed the key there meanwhile.
pub(super) fn minority_links_flapping(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_until_leaves_settle(lab, async {
        // Flapping stops two TTLs before the clients do: a release that found a link down
        // leaves its key there to expire with its TTL (the library does not retry it), and
        // the leftover scan after the run must only find keys nobody could account for.
        let until = Instant::now() + lab.timing.run_for.saturating_sub(lab.timing.ttl * 2);
        let mut now = [LinkFault::Pass; 2];
        let mut step = 0u64;
        while Instant::now() < until {
            for (i, n) in [3, 4].into_iter().enumerate() {
                // Phases of two steps (one FLAP): down, up, down, up...; node 4 a step late.
                let phase = (step + i as u64) / 2;
                let fault = match (phase % 2, phase / 2 % 2) {
                    (1, _) => LinkFault::Pass,
                    (_, 0) => LinkFault::Blackhole,
                    _ => LinkFault::Refuse,
                };
                if fault != now[i] {
                    lab.node_links(n, fault);
                    now[i] = fault;
                }
            }
            sleep(FLAP / 2).await;
            step += 1;
        }
        for (i, n) in [3, 4].into_iter().enumerate() {
            if now[i] != LinkFault::Pass {
                lab.node_links(n, LinkFault::Pass);
            }
        }
        Ok(())
    }))
}

/// Requests from client 0 reach nodes 0 and 1 (and are applied) but their replies never come
/// back, and the same for client 1 and node 4, for the whole run; client 2 sees every node
/// healthy, and so do clients 0 and 1 for the other nodes. Client 0 can only win on nodes
/// 2-4, while its SETs still take nodes 0 and 1 from the others; its rollbacks and releases
/// reach them too, so nothing is left.
pub(super) fn asymmetric_replies_dropped(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        for (c, n) in [(0, 0), (0, 1), (1, 4)] {
            lab.link(c, n, LinkFault::DropReplies);
        }
        Ok(())
    }))
}

//! Many clients on one key: separate `Redlock` instances (32 for locks), each with its own
//! links, contending while a minority of nodes is paused and resumed.

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::super::{at, contend_lab_each, shutdown};
use super::sleep_to;
use crate::error::LabError;
use crate::lab::Lab;
use crate::resource::Resource;
use crate::scenario::Outcome;

/// How many clients contend in [`many_clients_minority_paused`].
pub(super) const MANY: usize = 32;

/// How many clients contend in the semaphore's and the read-write lock's many-clients
/// scenarios: two loops each, so 32 contenders. With 32 clients (64 loops) on three permits
/// and two of five nodes paused, every round needs the three live nodes to agree on one
/// permit, and on a loaded machine a whole run could win none (1 docker run in 31 of a soak
/// while other builds ran), which a must-pass run reports as "checked nothing".
pub(super) const MANY_FAMILY: usize = 16;

/// The scenario's clients ([`MANY`] for locks) contend for the run (the lab's workload: the mix by default, where the
/// fair clients' plain cycles go through the queue too); nodes 3 and 4 are paused from a quarter to 70 % of
/// it. The checker judges overlap, lost updates, tokens and keys left as everywhere; the
/// notes report fairness: the critical sections each client got (min, max, how many got
/// none). Fairness is reported, not required: plain locks promise none.
pub(super) fn many_clients_minority_paused(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    many_clients(lab, false)
}

/// [`many_clients_minority_paused`] with every client's locks in the fair queue: the same
/// checks, and the notes show the queue's share per client. Fairness is still reported,
/// not required: a waiter whose links to a quorum are down or slow loses its place.
pub(super) fn many_clients_fair_minority_paused(
    lab: &Lab,
) -> BoxFuture<'_, Result<Outcome, LabError>> {
    many_clients(lab, true)
}

fn many_clients(lab: &Lab, fair: bool) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        let many = lab.links.clients();
        let mut clients = Vec::with_capacity(many);
        for c in 0..many {
            clients.push(lab.client_with(c, |b| b.fair(fair)).await?);
        }
        let resource = Arc::new(Resource::default());
        let start = Instant::now();
        let faults = async {
            sleep_to(start, at(lab, 0.25)).await;
            lab.pause(3).await?;
            lab.pause(4).await?;
            sleep_to(start, at(lab, 0.7)).await;
            lab.resume(3).await?;
            lab.resume(4).await
        };
        let until = start + lab.timing.run_for;
        let (tallies, faults) =
            tokio::join!(contend_lab_each(lab, &resource, &clients, until), faults);
        shutdown(&clients).await;
        faults?;
        let tallies = tallies?;
        let sections: Vec<u64> = tallies.iter().map(|t| t.writes()).collect();
        let won: u64 = tallies.iter().map(|t| t.acquired).sum();
        let failed: u64 = tallies.iter().map(|t| t.failed).sum();
        let (min, max) = (
            sections.iter().copied().min().unwrap_or(0),
            sections.iter().copied().max().unwrap_or(0),
        );
        let none = sections.iter().filter(|&&s| s == 0).count();
        Ok(Outcome {
            notes: vec![
                format!("{many} clients: {won} won, {failed} gave up"),
                format!(
                    "fairness: critical sections per client min {min}, max {max}, {none} of \
                     {many} clients got none; per client {sections:?}"
                ),
            ],
            violations: Vec::new(),
        })
    })
}

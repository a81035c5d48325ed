//! The scenario suite: must-pass scenarios (zero violations) and demonstrations (the checker
//! must report a violation, because each breaks an assumption of Redlock).

mod demos;
mod safe;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redlock_client::Redlock;
use tokio::time::Instant;

use crate::error::LabError;
use crate::lab::Lab;
use crate::scenario::{Outcome, Scenario, KEY};
use crate::workload::{contend, Resource};

/// Every scenario, must-pass ones first.
pub fn all() -> Vec<Scenario> {
    let mut all = safe::scenarios();
    all.extend(demos::scenarios());
    all
}

/// Runs `clients` contending clients for the lab's run time while `faults` runs, then shuts
/// the clients down. The most common driver shape.
async fn contend_under<F>(lab: &Lab, clients: usize, faults: F) -> Result<Outcome, LabError>
where
    F: Future<Output = Result<(), LabError>>,
{
    let clients = lab.clients(clients).await?;
    let clients = &clients[..];
    let resource = Arc::new(Resource::default());
    let until = Instant::now() + lab.timing.run_for;
    let (tally, faults) = tokio::join!(
        contend(&lab.history, &resource, clients, KEY, until),
        faults
    );
    shutdown(clients).await;
    faults?;
    Ok(Outcome {
        notes: vec![format!(
            "{} won, {} gave up, {} writes skipped for lack of validity",
            tally.acquired, tally.failed, tally.skipped_writes
        )],
        violations: Vec::new(),
    })
}

async fn shutdown(clients: &[Redlock]) {
    for client in clients {
        client.shutdown().await;
    }
}

/// `fraction` of the lab's run time.
fn at(lab: &Lab, fraction: f64) -> Duration {
    lab.timing.run_for.mul_f64(fraction)
}

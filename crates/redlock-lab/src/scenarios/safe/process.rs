//! Faults inside a minority of node processes: killed, paused and resumed, or running a clock
//! a little fast or slow (within the drift budget).

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::super::{at, contend_under};
use super::sleep_to;
use crate::error::LabError;
use crate::lab::Lab;
use crate::scenario::Outcome;

pub(super) fn minority_killed(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        let start = Instant::now();
        sleep_to(start, at(lab, 0.25)).await;
        lab.kill(1).await?;
        sleep_to(start, at(lab, 0.5)).await;
        lab.kill(3).await
    }))
}

pub(super) fn minority_paused(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
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

pub(super) fn clock_rate_within_drift(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        for (n, rate) in [(0, 1.004), (1, 1.004), (2, 0.996), (3, 1.003)] {
            lab.clock_rate(n, rate)?;
        }
        Ok(())
    }))
}

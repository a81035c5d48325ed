//! The paused holder against a fenced resource: the fault of the `paused_holder_writes`
//! demonstration, with fencing tokens checked where the value is written.

use futures::future::BoxFuture;

use super::super::steal::{hold_then_steal, Break};
use crate::checker::Violation;
use crate::error::LabError;
use crate::lab::Lab;
use crate::raw;
use crate::resource::Resource;
use crate::scenario::Outcome;

/// Client 0 stalls between its read and its write past its validity; client 1 takes the
/// lock and writes; client 0's write then carries a lower token than the one the resource
/// recorded, and is rejected. The checker must find no lost update and no stale write, and
/// the run must have seen a stale write rejected: without one it would prove nothing.
pub(super) fn paused_holder_writes_fenced(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        // The value lives on node 0, reached directly (not through the fault proxies) under
        // a key outside the lock prefix: the resource is not part of the lock service.
        let addr = lab.nodes().addrs()[0];
        let redis = raw::connect(&format!("redis://{addr}"), lab.timing.node_timeout * 4).await?;
        let resource = Resource::fenced(redis.clone(), lab.resource_key());
        let outcome = hold_then_steal(lab, Break::StallHolder, &resource).await;
        raw::close(&redis, lab.timing.node_timeout).await;
        let mut outcome = outcome?;
        let rejected = resource.rejected();
        outcome.notes.push(format!(
            "the fenced resource rejected {rejected} stale write(s); value {}",
            resource.value()
        ));
        if rejected == 0 {
            outcome.violations.push(Violation::Rule(
                "the fenced resource rejected no stale write: the scenario proved nothing".into(),
            ));
        }
        Ok(outcome)
    })
}

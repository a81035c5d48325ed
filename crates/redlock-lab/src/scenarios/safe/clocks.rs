//! Wall-clock steps on a minority of nodes (as an NTP step or an operator's `date -s` would
//! make), backward by seconds and forward by up to the clients' drift allowance.
//!
//! Why forward steps stay inside the drift allowance: a key set at `t` on a node whose clock
//! then steps forward by `j` expires at `t + ttl - j` in real time, while its holder claims
//! the lock until `t0 + ttl - drift` (`t0 <= t`). So a step of at most `drift` that a key
//! lives through once can never end it before its holder's validity; a larger one is key
//! loss on that node, and one lost key in a holder's quorum of exactly `Q` nodes (common
//! after a split vote) is enough for a second holder: that is H3's "no wall-clock steps", and
//! `majority_clock_jump_forward` demonstrates it. A step back only makes keys live longer
//! there (slower hand-over, never a second holder). Each node steps forward once per run, so
//! no key lives through two forward steps.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::super::{at, contend_lab, shutdown};
use super::sleep_to;
use crate::error::LabError;
use crate::lab::Lab;
use crate::resource::Resource;
use crate::scenario::Outcome;

/// The clients' drift factor here: 0.3 of the 1 s TTL plus 2 ms, room for the 250 ms
/// forward steps (the default 0.01 leaves 12 ms). A deployment that expects its servers'
/// clocks to be stepped sets its drift factor the same way, from the largest step it expects.
pub(super) const DRIFT_FACTOR: f64 = 0.3;
/// Forward steps: inside the allowance above (302 ms).
const FORWARD_MS: i64 = 250;
/// Backward steps: any size is safe; longer than the TTL, so keys outlive it there.
const BACKWARD_MS: i64 = -1500;

/// Three clients contend (the lab's workload: the mix by default); node 0 steps back 1.5 s, node 1 forward 250 ms, node 0 forward
/// 250 ms, node 1 back 1.5 s, at 15 %, 30 %, 55 % and 80 % of the run.
pub(super) fn minority_clock_jumps(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        let mut clients = Vec::new();
        for c in 0..3 {
            clients.push(lab.client_with(c, |b| b.drift_factor(DRIFT_FACTOR)).await?);
        }
        let resource = Arc::new(Resource::default());
        let start = Instant::now();
        let steps = async {
            for (when, n, by_ms) in [
                (0.15, 0, BACKWARD_MS),
                (0.3, 1, FORWARD_MS),
                (0.55, 0, FORWARD_MS),
                (0.8, 1, BACKWARD_MS),
            ] {
                sleep_to(start, at(lab, when)).await;
                lab.clock_jump(n, by_ms).await?;
            }
            Ok::<(), LabError>(())
        };
        let until = start + lab.timing.run_for;
        let (tally, steps) = tokio::join!(contend_lab(lab, &resource, &clients, until), steps);
        shutdown(&clients).await;
        steps?;
        let tally = tally?;
        Ok(Outcome {
            notes: vec![format!(
                "{} won, {} gave up, {} writes skipped for lack of validity (drift factor \
                 {DRIFT_FACTOR}: {} ms of a {} ms TTL)",
                tally.acquired,
                tally.failed,
                tally.skipped_writes,
                (lab.timing.ttl.mul_f64(DRIFT_FACTOR) + Duration::from_millis(2)).as_millis(),
                lab.timing.ttl.as_millis()
            )],
            violations: Vec::new(),
        })
    })
}

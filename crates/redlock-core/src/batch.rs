//! Extending many locks in one round: one script call per node for all of them (the
//! coordinator splits large sets into batches of `EXTEND_BATCH_LOCKS`), each lock
//! counted against the quorum on its own. This is what lets a renewal scheduler keep
//! thousands of locks alive with one command per node per tick instead of one per lock.
//!
//! Extensions need no rollback (a late `PEXPIRE` only lengthens a key that is still ours),
//! so this round does not outlive its future: dropping it simply stops waiting.

use std::sync::Arc;
use std::time::Duration;

use fred::types::{Key, Value};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::drift::{drift, validity};
use crate::lock::Lock;
use crate::node::Node;
use crate::quorum::{quorum, Decision, Tally};
use crate::report::{NodeOutcome, NodeReport, RoundKind, RoundReport};
use crate::round::Finished;
use crate::scripts::EXTEND_BATCH;

/// Runs one extension round for `locks` (each with the TTL it asks for, already checked).
pub(crate) async fn extend(
    nodes: &Arc<[Node]>,
    locks: &[(&Lock, Duration)],
    drift_factor: f64,
) -> Vec<Finished> {
    let n = nodes.len();
    let mut keys: Vec<Key> = Vec::new();
    let mut args: Vec<Value> = vec![Value::from("batch")];
    for (lock, ttl) in locks {
        keys.extend(lock.keys.iter().map(|k| Key::from(&**k)));
        args.push(Value::from(if lock.owner.is_some() { "r" } else { "e" }));
        args.push(Value::from(lock.keys.len() as i64));
        args.push(Value::String(lock.token.as_fred().clone()));
        args.push(Value::from(lock.owner.as_deref().unwrap_or("")));
        args.push(Value::from(ttl.as_millis() as i64));
    }
    let span = tracing::debug_span!("redlock.extend_batch", locks = locks.len(), nodes = n);
    let _entered = span.enter();

    let mut reports: Vec<Vec<NodeReport>> = locks
        .iter()
        .map(|_| {
            nodes
                .iter()
                .map(|node| NodeReport::pending(node.name.clone()))
                .collect()
        })
        .collect();
    let mut tallies: Vec<Tally> = locks.iter().map(|_| Tally::new(n)).collect();
    let mut decided: Vec<Option<Decision>> = vec![None; locks.len()];
    let mut open = locks.len();

    let t0 = Instant::now();
    let mut replies: FuturesUnordered<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let (keys, args) = (&keys, &args);
            async move { (i, node.eval(&EXTEND_BATCH, keys, args).await) }
        })
        .collect();
    while open > 0 {
        let Some((i, reply)) = replies.next().await else {
            break;
        };
        let latency = t0.elapsed();
        let flags = reply.and_then(|value| parse_flags(value, locks.len()));
        for (l, report) in reports.iter_mut().enumerate() {
            let outcome = match &flags {
                Ok(flags) if flags[l] => NodeOutcome::Extended,
                Ok(_) => NodeOutcome::NotHeld,
                Err(failure) => failure.clone(),
            };
            let accepted = outcome == NodeOutcome::Extended;
            report[i].outcome = outcome;
            report[i].latency = Some(latency);
            if decided[l].is_none() {
                decided[l] = tallies[l].record(accepted);
                if decided[l].is_some() {
                    open -= 1;
                }
            }
        }
    }
    let elapsed = t0.elapsed();

    locks
        .iter()
        .zip(reports)
        .zip(tallies)
        .zip(decided)
        .map(|((((lock, ttl), nodes), tally), decision)| {
            let validity = Some(*ttl)
                .filter(|_| decision == Some(Decision::Won))
                .and_then(|ttl| validity(ttl, elapsed, drift(ttl, drift_factor)));
            let won = decision == Some(Decision::Won) && validity.is_some();
            let report = RoundReport {
                kind: RoundKind::Extend,
                key: lock.name.clone(),
                quorum: quorum(n),
                accepted: tally.accepted(),
                nodes,
                elapsed,
                validity,
                tail: None,
            };
            Finished { report, t0, won }
        })
        .collect()
}

fn parse_flags(value: Value, expected: usize) -> Result<Vec<bool>, NodeOutcome> {
    match value {
        Value::Array(items) if items.len() == expected => Ok(items
            .into_iter()
            .map(|v| matches!(v, Value::Integer(1)))
            .collect()),
        other => Err(NodeOutcome::ServerError(format!(
            "unexpected reply to the extension script: {other:?}"
        ))),
    }
}

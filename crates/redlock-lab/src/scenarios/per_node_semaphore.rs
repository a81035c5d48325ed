//! The per-node-limit semaphore, a demonstration: each node keeps the holders it admitted
//! in a sorted set limited to `permits`, and a contender holds the semaphore once a
//! majority of nodes admitted it. Unsafe over independent nodes: with three nodes and two
//! permits, three contenders that each reach a different two-node majority are each
//! admitted by both of their nodes (every node admits two of them), three holders of two
//! permits. The checker's semaphore rule must report it, in every run.
//!
//! The schedule is fixed: each client's link to the node outside its majority is
//! blackholed for the whole run ([`REACH`]), the contenders go one after the other, each
//! talking to its two nodes, and hold until the third has been admitted. Then, as a
//! control, the library's semaphore of as many permits takes the same places: the first
//! two clients win a permit each and the third cannot (its two nodes hold the two permits,
//! each node a different one, so no permit reaches its quorum); a permit won there fails
//! the run.

use std::time::Duration;

use futures::future::BoxFuture;
use redlock_client::{LockGuard, LockOptions, Redlock, RetryPolicy, Semaphore};

use super::naive_fencing::cut;
use super::raw_holder::RawHolder;
use crate::error::LabError;
use crate::history::Event;
use crate::lab::Lab;
use crate::permits::{declare, SEMAPHORE};
use crate::scenario::Outcome;
use crate::workload::{record_acquired, release};

/// The semaphore's permits: fewer than the contenders.
pub(super) const PERMITS: u32 = 2;
/// Client `c` reaches the nodes of `REACH[c]`: three different majorities of three nodes.
pub(super) const REACH: [[usize; 2]; 3] = [[0, 1], [1, 2], [0, 2]];
/// How long the admitted contenders work before leaving: their claims overlap for that
/// long, not for an instant only.
const WORK: Duration = Duration::from_millis(50);
/// The library's third client's attempts in the control, each one round: all must fail.
const CONTROL_ATTEMPTS: usize = 5;
/// The TTL of the control's permits: the second client's rounds split between the permits
/// until one starts at the free one, and the first permit must outlive all of that and the
/// third client's attempts, which the lab's one-second TTL does not always cover.
const CONTROL_TTL: Duration = Duration::from_secs(10);
/// How long each of the control's first two clients may wait for its permit.
const CONTROL_WAIT: Duration = Duration::from_secs(5);

/// `KEYS[1]` = the node's holder set, `ARGV` = the member, the TTL in ms, the limit. The
/// set's scores are expiry times in the node's milliseconds: expired members go first; a
/// member already in is admitted again; one more is admitted below the limit.
const ADMIT: &str = r#"local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1"#;

/// `KEYS[1]` = the node's holder set, `ARGV[1]` = the member: out of the set (the set goes
/// with its last member).
const LEAVE: &str = "return redis.call('ZREM', KEYS[1], ARGV[1])";

pub(super) fn per_node_limit_semaphore(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        let set = lab.full_key(&format!("per-node-semaphore-{{{SEMAPHORE}}}"));
        lab.history.record(Event::Semaphore {
            name: format!("per-node-limit {SEMAPHORE}"),
            keys: format!("{set}:"),
            permits: PERMITS,
        });
        declare(&lab.history, &lab.prefix, PERMITS);
        let mut contenders = Vec::new();
        for (c, reach) in REACH.iter().enumerate() {
            contenders.push(RawHolder::connect(lab, c, reach).await?);
        }
        let library = lab.clients(REACH.len()).await?;
        cut(lab, &REACH);
        let mut admitted = 0;
        for contender in &contenders {
            admitted += usize::from(admit(lab, contender, &set).await);
        }
        tokio::time::sleep(WORK).await;
        for contender in &contenders {
            contender.leave(lab, LEAVE, &set).await;
        }
        let control = library_admits_two(lab, &library).await;
        for contender in contenders {
            contender.close(lab).await;
        }
        for client in &library {
            client.shutdown().await;
        }
        let mut notes = vec![format!(
            "per-node limit of {PERMITS}: {admitted} of {} contenders admitted by a majority",
            REACH.len()
        )];
        notes.push(control?);
        Ok(Outcome {
            notes,
            violations: Vec::new(),
        })
    })
}

/// Contender `holder` asks each of its nodes to admit it to the per-node sets under
/// `set`, recorded under `<set>:<client>`: whether a majority did.
async fn admit(lab: &Lab, holder: &RawHolder, set: &str) -> bool {
    let args = vec![
        holder.token.clone(),
        lab.timing.ttl.as_millis().to_string(),
        PERMITS.to_string(),
    ];
    let key = format!("{set}:{}", holder.name);
    holder
        .take(lab, ADMIT, vec![set.to_string()], args, key)
        .await
}

/// The control: the library's semaphore of [`PERMITS`] in the contenders' places. The
/// first two clients win a permit each (recorded, under the semaphore declared for the
/// checker); the third's single attempts must all fail. Its note, or why the control
/// failed.
async fn library_admits_two(lab: &Lab, library: &[Redlock]) -> Result<String, LabError> {
    let semaphores = library
        .iter()
        .map(|client| client.semaphore(SEMAPHORE, PERMITS))
        .collect::<Result<Vec<Semaphore>, _>>()?;
    // The first two wait longer than the lab's clients do (twice the TTL): a node that
    // stalls for a second on a loaded machine must not leave the control without its
    // permits. Their permits' TTL outlives the wait and the third's attempts.
    let long = LockOptions {
        ttl: Some(CONTROL_TTL),
        retry: Some(RetryPolicy {
            max_wait: Some(CONTROL_WAIT),
            ..RetryPolicy::default()
        }),
        ..LockOptions::default()
    };
    let mut held: Vec<(String, String, LockGuard)> = Vec::new();
    let mut failed = None;
    for (c, semaphore) in semaphores.iter().enumerate().take(2) {
        match semaphore.acquire_with(&long).await {
            Ok(guard) => {
                let name = format!("client-{c}");
                let token = record_acquired(&lab.history, &name, &guard);
                held.push((name, token, guard));
            }
            Err(e) => {
                failed = Some(LabError::Schedule(format!(
                    "the library's semaphore gave client-{c} no permit on its majority: {e}"
                )));
                break;
            }
        }
    }
    let mut third = None;
    if failed.is_none() {
        let once = LockOptions {
            retry: Some(RetryPolicy::no_retry()),
            ..long
        };
        for _ in 0..CONTROL_ATTEMPTS {
            if let Ok(guard) = semaphores[2].acquire_with(&once).await {
                third = Some(guard);
                break;
            }
        }
    }
    if let Some(guard) = third {
        let token = record_acquired(&lab.history, "client-2", &guard);
        failed = Some(if held.iter().all(|(_, _, first)| first.is_valid()) {
            LabError::Setup(format!(
                "the library's semaphore of {PERMITS} permits admitted a third holder while \
                 two held theirs: it must refuse"
            ))
        } else {
            LabError::Schedule(format!(
                "the control's first permits expired before the third client's attempts \
                 ended (TTL {CONTROL_TTL:?}): the control proved nothing"
            ))
        });
        held.push(("client-2".into(), token, guard));
    }
    for (name, token, guard) in held {
        release(&lab.history, &name, &token, guard).await;
    }
    match failed {
        Some(error) => Err(error),
        None => Ok(format!(
            "control: the library's semaphore, in the same places, gave client-0 and client-1 \
             a permit each and refused client-2 in {CONTROL_ATTEMPTS} attempts"
        )),
    }
}

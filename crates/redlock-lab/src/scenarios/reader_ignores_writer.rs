//! The read-write lock whose reader ignores the writer, a demonstration: its writer is
//! taken as the library's is (where no writer's key is and no reader's entry is live), but
//! its reader checks only a waiting writer's intent, not the writer's key, and so comes in
//! on every node while a writer holds the lock there. The checker's rule of a writer alone
//! must report it, in every run.
//!
//! The schedule is fixed: client 0 takes the write side on every node, then client 1 takes
//! the read side, also admitted by every node, and both hold for [`WORK`] before leaving.
//! Then, as a control, the library's read-write lock takes the same places: client 0 holds
//! its write side, and client 1's single attempts at the read side must all fail; a read
//! side won while the writer holds fails the run.

use std::time::Duration;

use futures::future::BoxFuture;
use redlock_client::{LockOptions, Redlock, RetryPolicy};

use super::raw_holder::RawHolder;
use crate::error::LabError;
use crate::history::Event;
use crate::lab::Lab;
use crate::rwlocks::{declare_rwlock, RWLOCK};
use crate::scenario::Outcome;
use crate::workload::{record_acquired, release};

/// How long the writer and the reader hold before leaving: their claims overlap for that
/// long, not for an instant only.
const WORK: Duration = Duration::from_millis(50);
/// The library's reader's attempts in the control, each one round: all must fail.
const CONTROL_ATTEMPTS: usize = 5;
/// The TTL of the control's writer: it must outlive the reader's attempts.
const CONTROL_TTL: Duration = Duration::from_secs(10);

/// The node's time in ms, for the scripts below.
const NOW: &str = r#"local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
"#;

/// `KEYS` = the writer's key, the readers' set; `ARGV` = the token, the TTL in ms. Taken
/// where no writer's key is and no reader's entry is live, as the library's writer is.
const WRITE: &str = r#"if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZCARD', KEYS[2]) > 0 then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1"#;

/// `KEYS` = the readers' set, the intent; `ARGV` = the token, the TTL in ms. The broken
/// reader: it checks the intent only, never the writer's key.
const READ: &str = r#"if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1"#;

/// `KEYS[1]` = the writer's key or the readers' set, `ARGV[1]` = the token: the writer's
/// key deleted where it is the token's, the reader's entry taken out of the set (the set
/// goes with its last entry).
const LEAVE: &str = r#"if redis.call('TYPE', KEYS[1]).ok == 'zset' then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0"#;

pub(super) fn reader_ignores_writer(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        let base = lab.full_key(&format!("broken-rwlock-{{{RWLOCK}}}"));
        let keys = [
            format!("{base}:write"),
            format!("{base}:read"),
            format!("{base}:intent"),
        ];
        lab.history.record(Event::RwLock {
            name: format!("reader-ignores-writer {RWLOCK}"),
            writers: keys[0].clone(),
            readers: keys[1].clone(),
        });
        declare_rwlock(&lab.history, &lab.prefix);
        let every: Vec<usize> = (0..lab.node_count()).collect();
        let writer = RawHolder::connect(lab, 0, &every).await?;
        let reader = RawHolder::connect(lab, 1, &every).await?;
        let wrote = take(lab, &writer, true, &keys).await;
        let read = take(lab, &reader, false, &keys).await;
        tokio::time::sleep(WORK).await;
        reader.leave(lab, LEAVE, &keys[1]).await;
        writer.leave(lab, LEAVE, &keys[0]).await;
        writer.close(lab).await;
        reader.close(lab).await;
        let control = library_refuses_the_reader(lab).await;
        let mut notes = vec![format!(
            "reader that ignores the writer: writer admitted by a majority: {wrote}, reader \
             admitted by a majority while it held: {read}"
        )];
        notes.push(control?);
        Ok(Outcome {
            notes,
            violations: Vec::new(),
        })
    })
}

/// Client `holder` takes the broken lock's write side (`write`) or its read side on every
/// node, recorded as a holder of that side's key: whether a majority admitted it.
async fn take(lab: &Lab, holder: &RawHolder, write: bool, keys: &[String; 3]) -> bool {
    let (script, taken) = if write {
        (WRITE, [&keys[0], &keys[1]])
    } else {
        (READ, [&keys[1], &keys[2]])
    };
    let args = vec![holder.token.clone(), lab.timing.ttl.as_millis().to_string()];
    let taken: Vec<String> = taken.into_iter().cloned().collect();
    let held = taken[0].clone();
    holder
        .take(lab, &format!("{NOW}{script}"), taken, args, held)
        .await
}

/// The control: the library's read-write lock in the same places. Client 0 holds the
/// write side (recorded, under the lock declared for the checker); client 1's single
/// attempts at the read side must all fail. Its note, or why the control failed.
async fn library_refuses_the_reader(lab: &Lab) -> Result<String, LabError> {
    // Single attempts, outside the fair queue; the writer needs no fencing token here.
    let mut library: Vec<Redlock> = Vec::new();
    for c in 0..2 {
        library.push(lab.client_with(c, |b| b.fair(false).fencing(false)).await?);
    }
    let long = LockOptions {
        ttl: Some(CONTROL_TTL),
        ..LockOptions::default()
    };
    let writer = library[0].rwlock(RWLOCK)?.write_with(&long).await;
    let result = match writer {
        Err(e) => Err(LabError::Schedule(format!(
            "the library's read-write lock gave client-0 no write side on a healthy node \
             set: {e}"
        ))),
        Ok(guard) => {
            let token = record_acquired(&lab.history, "client-0", &guard);
            let once = LockOptions {
                retry: Some(RetryPolicy::no_retry()),
                ..long
            };
            let rwlock = library[1].rwlock(RWLOCK)?;
            let mut read = None;
            for _ in 0..CONTROL_ATTEMPTS {
                if let Ok(reading) = rwlock.read_with(&once).await {
                    read = Some(reading);
                    break;
                }
            }
            let refused = match read {
                None => Ok(()),
                Some(reading) => {
                    let read_token = record_acquired(&lab.history, "client-1", &reading);
                    let failed = if guard.is_valid() {
                        LabError::Setup(
                            "the library's read-write lock admitted a reader while its writer \
                             held the write side: it must refuse"
                                .into(),
                        )
                    } else {
                        LabError::Schedule(format!(
                            "the control's writer expired before the reader's attempts ended \
                             (TTL {CONTROL_TTL:?}): the control proved nothing"
                        ))
                    };
                    release(&lab.history, "client-1", &read_token, reading).await;
                    Err(failed)
                }
            };
            release(&lab.history, "client-0", &token, guard).await;
            refused.map(|()| {
                format!(
                    "control: the library's read-write lock, in the same places, gave client-0 \
                     the write side and refused client-1 the read side in {CONTROL_ATTEMPTS} \
                     attempts"
                )
            })
        }
    };
    for client in &library {
        client.shutdown().await;
    }
    result
}

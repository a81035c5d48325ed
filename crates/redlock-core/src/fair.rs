//! Fair acquisition: a waiter queue per key on every node, so that the lock goes to waiters
//! in the order they began waiting, across clients and processes.
//!
//! Each waiter takes one ticket when it starts waiting (its wall clock in ms) and enqueues
//! itself under that ticket on every node (`ZADD NX`), on every attempt. All nodes order
//! the entries they hold the same way (ticket, then waiter id), so the oldest waiter is the
//! head on every node that has its entry; only the head may `SET NX`, the others are told
//! "not your turn" without writing. Waiters no longer split the votes, and a releasing
//! holder cannot take the lock straight back while others wait. Mutual exclusion still
//! rests on `SET NX PX` alone: the queue only decides who tries, so a queue that is lost or
//! differs between nodes costs fairness, never safety.
//!
//! A crashed waiter cannot block the queue: each entry expires `patience` after its
//! waiter's last attempt (by the node's clock), and every attempt first drops the expired
//! entries. Client clocks that disagree change the order (a waiter whose clock runs ahead
//! queues later), never safety.

use std::time::Duration;

use fred::types::{Key, Value};

use crate::coordinator::Coordinator;
use crate::error::{ConfigError, Error};
use crate::lock::Lock;
use crate::report::{NodeOutcome, RoundKind, RoundReport};
use crate::round::Command;
use crate::scripts::FAIR_LEAVE;

/// A waiter's place in a key's fair queue: who it is, its ticket, and how long its entry
/// outlives its last attempt. Give the same place to every attempt of one wait.
///
/// ```
/// use std::time::Duration;
/// use redlock_core::{Acquisition, FairPlace};
///
/// let keys = ["invoice:42"];
/// let place = FairPlace::now("waiter-7", Duration::from_secs(2));
/// let fair = Acquisition {
///     fair: Some(place),
///     ..Acquisition::new(&keys, Duration::from_secs(10))
/// };
/// assert_eq!(fair.fair.unwrap().waiter, "waiter-7");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairPlace<'a> {
    /// Who waits: unique among the waiters of the key (a random id per wait), without
    /// white space. An id `"<tag>:<rest>"` has the release that names it as the queue's
    /// next waiter published on `"<release channel>:<tag>"` instead of the shared release
    /// channel, so that only the waiter's own client hears it (`redlock-client` tags its
    /// waiters with a random id per client).
    pub waiter: &'a str,
    /// The order: lower goes first, then the waiter id. Normally the wall clock in ms
    /// when the wait began.
    pub ticket: u64,
    /// How long the entry stays on a node after the waiter's last attempt there. Longer
    /// than the longest pause between two attempts of the waiter, or it loses its place;
    /// short, because a waiter that crashed holds up the queue that long.
    pub patience: Duration,
}

impl<'a> FairPlace<'a> {
    /// A place with a ticket from the wall clock now.
    pub fn now(waiter: &'a str, patience: Duration) -> Self {
        let ticket = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            });
        FairPlace {
            waiter,
            ticket,
            patience,
        }
    }

    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.waiter.is_empty()
            || self.waiter.contains(char::is_whitespace)
            || self.patience.is_zero()
        {
            return Err(ConfigError::FairPlace);
        }
        Ok(())
    }

    /// The script's arguments after the token and the TTL: waiter, ticket, patience in ms.
    pub(crate) fn args(&self) -> [Value; 3] {
        // Sorted-set scores are doubles: tickets are exact up to 2^53 ms (285,000 years).
        let ticket = i64::try_from(self.ticket.min(1 << 53)).unwrap_or(i64::MAX);
        let patience = i64::try_from(self.patience.as_millis().max(1)).unwrap_or(i64::MAX);
        [
            Value::from(self.waiter),
            Value::from(ticket),
            Value::from(patience),
        ]
    }
}

/// The keys of lock key `key`'s queue and of the queue's expiry.
pub(crate) fn queue_keys(prefix: &str, key: &str) -> [Key; 2] {
    [
        Key::from(format!("{prefix}queue:{key}")),
        Key::from(format!("{prefix}expiry:{key}")),
    ]
}

impl Coordinator {
    /// Takes `waiter` out of `key`'s fair queue on every node (decided at a quorum; the
    /// other nodes finish in the background). A waiter that stops waiting, whether it won
    /// the lock or gave up, leaves at once instead of holding up the queue for its
    /// patience. With notifications on (`Config::release_channel`), a node where the key is
    /// free announces the leave to the queue's next waiter, as a release would.
    pub async fn leave_queue(&self, key: &str, waiter: &str) -> Result<RoundReport, Error> {
        let [queue, expiry] = queue_keys(&self.inner.config.fair_prefix, key);
        let channel = self.inner.config.release_channel.as_deref().unwrap_or("");
        let command = Command::Script {
            script: &FAIR_LEAVE,
            keys: vec![queue, expiry, Key::from(key)],
            args: vec![Value::from(waiter), Value::from(channel)],
        };
        let round = self.untimed_round(RoundKind::Leave, command, key.into());
        self.run_to_quorum(round).await
    }

    /// [`leave_queue`](Self::leave_queue) without waiting, for a waiter that cannot await
    /// (a dropped `lock` call). Counts as background work, like
    /// [`release_in_background`](Self::release_in_background); outside a tokio runtime it
    /// sends nothing and the entry expires with its patience.
    pub fn leave_queue_in_background(&self, key: String, waiter: String) -> bool {
        self.spawn_background(|this| async move {
            if let Err(e) = this.leave_queue(&key, &waiter).await {
                tracing::debug!(error = %e, "leaving a fair queue failed; the entry expires with its patience");
            }
        })
    }
}

impl Coordinator {
    /// After `waiter` won `lock` with a place in the key's queue: the winning script took it
    /// out of the queue on every node that set the key, so it leaves the queue (in the
    /// background, as [`leave_queue_in_background`](Self::leave_queue_in_background))
    /// only when some node did not, once the round's late answers are in.
    pub fn leave_queue_after_win(&self, lock: &Lock, waiter: String) -> bool {
        let report = lock.report().clone();
        let key = lock.key().to_string();
        self.spawn_background(|this| async move {
            let settled = report.settled().await;
            if settled
                .nodes
                .iter()
                .all(|node| node.outcome == NodeOutcome::Acquired)
            {
                return;
            }
            if let Err(e) = this.leave_queue(&key, &waiter).await {
                tracing::debug!(error = %e, "leaving a fair queue failed; the entry expires with its patience");
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_needs_a_waiter_and_patience() {
        let ok = FairPlace {
            waiter: "w",
            ticket: 1,
            patience: Duration::from_millis(1),
        };
        assert!(ok.check().is_ok());
        assert!(FairPlace { waiter: "", ..ok }.check().is_err());
        assert!(FairPlace {
            waiter: "a b",
            ..ok
        }
        .check()
        .is_err());
        assert!(FairPlace {
            patience: Duration::ZERO,
            ..ok
        }
        .check()
        .is_err());
    }

    #[test]
    fn tickets_beyond_a_double_are_capped_and_the_clock_ticket_is_recent() {
        let far = FairPlace {
            waiter: "w",
            ticket: u64::MAX,
            patience: Duration::from_secs(1),
        };
        assert_eq!(far.args()[1], Value::from(1i64 << 53));
        // After 2020-01-01 and exactly representable as a sorted-set score.
        let now = FairPlace::now("w", Duration::from_secs(1)).ticket;
        assert!(now > 1_577_836_800_000 && now < 1 << 53);
    }

    #[test]
    fn queue_keys_never_collide_between_locks() {
        let [q, e] = queue_keys("redlock:fair-", "redlock:a");
        assert_eq!(q.as_str(), Some("redlock:fair-queue:redlock:a"));
        assert_eq!(e.as_str(), Some("redlock:fair-expiry:redlock:a"));
    }
}

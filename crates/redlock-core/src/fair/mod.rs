//! Fair acquisition: a waiter queue per key on every node, so that the lock goes to waiters
//! in the order they began waiting, across clients and processes.
//!
//! Each waiter takes one ticket when it starts waiting (its wall clock in ms) and enqueues
//! itself under that ticket on every node (`ZADD NX`), on every attempt. All nodes order
//! the entries they hold the same way (ticket, then waiter id), so the oldest waiter is the
//! head on every node that has its entry; only the head may `SET NX`, the others are told
//! "not your turn" without writing. Waiters do not split the votes, and a releasing
//! holder cannot take the lock straight back while others wait. Mutual exclusion still
//! rests on `SET NX PX` alone: the queue only decides who tries, so a queue that is lost or
//! differs between nodes costs fairness, never safety.
//!
//! A crashed waiter cannot block the queue: each entry expires `patience` after its
//! waiter's last attempt (by the node's clock), and every attempt first drops the expired
//! entries. Client clocks that disagree change the order (a waiter whose clock runs ahead
//! queues later), never safety. A live head that cannot win (its answers come late, or it
//! reaches too few nodes) is the caller's to handle: `redlock-client`'s waiter leaves
//! ([`Waiters::leave`]) and queues again under a new ticket after three lost
//! rounds that no node refused.
//!
//! Hand-over: each attempt of a fair waiter also registers a hand-over (its attempt number
//! and TTL). A release (or a leave) that frees the key while such a waiter heads the queue
//! sets the key to the waiter's hand-over token `"<waiter>~<number>"` there and then, and
//! tells its client. Once a quorum of nodes has told it, the waiter holds the lock
//! ([`Waiters::handed_over`]) without a round of its own: a hand-off costs the release
//! and its message. Its validity is that of the attempt that registered the hand-over
//! (`t0 + ttl - drift`), a lower bound of each such node's expiry since every one of them
//! set the key after that attempt reached it. The hand-over token is no round's token, so
//! no rollback of the waiter's rounds deletes a key handed over meanwhile; a later attempt
//! takes such a key on under its round's token. A waiter that dies after registering and is
//! then handed the key holds it up for one TTL, as a holder that dies does. The release of
//! a handed-over lock takes its waiter out of the key's queue on every node where the key
//! is not its own, so that a holder's release that reaches such a node late (after the
//! waiter held and released the lock) cannot hand the key to it there again.
//!
//! Reentrant, fenced and multi-key locks queue the same way, gated by the same queues, but
//! are not handed the key: a release that finds one at the head frees the key and tells
//! its client, and its round (the head's: the only one let through) takes it. A reentrant
//! owner that already holds the key adds a hold without waiting for its turn. A lock over
//! several keys waits in each key's queue and may try once it heads all of them; one
//! ticket orders every queue, so the oldest waiter heads all of its queues, and waiters of
//! overlapping keys cannot wait for each other.
//!
//! A semaphore and a read-write lock have one queue each, with their own turns (see
//! `acquire::permit` and `acquire::rwlock`): the oldest waiters, as many as a node has free
//! permits; a writer at the head, a reader with no writer ahead. Their waiters leave the
//! same way, and nothing is handed over to them.

pub(crate) mod place;

use std::sync::Arc;

use fred::types::{Key, Value};
use tokio::time::Instant;

use crate::connection;
use crate::coordinator::Coordinator;
use crate::deadline::host_suspended;
use crate::error::ConfigError;
use crate::error::Error;
use crate::lock::Lock;
use crate::lock_spec::LockSpec;
use crate::node_name::NodeName;
use crate::report::{CleanupOutcome, NodeOutcome, NodeReport, RoundKind, RoundReport};
use crate::round::Decided;
use crate::round::{try_on, Command};
use crate::scripts::{channel_arg, FAIR_LEAVE};
use crate::token::Token;
use fred::clients::SubscriberClient;

use crate::layout::queue_keys;
pub use place::{handover_token, FairPlace, Handover};

/// What a client that waits for locks uses beside the rounds ([`Coordinator::waiters`]):
/// the subscribers that hear releases, a fair waiter's leave from the queues, and the lock
/// that releases hand over to a fair waiter. `redlock-client` builds its wake-ups and fair
/// mode on these; a service that calls the core directly needs them only for the fair
/// queue ([`crate::Acquisition::fair`]).
#[derive(Clone, Copy)]
pub struct Waiters<'a> {
    coordinator: &'a Coordinator,
}

impl std::fmt::Debug for Waiters<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiters").finish_non_exhaustive()
    }
}

impl Coordinator {
    /// The waiters' side of this coordinator (see [`Waiters`]).
    pub fn waiters(&self) -> Waiters<'_> {
        Waiters { coordinator: self }
    }
}

impl Waiters<'_> {
    /// One subscriber connection per node, in configuration order, for hearing release
    /// notifications (`Config::release_channel`). Built with the same settings as the
    /// round connections (timeouts, reconnect policy, credentials, TLS); not connected
    /// yet. A node whose subscriber cannot be built has an error in its place.
    pub fn subscribers(self) -> Vec<(NodeName, Result<SubscriberClient, ConfigError>)> {
        match self.coordinator.inner.config.endpoints() {
            Ok(endpoints) => endpoints
                .into_iter()
                .map(|e| {
                    let subscriber = connection::subscriber(&e, &self.coordinator.inner.config);
                    (e.name, subscriber)
                })
                .collect(),
            // Validated at connect; a configuration cannot change afterwards.
            Err(e) => self
                .coordinator
                .nodes()
                .into_iter()
                .map(|n| (n, Err(e.clone())))
                .collect(),
        }
    }

    /// Takes `waiter` out of `key`'s fair queue on every node (decided at a quorum; the
    /// other nodes finish in the background). A waiter that stops waiting, whether it won
    /// the lock or gave up, leaves at once instead of holding up the queue for its
    /// patience. With notifications on (`Config::release_channel`), a node where the key is
    /// free announces the leave to the queue's next waiter, as a release would.
    ///
    /// A key handed over to the waiter and not taken on (see [`FairPlace::handover`]) is
    /// deleted, and passed on to the next waiter.
    pub async fn leave(self, key: &str, waiter: &str) -> Result<RoundReport, Error> {
        self.leave_round(key, waiter, None).await
    }

    /// [`leave`](Self::leave) by a waiter that goes on waiting (a fair head that
    /// steps back to queue again): only a key handed over for one of its attempts numbered
    /// up to `last` ([`FairPlace::handover`]) is deleted. The leave is sent again to a node
    /// that did not answer, so it may land after the waiter's next attempt; a hand-over
    /// made for that attempt (which the waiter may hold by then) stays.
    pub async fn leave_up_to(
        self,
        key: &str,
        waiter: &str,
        last: u64,
    ) -> Result<RoundReport, Error> {
        self.leave_round(key, waiter, Some(last)).await
    }

    /// The `FAIR_LEAVE` round that takes `waiter` out of `key`'s queue, deleting a key handed
    /// over to it for an attempt up to `up_to` (any, with `None`).
    async fn leave_round(
        self,
        key: &str,
        waiter: &str,
        up_to: Option<u64>,
    ) -> Result<RoundReport, Error> {
        let (keys, args) = self.leave_args(key, waiter, None, up_to);
        let command = Command::Script {
            script: &FAIR_LEAVE,
            keys,
            args,
        };
        let round = self
            .coordinator
            .untimed_round(RoundKind::Leave, command, key.into());
        self.coordinator.run_to_quorum(round).await
    }

    /// The keys and arguments of the `FAIR_LEAVE` script call (see
    /// `leave_command`).
    fn leave_args(
        self,
        key: &str,
        waiter: &str,
        keep: Option<&Token>,
        up_to: Option<u64>,
    ) -> (Vec<Key>, Vec<Value>) {
        let [queue, expiry, handovers] =
            queue_keys(&self.coordinator.inner.config.fair_prefix, key);
        let channel = channel_arg(self.coordinator.inner.release_channel.as_ref());
        let keep = keep.map_or(Value::from(""), |t| Value::String(t.as_fred().clone()));
        let up_to = up_to.map_or(Value::from(""), |n| Value::from(n.to_string()));
        // The token of the message that passes a free key on, fresh for each leave: a
        // waiter passed the key by two leaves of the same waiter (a head that stepped back
        // twice while it was next) is woken by each (see `FAIR_LEAVE`).
        let passed = Value::String(Token::random().as_fred().clone());
        (
            vec![queue, expiry, Key::from(key), handovers],
            vec![Value::from(waiter), channel, keep, up_to, passed],
        )
    }

    /// [`leave`](Self::leave) without waiting, for a waiter that cannot await
    /// (a dropped `lock` call). Counts as background work, like
    /// [`release_in_background`](Coordinator::release_in_background) (outside a tokio runtime it
    /// runs in the one the coordinator was connected in; once that has shut down it sends
    /// nothing and the entry expires with its patience).
    ///
    /// `lost` is the report of the waiter's last round that was not won, if any: the leave
    /// waits until that round has settled, because its rollback puts the waiter back in the
    /// queue on every node where it frees the key (see [`Acquisition::fair`]); a leave that
    /// reached a node before that rollback would leave the entry there for the waiter's
    /// patience.
    ///
    /// [`Acquisition::fair`]: crate::Acquisition::fair
    pub fn leave_in_background(
        self,
        key: String,
        waiter: String,
        lost: Option<RoundReport>,
    ) -> bool {
        self.coordinator.spawn_background(|this| async move {
            if let Some(lost) = lost {
                lost.settled().await;
            }
            if let Err(e) = this.waiters().leave(&key, &waiter).await {
                tracing::debug!(error = %e, "leaving a fair queue failed; the entry expires with its patience");
            }
        })
    }
}

impl Waiters<'_> {
    /// After `waiter` won `lock` with a place in its keys' queues: the winning script (or
    /// the release that handed the key over) took it out of them on every node that set the
    /// keys, so it leaves each queue (in the background, counted as background work like
    /// [`leave_in_background`](Self::leave_in_background)) only on the nodes
    /// that did not, or did not say so, once the round's late answers are in. Tried on each
    /// such node as a rollback is: up to three times, each bounded by the node timeout,
    /// waiting (up to a node timeout) for a node whose connection is down to come back; an
    /// entry still not taken out expires with its patience.
    ///
    /// Where it leaves, a key handed over to it that is not this lock's is deleted. With
    /// `lost`, the waiter's last round that was not won (one that ran while the key was
    /// handed over to it, say), it first waits for that round's rollbacks, as
    /// [`leave_in_background`](Self::leave_in_background) does.
    pub fn leave_after_win(self, lock: &Lock, waiter: String, lost: Option<RoundReport>) -> bool {
        let report = lock.report().clone();
        let keys = lock.keys.clone();
        let token = lock.token().clone();
        self.coordinator.spawn_background(|this| async move {
            if let Some(lost) = lost {
                lost.settled().await;
            }
            let settled = report.settled().await;
            let missed: Vec<_> = settled
                .nodes
                .iter()
                .zip(this.inner.connections.iter())
                .filter(|(node, _)| node.outcome != NodeOutcome::Acquired)
                .map(|(_, connection)| connection)
                .collect();
            if missed.is_empty() {
                return;
            }
            let calls: Vec<_> = keys
                .iter()
                .map(|key| this.waiters().leave_args(key, &waiter, Some(&token), None))
                .collect();
            let leaves = calls.iter().flat_map(|(keys, args)| {
                missed.iter().map(move |connection| async move {
                    let left = try_on(connection, &FAIR_LEAVE, keys, args, None).await;
                    (connection, left)
                })
            });
            for (connection, left) in futures::future::join_all(leaves).await {
                if let CleanupOutcome::Failed(reason) = left {
                    tracing::debug!(node = %connection.name, %reason, "leaving a fair queue failed; the entry expires with its patience");
                }
            }
        })
    }
}

impl Waiters<'_> {
    /// The lock that the nodes' release scripts handed over to a fair waiter (see
    /// [`FairPlace::handover`]), once `handover.nodes` make a quorum: no round is run. Its
    /// token is [`handover_token`], its validity that of the attempt that registered the
    /// hand-over (`since + ttl - drift`), and its report names the nodes that handed it over
    /// as acquired and the others as not heard from. Only nodes that said so may be named:
    /// the lock is only as good as those messages. Fails with [`Error::NoQuorum`] when they
    /// are too few, and [`Error::ValidityExhausted`] when the validity has run out (a
    /// round of the waiter's then takes the key on with a fresh TTL).
    pub fn handed_over(self, handover: Handover<'_>) -> Result<Lock, Error> {
        let inner = &self.coordinator.inner;
        let config = &inner.config;
        // The validity below adds the TTL to an instant: an unchecked one could overflow.
        let ttl = config.check_ttl(handover.ttl)?;
        let mut nodes: Vec<NodeReport> = inner
            .connections
            .iter()
            .map(|c| NodeReport::pending(c.name.clone()))
            .collect();
        let mut accepted = 0;
        for &i in handover.nodes {
            // A node that casts no vote (another node's server, or not yet identified)
            // counts for nothing: its announcement may be the other node's.
            let votes = inner.connections.get(i).is_some_and(|c| c.identity.votes());
            if let (Some(node), true) = (nodes.get_mut(i), votes) {
                if node.outcome != NodeOutcome::Acquired {
                    node.outcome = NodeOutcome::Acquired;
                    accepted += 1;
                }
            }
        }
        // No later than now: the validity may not start after the keys' TTLs did; the
        // suspend then no later than now either.
        let since = handover.since.min(Instant::now());
        let suspended = handover.suspended.min(host_suspended());
        let key: Arc<str> = Arc::from(handover.key);
        let token = handover_token(handover.waiter, handover.number);
        Decided::handed_over(
            key.clone(),
            nodes,
            accepted,
            (since, suspended),
            (ttl, config.drift_factor),
        )
        .into_lock(LockSpec::handed_over(key, token), ttl, None)
    }
}

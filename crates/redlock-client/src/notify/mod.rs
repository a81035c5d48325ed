//! Wake-up on release: one subscriber connection per node, shared by every waiter of the
//! client.
//!
//! A release publishes the released key on the client's channel, on each node where it
//! deleted it. Each node's subscriber hands the key to the registry, which wakes the
//! client's oldest waiter for that key, one per release: waking every waiter at once would
//! send them all into the same round, where they split the votes and all lose. The others
//! keep their places and are woken by the next releases, in the order they began waiting
//! (or by their own backoff, whichever comes first). Notifications are an optimisation
//! only: a lost one (a node down, a lagging reader) costs a waiter its backoff delay, never
//! correctness. A waiter never waits for a wake-up alone: it sleeps its backoff delay and
//! is woken early if a release comes first.
//!
//! Every pub/sub step (waiting for the connection, `SUBSCRIBE`, `QUIT`) is bounded by the
//! node timeout. A subscriber that is not subscribed (not connected yet, its connection
//! closed, or `SUBSCRIBE` failing) is *down*: counted by the `redlock_subscribers_down`
//! gauge, and logged once per change (a warning when it goes down, an info line when it is
//! back). Back after being down, it wakes the oldest waiter of every key, since releases
//! may have been missed meanwhile.
//!
//! The release of a key whose queue has a waiter (a fair one, or one queued only to be
//! woken: see `Acquisition::queued`) names the queue's next waiter, on the channel of its
//! client alone: only that client wakes it, so one round follows a release instead of one
//! per client, and the other clients are not even sent the message (with many clients on
//! one key, delivering every release to every client cost more than the waiters' rounds).
//! A fair waiter is handed the key by the release itself (`FairPlace::handover`): the
//! registry counts the nodes that said so, for the hand-over the waiter expects (its last
//! attempt's), and wakes the waiter once they make a quorum; it then holds the lock
//! without a round. A hand-over for an older attempt wakes it at once: its next round takes
//! such a key on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::interfaces::ClientLike;
use redlock_core::message::{tagged_waiter, waiter_channel};
use redlock_core::{ConfigError, NodeName};
use tokio::sync::watch;

mod registry;
mod subscriber;

use registry::{Registry, WakeUp};
use subscriber::{dispatch, Presence};

/// The registry of waiters and the subscriber connections that feed it.
#[derive(Debug)]
pub(crate) struct Notifier {
    waiters: Arc<Mutex<Registry>>,
    /// This client's tag: fair waiters' ids start with `"<tag>:"`, and the releases that
    /// name them are published on `"<channel>:<tag>"`.
    tag: String,
    next_id: AtomicU64,
    subscribers: Vec<SubscriberClient>,
    presences: Vec<Arc<Presence>>,
    /// Set on close: the dispatch tasks stop, also one still trying to subscribe to a node
    /// that never came up.
    closed: watch::Sender<bool>,
    /// Bounds each pub/sub step: waiting for the connection, `SUBSCRIBE`, `QUIT`.
    timeout: Duration,
    /// The node set's quorum (the registry's, read without its lock).
    quorum: usize,
}

impl Notifier {
    /// Starts one subscriber per node on `channel` (built by the coordinator, with the
    /// same settings as its round connections), connecting in the background: a node that
    /// is down is subscribed when it comes up. A node whose subscriber could not be built
    /// is logged: its releases then wake nobody, and waiters fall back to their backoff.
    pub(crate) fn start(
        subscribers: Vec<(NodeName, Result<SubscriberClient, ConfigError>)>,
        channel: &str,
        timeout: Duration,
    ) -> Notifier {
        let quorum = redlock_core::quorum(subscribers.len());
        let waiters = Arc::new(Mutex::new(Registry {
            quorum,
            ..Registry::default()
        }));
        // This client's own channel, beside the shared one: a fair release names its next
        // waiter, and the waiter's id starts with the tag of the client that waits, so the
        // release is published there alone instead of to every client.
        let tag = crate::owner::random_id().to_string();
        let channels = vec![channel.to_string(), waiter_channel(channel, &tag)];
        let closed = watch::Sender::new(false);
        let mut started = Vec::new();
        let mut presences = Vec::new();
        for (index, (node, subscriber)) in subscribers.into_iter().enumerate() {
            let subscriber = match subscriber {
                Ok(subscriber) => subscriber,
                Err(error) => {
                    tracing::warn!(%node, %error, "no wake-up subscriber for this node: its releases wake nobody, and waiters fall back to their backoff");
                    continue;
                }
            };
            let presence = Arc::new(Presence::new(node));
            let task = dispatch(
                index,
                subscriber.clone(),
                channels.clone(),
                waiters.clone(),
                presence.clone(),
                timeout,
            );
            presences.push(presence);
            let mut closing = closed.subscribe();
            let on_close = subscriber.clone();
            tokio::spawn(async move {
                tokio::select! {
                    biased;
                    _ = closing.wait_for(|closed| *closed) => {}
                    _ = task => {}
                }
                // Closed: QUIT again, now that the dispatch is gone. Where this task ran
                // late (a loaded machine, a client dropped right after it connected), the
                // dispatch could start the subscriber's connection after `close` had sent
                // its QUIT, and that connection stayed open.
                if *closing.borrow() {
                    let _ = tokio::time::timeout(timeout, on_close.quit()).await;
                }
            });
            started.push(subscriber);
        }
        Notifier {
            waiters,
            tag,
            next_id: AtomicU64::new(0),
            subscribers: started,
            presences,
            closed,
            timeout,
            quorum,
        }
    }

    /// A fair waiter's id that routes its wake-ups to this client alone.
    pub(crate) fn waiter_id(&self) -> String {
        tagged_waiter(&self.tag, &crate::owner::random_id().to_string())
    }

    /// Registers a waiter for `keys`, with its id in the key's fair queue when it waits in
    /// one, and its owner for a reentrant lock; it is woken when any of them is released (a
    /// fair release: when it is the queue's next waiter), or when its owner took the key
    /// (see [`Waiter::owner_holds`]), and removed when the returned value is dropped.
    pub(crate) fn watch(
        &self,
        keys: &[String],
        fair: Option<&str>,
        owner: Option<&str>,
    ) -> Waiter<'_> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(WakeUp {
            owner: owner.map(Arc::from),
            ..WakeUp::default()
        });
        let fair: Option<Arc<str>> = fair.map(Arc::from);
        let mut registry = self.waiters.lock().expect("notifier lock");
        for key in keys {
            registry.waiters.entry(key.clone()).or_default().push_back((
                id,
                slot.clone(),
                fair.clone(),
            ));
        }
        Waiter {
            notifier: self,
            id,
            keys: keys.to_vec(),
            slot,
        }
    }

    /// Stops the dispatch tasks and quits every subscriber, concurrently and each within the
    /// node timeout: a QUIT that does not finish (seen behind slow links) must not hold up
    /// shutdown.
    pub(crate) async fn close(&self) {
        if self.closed.send_replace(true) {
            return; // closed before
        }
        for presence in &self.presences {
            presence.close();
        }
        let quits = self
            .subscribers
            .iter()
            .map(|s| tokio::time::timeout(self.timeout, s.quit()));
        futures::future::join_all(quits).await;
    }
}

/// One waiter's registration.
#[derive(Debug)]
pub(crate) struct Waiter<'a> {
    notifier: &'a Notifier,
    id: u64,
    keys: Vec<String>,
    slot: Arc<WakeUp>,
}

impl Waiter<'_> {
    /// Whether every node's subscriber is subscribed now, so that a release on any node
    /// reaches this client.
    pub(crate) fn all_subscribed(&self) -> bool {
        self.notifier.presences.iter().all(|p| p.is_up())
    }

    /// Expects a hand-over under `handed` (the token of the attempt about to start; see
    /// `FairPlace::handover`): the nodes counted for an earlier one are forgotten.
    pub(crate) fn expect(&self, handed: String) {
        let mut state = self.slot.handover.lock().expect("hand-over lock");
        state.expected = Some(handed);
        state.nodes.clear();
    }

    /// Expects no hand-over any more (a fair waiter that steps back: its leave deletes a
    /// key handed to it): a message for an earlier attempt only wakes the waiter.
    pub(crate) fn forget_handover(&self) {
        let mut state = self.slot.handover.lock().expect("hand-over lock");
        state.expected = None;
        state.nodes.clear();
    }

    /// The nodes that handed the key over under the expected token, once they make a
    /// quorum.
    pub(crate) fn handed(&self) -> Option<Vec<usize>> {
        let state = self.slot.handover.lock().expect("hand-over lock");
        (state.expected.is_some() && state.nodes.len() >= self.notifier.quorum.max(1))
            .then(|| state.nodes.clone())
    }

    /// Whether some nodes, fewer than a quorum, handed the key over under the expected
    /// token: the waiter heads the queue, and the others' messages are normally a moment
    /// behind. A node that freed the key without handing it over (its queue had lost the
    /// waiter's entry), or whose messages cannot reach this client, leaves the key handed to
    /// this waiter on the others, where nobody else can take it, until the waiter's next
    /// attempt takes it on: the waiter bounds its wait for the rest.
    pub(crate) fn handed_partly(&self) -> bool {
        let state = self.slot.handover.lock().expect("hand-over lock");
        state.expected.is_some()
            && !state.nodes.is_empty()
            && state.nodes.len() < self.notifier.quorum.max(1)
    }

    /// This waiter's owner (a reentrant lock's) now holds its key: the owner's other
    /// waiters for the key in this client are woken, since each of them can add a hold at
    /// once, without its turn in a fair queue (without the wake-up, a fair one would try
    /// again only after `max_delay`).
    pub(crate) fn owner_holds(&self) {
        let Some(owner) = &self.slot.owner else {
            return;
        };
        let registry = self.notifier.waiters.lock().expect("notifier lock");
        for key in &self.keys {
            for (id, slot, _) in registry.waiters.get(key).into_iter().flatten() {
                if *id != self.id && slot.owner.as_ref() == Some(owner) {
                    slot.wake();
                }
            }
        }
    }

    /// Drops a wake-up that came while the waiter was busy (the first node of a hand-over,
    /// say), once the waiter has acted on what woke it: its next wait is not cut short.
    pub(crate) fn forget_wake(&self) {
        use futures::FutureExt;
        if self.slot.notify.notified().now_or_never().is_some() {
            self.slot.pending.store(false, Ordering::SeqCst);
        }
    }

    /// Completes when this waiter's turn came with a release of a watched key since the
    /// last call. A turn that came while the waiter was busy is kept (as a `Notify`
    /// permit), not lost.
    pub(crate) async fn released(&self) {
        self.slot.notify.notified().await;
        self.slot.pending.store(false, Ordering::SeqCst);
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut registry = self.notifier.waiters.lock().expect("notifier lock");
        registry.remove(self.id, &self.keys, &self.slot);
    }
}

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

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use redlock_core::message::{tagged_waiter, waiter_channel, Release};
use redlock_core::{ConfigError, NodeName};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::{watch, Notify};

use crate::metrics;

/// One waiter's wake-up: a `Notify` permit, and whether one was handed out and not yet
/// taken (so that a waiter who leaves without taking it passes it on); for a fair waiter,
/// the hand-over it expects and the nodes that made it; for a reentrant lock's waiter, its
/// owner.
#[derive(Debug, Default)]
struct WakeUp {
    notify: Notify,
    pending: AtomicBool,
    handover: Mutex<Handed>,
    owner: Option<Arc<str>>,
}

/// The hand-over a fair waiter expects (its last attempt's token), and the nodes (by index)
/// that said they handed the key over under it.
#[derive(Debug, Default)]
struct Handed {
    expected: Option<String>,
    nodes: Vec<usize>,
}

impl WakeUp {
    fn wake(&self) {
        self.pending.store(true, Ordering::SeqCst);
        self.notify.notify_one();
    }
}

/// One registered waiter: its id, its wake-up, and its id in the key's fair queue.
type Entry = (u64, Arc<WakeUp>, Option<Arc<str>>);

/// The waiters by key, oldest first, and the releases seen lately.
#[derive(Debug, Default)]
struct Registry {
    waiters: HashMap<String, VecDeque<Entry>>,
    /// Recent releases as `"<token> <key>"` (and the next waiter, for a fair lock), with
    /// the nodes that announced each, to wake once per released key and not once per node:
    /// each release is published on every node that held the key. The key is part of the
    /// entry because a multi-key lock releases all its keys under one token, and each key
    /// has waiters of its own. Nodes, not messages, are counted: a leave that a node did
    /// not answer in time is sent to it again, and where it had run, it publishes again.
    /// `seen_order` evicts the oldest when [`SEEN_RELEASES`] are remembered.
    seen: HashMap<String, Vec<usize>>,
    seen_order: VecDeque<String>,
    /// The node set's quorum. A fair queue's next waiter is woken once this many nodes
    /// announced the release: then the key is gone from enough nodes for it to win, while
    /// at the first announcement its round would race the release on the others and lose.
    quorum: usize,
}

/// How many recent released keys are remembered to drop the copies from other nodes.
const SEEN_RELEASES: usize = 4096;

impl Registry {
    /// A release of `key` (by the lock with `token`) was announced by node `node`, naming the
    /// next waiter of the key's fair queue when it has one (`head`).
    fn wake(&mut self, node: usize, token: &str, key: &str, head: Option<&str>) {
        // Most messages are for keys nobody here waits for: drop those before any other work.
        let Some(list) = self.waiters.get(key) else {
            return;
        };
        // With a head, this client wakes that waiter if it has it, or else its oldest
        // waiter outside the queue; without one, its oldest waiter.
        let chosen = match head {
            Some(head) => list
                .iter()
                .find(|(_, _, fair)| fair.as_deref() == Some(head))
                .or_else(|| list.iter().find(|(_, _, fair)| fair.is_none())),
            None => list.front(),
        };
        let Some((_, chosen, _)) = chosen else {
            return;
        };
        // Nodes whose queues differ name different heads: each is counted on its own.
        let (release, wake_at) = match head {
            Some(head) => (format!("{token} {key} {head}"), self.quorum.max(1)),
            None => (format!("{token} {key}"), 1),
        };
        let announced = match self.seen.get_mut(&release) {
            Some(nodes) if nodes.contains(&node) => return,
            Some(nodes) => {
                nodes.push(node);
                nodes.len()
            }
            None => {
                if self.seen_order.len() == SEEN_RELEASES {
                    if let Some(oldest) = self.seen_order.pop_front() {
                        self.seen.remove(&oldest);
                    }
                }
                self.seen.insert(release.clone(), vec![node]);
                self.seen_order.push_back(release);
                1
            }
        };
        if announced == wake_at {
            chosen.wake();
        }
    }

    /// Node `node` handed `key` over to waiter `head` of this client under the token
    /// `handed`. Counted when it is the hand-over the waiter expects; the waiter is woken
    /// by the first node that made it (to bound its wait for the others, see
    /// [`Waiter::handed_partly`]) and once a quorum did. One for an older attempt of the
    /// waiter's wakes it at once: its next round takes the key on there.
    fn handed(&mut self, node: usize, head: &str, handed: &str, key: &str) {
        let Some(list) = self.waiters.get(key) else {
            return;
        };
        let Some((_, slot, _)) = list
            .iter()
            .find(|(_, _, fair)| fair.as_deref() == Some(head))
        else {
            return;
        };
        let mut state = slot.handover.lock().expect("hand-over lock");
        if state.expected.as_deref() != Some(handed) {
            drop(state);
            slot.wake();
            return;
        }
        if !state.nodes.contains(&node) {
            state.nodes.push(node);
            // Woken at the first node and at the quorum: the waiter then holds the lock and
            // does not wait for the last nodes (see `Redlock::handed_over`), which are
            // still counted.
            let counted = state.nodes.len();
            if counted == 1 || counted == self.quorum.max(1) {
                drop(state);
                slot.wake();
            }
        }
    }

    /// Releases may have been missed: wake the oldest waiter of every key.
    fn wake_all(&self) {
        for list in self.waiters.values() {
            if let Some((_, slot, _)) = list.front() {
                slot.wake();
            }
        }
    }

    /// Removes waiter `id` from the lists of `keys`; when it held a wake-up it did not use,
    /// the next waiter of each key gets one instead.
    fn remove(&mut self, id: u64, keys: &[String], slot: &WakeUp) {
        let unused = slot.pending.load(Ordering::SeqCst);
        for key in keys {
            if let Some(list) = self.waiters.get_mut(key) {
                list.retain(|(other, _, _)| *other != id);
                match list.front() {
                    None => {
                        self.waiters.remove(key);
                    }
                    Some((_, next, _)) if unused => next.wake(),
                    Some(_) => {}
                }
            }
        }
    }
}

/// Where one node's subscriber stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// Not subscribed yet since the start.
    Starting,
    Up,
    Down,
    Closed,
}

/// Whether one node's subscriber is subscribed: the `redlock_subscribers_down` gauge (a
/// subscriber counts as down from its start until it first subscribes) and one log line
/// per change.
#[derive(Debug)]
struct Presence {
    node: NodeName,
    link: Mutex<Link>,
}

impl Presence {
    fn new(node: NodeName) -> Presence {
        metrics::subscriber_down(1.0);
        Presence {
            node,
            link: Mutex::new(Link::Starting),
        }
    }

    /// Subscribed. Returns whether it was down before (and so may have missed releases).
    fn up(&self) -> bool {
        let mut link = self.link.lock().expect("presence lock");
        let was = *link;
        match was {
            Link::Starting => {
                tracing::debug!(node = %self.node, "wake-up subscriber subscribed");
            }
            Link::Down => {
                tracing::info!(node = %self.node, "wake-up subscriber subscribed again");
            }
            Link::Up | Link::Closed => return false,
        }
        metrics::subscriber_down(-1.0);
        *link = Link::Up;
        was == Link::Down
    }

    /// Whether it is subscribed now.
    fn is_up(&self) -> bool {
        *self.link.lock().expect("presence lock") == Link::Up
    }

    /// Not subscribed, because of `why`.
    fn down(&self, why: &str) {
        let mut link = self.link.lock().expect("presence lock");
        match *link {
            // Counted as down since its start.
            Link::Starting => {}
            Link::Up => metrics::subscriber_down(1.0),
            Link::Down | Link::Closed => return,
        }
        *link = Link::Down;
        tracing::warn!(node = %self.node, %why, "wake-up subscriber down: releases on this node wake nobody until it is back, and waiters fall back to their backoff");
    }

    fn close(&self) {
        let mut link = self.link.lock().expect("presence lock");
        if matches!(*link, Link::Starting | Link::Down) {
            metrics::subscriber_down(-1.0);
        }
        *link = Link::Closed;
    }
}

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

/// Subscribes (retrying until the node is there; fred also resubscribes by itself after
/// reconnections) and hands every message to the waiters of its key. A closed connection
/// (fred's error events) marks the subscriber down until a `SUBSCRIBE` succeeds again.
async fn dispatch(
    node: usize,
    subscriber: SubscriberClient,
    channels: Vec<String>,
    waiters: Arc<Mutex<Registry>>,
    presence: Arc<Presence>,
    timeout: Duration,
) {
    let mut messages = subscriber.message_rx();
    let mut errors = subscriber.error_rx();
    let _connection = subscriber.connect();
    let _resubscriber = subscriber.manage_subscriptions();
    subscribe(
        &subscriber,
        &channels,
        &presence,
        &waiters,
        &mut errors,
        timeout,
    )
    .await;
    loop {
        tokio::select! {
            message = messages.recv() => match message {
                Ok(message) => {
                    let Some(text) = message.value.as_string() else {
                        continue;
                    };
                    let Some(release) = Release::parse(&text) else {
                        continue;
                    };
                    let mut registry = waiters.lock().expect("notifier lock");
                    match release {
                        Release::Handed { head, handed, key, .. } => registry.handed(node, head, handed, key),
                        Release::Announced { token, key, head } => registry.wake(node, token, key, head),
                    }
                }
                // Messages were dropped: any waiter may have missed its release. Wake all.
                Err(RecvError::Lagged(_)) => {
                    waiters.lock().expect("notifier lock").wake_all();
                }
                Err(RecvError::Closed) => break,
            },
            error = errors.recv() => match error {
                Ok((error, _)) => {
                    presence.down(error.details());
                    // Whether fred already reconnected or not, only a SUBSCRIBE that
                    // succeeds makes the subscriber up again.
                    subscribe(&subscriber, &channels, &presence, &waiters, &mut errors, timeout).await;
                }
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => break,
            },
        }
    }
}

/// Waits for the connection and subscribes, each step within `timeout`, retrying with a
/// growing pause (10 ms to 1 s) until it succeeds; marks the subscriber down at the first
/// failure and up at the success. Back from down, it wakes the oldest waiter of every key:
/// releases published meanwhile were not heard.
async fn subscribe(
    subscriber: &SubscriberClient,
    channels: &[String],
    presence: &Presence,
    waiters: &Mutex<Registry>,
    errors: &mut broadcast::Receiver<(fred::error::Error, Option<fred::types::config::Server>)>,
    timeout: Duration,
) {
    let mut pause = Duration::from_millis(10);
    loop {
        let failure = match tokio::time::timeout(timeout, subscriber.wait_for_connect()).await {
            Err(_) => format!("not connected within {timeout:?}"),
            Ok(Err(e)) => e.details().to_string(),
            Ok(Ok(())) => {
                match tokio::time::timeout(timeout, subscriber.subscribe(channels.to_vec())).await {
                    Ok(Ok(())) => {
                        // Subscribed now: the errors of the failed attempts before are stale
                        // (each failed reconnection reports one), and must not mark it down.
                        *errors = errors.resubscribe();
                        if presence.up() {
                            waiters.lock().expect("notifier lock").wake_all();
                        }
                        return;
                    }
                    Ok(Err(e)) => format!("SUBSCRIBE failed: {}", e.details()),
                    Err(_) => format!("SUBSCRIBE not answered within {timeout:?}"),
                }
            }
        };
        presence.down(&failure);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(registry: &mut Registry, id: u64, keys: &[&str]) -> Arc<WakeUp> {
        let slot = Arc::new(WakeUp::default());
        for key in keys {
            registry
                .waiters
                .entry(key.to_string())
                .or_default()
                .push_back((id, slot.clone(), None));
        }
        slot
    }

    fn fair_waiter(registry: &mut Registry, id: u64, key: &str, fair: &str) -> Arc<WakeUp> {
        let slot = Arc::new(WakeUp::default());
        registry
            .waiters
            .entry(key.to_string())
            .or_default()
            .push_back((id, slot.clone(), Some(Arc::from(fair))));
        slot
    }

    #[test]
    fn a_fair_release_wakes_the_named_waiter_only() {
        let mut registry = Registry::default();
        let first = fair_waiter(&mut registry, 1, "k", "w1");
        let second = fair_waiter(&mut registry, 2, "k", "w2");
        // Another client's waiter is next: this client wakes nobody.
        registry.wake(0, "t1", "k", Some("w9"));
        assert!(!woken(&first) && !woken(&second));
        // This client's second waiter is next, although the first is older here.
        registry.wake(0, "t2", "k", Some("w2"));
        assert!(!woken(&first) && woken(&second));
        take(&second);
        // Another node whose queue names another head wakes that one too, once.
        registry.wake(1, "t2", "k", Some("w1"));
        registry.wake(2, "t2", "k", Some("w1"));
        registry.wake(1, "t2", "k", Some("w2"));
        assert!(woken(&first) && !woken(&second));
        // A waiter outside the queue on the same key is woken by a release naming a head
        // it does not have, so mixed use never leaves it without wake-ups.
        let plain = waiter(&mut registry, 3, &["k"]);
        registry.wake(0, "t3", "k", Some("w9"));
        assert!(woken(&plain));
    }

    #[test]
    fn a_fair_head_is_woken_once_a_quorum_of_nodes_announced_the_release() {
        let mut registry = Registry {
            quorum: 3,
            ..Registry::default()
        };
        let head = fair_waiter(&mut registry, 1, "k", "w1");
        registry.wake(0, "t1", "k", Some("w1"));
        registry.wake(1, "t1", "k", Some("w1"));
        assert!(!woken(&head), "woken before the key was gone from a quorum");
        registry.wake(2, "t1", "k", Some("w1"));
        assert!(woken(&head));
        take(&head);
        registry.wake(3, "t1", "k", Some("w1"));
        registry.wake(4, "t1", "k", Some("w1"));
        assert!(!woken(&head), "woken again by the last nodes");
    }

    /// Nodes count towards the quorum, not messages. A leave that a node did not answer in
    /// time is sent to it again, and where it had run it passes the key on again: copies
    /// from one node must not reach the quorum while the key is free on fewer nodes (the
    /// real quorum-th node's message would then count past it and wake nobody).
    #[test]
    fn copies_of_one_nodes_announcement_count_once() {
        let mut registry = Registry {
            quorum: 3,
            ..Registry::default()
        };
        let head = fair_waiter(&mut registry, 1, "k", "w1");
        for _ in 0..3 {
            registry.wake(0, "leave-1", "k", Some("w1"));
        }
        registry.wake(1, "leave-1", "k", Some("w1"));
        assert!(!woken(&head), "woken with the key free on two nodes");
        registry.wake(2, "leave-1", "k", Some("w1"));
        assert!(woken(&head), "not woken at the quorum-th node");
    }

    /// Two leaves of one waiter that each pass the key on to the same next waiter (a head
    /// that stepped back twice while it was next) have tokens of their own, and each wakes it.
    #[test]
    fn each_announcement_under_its_own_token_wakes_the_head_again() {
        let mut registry = Registry {
            quorum: 2,
            ..Registry::default()
        };
        let head = fair_waiter(&mut registry, 1, "k", "w1");
        for token in ["leave-1", "leave-2"] {
            registry.wake(0, token, "k", Some("w1"));
            registry.wake(1, token, "k", Some("w1"));
            assert!(woken(&head), "{token} did not wake the head");
            take(&head);
        }
    }

    fn handed_nodes(slot: &WakeUp) -> Vec<usize> {
        slot.handover.lock().unwrap().nodes.clone()
    }

    fn expect(slot: &WakeUp, handed: &str) {
        let mut state = slot.handover.lock().unwrap();
        state.expected = Some(handed.into());
        state.nodes.clear();
    }

    #[test]
    fn a_fair_waiter_is_woken_by_the_first_node_and_the_quorum_that_handed_it_the_key() {
        let mut registry = Registry {
            quorum: 3,
            ..Registry::default()
        };
        let head = fair_waiter(&mut registry, 1, "k", "w1");
        let other = fair_waiter(&mut registry, 2, "k", "w2");
        expect(&head, "w1~2");
        // The first node wakes it, to bound its wait for the others.
        registry.handed(0, "w1", "w1~2", "k");
        assert!(woken(&head) && !woken(&other));
        take(&head);
        registry.handed(0, "w1", "w1~2", "k");
        registry.handed(4, "w1", "w1~2", "k");
        assert!(!woken(&head), "two distinct nodes are no quorum");
        registry.handed(2, "w1", "w1~2", "k");
        assert!(woken(&head) && !woken(&other));
        assert_eq!(handed_nodes(&head), vec![0, 4, 2]);
        take(&head);
        // The last nodes are counted, without waking it again.
        registry.handed(3, "w1", "w1~2", "k");
        assert!(!woken(&head), "woken again past the quorum");
        assert_eq!(handed_nodes(&head), vec![0, 4, 2, 3]);
        // A hand-over for an older attempt is not counted, but wakes the waiter: its next
        // round takes the key on.
        registry.handed(1, "w1", "w1~1", "k");
        assert!(woken(&head));
        assert_eq!(handed_nodes(&head).len(), 4);
        // Another client's waiter, or another key: nothing.
        registry.handed(1, "w9", "w9~1", "k");
        registry.handed(1, "w2", "w2~1", "other-key");
        assert!(!woken(&other));
    }

    fn woken(slot: &WakeUp) -> bool {
        slot.pending.load(Ordering::SeqCst)
    }

    /// What `Waiter::released` does once its permit arrived.
    fn take(slot: &WakeUp) {
        slot.pending.store(false, Ordering::SeqCst);
    }

    #[test]
    fn releases_of_keys_nobody_waits_for_cost_no_memory() {
        let mut registry = Registry::default();
        for i in 0..10 {
            registry.wake(0, &format!("t{i}"), "k", None);
        }
        assert!(registry.seen.is_empty() && registry.seen_order.is_empty());
    }

    #[test]
    fn one_release_wakes_the_oldest_waiter_once_whatever_the_number_of_nodes() {
        let mut registry = Registry::default();
        let first = waiter(&mut registry, 1, &["k"]);
        let second = waiter(&mut registry, 2, &["k"]);
        let other = waiter(&mut registry, 3, &["other"]);
        for node in 0..5 {
            registry.wake(node, "t1", "k", None);
        }
        assert!(woken(&first));
        assert!(!woken(&second) && !woken(&other));
        take(&first);
        // The copies from the other nodes do not wake anybody again.
        registry.wake(5, "t1", "k", None);
        assert!(!woken(&first) && !woken(&second));
        // The next release goes to the oldest waiter again: it keeps its place.
        registry.wake(0, "t2", "k", None);
        assert!(woken(&first) && !woken(&second));
    }

    #[test]
    fn a_waiter_that_leaves_with_an_unused_wake_up_passes_it_on() {
        let mut registry = Registry::default();
        let first = waiter(&mut registry, 1, &["a", "b"]);
        let second = waiter(&mut registry, 2, &["a"]);
        let third = waiter(&mut registry, 3, &["b"]);
        registry.wake(0, "t1", "a", None);
        registry.remove(1, &["a".into(), "b".into()], &first);
        assert!(woken(&second) && woken(&third));

        // A waiter that took its wake-up (it won, or gave up later) passes nothing on.
        let mut registry = Registry::default();
        let first = waiter(&mut registry, 1, &["a"]);
        let second = waiter(&mut registry, 2, &["a"]);
        registry.wake(0, "t1", "a", None);
        take(&first);
        registry.remove(1, &["a".into()], &first);
        assert!(!woken(&second));
        registry.remove(2, &["a".into()], &second);
        assert!(registry.waiters.is_empty());
    }

    #[test]
    fn a_multi_key_release_wakes_a_waiter_of_each_key() {
        let mut registry = Registry::default();
        let on_a = waiter(&mut registry, 1, &["a"]);
        let on_b = waiter(&mut registry, 2, &["b"]);
        // One lock over a and b, released under one token, announced by two nodes.
        for node in 0..2 {
            registry.wake(node, "t1", "a", None);
            registry.wake(node, "t1", "b", None);
        }
        assert!(woken(&on_a) && woken(&on_b));
        take(&on_a);
        take(&on_b);
        registry.wake(2, "t1", "b", None);
        assert!(!woken(&on_b), "a copy from another node wakes nobody again");
    }

    #[test]
    fn a_lagging_reader_wakes_the_oldest_waiter_of_every_key() {
        let mut registry = Registry::default();
        let a1 = waiter(&mut registry, 1, &["a"]);
        let a2 = waiter(&mut registry, 2, &["a"]);
        let b1 = waiter(&mut registry, 3, &["b"]);
        registry.wake_all();
        assert!(woken(&a1) && woken(&b1) && !woken(&a2));
    }

    #[test]
    fn the_memory_of_seen_releases_is_bounded() {
        let mut registry = Registry::default();
        let slot = waiter(&mut registry, 1, &["k"]);
        for i in 0..SEEN_RELEASES + 10 {
            registry.wake(0, &format!("t{i}"), "k", None);
            assert!(woken(&slot));
            take(&slot);
        }
        assert_eq!(registry.seen.len(), SEEN_RELEASES);
        assert_eq!(registry.seen_order.len(), SEEN_RELEASES);
        // The oldest were forgotten, the newest are still recognised.
        assert!(!registry.seen.contains_key("t0 k"));
        registry.wake(0, &format!("t{}", SEEN_RELEASES + 9), "k", None);
        assert!(!woken(&slot));
    }
}

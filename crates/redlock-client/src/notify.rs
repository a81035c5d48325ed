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
//! correctness.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use redlock_core::{ConfigError, NodeName};
use tokio::sync::{watch, Notify};

/// One waiter's wake-up: a `Notify` permit, and whether one was handed out and not yet
/// taken (so that a waiter who leaves without taking it passes it on).
#[derive(Debug, Default)]
struct WakeUp {
    notify: Notify,
    pending: AtomicBool,
}

impl WakeUp {
    fn wake(&self) {
        self.pending.store(true, Ordering::SeqCst);
        self.notify.notify_one();
    }
}

/// The waiters by key, oldest first, and the releases seen lately.
#[derive(Debug, Default)]
struct Registry {
    waiters: HashMap<String, VecDeque<(u64, Arc<WakeUp>)>>,
    /// Recent releases as `"<token> <key>"`, to wake once per released key and not once per
    /// node: each release is published on every node that held the key. The key is part of
    /// the entry because a multi-key lock releases all its keys under one token, and each
    /// key has waiters of its own. `seen_order` evicts the oldest when [`SEEN_RELEASES`]
    /// are remembered.
    seen: HashSet<String>,
    seen_order: VecDeque<String>,
}

/// How many recent released keys are remembered to drop the copies from other nodes.
const SEEN_RELEASES: usize = 4096;

impl Registry {
    /// A release of `key` (by the lock with `token`) was announced by one node.
    fn wake(&mut self, token: &str, key: &str) {
        // Most messages are for keys nobody here waits for: drop those before any other work.
        let Some(list) = self.waiters.get(key) else {
            return;
        };
        let release = format!("{token} {key}");
        if self.seen.contains(&release) {
            return;
        }
        if self.seen_order.len() == SEEN_RELEASES {
            if let Some(oldest) = self.seen_order.pop_front() {
                self.seen.remove(&oldest);
            }
        }
        self.seen.insert(release.clone());
        self.seen_order.push_back(release);
        if let Some((_, slot)) = list.front() {
            slot.wake();
        }
    }

    /// Releases may have been missed: wake the oldest waiter of every key.
    fn wake_all(&self) {
        for list in self.waiters.values() {
            if let Some((_, slot)) = list.front() {
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
                list.retain(|(other, _)| *other != id);
                match list.front() {
                    None => {
                        self.waiters.remove(key);
                    }
                    Some((_, next)) if unused => next.wake(),
                    Some(_) => {}
                }
            }
        }
    }
}

/// The registry of waiters and the subscriber connections that feed it.
#[derive(Debug)]
pub(crate) struct Notifier {
    waiters: Arc<Mutex<Registry>>,
    next_id: AtomicU64,
    subscribers: Vec<SubscriberClient>,
    /// Set on close: the dispatch tasks stop, also one still trying to subscribe to a node
    /// that never came up.
    closed: watch::Sender<bool>,
    /// Bounds each subscriber's `QUIT` on close.
    timeout: Duration,
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
        let waiters: Arc<Mutex<Registry>> = Arc::default();
        let closed = watch::Sender::new(false);
        let mut started = Vec::new();
        for (node, subscriber) in subscribers {
            let subscriber = match subscriber {
                Ok(subscriber) => subscriber,
                Err(error) => {
                    tracing::warn!(%node, %error, "no wake-up subscriber for this node: its releases wake nobody, and waiters fall back to their backoff");
                    continue;
                }
            };
            let task = dispatch(subscriber.clone(), channel.to_string(), waiters.clone());
            let mut closing = closed.subscribe();
            tokio::spawn(async move {
                tokio::select! {
                    _ = task => {}
                    _ = closing.wait_for(|closed| *closed) => {}
                }
            });
            started.push(subscriber);
        }
        Notifier {
            waiters,
            next_id: AtomicU64::new(0),
            subscribers: started,
            closed,
            timeout,
        }
    }

    /// Registers a waiter for `keys`; it is woken when any of them is released, and
    /// removed when the returned value is dropped.
    pub(crate) fn watch(&self, keys: &[String]) -> Waiter<'_> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(WakeUp::default());
        let mut registry = self.waiters.lock().expect("notifier lock");
        for key in keys {
            registry
                .waiters
                .entry(key.clone())
                .or_default()
                .push_back((id, slot.clone()));
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

/// Subscribes (retrying until the node is there; fred resubscribes by itself after later
/// reconnections) and hands every message to the waiters of its key.
async fn dispatch(subscriber: SubscriberClient, channel: String, waiters: Arc<Mutex<Registry>>) {
    let mut messages = subscriber.message_rx();
    let _connection = subscriber.connect();
    let _resubscriber = subscriber.manage_subscriptions();
    let mut pause = Duration::from_millis(10);
    loop {
        if subscriber.wait_for_connect().await.is_ok()
            && subscriber.subscribe(channel.as_str()).await.is_ok()
        {
            break;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
    loop {
        match messages.recv().await {
            Ok(message) => {
                let Some(text) = message.value.as_string() else {
                    continue;
                };
                let Some((token, key)) = text.split_once(' ') else {
                    continue;
                };
                waiters.lock().expect("notifier lock").wake(token, key);
            }
            // Messages were dropped: any waiter may have missed its release. Wake all.
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                waiters.lock().expect("notifier lock").wake_all();
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
        }
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
                .push_back((id, slot.clone()));
        }
        slot
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
            registry.wake(&format!("t{i}"), "k");
        }
        assert!(registry.seen.is_empty() && registry.seen_order.is_empty());
    }

    #[test]
    fn one_release_wakes_the_oldest_waiter_once_whatever_the_number_of_nodes() {
        let mut registry = Registry::default();
        let first = waiter(&mut registry, 1, &["k"]);
        let second = waiter(&mut registry, 2, &["k"]);
        let other = waiter(&mut registry, 3, &["other"]);
        for _node in 0..5 {
            registry.wake("t1", "k");
        }
        assert!(woken(&first));
        assert!(!woken(&second) && !woken(&other));
        take(&first);
        // The copies from the other nodes do not wake anybody again.
        registry.wake("t1", "k");
        assert!(!woken(&first) && !woken(&second));
        // The next release goes to the oldest waiter again: it keeps its place.
        registry.wake("t2", "k");
        assert!(woken(&first) && !woken(&second));
    }

    #[test]
    fn a_waiter_that_leaves_with_an_unused_wake_up_passes_it_on() {
        let mut registry = Registry::default();
        let first = waiter(&mut registry, 1, &["a", "b"]);
        let second = waiter(&mut registry, 2, &["a"]);
        let third = waiter(&mut registry, 3, &["b"]);
        registry.wake("t1", "a");
        registry.remove(1, &["a".into(), "b".into()], &first);
        assert!(woken(&second) && woken(&third));

        // A waiter that took its wake-up (it won, or gave up later) passes nothing on.
        let mut registry = Registry::default();
        let first = waiter(&mut registry, 1, &["a"]);
        let second = waiter(&mut registry, 2, &["a"]);
        registry.wake("t1", "a");
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
        for _node in 0..2 {
            registry.wake("t1", "a");
            registry.wake("t1", "b");
        }
        assert!(woken(&on_a) && woken(&on_b));
        take(&on_a);
        take(&on_b);
        registry.wake("t1", "b");
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
            registry.wake(&format!("t{i}"), "k");
            assert!(woken(&slot));
            take(&slot);
        }
        assert_eq!(registry.seen.len(), SEEN_RELEASES);
        assert_eq!(registry.seen_order.len(), SEEN_RELEASES);
        // The oldest were forgotten, the newest are still recognised.
        assert!(!registry.seen.contains("t0 k"));
        registry.wake(&format!("t{}", SEEN_RELEASES + 9), "k");
        assert!(!woken(&slot));
    }
}

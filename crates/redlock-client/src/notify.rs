//! Wake-up on release: one subscriber connection per node, shared by every waiter of the
//! client.
//!
//! A release publishes the released key on the client's channel, on each node where it
//! deleted it. Each node's subscriber hands the key to the waiters registered for it, which
//! retry at once instead of sleeping out their backoff. Notifications are an optimisation
//! only: a lost one (a node down, a lagging reader) costs a waiter its backoff delay, never
//! correctness.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fred::types::config::{Config as FredConfig, ReconnectPolicy};
use fred::types::Builder;
use tokio::sync::Notify;

/// The waiters by key, and the releases seen lately.
#[derive(Debug, Default)]
struct Registry {
    waiters: HashMap<String, Vec<(u64, Arc<Notify>)>>,
    /// Tokens of recent releases: each release is published on every node that held the
    /// key, and should wake each waiter once, not once per node.
    seen: VecDeque<String>,
}

/// How many recent release tokens are remembered to drop the copies from other nodes.
const SEEN_RELEASES: usize = 4096;

impl Registry {
    fn wake(&mut self, token: &str, key: &str) {
        if self.seen.iter().any(|t| t == token) {
            return;
        }
        if self.seen.len() == SEEN_RELEASES {
            self.seen.pop_front();
        }
        self.seen.push_back(token.to_string());
        if let Some(list) = self.waiters.get(key) {
            for (_, notify) in list {
                notify.notify_one();
            }
        }
    }

    fn wake_all(&self) {
        for list in self.waiters.values() {
            for (_, notify) in list {
                notify.notify_one();
            }
        }
    }
}

/// How long one subscriber's QUIT may take on shutdown.
const QUIT_LIMIT: Duration = Duration::from_millis(500);

/// The registry of waiters and the subscriber connections that feed it.
#[derive(Debug)]
pub(crate) struct Notifier {
    waiters: Arc<Mutex<Registry>>,
    next_id: AtomicU64,
    subscribers: Vec<SubscriberClient>,
}

impl Notifier {
    /// Connects one subscriber per node (in the background: a node that is down is
    /// subscribed when it comes up) to `channel`.
    pub(crate) fn start(urls: &[String], channel: &str, timeout: Duration) -> Notifier {
        let waiters: Arc<Mutex<Registry>> = Arc::default();
        let mut subscribers = Vec::new();
        for url in urls {
            // The URLs were validated by the coordinator already.
            let Ok(mut config) = FredConfig::from_url(url) else {
                continue;
            };
            config.fail_fast = false;
            let mut builder = Builder::from_config(config);
            builder
                .with_connection_config(|c| {
                    c.connection_timeout = timeout;
                    c.internal_command_timeout = timeout;
                    c.tcp.nodelay = Some(true);
                })
                // fred's default of 32 buffered messages is easily overrun by a burst of
                // releases; a lagging reader wakes everybody instead (see below).
                .with_performance_config(|p| p.broadcast_channel_capacity = 1024)
                .set_policy(ReconnectPolicy::new_exponential(0, 1, 1000, 2));
            let Ok(subscriber) = builder.build_subscriber_client() else {
                continue;
            };
            tokio::spawn(dispatch(
                subscriber.clone(),
                channel.to_string(),
                waiters.clone(),
            ));
            subscribers.push(subscriber);
        }
        Notifier {
            waiters,
            next_id: AtomicU64::new(0),
            subscribers,
        }
    }

    /// Registers a waiter for `keys`; it is woken when any of them is released, and
    /// removed when the returned value is dropped.
    pub(crate) fn watch(&self, keys: &[String]) -> Watch<'_> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        let mut registry = self.waiters.lock().expect("notifier lock");
        for key in keys {
            registry
                .waiters
                .entry(key.clone())
                .or_default()
                .push((id, notify.clone()));
        }
        Watch {
            notifier: self,
            id,
            keys: keys.to_vec(),
            notify,
        }
    }

    /// Quits every subscriber, concurrently and each within [`QUIT_LIMIT`]: a QUIT that does
    /// not finish (seen behind slow links) must not hold up shutdown; the connection closes
    /// when the client is dropped anyway.
    pub(crate) async fn close(&self) {
        let quits = self
            .subscribers
            .iter()
            .map(|s| tokio::time::timeout(QUIT_LIMIT, s.quit()));
        futures::future::join_all(quits).await;
    }
}

/// One waiter's registration.
#[derive(Debug)]
pub(crate) struct Watch<'a> {
    notifier: &'a Notifier,
    id: u64,
    keys: Vec<String>,
    notify: Arc<Notify>,
}

impl Watch<'_> {
    /// Completes when a release of a watched key has been seen since the last call. A
    /// release seen while the waiter was busy is kept (as a `Notify` permit), not lost.
    pub(crate) async fn released(&self) {
        self.notify.notified().await;
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        let mut registry = self.notifier.waiters.lock().expect("notifier lock");
        for key in &self.keys {
            if let Some(list) = registry.waiters.get_mut(key) {
                list.retain(|(id, _)| *id != self.id);
                if list.is_empty() {
                    registry.waiters.remove(key);
                }
            }
        }
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

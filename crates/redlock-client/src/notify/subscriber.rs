//! One node's subscriber: whether it is subscribed (its presence), the task that reads its
//! messages into the registry, and (re)subscribing with a growing pause.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use redlock_core::message::Release;
use redlock_core::NodeName;
use tokio::sync::broadcast::{self, error::RecvError};

use super::registry::Registry;
use crate::metrics;

/// Where one node's subscriber stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Link {
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
pub(super) struct Presence {
    pub(super) node: NodeName,
    pub(super) link: Mutex<Link>,
}

impl Presence {
    pub(super) fn new(node: NodeName) -> Presence {
        metrics::subscriber_down(1.0);
        Presence {
            node,
            link: Mutex::new(Link::Starting),
        }
    }

    /// Subscribed. Returns whether it was down before (and so may have missed releases).
    pub(super) fn up(&self) -> bool {
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
    pub(super) fn is_up(&self) -> bool {
        *self.link.lock().expect("presence lock") == Link::Up
    }

    /// Not subscribed, because of `why`.
    pub(super) fn down(&self, why: &str) {
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

    pub(super) fn close(&self) {
        let mut link = self.link.lock().expect("presence lock");
        if matches!(*link, Link::Starting | Link::Down) {
            metrics::subscriber_down(-1.0);
        }
        *link = Link::Closed;
    }
}

/// Subscribes (retrying until the node is there; fred also resubscribes by itself after
/// reconnections) and hands every message to the waiters of its key. A closed connection
/// (fred's error events) marks the subscriber down until a `SUBSCRIBE` succeeds again.
pub(super) async fn dispatch(
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
pub(super) async fn subscribe(
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

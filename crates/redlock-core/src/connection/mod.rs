//! One Redis master: its fred client, configured so that nothing is ever replayed, and the
//! commands a round sends to it, each bounded by the node timeout.
//!
//! This file holds the connection itself: its clients, connecting, and waiting for it to
//! come back. The rest, by concern: `commands` (what a round sends: `SET NX PX`, scripts by
//! SHA-1 with their `EVAL` fallback), `sending` (how each command is bounded by fred's
//! timeout and a backstop, and how a fred error becomes a node's outcome), `script_cache`
//! (whether the node knows the lock's scripts, and loading them again), `liveness` (whether
//! the client can still send), `identity` (which server each node is), `native` (whether
//! the node has `DELIFEQ`, and the release that uses it), `health` (the node's settings for
//! the health check), `failure` (why a connection failed) and `factory` (the one place that
//! builds fred clients for lock nodes).

mod commands;
mod factory;
mod failure;
mod health;
mod identity;
mod liveness;
mod native;
mod script_cache;
mod sending;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::clients::{Client, SubscriberClient, WithOptions};
use fred::interfaces::ClientLike;
use tokio::time::Instant;

use crate::config::{Config, Endpoint};
use crate::error::ConfigError;
use crate::report::NodeName;

pub(crate) use commands::OnNoScript;
use failure::{watch_connection, ConnectFailure, FailureContext};
pub(crate) use identity::{check_distinct, watch_identity};
use identity::{Identity, Reconnections};
pub(crate) use liveness::Liveness;
use native::{ask_again, NativeDelete};
use script_cache::{load_scripts, reload_scripts, ScriptCache};
pub(crate) use sending::Sending;
use sending::{cleanup_options, command_options};

/// A subscriber for release notifications from the node at `endpoint`, with the same
/// settings as the node's round connection.
pub(crate) fn subscriber(
    endpoint: &Endpoint,
    config: &Config,
) -> Result<SubscriberClient, ConfigError> {
    factory::subscriber(endpoint, config)
}

/// A connection to one master, opened once and shared by every round.
#[derive(Debug)]
pub(crate) struct Connection {
    pub(crate) name: NodeName,
    /// The node's metric keys, built once.
    pub(crate) metrics: crate::metrics::NodeMetrics,
    client: Client,
    /// The same client with per-command options. Every command goes through `custom`,
    /// because fred applies per-command options to `custom` but silently not to its
    /// `evalsha`/`eval` helpers.
    /// Shared with the task that loads the scripts again after a reconnection, which keeps
    /// only a weak reference (it must not keep the client alive).
    cmd: Arc<WithOptions<Client>>,
    /// The same client with the options of cleanup commands ([`cleanup_options`]).
    cleanup: WithOptions<Client>,
    timeout: Duration,
    /// Why the connection last failed, from fred's error events; cleared when it comes
    /// back. A command refused for want of a connection reports this instead of fred's
    /// generic "connection closed", so that a wrong password or database says so.
    last_error: Arc<Mutex<Option<ConnectFailure>>>,
    /// Whether the client is closed, shared by every node's connection.
    liveness: Arc<Liveness>,
    /// Whether the node may not know the scripts, and their loading in the background.
    scripts: Arc<ScriptCache>,
    /// Whether the node takes `DELIFEQ` (see [`native`]).
    native: Arc<NativeDelete>,
    /// Whether the node casts votes (see [`identity`]).
    pub(crate) identity: Identity,
    /// Its connections, for the task that identifies it again after each.
    reconnections: Arc<Reconnections>,
    /// Whether the member is a whole cluster (its URL's scheme), read once here.
    cluster: bool,
    /// On a cluster member, how many replicas must acknowledge an acquisition or an
    /// extension (the member URL's `replica_acks=`, else `Config::replica_acks`); 0 on a
    /// single server.
    replica_acks: u32,
}

impl Connection {
    /// Builds the client (it connects in [`connect`](Self::connect)). Must run inside a
    /// Tokio runtime: it starts the task that records the connection's errors.
    pub(crate) fn new(
        endpoint: Endpoint,
        config: &Config,
        liveness: Arc<Liveness>,
    ) -> Result<Connection, ConfigError> {
        let timeout = config.node_timeout;
        let cluster = endpoint.fred.server.is_clustered();
        let client = factory::round_client(&endpoint, config)?;
        let cmd = Arc::new(client.with_options(&command_options(timeout)));
        let last_error = Arc::new(Mutex::new(None));
        // Subscribed before the first connection attempt, so that none of its errors is
        // missed. The password only lives in the task, to be masked should an error echo it.
        let client_cert = config
            .tls
            .as_ref()
            .is_some_and(|tls| tls.client_cert_file.is_some() || tls.client_cert_pem.is_some());
        let context = FailureContext {
            password: endpoint.fred.password.clone(),
            tls_without_client_cert: endpoint.fred.uses_tls() && !client_cert,
        };
        let scripts = Arc::new(ScriptCache {
            node: endpoint.name.clone(),
            missing: AtomicBool::new(true),
            running: AtomicBool::new(false),
            wanted: AtomicBool::new(false),
        });
        let native = Arc::new(NativeDelete::new(endpoint.name.clone()));
        let reconnections = Arc::new(Reconnections::new(0));
        let on_reconnect = {
            let (cmd, scripts, native) = (Arc::downgrade(&cmd), scripts.clone(), native.clone());
            let counted = Arc::downgrade(&reconnections);
            // A restarted node has forgotten the scripts. Every connection loads them,
            // the first one too: `connect` loads them as well and waits for that, but a
            // node that was down then connects later.
            move || {
                if let Some(cmd) = cmd.upgrade() {
                    scripts.missing.store(true, Ordering::SeqCst);
                    reload_scripts(&cmd, &scripts);
                    // The server may be another one now.
                    ask_again(&cmd, &native);
                }
                // Its identification task identifies it again.
                if let Some(counted) = counted.upgrade() {
                    counted.send_modify(|n| *n = n.wrapping_add(1));
                }
            }
        };
        watch_connection(&client, last_error.clone(), context, on_reconnect);
        Ok(Connection {
            metrics: crate::metrics::NodeMetrics::new(&endpoint.name),
            name: endpoint.name,
            cleanup: client.with_options(&cleanup_options()),
            client,
            cmd,
            timeout,
            last_error,
            liveness,
            scripts,
            native,
            identity: Identity::default(),
            reconnections,
            cluster,
            replica_acks: match endpoint.replica_acks {
                _ if !cluster => 0,
                Some(own) => own,
                None => config.replica_acks,
            },
        })
    }

    /// Starts the connection task (it reconnects by itself) and waits up to `within` for the
    /// first connection. A node that is down, or that refuses the connection (wrong
    /// password, database out of range), does not fail this: it counts as failing in rounds
    /// until it comes back. `Err` says why it is not connected, without any password.
    pub(crate) async fn connect(&self, within: Duration) -> Result<(), String> {
        let _task = self.client.connect();
        let up = matches!(
            tokio::time::timeout(within, self.client.wait_for_connect()).await,
            Ok(Ok(()))
        );
        if !up {
            return Err(match self.connect_failure() {
                Some(failure) => failure.to_string(),
                None => format!("no connection within {within:?}"),
            });
        }
        // Loaded now (the connection's own load, in the background, may still be under
        // way), so that the first acquisitions on a node that was up from the start go by
        // `EVALSHA` (see `OnNoScript`), and its first releases by `DELIFEQ` where it has it.
        let (loaded, ()) = futures::join!(load_scripts(&self.cmd), self.native.ask(&self.cmd));
        self.scripts.loaded(loaded);
        Ok(())
    }

    /// Whether the member is a whole cluster, whose commands go to the master of their
    /// keys' slot.
    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// How many replicas must acknowledge an acquisition or an extension before the
    /// member's vote counts: the member URL's `replica_acks=`, else
    /// `Config::replica_acks`, on a cluster member; 0 otherwise.
    pub(crate) fn replica_acks(&self) -> u32 {
        self.replica_acks
    }

    /// The node timeout: how long one command may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) async fn quit(&self) {
        let _ = tokio::time::timeout(self.timeout, self.client.quit()).await;
    }

    /// Waits until the connection is up, at most the node timeout and not past `deadline`:
    /// before a command is tried again on a node whose connection failed. Commands fail at
    /// once while the connection is down between two reconnection attempts (they wait only
    /// while one is under way), so tries a few milliseconds apart could all fall into the
    /// gaps of a cut that heals soon after. Returns at once on a connected node.
    pub(crate) async fn until_connected(&self, deadline: Option<Instant>) {
        /// fred's connect notification wakes the wait; the state is also read again at
        /// least this often, since a connection made just before the notification is
        /// awaited sends none.
        const RECHECK: Duration = Duration::from_millis(25);
        /// The pause after a failed reconnection attempt's notification (or a closed
        /// client's, which comes at once), so that the loop never spins.
        const AFTER_FAILED_ATTEMPT: Duration = Duration::from_millis(5);
        let limit = Instant::now() + self.timeout;
        let limit = deadline.map_or(limit, |deadline| deadline.min(limit));
        while !self.client.is_connected() {
            let now = Instant::now();
            if now >= limit {
                return;
            }
            let step = (limit - now).min(RECHECK);
            match tokio::time::timeout(step, self.client.wait_for_connect()).await {
                Ok(Ok(())) => return,
                Ok(Err(_)) => tokio::time::sleep(AFTER_FAILED_ATTEMPT.min(step)).await,
                Err(_) => {}
            }
        }
    }
}

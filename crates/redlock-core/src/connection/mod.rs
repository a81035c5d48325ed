//! One Redis master: its fred client, configured so that nothing is ever replayed, and the
//! commands a round sends to it, each bounded by the node timeout.

mod factory;
mod failure;
mod identity;

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fred::bytes_utils::Str;
use fred::clients::{Client, SubscriberClient, WithOptions};
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::ClientLike;
use fred::types::config::Options;
use fred::types::{CustomCommand, Key, Value};
use tokio::time::Instant;

use crate::config::{Config, Endpoint};
use crate::error::ConfigError;
use crate::health::NodeHealth;
use crate::report::{ClosedReason, NodeName, NodeOutcome};
use crate::scripts::Script;
use crate::server_error::{ServerError, ServerErrorKind};

use failure::{watch_connection, ConnectFailure, FailureContext};
pub(crate) use identity::watch_identity;
use identity::{Identity, Reconnections};

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
    /// Whether the node casts votes (see [`identity`]).
    pub(crate) identity: Identity,
    /// Its connections, for the task that identifies it again after each.
    reconnections: Arc<Reconnections>,
}

/// Whether a node knows the lock's scripts, and the background load that teaches it them.
#[derive(Debug)]
struct ScriptCache {
    /// The node, for the warning when a load fails.
    node: NodeName,
    /// The node may not know them: from a reconnection (a restarted node has forgotten
    /// them), a `NOSCRIPT`, or a load that failed, until a load succeeds. Meanwhile an
    /// acquisition is sent with its script's source (`EVAL`): one command, in order.
    missing: AtomicBool,
    /// A load runs in the background.
    running: AtomicBool,
    /// A load was asked for since the running one started: it runs again.
    wanted: AtomicBool,
}

/// What [`Connection::eval`] does when the node does not know the script (`NOSCRIPT`: the
/// node restarted, or someone ran `SCRIPT FLUSH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnNoScript {
    /// Sends it again with its source (`EVAL`): for commands whose order against the
    /// caller's later commands does not matter (releases, extensions, records, reads).
    Resend,
    /// Answers [`ServerErrorKind::ScriptNotLoaded`] (nothing ran) and loads the scripts
    /// again in the background: for acquisitions. Their `EVAL` would be a second command,
    /// written after whatever the caller sent the node meanwhile: a release of the lock,
    /// once the other nodes made a quorum, would then find nothing to delete there, and
    /// the acquisition, run after it, would leave the key for its TTL. Until the scripts
    /// are loaded, later acquisitions on the node are sent as `EVAL` with the source from
    /// the start (one command).
    Refuse,
}

/// Whether a client (all of its connections) can still send: open until it is closed or
/// the tokio runtime it was connected in shuts down. A closed client's commands fail at
/// once with [`NodeOutcome::Closed`], never sent, instead of with fred's words for a
/// client whose tasks are gone ("Failed to send command to router", a server error to
/// look at) or for a connection that was quit.
#[derive(Debug, Default)]
pub(crate) struct Liveness(AtomicU8);

impl Liveness {
    const OPEN: u8 = 0;
    const SHUTDOWN: u8 = 1;
    const RUNTIME_STOPPED: u8 = 2;

    /// Why the client is closed, or `None` while it is open.
    pub(crate) fn closed(&self) -> Option<ClosedReason> {
        match self.0.load(Ordering::Acquire) {
            Liveness::OPEN => None,
            Liveness::SHUTDOWN => Some(ClosedReason::Shutdown),
            _ => Some(ClosedReason::RuntimeStopped),
        }
    }

    /// Closes the client for `reason`; returns whether it was open (the first reason
    /// stays).
    pub(crate) fn close(&self, reason: ClosedReason) -> bool {
        let code = match reason {
            ClosedReason::Shutdown => Liveness::SHUTDOWN,
            ClosedReason::RuntimeStopped => Liveness::RUNTIME_STOPPED,
        };
        self.0
            .compare_exchange(Liveness::OPEN, code, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Closes `liveness` when the runtime this runs in shuts down: a task holds a guard
    /// that closes it when dropped (a runtime drops its tasks as it shuts down), until the
    /// returned sender is dropped (with the coordinator), when the task ends quietly.
    pub(crate) fn watch_runtime(liveness: &Arc<Liveness>) -> tokio::sync::oneshot::Sender<()> {
        struct CloseOnDrop(Option<std::sync::Weak<Liveness>>);
        impl CloseOnDrop {
            fn disarm(&mut self) {
                self.0 = None;
            }
        }
        impl Drop for CloseOnDrop {
            fn drop(&mut self) {
                if let Some(liveness) = self.0.take().and_then(|weak| weak.upgrade()) {
                    liveness.close(ClosedReason::RuntimeStopped);
                }
            }
        }
        let (owner, gone) = tokio::sync::oneshot::channel::<()>();
        let guard = CloseOnDrop(Some(Arc::downgrade(liveness)));
        tokio::spawn(async move {
            let mut guard = guard;
            // Only a dropped sender ends this: the coordinator is gone, nothing to close.
            let _ = gone.await;
            guard.disarm();
        });
        owner
    }
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
        let reconnections = Arc::new(Reconnections::new(0));
        let on_reconnect = {
            let (cmd, scripts) = (Arc::downgrade(&cmd), scripts.clone());
            let counted = Arc::downgrade(&reconnections);
            // A restarted node has forgotten the scripts. Every connection loads them,
            // the first one too: `connect` loads them as well and waits for that, but a
            // node that was down then connects later.
            move || {
                if let Some(cmd) = cmd.upgrade() {
                    scripts.missing.store(true, Ordering::SeqCst);
                    reload_scripts(&cmd, &scripts);
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
            identity: Identity::default(),
            reconnections,
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
        // `EVALSHA` (see `OnNoScript`).
        self.scripts.loaded(load_scripts(&self.cmd).await);
        Ok(())
    }

    /// The server's identity: the `run_id` field of `INFO server`, under the node timeout.
    /// Random per server process, and the same for every database of one server and under
    /// every name or address that reaches it; two nodes reporting the same `run_id` are one
    /// server, one failure domain.
    pub(crate) async fn server_id(&self) -> Result<String, NodeOutcome> {
        // Not gated: it is how a node gets through the gate (see `identity`).
        let reply = self
            .send_custom("INFO", vec![Value::from("server")])
            .await?;
        reply
            .as_str()
            .and_then(|text| run_id(&text))
            .ok_or_else(|| {
                NodeOutcome::ServerError(ServerError::of_kind(
                    ServerErrorKind::Unknown,
                    "INFO",
                    "INFO server reported no run_id",
                ))
            })
    }

    /// Reads the node's settings for the health check: `INFO` (timed, for the latency) and
    /// `CONFIG GET appendfsync`, which managed services may refuse (then unknown).
    pub(crate) async fn health(&self) -> NodeHealth {
        let started = tokio::time::Instant::now();
        // Not gated: a node that casts no vote is still reachable, and its settings count.
        let info = match self.send_custom("INFO", Vec::new()).await {
            Ok(reply) => reply
                .as_str()
                .map(|text| text.to_string())
                .unwrap_or_default(),
            Err(why) => return NodeHealth::unreachable(self.name.clone(), why),
        };
        let latency = started.elapsed();
        let appendfsync = match self
            .send_custom(
                "CONFIG",
                vec![Value::from("GET"), Value::from("appendfsync")],
            )
            .await
        {
            Ok(reply) => config_value(reply, "appendfsync"),
            Err(why) => {
                tracing::debug!(node = %self.name, %why, "CONFIG GET appendfsync not answered; reported as unknown");
                None
            }
        };
        NodeHealth::from_info(self.name.clone(), latency, &info, appendfsync)
    }

    /// The node timeout: how long one command may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) async fn quit(&self) {
        let _ = tokio::time::timeout(self.timeout, self.client.quit()).await;
    }

    /// `SET key token NX PX ttl`: the raw reply (`OK` when set, nil when the key exists).
    pub(crate) async fn set_nx_px(
        &self,
        key: Key,
        token: Value,
        ttl: Duration,
    ) -> Result<Value, NodeOutcome> {
        // TTLs are checked to be at most a year before any round, so this never saturates.
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        // Static arguments: no copy per command.
        let (nx, px) = (Str::from_static("NX"), Str::from_static("PX"));
        let args = vec![key.into(), token, nx.into(), px.into(), ttl_ms.into()];
        self.custom("SET", args).await
    }

    /// Runs a script by its SHA-1. When the node does not know it (`NOSCRIPT`: a
    /// restarted node, or `SCRIPT FLUSH`), `on_no_script` says whether it is sent again with
    /// its source (`EVAL`; both steps share one timeout) or refused (see [`OnNoScript`]).
    pub(crate) async fn eval(
        &self,
        script: &Script,
        keys: &[Key],
        args: &[Value],
        on_no_script: OnNoScript,
    ) -> Result<Value, NodeOutcome> {
        self.eval_as(script, keys, args, on_no_script, Sending::Round)
            .await
    }

    /// [`eval`](Self::eval) for a command that removes what is ours (a rollback, a release
    /// sent again), sent as [`Sending::Cleanup`], with the `EVAL` fallback.
    pub(crate) async fn eval_cleanup(
        &self,
        script: &Script,
        keys: &[Key],
        args: &[Value],
    ) -> Result<Value, NodeOutcome> {
        self.eval_as(script, keys, args, OnNoScript::Resend, Sending::Cleanup)
            .await
    }

    async fn eval_as(
        &self,
        script: &Script,
        keys: &[Key],
        args: &[Value],
        on_no_script: OnNoScript,
        sending: Sending,
    ) -> Result<Value, NodeOutcome> {
        self.gate()?;
        let cmd = match sending {
            Sending::Round => &*self.cmd,
            Sending::Cleanup => &self.cleanup,
        };
        let whole = on_no_script == OnNoScript::Refuse || sending == Sending::Cleanup;
        if whole && self.scripts.missing.load(Ordering::SeqCst) {
            // The node may not know the script: one command with its source, in order. An
            // acquisition may not be sent twice (`OnNoScript::Refuse`); a cleanup command's
            // `NOSCRIPT` comes after what it undoes has run, often after its wait, when the
            // `EVAL` that would follow it is never sent.
            let args = script_args(Value::from(script.source()), keys, args);
            let eval = CustomCommand::new_static("EVAL", None, false);
            let fut = boxed(Box::new_uninit(), cmd.custom::<Value, Value>(eval, args));
            return self.bounded_as(fut, "EVAL", sending).await;
        }
        let mut sent = "EVALSHA";
        let outcome = self
            .bounded_as(
                async {
                    let evalsha = CustomCommand::new_static("EVALSHA", None, false);
                    let start = Instant::now();
                    // Boxed where made, as in `custom`.
                    match boxed(
                        Box::new_uninit(),
                        cmd.custom::<Value, Value>(
                            evalsha,
                            script_args(script.sha_arg(), keys, args),
                        ),
                    )
                    .await
                    {
                        Err(e)
                            if e.details().starts_with("NOSCRIPT")
                                && on_no_script == OnNoScript::Refuse =>
                        {
                            self.scripts.missing.store(true, Ordering::SeqCst);
                            reload_scripts(&self.cmd, &self.scripts);
                            Err(e)
                        }
                        Err(e) if e.details().starts_with("NOSCRIPT") => {
                            sent = "EVAL";
                            let eval = CustomCommand::new_static("EVAL", None, false);
                            // fred's own timeout for the second step ends with the first's
                            // (see `bounded`): the time left, at least a millisecond.
                            let left = self
                                .timeout
                                .saturating_sub(start.elapsed())
                                .max(Duration::from_millis(1));
                            let options = match sending {
                                Sending::Round => command_options(left),
                                Sending::Cleanup => cleanup_options(),
                            };
                            let client = self.client.with_options(&options);
                            Box::pin(client.custom::<Value, Value>(
                                eval,
                                script_args(Value::from(script.source()), keys, args),
                            ))
                            .await
                        }
                        other => other,
                    }
                },
                "EVALSHA",
                sending,
            )
            .await;
        // Name the command that failed: the retry with the source when it was sent.
        outcome.map_err(|failure| match failure {
            NodeOutcome::ServerError(mut e) => {
                e.command = sent.into();
                NodeOutcome::ServerError(e)
            }
            other => other,
        })
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

    /// One command with the per-command options, under the node timeout.
    ///
    /// fred's future for a command is about 7 KB: it is boxed where it is made, so that the
    /// futures around it (this one, a round's call to one node) stay small. Unboxed, every
    /// move of each of them would copy it whole (into `bounded`, into the timeout, into the
    /// boxed call of each node), and those copies would be a large share of the
    /// instructions of an uncontended lock and release (see `docs/benchmarks.md`,
    /// "Instructions per cycle").
    async fn custom(&self, name: &'static str, args: Vec<Value>) -> Result<Value, NodeOutcome> {
        self.gate()?;
        self.send_custom(name, args).await
    }

    /// Whether the node's commands may be sent: `Err` with why not, for a node not yet
    /// identified or found to be another node's server (see [`identity`]).
    fn gate(&self) -> Result<(), NodeOutcome> {
        self.identity
            .gate(|| self.connect_failure().map(|failure| failure.outcome()))
    }

    /// [`custom`](Self::custom) whatever the node's identity.
    async fn send_custom(
        &self,
        name: &'static str,
        args: Vec<Value>,
    ) -> Result<Value, NodeOutcome> {
        let command = CustomCommand::new_static(name, None, false);
        let fut = boxed(
            Box::new_uninit(),
            self.cmd.custom::<Value, Value>(command, args),
        );
        self.bounded(fut, name).await
    }

    /// A command under fred's own timeout (the node timeout, from the per-command
    /// options), with a backstop a moment later.
    ///
    /// fred's timeout must be the one that ends the command: it marks the command as timed
    /// out, and fred then never writes it. A command that is abandoned unmarked (its future
    /// dropped) stays in fred's queue when it was sent just as the connection dropped (fred
    /// still reads it as up for a moment), and fred writes it once the connection is back,
    /// however long after: an acquisition written then sets a key that no rollback deletes,
    /// since every rollback of its round was over by then. This library's own timeout, the
    /// backstop, starts first, so it must end a moment after fred's: with the same
    /// timeout, it would fire first and leave such commands unmarked.
    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, FredError>>,
        command: &'static str,
    ) -> Result<T, NodeOutcome> {
        self.bounded_as(fut, command, Sending::Round).await
    }

    /// [`bounded`](Self::bounded) for a command sent as `sending`: a cleanup command is
    /// waited for a node timeout, but fred's own (longer) timeout is left to run, so that
    /// it is still written if it was not yet (see [`Sending::Cleanup`]).
    async fn bounded_as<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, FredError>>,
        command: &'static str,
        sending: Sending,
    ) -> Result<T, NodeOutcome> {
        if let Some(reason) = self.liveness.closed() {
            return Err(NodeOutcome::Closed(reason));
        }
        let wait = match sending {
            Sending::Round => self.timeout + BACKSTOP_MARGIN,
            Sending::Cleanup => self.timeout,
        };
        match tokio::time::timeout(wait, fut).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.failure(&e, command)),
            Err(_) => Err(NodeOutcome::TimedOut),
        }
    }

    /// Sorts a fred error into what a report can say about the node. A command that fred
    /// refused for want of a connection reports why the connection failed, when known.
    fn failure(&self, e: &FredError, command: &'static str) -> NodeOutcome {
        if failure::is_stopped(e) {
            // fred's tasks for this client are gone: it was quit, or its runtime stopped
            // (a runtime that shuts down drops them before the watch on it runs).
            self.liveness.close(ClosedReason::RuntimeStopped);
            return NodeOutcome::Closed(
                self.liveness
                    .closed()
                    .unwrap_or(ClosedReason::RuntimeStopped),
            );
        }
        if *e.kind() == ErrorKind::Canceled || failure::is_unrouted(e) {
            if let Some(failure) = self.connect_failure() {
                return failure.outcome();
            }
        }
        failure::failure(e, command)
    }

    fn connect_failure(&self) -> Option<ConnectFailure> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// `future`, pinned in `slot`. The slot is allocated before the future is made, so that
/// the future (fred's is about 7 KB) can be written there directly; `Box::pin(future)` makes
/// it on the stack first and then copies it whole.
#[inline(always)]
fn boxed<F>(slot: Box<std::mem::MaybeUninit<F>>, future: F) -> Pin<Box<F>> {
    Box::into_pin(Box::write(slot, future))
}

/// Loads every script of the lock on the node (`SCRIPT LOAD`), each under the node
/// timeout; `Err` says why one was not loaded (an ACL without `script|load`, a proxy that
/// refuses `SCRIPT`, the node down).
async fn load_scripts(cmd: &WithOptions<Client>) -> Result<(), String> {
    let command = || CustomCommand::new_static("SCRIPT", None, false);
    // Each of fred's futures (about 7 KB) boxed where it is made, never an array of them
    // on the stack.
    let loads = crate::kind::every_script().into_iter().map(|script| {
        boxed(
            Box::new_uninit(),
            cmd.custom::<Value, Value>(
                command(),
                vec![Value::from("LOAD"), Value::from(script.source())],
            ),
        )
    });
    // Sent together: one round trip, not one per script.
    match futures::future::join_all(loads)
        .await
        .into_iter()
        .find_map(Result::err)
    {
        None => Ok(()),
        Some(e) => Err(format!("SCRIPT LOAD: {:?}: {}", e.kind(), e.details())),
    }
}

impl ScriptCache {
    /// Records how a load went: the node knows the scripts once one succeeded with no
    /// request for another since (the node may have restarted meanwhile); a failure is
    /// logged, and acquisitions there keep sending the source.
    fn loaded(&self, load: Result<(), String>) {
        match load {
            Ok(()) if !self.wanted.load(Ordering::SeqCst) => {
                self.missing.store(false, Ordering::SeqCst);
            }
            Ok(()) => {}
            Err(why) => {
                tracing::warn!(node = %self.node, %why, "the lock's scripts could not be loaded; acquisitions there send their scripts' source (EVAL) until they are")
            }
        }
    }
}

/// Loads the scripts again in the background (see [`load_scripts`]); a request that comes
/// while a load runs makes it run once more when it ends. Outside a tokio runtime (a
/// connection being dropped) it does nothing.
fn reload_scripts(cmd: &Arc<WithOptions<Client>>, scripts: &Arc<ScriptCache>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    scripts.wanted.store(true, Ordering::SeqCst);
    if scripts.running.swap(true, Ordering::SeqCst) {
        return;
    }
    let (cmd, scripts) = (cmd.clone(), scripts.clone());
    runtime.spawn(async move {
        loop {
            scripts.wanted.store(false, Ordering::SeqCst);
            scripts.loaded(load_scripts(&cmd).await);
            scripts.running.store(false, Ordering::SeqCst);
            // A request that came during the load found it running and left it to us,
            // unless another task has taken over since.
            if !scripts.wanted.load(Ordering::SeqCst)
                || scripts.running.swap(true, Ordering::SeqCst)
            {
                break;
            }
        }
    });
}

/// How long after fred's timeout of a command [`Connection::bounded`]'s backstop ends it:
/// enough to let fred's timer (which starts a moment later) fire first, whatever the
/// timer wheel's millisecond rounding.
const BACKSTOP_MARGIN: Duration = Duration::from_millis(20);

/// The per-command options of every command a round sends: no replay (one attempt: an
/// unanswered command is ambiguous, and cleaned up by compare-and-delete), fred's timeout,
/// and failing at once while the connection is down.
fn command_options(timeout: Duration) -> Options {
    Options {
        max_attempts: Some(1),
        timeout: Some(timeout),
        fail_fast: true,
        ..Default::default()
    }
}

/// How a command is sent: as part of a round, or to clean up after one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sending {
    /// Under fred's timeout (the node timeout), which marks the command so that fred never
    /// writes it late (see [`Connection::bounded`]).
    Round,
    /// A command that only removes what is ours (compare-and-delete of a round's token: a
    /// rollback, a release sent again), waited for a node timeout, under fred's much
    /// longer [`CLEANUP_WRITE_LIMIT`]. Marked timed out after a node timeout, a rollback
    /// still waiting in fred's queue behind the command it undoes (a lock over many keys is
    /// megabytes to write) would never be written, and that command would then set its keys
    /// for their TTL; every later try would meet the same fate. Written late, it removes
    /// only this round's keys, in order after the command it undoes.
    Cleanup,
}

/// fred's timeout of a cleanup command ([`Sending::Cleanup`]): it is written however long
/// the commands before it on the connection take to write, up to this.
const CLEANUP_WRITE_LIMIT: Duration = Duration::from_secs(30);

/// The per-command options of a cleanup command: as a round's ([`command_options`]) but
/// with fred's timeout at [`CLEANUP_WRITE_LIMIT`].
fn cleanup_options() -> Options {
    command_options(CLEANUP_WRITE_LIMIT)
}

/// Fails when two connected nodes are one server: reached under two names, addresses or
/// databases, it would cast two votes. Compares the servers' identities (`run_id`), not the
/// URLs, so two databases of one server are rejected too (one process, one failure
/// domain). Only the nodes connected now can be identified; the others (down, or refusing
/// the password or database) are identified when they connect (see [`identity`]), and a
/// warning names them.
pub(crate) async fn check_distinct(
    connections: &[Connection],
    connected: &[Result<(), String>],
) -> Result<Vec<usize>, ConfigError> {
    let ids = futures::future::join_all(connections.iter().zip(connected).map(
        |(connection, connected)| async move {
            match connected {
                Ok(()) => Some(connection.server_id().await),
                Err(_) => None,
            }
        },
    ))
    .await;
    let mut seen: std::collections::HashMap<&str, &NodeName> = Default::default();
    let mut unchecked = Vec::new();
    // Those that may be identified later (see `identity`): down, or `INFO` unanswered. A
    // node that answers `INFO` with an error (an ACL user without it) never can be.
    let mut later = Vec::new();
    for (i, (connection, id)) in connections.iter().zip(&ids).enumerate() {
        let id = match id {
            Some(Ok(id)) => id,
            // It answered with an error: it cannot be identified (see `identity`).
            Some(Err(outcome)) if identity::unidentifiable(outcome) => {
                unchecked.push(connection.name.to_string());
                continue;
            }
            _ => {
                unchecked.push(connection.name.to_string());
                later.push(i);
                continue;
            }
        };
        if let Some(first) = seen.insert(id, &connection.name) {
            return Err(ConfigError::DuplicateServer {
                first: first.to_string(),
                second: connection.name.to_string(),
            });
        }
    }
    if !unchecked.is_empty() {
        tracing::warn!(
            nodes = %unchecked.join(", "),
            "nodes not identified at start-up were not checked for being the same server as another node: each that is down or did not answer INFO in time casts no vote until it is identified once it does; make sure every URL names a distinct master"
        );
    }
    Ok(later)
}

/// The `run_id` field of an `INFO` reply.
fn run_id(info: &str) -> Option<String> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("run_id:"))
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .map(str::to_string)
}

/// The value of `name` in a `CONFIG GET` reply (an array of name, value pairs, or a map).
fn config_value(reply: Value, name: &str) -> Option<String> {
    match reply {
        Value::Array(items) => items
            .chunks(2)
            .find(|pair| pair[0].as_str().as_deref() == Some(name))
            .and_then(|pair| pair.get(1)?.as_string()),
        Value::Map(map) => map
            .inner()
            .into_iter()
            .find(|(k, _)| k.as_str() == Some(name))
            .and_then(|(_, v)| v.as_string()),
        _ => None,
    }
}

fn script_args(head: Value, keys: &[Key], args: &[Value]) -> Vec<Value> {
    let mut all = Vec::with_capacity(2 + keys.len() + args.len());
    all.push(head);
    all.push((keys.len() as i64).into());
    all.extend(keys.iter().cloned().map(Value::from));
    all.extend(args.iter().cloned());
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_id_is_read_from_info_server() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:3f1c0a\r\ntcp_port:6379\r\n";
        assert_eq!(run_id(info).as_deref(), Some("3f1c0a"));
        assert_eq!(run_id("# Server\r\nrun_id:\r\n"), None);
        assert_eq!(run_id(""), None);
    }
}

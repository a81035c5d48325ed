//! The coordinator: the node connections and what every round needs (its runner, its
//! background work, closing); the rounds themselves are the protocols' (`acquire`,
//! `hold`, `fair`, `group`, `inspect`).

use std::sync::Arc;
use std::time::Duration;

use fred::types::{Key, Value};
use futures::future::join_all;

use crate::config::{check_key, Config, HealthPolicy};
use crate::connection::{self, Connection, Liveness};
use crate::drift::drift;
use crate::error::{ConfigError, Error};
use crate::group::queue::{Answer, Group, Released, Unclaimed};
use crate::health::NodeHealth;
use crate::inspect::Inspection;
use crate::lock::Lock;
use crate::quorum::quorum;
use crate::report::{ClosedReason, NodeName, RoundKind, RoundReport};
use crate::round::{self, BackgroundWork, Command, Decided, Request, Round};
use crate::scripts::INSPECT;

const STARTUP_WAIT: Duration = Duration::from_millis(500);

/// Runs Redlock rounds against a fixed set of independent Redis masters.
///
/// Cheap to clone (the connections are shared); create one per node set and share it. One
/// round is one attempt: retrying, renewal and guards live in `redlock-client`.
///
/// ```no_run
/// # async fn demo() -> Result<(), redlock_core::Error> {
/// use std::time::Duration;
/// use redlock_core::{Config, Coordinator};
///
/// let coordinator = Coordinator::connect(Config {
///     nodes: (7001..=7005).map(|p| format!("redis://127.0.0.1:{p}")).collect(),
///     ..Default::default()
/// })
/// .await?;
/// let lock = coordinator.acquire("invoice:42", Duration::from_secs(10)).await?;
/// // ... use the resource while lock.is_valid() ...
/// coordinator.release(&lock).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Coordinator {
    pub(crate) inner: Arc<Inner>,
}

/// The nodes (passwords masked), the quorum and whether it is closed: a few lines, not
/// every connection's internals.
impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<&crate::NodeName> = self.inner.connections.iter().map(|c| &c.name).collect();
        f.debug_struct("Coordinator")
            .field("nodes", &nodes)
            .field("quorum", &self.quorum())
            .field("closed", &self.closed())
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) connections: Arc<[Connection]>,
    pub(crate) config: Config,
    pub(crate) work: BackgroundWork,
    /// Plain acquisitions waiting for the round in flight (group commit).
    pub(crate) group: Group<Answer>,
    /// Plain releases waiting for the release round in flight.
    pub(crate) release_group: Group<Released>,
    /// Closed by the first `close` (later ones only wait for background work), or when
    /// the runtime the coordinator was connected in shuts down; shared with every
    /// connection, whose commands then fail at once.
    liveness: Arc<Liveness>,
    /// Held so that the task that watches the runtime for `liveness` ends with the
    /// coordinator.
    _runtime_watch: tokio::sync::oneshot::Sender<()>,
    /// The runtime it was connected in, which runs its background work when a caller has
    /// none (a guard dropped on a plain thread).
    pub(crate) runtime: tokio::runtime::Handle,
    /// The release channel (when notifications are on) and the fair queues' prefix, as
    /// the release scripts take them: built once here rather than for every release.
    pub(crate) release_channel: Option<Value>,
    /// Fencing: the counter's keys, repairs in flight, the highest token handed out.
    pub(crate) fencing: crate::fence::State,
    /// The first member that is a whole cluster, if one is. Such a member runs each
    /// script on the master of its keys' slot, so a script may only name keys of one slot:
    /// a lock over keys of several slots goes to it as one script per slot
    /// (`LockSpec::by_slot`) and is refused in the fair queue, fencing needs a fence key
    /// with a hash tag (its fenced acquisitions read the counter apart, see
    /// `scripts::Unfenced`), and the rounds of grouped acquisitions and releases, and
    /// renewal batches, go to it as one command per slot (`Command::PerSlot`).
    pub(crate) cluster: Option<NodeName>,
    /// Whether plain acquisitions and releases are grouped: `Config::group_commit`.
    pub(crate) groups: bool,
}

impl Unclaimed for Inner {
    fn release_in_background(self: Arc<Self>, lock: Lock) {
        Coordinator { inner: self }.release_in_background(lock);
    }
}

/// A coordinator dropped without [`Coordinator::close`] (its last clone gone): fred's
/// connection tasks hold their own references to their clients and would keep each node's
/// socket, reconnecting for ever. As `close` does, this first waits for the background
/// work (a lost round's rollbacks, its late nodes' cleanup hold the connections but not
/// the coordinator: closed at once, they sent nothing and left their keys for the TTL),
/// then closes the connections, in the runtime the coordinator was connected in, if it
/// still runs.
impl Drop for Inner {
    fn drop(&mut self) {
        if self.liveness.closed().is_some() {
            return;
        }
        let (connections, liveness, work) = (
            self.connections.clone(),
            self.liveness.clone(),
            self.work.clone(),
        );
        // A runtime that has shut down took the tasks with it: nothing to wait for or to
        // quit. The task runs on its own (its handle is not needed).
        drop(self.runtime.spawn(async move {
            shut_down(&work, &liveness, &connections).await;
        }));
    }
}

/// What [`Coordinator::close`] and a coordinator dropped without it do: wait for the
/// background work, then close every connection (once).
async fn shut_down(work: &BackgroundWork, liveness: &Liveness, connections: &[Connection]) {
    work.idle().await;
    if liveness.close(ClosedReason::Shutdown) {
        join_all(connections.iter().map(Connection::quit)).await;
    }
}

/// The health check at connect: logs each connected node's settings (`node checked`, also
/// for a node with problems), warns about each node's problems, and with
/// [`HealthPolicy::Strict`] refuses the first node that has one. Nodes that refuse the
/// lock's scripts so many that no quorum is left are refused under both policies.
async fn check_health(
    connections: &[Connection],
    connected: &[Result<(), String>],
    policy: HealthPolicy,
) -> Result<(), ConfigError> {
    if policy == HealthPolicy::Off {
        return Ok(());
    }
    let checks = connections
        .iter()
        .zip(connected)
        .filter(|(_, up)| up.is_ok())
        .map(|(connection, _)| connection.health());
    let checked = join_all(checks).await;
    crate::health::check_commands(&checked, connections.len())?;
    for health in checked {
        match &health.reachable {
            Ok(_) if health.problems.is_empty() => tracing::info!(%health, "node checked"),
            Ok(_) => {
                // The settings read, as for a healthy node; then what is wrong with them.
                tracing::info!(%health, "node checked");
                let problems = health
                    .problems
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                if policy == HealthPolicy::Strict {
                    return Err(ConfigError::UnhealthyNode {
                        node: health.node.to_string(),
                        problems,
                    });
                }
                tracing::warn!(node = %health.node, %problems, "node breaks the algorithm's assumptions");
            }
            Err(why) => {
                tracing::warn!(node = %health.node, %why, "node health not checked: it did not answer INFO")
            }
        }
    }
    Ok(())
}

impl Coordinator {
    /// Validates the configuration, opens one connection per node and waits for them to
    /// come up (at most the node timeout or 500 ms, whichever is longer).
    ///
    /// A node that is down, or that refuses the password or database, does not fail this:
    /// it counts as failing until it comes back, is reconnected in the background, and
    /// rounds report the server's reason for it. Two nodes that report the same server
    /// `run_id` (another name, address or database of one server, which would cast two
    /// votes) fail this with [`ConfigError::DuplicateServer`]; only the nodes connected now
    /// can be checked, and the others are named in a warning. Each of those casts no vote
    /// until it is identified once connected; one found then to be the same server as a
    /// node that votes casts none
    /// ([`ServerErrorKind::SameServer`](crate::ServerErrorKind::SameServer)). Every node is
    /// identified again after each reconnection (see the README).
    pub async fn connect(config: Config) -> Result<Coordinator, ConfigError> {
        crate::metrics::describe_once();
        let endpoints = config.endpoints()?;
        let liveness = Arc::new(Liveness::default());
        let connections = endpoints
            .into_iter()
            .map(|e| Connection::new(e, &config, liveness.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        // Long enough for a healthy node to connect even with a tiny node timeout; a node
        // that is down costs this once, at start-up.
        let within = config.node_timeout.max(STARTUP_WAIT);
        let connected = join_all(connections.iter().map(|c| c.connect(within))).await;
        for (connection, connected) in connections.iter().zip(&connected) {
            if let Err(reason) = connected {
                tracing::warn!(node = %connection.name, %reason, "node not usable at start-up; it counts as failing until it connects");
            }
        }
        let checked = match connection::check_distinct(&connections, &connected).await {
            Ok(later) => check_health(&connections, &connected, config.health)
                .await
                .map(|()| later),
            Err(e) => Err(e),
        };
        let later = match checked {
            Ok(later) => later,
            Err(e) => {
                join_all(connections.iter().map(Connection::quit)).await;
                return Err(e);
            }
        };
        // A node not identified now casts no vote until it is; every node is identified
        // again after each reconnection (see `connection::identity`).
        for i in later {
            connections[i].identity.set_pending();
        }
        let cluster = connections
            .iter()
            .find(|c| c.is_cluster())
            .map(|c| c.name.clone());
        let connections: Arc<[Connection]> = connections.into();
        let turns = Arc::new(tokio::sync::Mutex::new(()));
        for i in 0..connections.len() {
            connection::watch_identity(&connections, i, turns.clone());
        }
        Ok(Coordinator {
            inner: Arc::new(Inner {
                release_channel: config.release_channel.as_deref().map(Value::from),
                fencing: crate::fence::State::new(&config.fence_key, connections.len()),
                groups: config.group_commit,
                cluster,
                connections,
                config,
                work: BackgroundWork::new(tokio::runtime::Handle::current()),
                group: Group::default(),
                release_group: Group::default(),
                _runtime_watch: Liveness::watch_runtime(&liveness),
                liveness,
                runtime: tokio::runtime::Handle::current(),
            }),
        })
    }

    /// The configuration this coordinator runs with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The number of nodes that must accept: `N / 2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum(self.inner.connections.len())
    }

    /// The nodes, in configuration order, as reports name them.
    pub fn nodes(&self) -> Vec<NodeName> {
        self.inner
            .connections
            .iter()
            .map(|c| c.name.clone())
            .collect()
    }

    /// Reads every node's settings (under the node timeout, concurrently) and says which
    /// break the algorithm's assumptions: a replica or cluster node, an evicting memory
    /// policy, persistence that can lose keys. What a node does not let us read (managed
    /// services often refuse `CONFIG GET`) is reported as unknown, not as a problem.
    pub async fn health(&self) -> Vec<NodeHealth> {
        join_all(self.inner.connections.iter().map(Connection::health)).await
    }

    /// The drift allowance for a TTL under this configuration.
    pub fn drift(&self, ttl: Duration) -> Duration {
        drift(ttl, self.inner.config.drift_factor)
    }

    /// A round of one request that asks for no TTL and undoes nothing (a release, a read,
    /// a fencing write-back, leaving a fair queue), reported under `name`. A release and a
    /// leave are sent again on the nodes that did not answer ([`Request::redo`]).
    pub(crate) fn untimed_round(&self, kind: RoundKind, command: Command, name: Arc<str>) -> Round {
        Round {
            kind,
            alternatives: false,
            command,
            requests: vec![Request::untimed(name, kind)],
            drift_factor: self.inner.config.drift_factor,
        }
    }

    /// Runs a round of one request: its report once a quorum answered as the round asks,
    /// [`Error::NoQuorum`] otherwise.
    pub(crate) async fn run_to_quorum(&self, round: Round) -> Result<RoundReport, Error> {
        let decided = self.run_one(round).await;
        if decided.won {
            Ok(decided.report)
        } else {
            Err(Error::NoQuorum {
                report: Box::new(decided.report),
            })
        }
    }

    /// Reads a key's state from every node (one read-only script that reads the holder and
    /// the TTL, under the per-node timeout): whether a quorum holds it, for how long, and
    /// for whom ([`Inspection::held_by`]). A snapshot: it may change right after.
    pub async fn inspect(&self, key: &str) -> Result<Inspection, Error> {
        check_key(key)?;
        let command = Command::Script {
            script: &INSPECT,
            keys: vec![Key::from(key)],
            args: Vec::new(),
        };
        let round = self.untimed_round(RoundKind::Inspect, command, key.into());
        let decided = self.run_one(round).await;
        Ok(Inspection::new(key, &decided.report, &decided.values))
    }

    /// Releases a lock without waiting for it, for a holder that cannot await (a guard
    /// being dropped). The release counts as background work: [`quiesce`](Self::quiesce)
    /// and [`close`](Self::close) wait for it. Called outside a tokio runtime (a guard
    /// dropped on a plain thread), it runs in the runtime the coordinator was connected
    /// in. Returns `false`, sending nothing, when that runtime has shut down and the call
    /// has none either: the key then expires with its TTL.
    pub fn release_in_background(&self, lock: Lock) -> bool {
        self.spawn_background(|this| async move {
            if let Err(e) = this.release(&lock).await {
                tracing::warn!(error = %e, "background release failed; the key expires with its TTL");
            }
        })
    }

    /// Spawns `work` (given a handle to this coordinator) as background work, which
    /// [`quiesce`](Self::quiesce) and [`close`](Self::close) wait for, in the runtime this
    /// coordinator was connected in (see `BackgroundWork::spawn`: the caller may be in
    /// another runtime, shutting down). Returns `false`, running nothing, when that runtime
    /// has shut down.
    pub(crate) fn spawn_background<F>(&self, work: impl FnOnce(Coordinator) -> F) -> bool
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        if self.inner.liveness.closed() == Some(ClosedReason::RuntimeStopped) {
            return false;
        }
        // Entered before the task is spawned, so a quiesce called right after this
        // returns already waits for it.
        let busy = self.inner.work.enter();
        let work = work(self.clone());
        self.inner.work.spawn(async move {
            let _busy = busy;
            work.await;
        });
        true
    }

    /// Waits until no round of this coordinator has work left in the background (late
    /// answers, rollbacks, the nodes a release had not heard from yet, releases started by
    /// [`release_in_background`](Self::release_in_background)).
    ///
    /// The wait is bounded whatever the nodes do: a command in flight gives up after one
    /// node timeout, and a rollback (or a release a node did not answer, or refused as not
    /// ready) is tried at most three times, each try bounded by the node timeout, 10 ms and
    /// 20 ms apart (a node timeout apart after a node that was not ready: `LOADING`,
    /// `BUSY`), and before the second and the third try a node whose connection is down is
    /// waited for, up to one node timeout each (a try would fail at once). So it returns at
    /// most `8 × node_timeout + 30 ms` after the decision of the last round started (a
    /// background release first needs its own round: add one node timeout). A key that
    /// could not be rolled back on a node that is down expires there with its TTL.
    pub async fn quiesce(&self) {
        self.inner.work.idle().await;
    }

    /// Waits for background work (see [`quiesce`](Self::quiesce) for the bound), then
    /// closes every connection, each `QUIT` bounded by the node timeout. Rounds started
    /// afterwards send nothing: each node reports
    /// [`NodeOutcome::Closed`](crate::NodeOutcome::Closed).
    pub async fn close(&self) {
        let inner = &self.inner;
        shut_down(&inner.work, &inner.liveness, &inner.connections).await;
    }

    /// Why this coordinator can send nothing any more, or `None` while it can: it was
    /// closed, or the tokio runtime it was connected in has shut down (a coordinator, and
    /// a client, works only in the runtime that connected it).
    pub fn closed(&self) -> Option<ClosedReason> {
        self.inner.liveness.closed()
    }

    pub(crate) async fn run_one(&self, round: Round) -> Decided {
        let mut decided = round::run(&self.inner.connections, round, &self.inner.work).await;
        decided
            .pop()
            .expect("one result for a round of one request")
    }
}

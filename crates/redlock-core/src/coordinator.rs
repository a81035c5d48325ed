//! The coordinator: the node connections, and the acquire, extend and release rounds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::types::{Key, Value};
use futures::future::{join, join_all};
use tokio::time::Instant;

use crate::batch;
use crate::config::{check_key, Config};
use crate::drift::drift;
use crate::error::{ConfigError, Error};
use crate::inspect::Inspection;
use crate::lock::Lock;
use crate::node::Node;
use crate::quorum::quorum;
use crate::report::{NodeName, RoundKind};
use crate::round::{self, Busy, Forward, Op};
use crate::scripts::{Script, ACQUIRE_MANY, REENTRANT_ACQUIRE, REENTRANT_RELEASE, RELEASE};
use crate::token::Token;

/// The most locks [`Coordinator::extend_many`] sends in one script call per node. At this
/// size a call carries about 25 KB of arguments and runs on a node in about a millisecond.
pub const EXTEND_BATCH_LOCKS: usize = 256;

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
#[derive(Debug, Clone)]
pub struct Coordinator {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    nodes: Arc<[Node]>,
    config: Config,
    busy: Busy,
    /// Set by the first `close`: later ones only wait for background work.
    closed: AtomicBool,
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
    /// can be checked, and the others are named in a warning.
    pub async fn connect(config: Config) -> Result<Coordinator, ConfigError> {
        let endpoints = config.endpoints()?;
        let nodes = endpoints
            .into_iter()
            .map(|e| Node::new(e, &config))
            .collect::<Result<Vec<_>, _>>()?;
        // Long enough for a healthy node to connect even with a tiny node timeout; a node
        // that is down costs this once, at start-up.
        let within = config.node_timeout.max(STARTUP_WAIT);
        let connected = join_all(nodes.iter().map(|node| node.connect(within))).await;
        for (node, connected) in nodes.iter().zip(&connected) {
            if let Err(reason) = connected {
                tracing::warn!(node = %node.name, %reason, "node not usable at start-up; it counts as failing until it connects");
            }
        }
        // One server reached under two names, addresses or databases would cast two votes:
        // compare the servers' identities (`run_id`), not the URLs. This also rejects two
        // databases of one server: one process, one failure domain. Only the nodes connected
        // now can be identified; the others (down, or refusing the password or database)
        // are not checked, and a warning names them.
        let ids = join_all(
            nodes
                .iter()
                .zip(&connected)
                .map(|(node, connected)| async move {
                    match connected {
                        Ok(()) => node.server_id().await.ok(),
                        Err(_) => None,
                    }
                }),
        )
        .await;
        let mut seen: std::collections::HashMap<&str, &NodeName> = Default::default();
        let mut unchecked = Vec::new();
        for (node, id) in nodes.iter().zip(&ids) {
            let Some(id) = id else {
                unchecked.push(node.name.to_string());
                continue;
            };
            if let Some(first) = seen.insert(id, &node.name) {
                let err = ConfigError::DuplicateServer {
                    first: first.to_string(),
                    second: node.name.to_string(),
                };
                join_all(nodes.iter().map(Node::quit)).await;
                return Err(err);
            }
        }
        if !unchecked.is_empty() {
            tracing::warn!(
                nodes = %unchecked.join(", "),
                "nodes not connected at start-up were not checked for being the same server as another node (only connected nodes can be identified): make sure every URL names a distinct master"
            );
        }
        Ok(Coordinator {
            inner: Arc::new(Inner {
                nodes: nodes.into(),
                config,
                busy: Busy::new(),
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// The configuration this coordinator runs with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The number of nodes that must accept: `N / 2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum(self.inner.nodes.len())
    }

    /// The nodes, in configuration order, as reports name them.
    pub fn nodes(&self) -> Vec<NodeName> {
        self.inner.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// The drift allowance for a TTL under this configuration.
    pub fn drift(&self, ttl: Duration) -> Duration {
        drift(ttl, self.inner.config.drift_factor)
    }

    /// One acquisition round with a fresh random token.
    pub async fn acquire(&self, key: &str, ttl: Duration) -> Result<Lock, Error> {
        self.acquire_with_token(key, Token::random(), ttl).await
    }

    /// One acquisition round: `SET key token NX PX ttl` on every node at once, decided as
    /// soon as a quorum accepted or can no longer accept.
    ///
    /// Won only with a quorum and positive validity. Otherwise, and also when this future
    /// is dropped before it finishes, the key is deleted again on every node where it holds
    /// `token`, including nodes that answer after the decision; that runs in the
    /// background, and [`RoundReport::settled`](crate::RoundReport::settled) or
    /// [`quiesce`](Self::quiesce) wait for it.
    pub async fn acquire_with_token(
        &self,
        key: &str,
        token: Token,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let spec = Spec::new(&[key], token, None)?;
        let ttl = self.inner.config.check_ttl(ttl)?;
        let forward = Forward::SetNx {
            token: spec.token_value(),
            ttl_ms: ttl.as_millis() as u64,
        };
        self.acquire_spec(spec, forward, ttl).await
    }

    /// One acquisition round over several keys, all or nothing: each node sets every key or
    /// none (one script per node), and the lock is won when a quorum of nodes set them all.
    /// Rolled back like [`acquire_with_token`](Self::acquire_with_token).
    pub async fn acquire_many<K: AsRef<str>>(
        &self,
        keys: &[K],
        token: Token,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let keys: Vec<&str> = keys.iter().map(AsRef::as_ref).collect();
        let spec = Spec::new(&keys, token, None)?;
        let ttl = self.inner.config.check_ttl(ttl)?;
        let forward = Forward::Script {
            script: &ACQUIRE_MANY,
            args: vec![spec.token_value(), (ttl.as_millis() as i64).into()],
        };
        self.acquire_spec(spec, forward, ttl).await
    }

    /// One acquisition round of a reentrant lock: succeeds when the key is free or already
    /// held by `owner`, adding one hold (identified by `token`) either way. Each hold is
    /// released on its own; the key goes with the last one. A key is used either reentrantly
    /// or not: a plain lock and a reentrant lock on one key see each other as taken.
    pub async fn acquire_reentrant(
        &self,
        key: &str,
        owner: &str,
        token: Token,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        if owner.is_empty() {
            return Err(ConfigError::EmptyOwner.into());
        }
        let spec = Spec::new(&[key], token, Some(owner.into()))?;
        let ttl = self.inner.config.check_ttl(ttl)?;
        let forward = Forward::Script {
            script: &REENTRANT_ACQUIRE,
            args: vec![
                owner.into(),
                spec.token_value(),
                (ttl.as_millis() as i64).into(),
            ],
        };
        self.acquire_spec(spec, forward, ttl).await
    }

    async fn acquire_spec(
        &self,
        spec: Spec,
        forward: Forward,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let op = Op {
            kind: RoundKind::Acquire,
            name: spec.name.clone(),
            keys: spec.fred_keys(),
            forward,
            // A rollback publishes nothing: nobody held the lock, so nobody waits for it.
            undo: Some(spec.release(None)),
            ttl: Some(ttl),
            drift_factor: self.inner.config.drift_factor,
        };
        let finished = round::run(&self.inner.nodes, op, &self.inner.busy).await;
        self.lock_from(finished, spec, ttl, None)
    }

    /// One extension round: compare-and-`PEXPIRE` to `ttl` on every node, counted like an
    /// acquisition, with validity measured from the start of this round. It never
    /// recreates a key that expired, and it never shortens one: a node whose key already
    /// lives at least `ttl` keeps its expiry, so an extension (won, lost or late) can never
    /// pull a node's expiry before a validity some holder relies on. The returned lock is
    /// valid until the later of its previous deadline and this round's `t0 + ttl - drift`.
    /// On failure nothing is deleted or shortened: the lock keeps the validity it had, and
    /// the caller should stop using it by then and release it.
    pub async fn extend(&self, lock: &Lock, ttl: Duration) -> Result<Lock, Error> {
        let ttl = self.inner.config.check_ttl(ttl)?;
        let mut results = self.extend_checked(&[(lock, ttl)]).await;
        results.pop().expect("one result per lock")
    }

    /// Extends several locks at once: one script call per node for up to
    /// [`EXTEND_BATCH_LOCKS`] of them, each lock decided on its own by the same quorum and
    /// validity rules as [`extend`](Self::extend), with its validity measured from the start
    /// of its own batch. Larger sets are split into batches, two in flight at a time, so
    /// that no single script keeps a node busy for long: a script that outlives the node
    /// timeout still runs to its end on the node, and a renewal of thousands of locks in
    /// one call would pile such scripts up. Returns one result per lock, in order.
    pub async fn extend_many(&self, locks: &[(&Lock, Duration)]) -> Vec<Result<Lock, Error>> {
        let mut checked = Vec::with_capacity(locks.len());
        let mut errors = Vec::new();
        for (i, (lock, ttl)) in locks.iter().enumerate() {
            match self.inner.config.check_ttl(*ttl) {
                Ok(ttl) => checked.push((*lock, ttl)),
                Err(e) => errors.push((i, e)),
            }
        }
        let mut results = self.extend_checked(&checked).await.into_iter();
        let mut errors = errors.into_iter().peekable();
        (0..locks.len())
            .map(|i| match errors.next_if(|(at, _)| *at == i) {
                Some((_, e)) => Err(e.into()),
                None => results.next().expect("one result per checked lock"),
            })
            .collect()
    }

    async fn extend_checked(&self, locks: &[(&Lock, Duration)]) -> Vec<Result<Lock, Error>> {
        if locks.is_empty() {
            return Vec::new();
        }
        let drift_factor = self.inner.config.drift_factor;
        let nodes = &self.inner.nodes;
        let mut finished = Vec::with_capacity(locks.len());
        let mut chunks = locks.chunks(EXTEND_BATCH_LOCKS);
        while let Some(first) = chunks.next() {
            let first = batch::extend(nodes, first, drift_factor);
            match chunks.next() {
                Some(second) => {
                    let (a, b) = join(first, batch::extend(nodes, second, drift_factor)).await;
                    finished.extend(a.into_iter().chain(b));
                }
                None => finished.extend(first.await),
            }
        }
        locks
            .iter()
            .zip(finished)
            .map(|((lock, ttl), finished)| {
                let spec = Spec {
                    keys: lock.keys.clone(),
                    name: lock.name.clone(),
                    token: lock.token.clone(),
                    owner: lock.owner.clone(),
                };
                // Extensions only lengthen, so what the lock held before still stands.
                self.lock_from(finished, spec, *ttl, Some(lock.valid_until))
            })
            .collect()
    }

    /// Releases a lock: compare-and-delete on every node (for a reentrant lock: drops this
    /// hold, and the key with the last one). Returns once a quorum of nodes no longer hold
    /// it; the remaining nodes finish in the background. It only ever deletes a key that
    /// still holds this lock's token, so a late release never touches a newer holder.
    pub async fn release(&self, lock: &Lock) -> Result<crate::RoundReport, Error> {
        let spec = Spec {
            keys: lock.keys.clone(),
            name: lock.name.clone(),
            token: lock.token.clone(),
            owner: lock.owner.clone(),
        };
        let (script, args) = spec.release(self.inner.config.release_channel.as_deref());
        let op = Op {
            kind: RoundKind::Release,
            name: spec.name.clone(),
            keys: spec.fred_keys(),
            forward: Forward::Script { script, args },
            undo: None,
            ttl: None,
            drift_factor: self.inner.config.drift_factor,
        };
        let finished = round::run(&self.inner.nodes, op, &self.inner.busy).await;
        if finished.won {
            Ok(finished.report)
        } else {
            Err(Error::NoQuorum {
                report: Box::new(finished.report),
            })
        }
    }

    /// Reads a key's state from every node (`PTTL`, under the per-node timeout): whether a
    /// quorum holds it and for how long. A snapshot: it may change right after.
    pub async fn inspect(&self, key: &str) -> Result<Inspection, Error> {
        check_key(key)?;
        let ttls = join_all(
            self.inner
                .nodes
                .iter()
                .map(|node| async move { (node.name.clone(), node.pttl(Key::from(key)).await) }),
        )
        .await;
        Ok(Inspection::new(key, ttls))
    }

    /// Releases a lock without waiting for it, for a holder that cannot await (a guard
    /// being dropped). The release counts as background work: [`quiesce`](Self::quiesce)
    /// and [`close`](Self::close) wait for it. Returns `false`, sending nothing, outside a
    /// tokio runtime: the key then expires with its TTL.
    pub fn release_in_background(&self, lock: Lock) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        // Entered before the task is spawned, so a quiesce called right after this
        // returns already waits for the release.
        let busy = self.inner.busy.enter();
        let this = self.clone();
        runtime.spawn(async move {
            let _busy = busy;
            if let Err(e) = this.release(&lock).await {
                tracing::warn!(error = %e, "background release failed; the key expires with its TTL");
            }
        });
        true
    }

    /// Waits until no round of this coordinator has work left in the background (late
    /// answers, rollbacks, the tail of a release, releases started by
    /// [`release_in_background`](Self::release_in_background)).
    ///
    /// The wait is bounded whatever the nodes do: a command in flight gives up after one
    /// node timeout, and a rollback is tried at most three times, each try bounded by the
    /// node timeout, 10 ms and 20 ms apart. So it returns at most `4 × node_timeout + 30 ms`
    /// after the decision of the last round started (a background release first needs its
    /// own round: add one node timeout). A key that could not be rolled back on a node
    /// that is down expires there with its TTL.
    pub async fn quiesce(&self) {
        self.inner.busy.idle().await;
    }

    /// Waits for background work (see [`quiesce`](Self::quiesce) for the bound), then
    /// closes every connection, each `QUIT` bounded by the node timeout. Rounds started
    /// afterwards fail with connection errors.
    pub async fn close(&self) {
        self.quiesce().await;
        if !self.inner.closed.swap(true, Ordering::SeqCst) {
            join_all(self.inner.nodes.iter().map(Node::quit)).await;
        }
    }

    /// The lock a finished round produced. `held_until` is the deadline an extended lock
    /// had before the round: extensions never shorten, so it stays a lower bound.
    fn lock_from(
        &self,
        finished: round::Finished,
        spec: Spec,
        ttl: Duration,
        held_until: Option<Instant>,
    ) -> Result<Lock, Error> {
        let report = Box::new(finished.report);
        if finished.won {
            // `ttl` passed `check_ttl` (at most a year), so neither step can overflow.
            let valid_until =
                (finished.t0 + ttl - self.drift(ttl)).max(held_until.unwrap_or(finished.t0));
            return Ok(Lock {
                keys: spec.keys,
                name: spec.name,
                token: spec.token,
                owner: spec.owner,
                ttl,
                valid_until,
                report: *report,
            });
        }
        if report.accepted >= report.quorum {
            Err(Error::ValidityExhausted { report, ttl })
        } else {
            Err(Error::NoQuorum { report })
        }
    }
}

/// The identity of a lock: what its scripts are built from.
struct Spec {
    keys: Arc<[Arc<str>]>,
    name: Arc<str>,
    token: Token,
    owner: Option<Arc<str>>,
}

impl Spec {
    fn new(keys: &[&str], token: Token, owner: Option<Arc<str>>) -> Result<Spec, ConfigError> {
        if keys.is_empty() {
            return Err(ConfigError::NoKeys);
        }
        token.check()?;
        // Only multi-key locks can repeat a key; the common single-key round skips the set.
        let mut seen =
            std::collections::HashSet::with_capacity(if keys.len() > 1 { keys.len() } else { 0 });
        for key in keys {
            check_key(key)?;
            if keys.len() > 1 && !seen.insert(*key) {
                return Err(ConfigError::DuplicateKey {
                    key: (*key).to_string(),
                });
            }
        }
        Ok(Spec {
            keys: keys.iter().map(|k| Arc::from(*k)).collect(),
            name: keys.join(", ").into(),
            token,
            owner,
        })
    }

    fn fred_keys(&self) -> Vec<Key> {
        self.keys.iter().map(|k| Key::from(&**k)).collect()
    }

    fn token_value(&self) -> Value {
        Value::String(self.token.as_fred().clone())
    }

    /// The compare-and-delete for this lock, publishing on `channel` when given.
    fn release(&self, channel: Option<&str>) -> (&'static Script, Vec<Value>) {
        let channel = Value::from(channel.unwrap_or(""));
        match &self.owner {
            Some(owner) => (
                &REENTRANT_RELEASE,
                vec![Value::from(&**owner), self.token_value(), channel],
            ),
            None => (&RELEASE, vec![self.token_value(), channel]),
        }
    }
}

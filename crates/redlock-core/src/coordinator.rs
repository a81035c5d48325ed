//! The coordinator: the node connections, and the acquire, extend and release rounds.

use std::sync::Arc;
use std::time::Duration;

use fred::types::{Key, Value};
use futures::future::join_all;

use crate::config::{check_key, Config};
use crate::drift::drift;
use crate::error::{ConfigError, Error};
use crate::lock::Lock;
use crate::node::Node;
use crate::quorum::quorum;
use crate::report::{NodeName, RoundKind};
use crate::round::{self, Busy, Forward, Op};
use crate::scripts::{EXTEND, RELEASE};
use crate::token::Token;

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
}

impl Coordinator {
    /// Validates the configuration, opens one connection per node and waits for them to
    /// come up (at most the node timeout or 500 ms, whichever is longer). A node that is down does not fail this: it counts
    /// as failing until it comes back, and is reconnected in the background.
    pub async fn connect(config: Config) -> Result<Coordinator, ConfigError> {
        let endpoints = config.endpoints()?;
        let nodes = endpoints
            .into_iter()
            .map(|e| Node::new(e, &config))
            .collect::<Result<Vec<_>, _>>()?;
        // Long enough for a healthy node to connect even with a tiny node timeout; a node
        // that is down costs this once, at start-up.
        let within = config.node_timeout.max(STARTUP_WAIT);
        let up = join_all(nodes.iter().map(|node| node.connect(within))).await;
        for (node, up) in nodes.iter().zip(up) {
            if !up {
                tracing::warn!(node = %node.name, "node not reachable at start-up; it counts as failing until it comes back");
            }
        }
        Ok(Coordinator {
            inner: Arc::new(Inner {
                nodes: nodes.into(),
                config,
                busy: Busy::new(),
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
        check_key(key)?;
        let ttl = self.inner.config.check_ttl(ttl)?;
        let ttl_ms = ttl.as_millis() as u64;
        let op = Op {
            kind: RoundKind::Acquire,
            name: key.into(),
            keys: vec![Key::from(key)],
            forward: Forward::SetNx {
                token: token_value(&token),
                ttl_ms,
            },
            undo: Some((&RELEASE, vec![token_value(&token)])),
            ttl: Some(ttl),
            drift_factor: self.inner.config.drift_factor,
        };
        let finished = round::run(&self.inner.nodes, op, &self.inner.busy).await;
        self.lock_from(finished, key, token, ttl)
    }

    /// One extension round: compare-and-`PEXPIRE` to `ttl` on every node, counted like an
    /// acquisition, with validity measured from the start of this round. It never
    /// recreates a key that expired. On failure nothing is deleted: the lock keeps the
    /// validity it had, and the caller should stop using it by then and release it.
    pub async fn extend(&self, lock: &Lock, ttl: Duration) -> Result<Lock, Error> {
        let ttl = self.inner.config.check_ttl(ttl)?;
        let op = Op {
            kind: RoundKind::Extend,
            name: lock.key.clone(),
            keys: vec![Key::from(&*lock.key)],
            forward: Forward::Script {
                script: &EXTEND,
                args: vec![token_value(&lock.token), (ttl.as_millis() as i64).into()],
            },
            undo: None,
            ttl: Some(ttl),
            drift_factor: self.inner.config.drift_factor,
        };
        let finished = round::run(&self.inner.nodes, op, &self.inner.busy).await;
        self.lock_from(finished, &lock.key, lock.token.clone(), ttl)
    }

    /// Releases a lock: compare-and-delete on every node. Returns once a quorum of nodes no
    /// longer hold our key; the remaining nodes finish in the background. It only ever
    /// deletes a key that still holds this lock's token, so a late release never touches a
    /// newer holder.
    pub async fn release(&self, lock: &Lock) -> Result<crate::RoundReport, Error> {
        let op = Op {
            kind: RoundKind::Release,
            name: lock.key.clone(),
            keys: vec![Key::from(&*lock.key)],
            forward: Forward::Script {
                script: &RELEASE,
                args: vec![token_value(&lock.token)],
            },
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

    /// Waits until no round of this coordinator has work left in the background (late
    /// answers, rollbacks, the tail of a release).
    pub async fn quiesce(&self) {
        self.inner.busy.idle().await;
    }

    /// Waits for background work, then closes every connection. Rounds started afterwards
    /// fail with connection errors.
    pub async fn close(&self) {
        self.quiesce().await;
        join_all(self.inner.nodes.iter().map(Node::quit)).await;
    }

    fn lock_from(
        &self,
        finished: round::Finished,
        key: &str,
        token: Token,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let report = Box::new(finished.report);
        if finished.won {
            let valid_until = finished.t0 + ttl - self.drift(ttl);
            return Ok(Lock {
                key: key.into(),
                token,
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

fn token_value(token: &Token) -> Value {
    Value::String(token.as_fred().clone())
}

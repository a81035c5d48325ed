//! The contenders: the raw floor, this workspace's client in its configurations, and rslock,
//! behind one interface (connect, lock, release, one cycle).

use std::time::Duration;

use redlock_client::{LockConfig, LockGuard, LockOptions, Redlock};

use crate::error::{BenchError, Context};
use crate::floor::{Floor, Wait};
use crate::per_node::{PerNode, Trim};

/// The TTL every contender asks for, in every scenario.
pub const TTL: Duration = Duration::from_secs(10);

/// rslock's per-node limits, fixed by the library (it builds its redis clients with the
/// redis crate's defaults and offers no setting): 500 ms per reply, 1 s per connection.
pub const RSLOCK_RESPONSE_TIMEOUT: &str = "500 ms per reply (redis crate default, not settable)";

/// Which contender, in which configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Raw fred, waiting for every node.
    Floor,
    /// Raw fred, returning at a quorum of replies.
    FloorQuorum,
    /// Ours: defaults (release notifications on) but no automatic renewal, like-for-like
    /// with rslock, whose `lock` has no watchdog.
    Ours,
    /// Ours with release notifications off: waiters poll on their backoff.
    OursPolling,
    /// Ours with every default, automatic renewal included.
    OursDefaults,
    /// Ours like `Ours`, with a fencing token for every lock (one more round trip: the
    /// token's write-back).
    OursFenced,
    /// Ours like `Ours`, with the fair queue (`fair`): waiters take the lock in the order
    /// they began waiting, across clients.
    OursFair,
    /// Ours like `Ours`, with group commit off: every acquisition and release is a
    /// command of its own per node, however many run at once.
    OursUngrouped,
    /// Ours like `Ours`, taking one of [`PERMITS`] permits of a semaphore named by the
    /// key instead of the lock of the key.
    OursPermit,
    /// `OursPermit` in the semaphore's fair queue.
    OursPermitFair,
    /// Ours like `Ours`, taking the read side of a read-write lock named by the key.
    OursRead,
    /// Ours like `Ours`, taking the write side of a read-write lock named by the key.
    OursWrite,
    /// Ours like `Ours`, with `replica_acks` 1: on a cluster member, a `WAIT` for one
    /// replica behind each acquisition and extension (P9 only: single servers ignore it).
    OursReplicaAcks,
    /// The per-node-limit semaphore of [`PERMITS`] permits, the design the library did not
    /// take, modelled with raw fred (see `per_node.rs`): a winner keeps every entry it won.
    PerNodeLimit,
    /// Like `PerNodeLimit`, but a winner takes back its entries beyond a quorum at once.
    PerNodeLimitTrimmed,
    /// The `rslock` crate.
    Rslock,
}

/// How many permits the `ours-permit` contender's semaphores have.
pub const PERMITS: u32 = 4;

impl Kind {
    /// Every contender, in the order the tables list them.
    pub const ALL: [Kind; 16] = [
        Kind::Floor,
        Kind::FloorQuorum,
        Kind::Ours,
        Kind::OursPolling,
        Kind::OursDefaults,
        Kind::OursFenced,
        Kind::OursFair,
        Kind::OursUngrouped,
        Kind::OursPermit,
        Kind::OursPermitFair,
        Kind::OursRead,
        Kind::OursWrite,
        Kind::OursReplicaAcks,
        Kind::PerNodeLimit,
        Kind::PerNodeLimitTrimmed,
        Kind::Rslock,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Floor => "floor",
            Kind::FloorQuorum => "floor-quorum",
            Kind::Ours => "ours",
            Kind::OursPolling => "ours-polling",
            Kind::OursDefaults => "ours-defaults",
            Kind::OursFenced => "ours-fenced",
            Kind::OursFair => "ours-fair",
            Kind::OursUngrouped => "ours-ungrouped",
            Kind::OursPermit => "ours-permit",
            Kind::OursPermitFair => "ours-permit-fair",
            Kind::OursRead => "ours-read",
            Kind::OursWrite => "ours-write",
            Kind::OursReplicaAcks => "ours-replica-acks",
            Kind::PerNodeLimit => "per-node-limit",
            Kind::PerNodeLimitTrimmed => "per-node-limit-trimmed",
            Kind::Rslock => "rslock",
        }
    }

    /// What the tables say about this contender.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Floor => "floor (raw fred, waits for all N)",
            Kind::FloorQuorum => "floor (raw fred, returns at quorum)",
            Kind::Ours => "ours (notify on, no renewal)",
            Kind::OursPolling => "ours, polling only (notify off)",
            Kind::OursDefaults => "ours, all defaults (renewal on)",
            Kind::OursFenced => "ours, fenced (notify on, no renewal)",
            Kind::OursFair => "ours, fair queue (notify on, no renewal)",
            Kind::OursUngrouped => "ours, group commit off (notify on, no renewal)",
            Kind::OursPermit => "ours, a permit of a semaphore of 4 (notify on, no renewal)",
            Kind::OursPermitFair => "ours, a permit of a semaphore of 4, fair queue (notify on)",
            Kind::OursRead => "ours, a read-write lock's read side (notify on, no renewal)",
            Kind::OursWrite => "ours, a read-write lock's write side (notify on, no renewal)",
            Kind::OursReplicaAcks => {
                "ours, replica_acks 1: a WAIT behind each write on a cluster member (notify on)"
            }
            Kind::PerNodeLimit => {
                "per-node limit of floor(k*q/N) = 2 (safe; the bench's model, raw fred)"
            }
            Kind::PerNodeLimitTrimmed => {
                "per-node limit of 2, winner keeps only q entries (safe; the bench's model)"
            }
            Kind::Rslock => "rslock 0.10",
        }
    }

    /// The per-node timeout in force, for the tables.
    pub fn node_timeout(self, ours: Duration) -> String {
        match self {
            Kind::Floor | Kind::FloorQuorum => "none".into(),
            Kind::Ours
            | Kind::OursPolling
            | Kind::OursDefaults
            | Kind::OursFenced
            | Kind::OursFair
            | Kind::OursUngrouped
            | Kind::OursPermit
            | Kind::OursPermitFair
            | Kind::OursRead
            | Kind::OursWrite
            | Kind::OursReplicaAcks
            | Kind::PerNodeLimit
            | Kind::PerNodeLimitTrimmed => {
                format!("{} ms (setting, default)", ours.as_millis())
            }
            Kind::Rslock => "500 ms (fixed)".into(),
        }
    }
}

/// How long a contender's first uncontended cycle may keep failing before its connection
/// counts as broken (see `Subject::warm_up`).
const WARM_UP: Duration = Duration::from_secs(30);

/// A connected contender.
#[derive(Debug, Clone)]
pub enum Subject {
    Floor(Floor),
    Ours(Redlock),
    /// Ours, taking a permit of the semaphore a key names.
    Permit(Redlock),
    /// Ours, taking the write side (`true`) or the read side of the read-write lock a key
    /// names.
    Rw(Redlock, bool),
    /// The per-node-limit semaphore (the bench's model).
    PerNode(PerNode),
    Rslock(rslock::LockManager),
}

/// A lock held by a contender.
#[derive(Debug)]
pub enum Held {
    Floor(String, redlock_core::Token),
    Ours(LockGuard),
    PerNode(String, redlock_core::Token),
    Rslock(rslock::Lock),
}

impl Subject {
    pub async fn connect(kind: Kind, urls: &[String]) -> Result<Subject, BenchError> {
        match kind {
            Kind::Floor => Ok(Subject::Floor(Floor::connect(urls, TTL, Wait::All).await?)),
            Kind::FloorQuorum => Ok(Subject::Floor(
                Floor::connect(urls, TTL, Wait::Quorum).await?,
            )),
            Kind::Ours
            | Kind::OursPolling
            | Kind::OursDefaults
            | Kind::OursFenced
            | Kind::OursFair
            | Kind::OursUngrouped
            | Kind::OursPermit
            | Kind::OursPermitFair
            | Kind::OursRead
            | Kind::OursWrite
            | Kind::OursReplicaAcks => {
                // A prefix per configuration: it names the release channel too, so clients
                // of different configurations do not hear each other's releases.
                let mut builder = LockConfig::builder()
                    .nodes(urls.iter().cloned())
                    .ttl(TTL)
                    .key_prefix(format!("{}:", kind.name()));
                if kind != Kind::OursDefaults {
                    builder = builder.no_renewal();
                }
                if kind == Kind::OursPolling {
                    builder = builder.notify(false);
                }
                if kind == Kind::OursFenced {
                    builder = builder.fencing(true);
                }
                if matches!(kind, Kind::OursFair | Kind::OursPermitFair) {
                    builder = builder.fair(true);
                }
                if kind == Kind::OursUngrouped {
                    builder = builder.group_commit(false);
                }
                if kind == Kind::OursReplicaAcks {
                    builder = builder.replica_acks(1);
                }
                let config = builder
                    .build()
                    .during("building our client's configuration", "fix the bench")?;
                let client = Redlock::connect(config)
                    .await
                    .during("connecting our client", "are the nodes running?")?;
                let subject = match kind {
                    Kind::OursPermit | Kind::OursPermitFair => Subject::Permit(client),
                    Kind::OursRead => Subject::Rw(client, false),
                    Kind::OursWrite => Subject::Rw(client, true),
                    _ => Subject::Ours(client),
                };
                subject.warm_up().await?;
                Ok(subject)
            }
            Kind::PerNodeLimit | Kind::PerNodeLimitTrimmed => {
                let trim = if kind == Kind::PerNodeLimit {
                    Trim::Keep
                } else {
                    Trim::ToQuorum
                };
                let subject = Subject::PerNode(PerNode::connect(urls, TTL, PERMITS, trim).await?);
                subject.warm_up().await?;
                Ok(subject)
            }
            Kind::Rslock => {
                // `LockManager::new` panics on a URL it cannot parse: check them first.
                for url in urls {
                    fred::prelude::Config::from_url(url).during(
                        format!("checking the node URL {url} for rslock"),
                        "fix the URL",
                    )?;
                }
                let mut manager = rslock::LockManager::new(urls.to_vec());
                // One attempt per `lock` call, like our `try_lock`; `lock` below re-applies
                // rslock's own retry policy for the contended scenario.
                manager.set_retry(1, Duration::from_millis(200));
                let subject = Subject::Rslock(manager);
                // rslock connects lazily, on first use: warm every connection now.
                subject
                    .cycle("bench:connect")
                    .await
                    .during("connecting rslock", "are the nodes running?")?;
                Ok(subject)
            }
        }
    }

    /// Runs uncontended cycles until one succeeds: a node that did not answer `INFO` in
    /// time at start-up (a loaded machine, or callgrind's slowdown) casts no vote until it
    /// is identified in the background, and the first measured cycles must not depend on
    /// that. Gives up, with the last failure, after `WARM_UP`.
    async fn warm_up(&self) -> Result<(), BenchError> {
        let started = tokio::time::Instant::now();
        let mut attempt = 0u64;
        loop {
            // A key per attempt: a failed release leaves the last one held for its TTL. Each
            // bounded, so that a hung cycle cannot hang the bench.
            let key = format!("bench:connect:{attempt}");
            let deadline = crate::latency::CYCLE_DEADLINE;
            let cycle = tokio::time::timeout(deadline, self.cycle(&key)).await;
            match cycle.unwrap_or_else(|_| Err(format!("no answer within {deadline:?}"))) {
                Ok(()) => return Ok(()),
                Err(why) if started.elapsed() >= WARM_UP => {
                    return Err(BenchError::new(
                        "warming up our client's connections",
                        why,
                        "check that the nodes are running and reachable; the cause names \
                         what each node answered",
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
            attempt += 1;
        }
    }

    /// One attempt: the lock, `Ok(None)` when it is taken, or a failure.
    pub async fn try_lock(&self, key: &str) -> Result<Option<Held>, String> {
        match self {
            Subject::Floor(floor) => match floor.acquire(key).await? {
                (true, token) => Ok(Some(Held::Floor(key.to_string(), token))),
                (false, token) => {
                    floor.release(key, &token).await?;
                    Ok(None)
                }
            },
            Subject::Ours(client) => match client.try_lock(key).await {
                Ok(guard) => Ok(Some(Held::Ours(guard))),
                Err(redlock_client::Error::NotAcquired { .. }) => Ok(None),
                Err(e) => Err(format!("ours: {e}")),
            },
            Subject::Permit(client) => match semaphore(client, key)?.try_acquire().await {
                Ok(guard) => Ok(Some(Held::Ours(guard))),
                Err(redlock_client::Error::NotAcquired { .. }) => Ok(None),
                Err(e) => Err(format!("ours-permit: {e}")),
            },
            Subject::Rw(client, write) => {
                let rw = client.rwlock(key).map_err(|e| format!("ours-rw: {e}"))?;
                let side = if *write {
                    rw.try_write().await
                } else {
                    rw.try_read().await
                };
                match side {
                    Ok(guard) => Ok(Some(Held::Ours(guard))),
                    Err(redlock_client::Error::NotAcquired { .. }) => Ok(None),
                    Err(e) => Err(format!("ours-rw: {e}")),
                }
            }
            Subject::PerNode(per_node) => Ok(per_node
                .try_acquire(key)
                .await?
                .map(|token| Held::PerNode(key.to_string(), token))),
            Subject::Rslock(manager) => match manager.lock(key.as_bytes(), TTL).await {
                Ok(lock) => Ok(Some(Held::Rslock(lock))),
                Err(rslock::LockError::Unavailable) => Ok(None),
                Err(e) => Err(format!("rslock: {e}")),
            },
        }
    }

    /// Waits for the lock under the library's own retry policy (and, for ours, wake-up on
    /// release when notifications are on). `Ok(None)`: the library gave up.
    pub async fn lock(&self, key: &str) -> Result<Option<Held>, String> {
        match self {
            Subject::Floor(_) => self.try_lock(key).await,
            Subject::Ours(client) => match client.lock_with(key, &LockOptions::default()).await {
                Ok(guard) => Ok(Some(Held::Ours(guard))),
                Err(
                    redlock_client::Error::NotAcquired { .. }
                    | redlock_client::Error::DeadlinePassed { .. },
                ) => Ok(None),
                Err(e) => Err(format!("ours: {e}")),
            },
            Subject::Rw(client, write) => {
                let rw = client.rwlock(key).map_err(|e| format!("ours-rw: {e}"))?;
                let side = if *write {
                    rw.write().await
                } else {
                    rw.read().await
                };
                match side {
                    Ok(guard) => Ok(Some(Held::Ours(guard))),
                    Err(
                        redlock_client::Error::NotAcquired { .. }
                        | redlock_client::Error::DeadlinePassed { .. },
                    ) => Ok(None),
                    Err(e) => Err(format!("ours-rw: {e}")),
                }
            }
            Subject::Permit(client) => match semaphore(client, key)?.acquire().await {
                Ok(guard) => Ok(Some(Held::Ours(guard))),
                Err(
                    redlock_client::Error::NotAcquired { .. }
                    | redlock_client::Error::DeadlinePassed { .. },
                ) => Ok(None),
                Err(e) => Err(format!("ours-permit: {e}")),
            },
            Subject::PerNode(per_node) => Ok(per_node
                .acquire(key)
                .await?
                .map(|token| Held::PerNode(key.to_string(), token))),
            Subject::Rslock(manager) => {
                // rslock's defaults: 3 attempts per `lock`, 0-200 ms apart; `acquire`
                // loops over `lock` until it succeeds.
                let mut manager = manager.clone();
                manager.set_retry(3, Duration::from_millis(200));
                match manager.acquire_no_guard(key.as_bytes(), TTL).await {
                    Ok(lock) => Ok(Some(Held::Rslock(lock))),
                    Err(e) => Err(format!("rslock: {e}")),
                }
            }
        }
    }

    /// One uncontended cycle: acquire, then release. Not acquiring is a failure here.
    pub async fn cycle(&self, key: &str) -> Result<(), String> {
        if let Subject::Ours(client) = self {
            // Straight to the client, so that a failure keeps its per-node report.
            let guard = client
                .try_lock(key)
                .await
                .map_err(|e| format!("ours: {e}"))?;
            return self.release(Held::Ours(guard)).await;
        }
        match self.try_lock(key).await? {
            Some(held) => self.release(held).await,
            None => Err(format!(
                "{key} was not acquired although nobody else holds it"
            )),
        }
    }

    pub async fn release(&self, held: Held) -> Result<(), String> {
        self.release_timed(held).await.map(|_| ())
    }

    /// [`release`](Self::release), with the round's own times for ours (P4's trace).
    pub async fn release_timed(&self, held: Held) -> Result<Option<ReleaseRound>, String> {
        if let Held::Ours(guard) = held {
            return match self {
                Subject::Ours(_) | Subject::Permit(_) | Subject::Rw(..) => guard
                    .release()
                    .await
                    .map(|report| Some(ReleaseRound::of(&report)))
                    .map_err(|e| format!("ours: release: {e}")),
                _ => Err("a lock was released through another contender (bench bug)".into()),
            };
        }
        self.release_other(held).await.map(|()| None)
    }

    async fn release_other(&self, held: Held) -> Result<(), String> {
        match (self, held) {
            (Subject::Floor(floor), Held::Floor(key, token)) => floor.release(&key, &token).await,
            (Subject::PerNode(per_node), Held::PerNode(key, token)) => {
                per_node.release(&key, &token).await
            }
            // Best effort by design: rslock reports nothing about its release.
            (Subject::Rslock(manager), Held::Rslock(lock)) => {
                manager.unlock(&lock).await;
                Ok(())
            }
            _ => Err("a lock was released through another contender (bench bug)".into()),
        }
    }

    /// Our client, for the contenders that are ours.
    pub fn redlock(&self) -> Option<&Redlock> {
        match self {
            Subject::Ours(client) | Subject::Permit(client) | Subject::Rw(client, _) => {
                Some(client)
            }
            _ => None,
        }
    }

    /// Closes what needs closing (our clients wait for their background work).
    pub async fn close(&self) {
        if let Subject::Ours(client) | Subject::Permit(client) | Subject::Rw(client, _) = self {
            client.shutdown().await;
        }
        if let Subject::PerNode(per_node) = self {
            per_node.close().await;
        }
    }
}

/// The semaphore of [`PERMITS`] permits that `key` names.
fn semaphore(client: &Redlock, key: &str) -> Result<redlock_client::Semaphore, String> {
    client
        .semaphore(key, PERMITS)
        .map_err(|e| format!("ours-permit: {e}"))
}

/// What ours' release round took, from its report: for P4's trace of a hand-off.
#[derive(Debug, Clone, Copy)]
pub struct ReleaseRound {
    /// From the round's first command sent to its decision.
    pub round: Duration,
    /// From the first command sent to the first reply, and to the reply that made the
    /// quorum.
    pub first_reply: Option<Duration>,
    pub quorum_reply: Option<Duration>,
}

impl ReleaseRound {
    fn of(report: &redlock_client::RoundReport) -> Self {
        let mut replies: Vec<Duration> = report.nodes.iter().filter_map(|n| n.latency).collect();
        replies.sort();
        ReleaseRound {
            round: report.elapsed,
            first_reply: replies.first().copied(),
            quorum_reply: report
                .quorum
                .checked_sub(1)
                .and_then(|q| replies.get(q))
                .copied(),
        }
    }
}

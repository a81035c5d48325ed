//! What a scenario works with: the nodes, one fault proxy per (client, node) link, the
//! history, and fault helpers that record what they inject.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redlock_client::{LockConfig, LockConfigBuilder, Redlock};
use redlock_testkit::{ClockControl, ClusterSet, Failover, LinkFault, Links, Nodes};

use crate::backend::{Backend, Setup};
use crate::error::LabError;
use crate::history::{FaultKind, History};
use crate::mix::Workload;
use crate::observer::Samples;

/// Settings shared by the scenarios. Short TTLs keep the whole lab within a few minutes.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Lock TTL.
    pub ttl: Duration,
    /// Per-node timeout of the clients.
    pub node_timeout: Duration,
    /// How long the workload of one scenario runs.
    pub run_for: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            ttl: Duration::from_secs(1),
            node_timeout: Duration::from_millis(50),
            run_for: Duration::from_secs(4),
        }
    }
}

/// The key under the scenario's prefix where the library keeps its fencing counter on each
/// node (`{key_prefix}fencing-counter`, see `LockConfig::fencing`). One key for every lock of
/// the node set, meant to stay: the leftover scan leaves it out, and the lab-side token
/// issuers of the demonstrations count under the same key.
pub const FENCING_COUNTER: &str = "fencing-counter";

/// Which of a scenario's clients take fenced locks (a [`FencingToken`] with every lock,
/// which the checker's token rule then judges).
///
/// [`FencingToken`]: redlock_client::FencingToken
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fencing {
    /// None: plain locks only.
    Off,
    /// Clients 0, 2, 4, ...: fenced and plain acquisitions interleave on the same key, so
    /// both kinds stay exercised, and the tokens of at least two clients (with three or
    /// more) are ordered against each other.
    EvenClients,
    /// Every client.
    All,
}

impl Fencing {
    /// Whether client `c` takes fenced locks.
    pub fn fenced(self, c: usize) -> bool {
        match self {
            Fencing::Off => false,
            Fencing::EvenClients => c.is_multiple_of(2),
            Fencing::All => true,
        }
    }
}

/// One scenario run's world.
#[derive(Debug)]
pub struct Lab {
    /// The node set; scenarios reach it through [`Lab::nodes`] and [`Lab::node_count`].
    pub backend: Backend,
    /// Client `c` reaches node `n` through `links.link(c, n)`.
    pub links: Links,
    /// The recorded history.
    pub history: History,
    /// Every key the scenario locks starts with this.
    pub prefix: String,
    /// TTLs and timeouts.
    pub timing: Timing,
    /// What the nodes were started with.
    pub setup: Setup,
    /// Which clients take fenced locks.
    pub fencing: Fencing,
    /// The observer's samples so far, for schedules that wait until the observer has seen
    /// what the checker needs.
    pub observed: Samples,
    /// What the contending clients run: plain cycles or the mix.
    pub workload: Workload,
    /// Whether this run is one of a soak's (the scenario run again and again until it has
    /// reached a number of acquisitions): scripted schedules may then run more rounds per
    /// run.
    pub soak: bool,
    /// Whether a shard of a cluster member was failed over: a release its master had not
    /// passed on to the replica is lost, and leaves the key to its TTL (see
    /// [`Lab::fail_over`]).
    pub failed_over: AtomicBool,
}

impl Lab {
    /// The node set, through testkit's interface for both backends (inspection with
    /// [`Nodes::redis`], names, clocks; inject faults through the methods of `Lab`, which
    /// record them). It is the whole set: use indices below [`Lab::node_count`] only.
    pub fn nodes(&self) -> &dyn Nodes {
        self.backend.nodes()
    }

    /// How many nodes the scenario uses ([`Setup::nodes`]): all local nodes, or the first of
    /// the docker set's five.
    pub fn node_count(&self) -> usize {
        self.setup.nodes
    }

    /// The longest TTL a lock key can be given in this run: the mix extends locks to twice
    /// the TTL ([`Op::ExtendLonger`](crate::Op::ExtendLonger)). A node that restarts empty
    /// must stay down longer than this (H2), not just longer than the configured TTL.
    pub fn max_ttl(&self) -> Duration {
        match self.workload {
            Workload::Plain | Workload::Semaphore(_) | Workload::RwLock => self.timing.ttl,
            Workload::Mix(_) => self.timing.ttl * 2,
        }
    }

    /// How long a fair waiter's queue entry outlives its last attempt with the lab's
    /// client configuration ([`LockConfig::fair_patience`]); zero if the configuration is
    /// refused (the scenario then fails on connecting anyway).
    pub fn fair_patience(&self) -> Duration {
        self.config(0)
            .build()
            .map_or(Duration::ZERO, |config| config.fair_patience())
    }

    /// How long the clients must go on contending after link faults that can cut off a
    /// waiter's leave (a blackhole, refused connections, a partition) before the leftover
    /// scan: a waiter whose call ended while it could not reach a node leaves its queue
    /// entry there for its patience, and a release in that time hands the key to that
    /// entry, where it stays for the waiter's TTL (as with a waiter that died): the
    /// patience and [`max_ttl`](Self::max_ttl), documented bounds both, so the scan must
    /// come after them.
    pub fn leave_settle(&self) -> Duration {
        self.fair_patience() + self.max_ttl()
    }

    /// Node `n`'s name, for fault descriptions.
    fn name(&self, n: usize) -> &str {
        self.nodes().name(n)
    }

    /// Where a scenario keeps a protected value in Redis: outside the lock prefix, since
    /// the leftover scan looks for lock keys.
    pub fn resource_key(&self) -> String {
        format!("resource:{}value", self.prefix)
    }

    /// The full key (with the prefix) of `key`.
    pub fn full_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// A client configuration for client `c`: its own links (a cluster member straight, by
    /// its URL), the lab's TTL and node timeout, no automatic renewal (the scenarios decide
    /// when a holder extends), fencing as the scenario's [`Fencing`] says, and a seed so
    /// the retry jitter differs per client.
    pub fn config(&self, c: usize) -> LockConfigBuilder {
        let mut urls = self.links.urls(c);
        for (n, url) in urls.iter_mut().enumerate() {
            if let Some(direct) = self.backend.direct_url(n) {
                *url = direct;
            }
        }
        LockConfig::builder()
            .nodes(urls)
            .ttl(self.timing.ttl)
            .node_timeout(self.timing.node_timeout)
            .key_prefix(self.prefix.clone())
            .no_renewal()
            .max_wait(self.timing.ttl * 2)
            .fencing(self.fencing.fenced(c))
            .seed(c as u64 + 1)
    }

    /// Connects client `c` with [`Lab::config`].
    pub async fn client(&self, c: usize) -> Result<Redlock, LabError> {
        self.client_with(c, |b| b).await
    }

    /// Connects client `c` with [`Lab::config`] changed by `tweak`. Under the semaphore and
    /// read-write workloads without fencing and the fair queue: their workloads ask for the
    /// fair queue per call, on half their loops.
    pub async fn client_with(
        &self,
        c: usize,
        tweak: impl FnOnce(LockConfigBuilder) -> LockConfigBuilder,
    ) -> Result<Redlock, LabError> {
        let mut config = tweak(self.config(c));
        if self.workload.takes_no_locks() {
            config = config.fencing(false).fair(false);
        }
        Ok(Redlock::connect(config.build()?).await?)
    }

    /// Seeds every node's fencing counter, as on a node set that has handed out tokens
    /// before: one fenced lock taken and released through client 0's links before the
    /// scenario starts (not recorded in the history). A fresh node set hands out its first
    /// token only once every node has answered without a counter (a missing counter is never
    /// counted as 0), so a fault that takes nodes down early in a run would otherwise leave
    /// the fenced clients without a single token, and the token rule with nothing to check.
    pub async fn seed_fencing_counters(&self) -> Result<(), LabError> {
        let seeder = self
            .client_with(0, |b| b.fencing(true).notify(false))
            .await?;
        let seeded = match seeder.lock("fencing-seed").await {
            Ok(guard) => guard.release().await.map(drop),
            Err(e) => Err(e),
        };
        seeder.shutdown().await;
        Ok(seeded?)
    }

    /// Connects clients `0..n`.
    pub async fn clients(&self, n: usize) -> Result<Vec<Redlock>, LabError> {
        let mut clients = Vec::with_capacity(n);
        for c in 0..n {
            clients.push(self.client(c).await?);
        }
        Ok(clients)
    }

    fn key_loss_on_restart(&self) -> FaultKind {
        if self.persistent() {
            FaultKind::Other
        } else {
            FaultKind::KeyLoss
        }
    }

    fn persistent(&self) -> bool {
        self.setup.persistent
    }

    /// Kills node `n`. Without persistence its keys are gone when it comes back, so this is
    /// recorded as key loss.
    pub async fn kill(&self, n: usize) -> Result<(), LabError> {
        let kind = self.key_loss_on_restart();
        self.history
            .fault(Some(n), kind, format!("kill {}", self.name(n)));
        Ok(self.nodes().kill(n).await?)
    }

    /// Cluster member `n`, or an error for a single server.
    fn cluster(&self, n: usize) -> Result<&ClusterSet, LabError> {
        self.backend.cluster(n).ok_or_else(|| {
            LabError::Setup(format!(
                "{} is a single server, not a cluster member",
                self.name(n)
            ))
        })
    }

    /// Fails shard `shard` of cluster member `n` over to its replica, as `how` says, and
    /// returns once the replica is master and the cluster is whole again. A `FORCE` or
    /// `TAKEOVER` failover loses what the master had not passed on to the replica, so it is
    /// recorded as key loss; and a lost release leaves its key to its TTL, which the
    /// leftover scan then waits out ([`Lab::failed_over`]).
    pub async fn fail_over(&self, n: usize, shard: usize, how: Failover) -> Result<(), LabError> {
        let kind = match how {
            Failover::Coordinated => FaultKind::Other,
            Failover::Force | Failover::Takeover => FaultKind::KeyLoss,
        };
        self.history.fault(
            Some(n),
            kind,
            format!("fail {} shard {shard} over ({how:?})", self.name(n)),
        );
        self.failed_over.store(true, Ordering::SeqCst);
        Ok(self.cluster(n)?.fail_over(shard, how).await?)
    }

    /// Holds back the replication of shard `shard` of cluster member `n`: what its master
    /// writes from now on stays there (see `ClusterSet::hold_back_replication`).
    pub async fn hold_back_replication(&self, n: usize, shard: usize) -> Result<(), LabError> {
        self.history.fault(
            Some(n),
            FaultKind::Other,
            format!("hold back {} shard {shard}'s replication", self.name(n)),
        );
        Ok(self.cluster(n)?.hold_back_replication(shard).await?)
    }

    /// Undoes [`Lab::hold_back_replication`].
    pub async fn resume_replication(&self, n: usize, shard: usize) -> Result<(), LabError> {
        self.history.fault(
            Some(n),
            FaultKind::Other,
            format!("resume {} shard {shard}'s replication", self.name(n)),
        );
        Ok(self.cluster(n)?.resume_replication(shard).await?)
    }

    /// Pauses node `n` (SIGSTOP or `docker pause`).
    pub async fn pause(&self, n: usize) -> Result<(), LabError> {
        self.history
            .fault(Some(n), FaultKind::Other, format!("pause {}", self.name(n)));
        Ok(self.nodes().pause(n).await?)
    }

    /// Resumes node `n`.
    pub async fn resume(&self, n: usize) -> Result<(), LabError> {
        self.history.fault(
            Some(n),
            FaultKind::Other,
            format!("resume {}", self.name(n)),
        );
        Ok(self.nodes().resume(n).await?)
    }

    /// Restarts node `n` at once.
    pub async fn restart(&self, n: usize) -> Result<(), LabError> {
        let kind = self.key_loss_on_restart();
        self.history
            .fault(Some(n), kind, format!("restart {} at once", self.name(n)));
        self.nodes().restart(n).await?;
        self.history
            .fault(Some(n), kind.end(), format!("{} is back", self.name(n)));
        Ok(())
    }

    /// Kills node `n` and starts it again after `delay`.
    pub async fn restart_after(&self, n: usize, delay: Duration) -> Result<(), LabError> {
        let kind = self.key_loss_on_restart();
        self.history.fault(
            Some(n),
            kind,
            format!("kill {}, restart in {delay:?}", self.name(n)),
        );
        self.nodes().restart_after(n, delay).await?;
        self.history
            .fault(Some(n), kind.end(), format!("{} is back", self.name(n)));
        Ok(())
    }

    /// `FLUSHALL` on node `n`: every key gone at once, the server still running (its run
    /// goes on, so only the missing counter tells the loss).
    pub async fn flush(&self, n: usize) -> Result<(), LabError> {
        self.history.fault(
            Some(n),
            FaultKind::KeyLoss,
            format!("FLUSHALL on {}", self.name(n)),
        );
        self.nodes().redis(n).flushall().await?;
        // The keys go when the command runs, between the two records: a sample that saw
        // a key after the first (the command still on its way) is explained too.
        self.history.fault(
            Some(n),
            FaultKind::KeyLossEnd,
            format!("FLUSHALL on {} done", self.name(n)),
        );
        Ok(())
    }

    /// `SAVE` on node `n`: a snapshot of every key now, which a later restart of a node
    /// without persistence loads (it comes back with that older data).
    pub async fn snapshot(&self, n: usize) -> Result<(), LabError> {
        self.history.fault(
            Some(n),
            FaultKind::Other,
            format!("SAVE on {}", self.name(n)),
        );
        Ok(self.nodes().redis(n).save().await?)
    }

    /// Evicts every key on node `n` through real memory pressure.
    pub async fn evict(&self, n: usize) -> Result<u64, LabError> {
        self.history.fault(
            Some(n),
            FaultKind::KeyLoss,
            format!("evict all keys on {}", self.name(n)),
        );
        Ok(self.nodes().evict_all(n).await?)
    }

    /// Node `n`'s clock shim, or why there is none.
    fn clock(&self, n: usize) -> Result<&ClockControl, LabError> {
        self.nodes().clock(n).ok_or_else(|| {
            LabError::Setup(format!(
                "{} has no clock shim: the scenario must ask for fake_clock",
                self.name(n)
            ))
        })
    }

    /// Sets node `n`'s clock rate (1.0 = real time).
    pub fn clock_rate(&self, n: usize, rate: f64) -> Result<(), LabError> {
        let clock = self.clock(n)?;
        self.history.fault(
            Some(n),
            FaultKind::Other,
            format!("clock rate {rate} on {}", self.name(n)),
        );
        clock.set_rate(rate)?;
        Ok(())
    }

    /// Steps node `n`'s wall clock by `by_ms` milliseconds at once (negative: back). Recorded
    /// from the step until the shim has surely applied it (it re-reads its control file
    /// about every 10 ms): a step forward as key loss (it expires keys early there), a step
    /// back as [`FaultKind::ClockBack`] (it moves their expiry later, which the checker
    /// would otherwise take for a foreign extension, and removes nothing).
    pub async fn clock_jump(&self, n: usize, by_ms: i64) -> Result<(), LabError> {
        let clock = self.clock(n)?;
        // Forward, keys there may expire early (key loss on that node); back, they only
        // outlive their PTTL, which excuses an expiry moving later and nothing else.
        let kind = if by_ms > 0 {
            FaultKind::ClockForward(Duration::from_millis(by_ms.unsigned_abs()))
        } else {
            FaultKind::ClockBack
        };
        self.history.fault(
            Some(n),
            kind,
            format!("clock of {} steps {by_ms:+} ms", self.name(n)),
        );
        clock.jump(by_ms)?;
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.history.fault(
            Some(n),
            kind.end(),
            format!("{}'s clock step applied", self.name(n)),
        );
        Ok(())
    }

    /// Sets the fault of client `c`'s link to node `n`.
    pub fn link(&self, c: usize, n: usize, fault: LinkFault) {
        self.history.fault(
            Some(n),
            FaultKind::Other,
            format!("client-{c} -> {}: {fault:?}", self.name(n)),
        );
        self.links.link(c, n).set(fault);
    }

    /// Sets the same fault on node `n`'s link from every client.
    pub fn node_links(&self, n: usize, fault: LinkFault) {
        self.history.fault(
            Some(n),
            FaultKind::Other,
            format!("every client -> {}: {fault:?}", self.name(n)),
        );
        self.links.set_node(n, fault);
    }

    /// Cuts node `n` off from every client ([`Nodes::partition`]): `docker network
    /// disconnect` on the docker set, blackholed links for local nodes (which share the
    /// host's loopback).
    pub async fn partition(&self, n: usize) -> Result<(), LabError> {
        self.history.fault(
            Some(n),
            FaultKind::Other,
            format!("partition {} from every client", self.name(n)),
        );
        Ok(self.nodes().partition(n, &self.links).await?)
    }

    /// Undoes [`Lab::partition`] ([`Nodes::heal`]).
    pub async fn heal(&self, n: usize) -> Result<(), LabError> {
        self.history.fault(
            Some(n),
            FaultKind::Other,
            format!("heal the partition of {}", self.name(n)),
        );
        Ok(self.nodes().heal(n, &self.links).await?)
    }

    /// Heals every link.
    pub fn heal_links(&self) {
        self.history
            .fault(None, FaultKind::Other, "heal every link");
        self.links.heal_all();
    }
}

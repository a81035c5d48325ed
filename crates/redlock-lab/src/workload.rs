//! The workload: clients contending for a key to update a protected value, recording every
//! acquisition, write and release in the history. The scenarios and the demo both run it.

use std::collections::BTreeMap;
use std::iter::Sum;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redlock_client::{Error, LockGuard, NodeOutcome, Redlock, RoundReport};
use tokio::time::Instant;

use crate::history::{Event, History};

/// How long the critical section holds the value between its read and its write.
pub const CRITICAL_SECTION: Duration = Duration::from_millis(1);
/// A well-behaved holder writes only with at least this much validity left (H4: stop using
/// the lock before its validity ends, with room for the write itself).
pub const WRITE_MARGIN: Duration = Duration::from_millis(100);

/// The protected value: a counter updated by read, pause, write. Without mutual exclusion
/// updates get lost, which the checker detects from the recorded reads and writes.
#[derive(Debug, Default)]
pub struct Resource {
    value: AtomicU64,
    /// Whether an [`update`](Self::update) is in progress.
    busy: AtomicBool,
    overlaps: AtomicU64,
}

impl Resource {
    /// Reads the value (and when).
    pub fn read(&self, history: &History) -> (u64, Duration) {
        (self.value.load(Ordering::SeqCst), history.now())
    }

    /// Writes `read + 1` and records the write.
    pub fn write(&self, history: &History, client: &str, token: &str, read: (u64, Duration)) {
        self.value.store(read.0 + 1, Ordering::SeqCst);
        history.record(Event::Write {
            client: client.to_owned(),
            token: token.to_owned(),
            read_at: read.1,
            wrote_at: history.now(),
            read: read.0,
            wrote: read.0 + 1,
        });
    }

    /// One full update inside a critical section. An update that starts while another is
    /// in progress is counted in [`overlaps`](Self::overlaps).
    pub async fn update(&self, history: &History, client: &str, token: &str) {
        if self.busy.swap(true, Ordering::SeqCst) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let read = self.read(history);
        tokio::time::sleep(CRITICAL_SECTION).await;
        self.write(history, client, token, read);
        self.busy.store(false, Ordering::SeqCst);
    }

    /// The current value.
    pub fn value(&self) -> u64 {
        self.value.load(Ordering::SeqCst)
    }

    /// How many updates started while another was in progress: a quick count the demo
    /// prints; the checker finds every overlap, the unsafe writes of the demonstrations
    /// included, from the history.
    pub fn overlaps(&self) -> u64 {
        self.overlaps.load(Ordering::SeqCst)
    }
}

/// Records a won lock and returns its token.
pub fn record_acquired(history: &History, client: &str, guard: &LockGuard) -> String {
    let lock = guard.lock();
    let acquired = history.now();
    let token = lock.token().as_str().to_owned();
    history.record(Event::Acquired {
        client: client.to_owned(),
        token: token.clone(),
        key: guard.key(),
        started: acquired.saturating_sub(lock.report().elapsed),
        acquired,
        valid_until: history.at(guard.valid_until()),
    });
    token
}

/// Releases `guard`, recording the start of the release first (the claim ends there).
pub async fn release(history: &History, client: &str, token: &str, guard: LockGuard) {
    release_round(history, client, token, guard).await;
}

/// [`release`], returning the release round's report when the round ran.
async fn release_round(
    history: &History,
    client: &str,
    token: &str,
    guard: LockGuard,
) -> Option<RoundReport> {
    history.record(Event::ReleaseStarted {
        client: client.to_owned(),
        token: token.to_owned(),
        at: history.now(),
    });
    match guard.release().await {
        Ok(report) => Some(report),
        Err(error) => {
            tracing::debug!(client, %error, "release failed");
            None
        }
    }
}

/// What one contention run did, for one client or summed over all.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Locks won.
    pub acquired: u64,
    /// `lock()` calls that gave up.
    pub failed: u64,
    /// Holders that skipped their write because too little validity was left.
    pub skipped_writes: u64,
    /// Rounds run by `lock()` calls, won or given up (a call that gave up without saying how
    /// many it ran counts one).
    pub rounds: u64,
    /// What each node answered in the rounds that decided something (the winning round of a
    /// `lock()` call, the last round of one that gave up, each release round), at the moment
    /// each was decided: counts by node index and [`outcome_label`].
    pub outcomes: BTreeMap<(usize, String), u64>,
    /// How long each `lock()` call took, retries included, won or given up.
    pub lock_waits: Vec<Duration>,
    /// How long each release round that ran took.
    pub release_rounds: Vec<Duration>,
}

impl Tally {
    /// Updates of the protected value: the locks won whose holder did not skip its write.
    pub fn writes(&self) -> u64 {
        self.acquired - self.skipped_writes
    }

    fn add(&mut self, other: &Tally) {
        self.acquired += other.acquired;
        self.failed += other.failed;
        self.skipped_writes += other.skipped_writes;
        self.rounds += other.rounds;
        for (key, count) in &other.outcomes {
            *self.outcomes.entry(key.clone()).or_default() += count;
        }
        self.lock_waits.extend_from_slice(&other.lock_waits);
        self.release_rounds.extend_from_slice(&other.release_rounds);
    }

    fn record_round(&mut self, report: &RoundReport) {
        for (node, answer) in report.nodes.iter().enumerate() {
            *self
                .outcomes
                .entry((node, outcome_label(&answer.outcome)))
                .or_default() += 1;
        }
    }
}

/// Sums the tallies of several clients.
impl<'a> Sum<&'a Tally> for Tally {
    fn sum<I: Iterator<Item = &'a Tally>>(tallies: I) -> Tally {
        let mut total = Tally::default();
        for tally in tallies {
            total.add(tally);
        }
        total
    }
}

/// A node's answer as [`Tally::outcomes`] counts it: connection errors together, whatever
/// their message says, so that a dead node shows as one line.
pub fn outcome_label(outcome: &NodeOutcome) -> String {
    match outcome {
        NodeOutcome::ConnectionError(_) => "connection error".to_owned(),
        other => other.to_string(),
    }
}

/// Every client loops until `until`: lock `key`, update the resource if enough validity is
/// left, release. Returns the summed tally.
pub async fn contend(
    history: &History,
    resource: &Arc<Resource>,
    clients: &[Redlock],
    key: &str,
    until: Instant,
) -> Tally {
    contend_each(history, resource, clients, key, until)
        .await
        .iter()
        .sum()
}

/// [`contend`], returning each client's own tally, in the order of `clients`. Client `c` is
/// `"client-c"` in the history.
pub async fn contend_each(
    history: &History,
    resource: &Arc<Resource>,
    clients: &[Redlock],
    key: &str,
    until: Instant,
) -> Vec<Tally> {
    let workers = clients.iter().enumerate().map(|(c, client)| {
        let (history, resource, client) = (history.clone(), resource.clone(), client.clone());
        let key = key.to_owned();
        async move {
            let name = format!("client-{c}");
            let mut tally = Tally::default();
            while Instant::now() < until {
                let started = Instant::now();
                let result = client.lock(&key).await;
                tally.lock_waits.push(started.elapsed());
                match result {
                    Ok(guard) => {
                        tally.acquired += 1;
                        tally.rounds += u64::from(guard.attempts());
                        tally.record_round(guard.lock().report());
                        let token = record_acquired(&history, &name, &guard);
                        if guard.remaining().is_some_and(|left| left >= WRITE_MARGIN) {
                            resource.update(&history, &name, &token).await;
                        } else {
                            tally.skipped_writes += 1;
                        }
                        let started = Instant::now();
                        if let Some(report) = release_round(&history, &name, &token, guard).await {
                            tally.release_rounds.push(started.elapsed());
                            tally.record_round(&report);
                        }
                    }
                    Err(error) => {
                        tally.failed += 1;
                        tally.rounds += u64::from(rounds_run(&error));
                        if let Some(report) = error.report() {
                            tally.record_round(report);
                        }
                        tracing::debug!(client = %name, %error, "lock failed");
                        if matches!(error, Error::Unreachable { .. }) {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
            }
            tally
        }
    });
    futures::future::join_all(workers).await
}

/// How many rounds a `lock()` call that gave up ran.
fn rounds_run(error: &Error) -> u32 {
    match error {
        Error::NotAcquired { attempts, .. } | Error::DeadlinePassed { attempts, .. } => *attempts,
        _ => 1,
    }
}

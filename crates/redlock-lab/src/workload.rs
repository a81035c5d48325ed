//! The workload: clients contending for a key to update a protected value, recording every
//! acquisition, write and release in the history. The scenarios and the demo both run it.

use std::collections::BTreeMap;
use std::iter::Sum;
use std::sync::Arc;
use std::time::Duration;

use redlock_client::{Error, FencingToken, LockGuard, NodeOutcome, Redlock, RoundReport};
use tokio::time::Instant;

use crate::error::LabError;
use crate::history::{Event, History};
use crate::resource::Resource;

/// A well-behaved holder writes only with at least this much validity left (H4: stop using
/// the lock before its validity ends, with room for the write itself).
pub const WRITE_MARGIN: Duration = Duration::from_millis(100);

/// Records a won lock, with its fencing token if it is fenced, and returns its token.
pub fn record_acquired(history: &History, client: &str, guard: &LockGuard) -> String {
    let fencing = guard.fencing_token().map(FencingToken::get);
    record_acquisition(history, client, guard, fencing)
}

/// Records a won lock with `fencing` as its fencing token (the library's, or one a lab-side
/// issuer made for it), and returns its token. Call it once the token is known: the
/// recorded end of the acquisition is now.
pub(crate) fn record_acquisition(
    history: &History,
    client: &str,
    guard: &LockGuard,
    fencing: Option<u64>,
) -> String {
    let lock = guard.lock();
    let acquired = history.now();
    let token = lock.token().as_str().to_owned();
    // The winning round's t0: its validity ends at t0 + elapsed + validity (the validity
    // left at the decision, `elapsed` after t0). Without a reported validity, the end less
    // the TTL is earlier still (valid_until = t0 + ttl - drift).
    let report = lock.report();
    let before = match report.validity {
        Some(left) => left + report.elapsed,
        None => lock.ttl(),
    };
    let started = lock
        .valid_until()
        .checked_sub(before)
        .map_or(Duration::ZERO, |t0| history.at(t0));
    history.record(Event::Acquired {
        client: client.to_owned(),
        token: token.clone(),
        key: guard.key(),
        started,
        acquired,
        valid_until: history.at(guard.valid_until()),
        fencing,
        owner: lock.owner().map(str::to_owned),
    });
    token
}

/// Releases `guard`, recording the start of the release first (the claim ends there).
pub async fn release(history: &History, client: &str, token: &str, guard: LockGuard) {
    release_round(history, client, token, guard).await;
}

/// [`release`], returning the release round's report when the round ran.
pub(crate) async fn release_round(
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

/// Runs `loops` loops at once on each of `clients`, loop `l` of client `c` being
/// `run(c, l, client)`, and returns each client's tally (its loops summed), in the order of
/// `clients`; the first loop that fails fails it all. The semaphore's and the read-write
/// lock's workloads run their loops so.
pub(crate) async fn per_client_loops<'a, F, Fut>(
    clients: &'a [Redlock],
    loops: usize,
    run: F,
) -> Result<Vec<Tally>, LabError>
where
    F: Fn(usize, usize, &'a Redlock) -> Fut + Copy,
    Fut: std::future::Future<Output = Result<Tally, LabError>>,
{
    let per_client = clients.iter().enumerate().map(|(c, client)| async move {
        let tallies = futures::future::try_join_all((0..loops).map(|l| run(c, l, client))).await?;
        Ok::<Tally, LabError>(tallies.iter().sum())
    });
    futures::future::try_join_all(per_client).await
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

    pub(crate) fn record_round(&mut self, report: &RoundReport) {
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
                            let fencing = guard.fencing_token();
                            let update = resource.update(&history, &name, &token, fencing);
                            if let Err(error) = update.await {
                                tracing::warn!(client = %name, %error, "update failed");
                            }
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
pub(crate) fn rounds_run(error: &Error) -> u32 {
    match error {
        Error::NotAcquired { attempts, .. } | Error::DeadlinePassed { attempts, .. } => *attempts,
        _ => 1,
    }
}

//! The workload: clients contending for a key to update a protected value, recording every
//! acquisition, write and release in the history.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redlock_client::{Error, LockGuard, Redlock};
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

    /// One full update inside a critical section.
    pub async fn update(&self, history: &History, client: &str, token: &str) {
        let read = self.read(history);
        tokio::time::sleep(CRITICAL_SECTION).await;
        self.write(history, client, token, read);
    }

    /// The current value.
    pub fn value(&self) -> u64 {
        self.value.load(Ordering::SeqCst)
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
    history.record(Event::ReleaseStarted {
        client: client.to_owned(),
        token: token.to_owned(),
        at: history.now(),
    });
    if let Err(error) = guard.release().await {
        tracing::debug!(client, %error, "release failed");
    }
}

/// What one contention run did.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Locks won.
    pub acquired: u64,
    /// `lock()` calls that gave up.
    pub failed: u64,
    /// Holders that skipped their write because too little validity was left.
    pub skipped_writes: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.acquired += other.acquired;
        self.failed += other.failed;
        self.skipped_writes += other.skipped_writes;
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
    let workers = clients.iter().enumerate().map(|(c, client)| {
        let (history, resource, client) = (history.clone(), resource.clone(), client.clone());
        let key = key.to_owned();
        async move {
            let name = format!("client-{c}");
            let mut tally = Tally::default();
            while Instant::now() < until {
                match client.lock(&key).await {
                    Ok(guard) => {
                        tally.acquired += 1;
                        let token = record_acquired(&history, &name, &guard);
                        if guard.remaining().is_some_and(|left| left >= WRITE_MARGIN) {
                            resource.update(&history, &name, &token).await;
                        } else {
                            tally.skipped_writes += 1;
                        }
                        release(&history, &name, &token, guard).await;
                    }
                    Err(error) => {
                        tally.failed += 1;
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
    let mut total = Tally::default();
    for tally in futures::future::join_all(workers).await {
        total.add(&tally);
    }
    total
}

//! The protected value the workload updates: in memory, or (fenced) in a Redis behind
//! `fenced_set`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use fred::prelude::{Client, KeysInterface};
use redlock_client::{fenced_set, FencingToken};

use crate::error::LabError;
use crate::history::{At, Event, History};

/// How long the critical section holds the value between its read and its write.
pub const CRITICAL_SECTION: Duration = Duration::from_millis(1);

/// The protected value: a counter updated by read, pause, write. Without mutual exclusion
/// updates get lost, which the checker detects from the recorded reads and writes.
///
/// In memory by default. A [fenced](Resource::fenced) resource keeps the value in a Redis and
/// writes it only through [`fenced_set`], which rejects a write whose fencing token is lower
/// than one that wrote before: a rejected write is recorded as such and changes nothing.
#[derive(Debug, Default)]
pub struct Resource {
    value: AtomicU64,
    /// Whether an [`update`](Self::update) is in progress.
    busy: AtomicBool,
    overlaps: AtomicU64,
    rejected: AtomicU64,
    fenced: Option<FencedValue>,
}

/// Where a fenced resource keeps its value.
#[derive(Debug)]
struct FencedValue {
    redis: Client,
    key: String,
}

/// What a read saw: the value, and when.
pub type Read = (u64, At);

impl Resource {
    /// A fenced resource: the value lives under `key` in the Redis behind `redis` (a
    /// connection of the resource's own, not through the clients' fault proxies) and is
    /// written with [`fenced_set`]; the highest token is kept next to it
    /// ([`fence_record_key`](redlock_client::fence_record_key)).
    pub fn fenced(redis: Client, key: impl Into<String>) -> Resource {
        Resource {
            fenced: Some(FencedValue {
                redis,
                key: key.into(),
            }),
            ..Resource::default()
        }
    }

    /// Reads the value (and when).
    pub async fn read(&self, history: &History) -> Result<Read, LabError> {
        let value = match &self.fenced {
            None => self.value.load(Ordering::SeqCst),
            Some(f) => {
                let value: Option<String> = f.redis.get(&f.key).await?;
                value.map_or(Ok(0), |v| {
                    v.parse()
                        .map_err(|_| LabError::Setup(format!("{} holds {v:?}", f.key)))
                })?
            }
        };
        Ok((value, history.now()))
    }

    /// Writes `read + 1` and records the write. A fenced resource needs the writer's
    /// `fencing` token and may reject the write (`Ok(false)`, recorded as rejected).
    pub async fn write(
        &self,
        history: &History,
        client: &str,
        token: &str,
        fencing: Option<FencingToken>,
        read: Read,
    ) -> Result<bool, LabError> {
        let next = read.0 + 1;
        if let Some(f) = &self.fenced {
            let fencing = fencing.ok_or_else(|| {
                LabError::Setup(format!(
                    "{client} wrote a fenced resource without a fencing token: give the \
                     scenario's writers fenced locks"
                ))
            })?;
            if !fenced_set(&f.redis, &f.key, &next.to_string(), fencing).await? {
                self.rejected.fetch_add(1, Ordering::SeqCst);
                history.record(Event::WriteRejected {
                    client: client.to_owned(),
                    token: token.to_owned(),
                    fencing: fencing.get(),
                    read_at: read.1,
                    rejected_at: history.now(),
                    read: read.0,
                });
                return Ok(false);
            }
        }
        self.value.store(next, Ordering::SeqCst);
        history.record(Event::Write {
            client: client.to_owned(),
            token: token.to_owned(),
            read_at: read.1,
            wrote_at: history.now(),
            read: read.0,
            wrote: next,
        });
        Ok(true)
    }

    /// One full update inside a critical section; whether the write was accepted. An
    /// update that starts while another is in progress is counted in
    /// [`overlaps`](Self::overlaps).
    pub async fn update(
        &self,
        history: &History,
        client: &str,
        token: &str,
        fencing: Option<FencingToken>,
    ) -> Result<bool, LabError> {
        if self.busy.swap(true, Ordering::SeqCst) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let written = async {
            let read = self.read(history).await?;
            tokio::time::sleep(CRITICAL_SECTION).await;
            self.write(history, client, token, fencing, read).await
        }
        .await;
        self.busy.store(false, Ordering::SeqCst);
        written
    }

    /// The value the last accepted write produced.
    pub fn value(&self) -> u64 {
        self.value.load(Ordering::SeqCst)
    }

    /// How many updates started while another was in progress: a quick count the demo
    /// prints; the checker finds every overlap, the unsafe writes of the demonstrations
    /// included, from the history.
    pub fn overlaps(&self) -> u64 {
        self.overlaps.load(Ordering::SeqCst)
    }

    /// How many writes a fenced resource rejected.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::SeqCst)
    }
}

//! A read-write lock: readers share it, a writer holds it alone, and a waiting writer
//! holds new readers back so that a stream of readers cannot starve it. Each side's hold
//! is a guard like a lock's (renewed, released on drop, with a loss signal).
//!
//! How the nodes keep it, and why no reader and writer overlap: see `redlock_core`'s
//! `Coordinator::acquire_rw`.

use std::sync::{Arc, Mutex, PoisonError};

use redlock_core::ArgumentError;

use crate::acquire::{acquire, LockOptions, Shape};
use crate::client::Redlock;
use crate::error::Error;
use crate::guard::{LockGuard, LockHandle};
use crate::retry::RetryPolicy;

/// The read-write lock `name`, from [`Redlock::rwlock`]. One `RwLock` value, with its
/// clones, is one owner: it may hold the read side several times, or the write side, but
/// it may not ask for the write side while it holds the read side (there is no upgrade:
/// two readers that both upgraded would wait for each other for ever), which fails with
/// [`ArgumentError::Upgrade`] and sends nothing.
///
/// ```no_run
/// # async fn demo(client: redlock_client::Redlock) -> Result<(), redlock_client::Error> {
/// let config = client.rwlock("config")?;
/// let reading = config.read().await?; // shared with other readers
/// reading.release().await?;
/// let writing = config.write().await?; // alone
/// writing.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// A writer refused by readers leaves its intent on the nodes while it keeps trying (for
/// the client's fair patience after each attempt), and new readers wait for it; it takes
/// the intent back when its call ends. With fencing on, a writer's guard carries a fencing
/// token; readers get none. With notifications on, a reader is woken by the writer's
/// release, a writer by it or the last reader's.
///
/// With the fair queue ([`LockOptions::fair`], or a client configured with
/// [`fair`](crate::LockConfigBuilder::fair)), both sides wait in the lock's one queue:
/// writers go one at a time in the order they came, readers that came between two writers
/// share the lock, and a reader that came after a waiting writer waits for it. Nothing is
/// handed over (a writer must see the readers): a release, or a waiter that wins or leaves,
/// wakes the queue's next waiter, which runs its round.
#[derive(Clone, Debug)]
pub struct RwLock {
    client: Redlock,
    name: String,
    shown: String,
    /// The read sides this owner took, for the upgrade check.
    reading: Arc<Mutex<Vec<LockHandle>>>,
}

impl Redlock {
    /// The read-write lock `name`. Nothing is sent until a side is acquired. Fails with
    /// [`Error::InvalidArgument`] for an empty or too long name.
    pub fn rwlock(&self, name: &str) -> Result<RwLock, Error> {
        redlock_core::support::check_key(name)?;
        Ok(RwLock {
            client: self.clone(),
            name: name.to_string(),
            shown: redlock_core::layout::named_base(
                &self.coordinator().config().rwlock_prefix,
                name,
            ),
            reading: Arc::default(),
        })
    }
}

impl RwLock {
    /// The read-write lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What its keys start with, `<key_prefix>rwlock-{name}`: how errors and traces name it.
    pub fn base_key(&self) -> &str {
        &self.shown
    }

    /// Acquires the read side, shared with other readers, retrying under the client's
    /// retry policy. Cancel-safe as [`Redlock::lock`] is.
    pub async fn read(&self) -> Result<LockGuard, Error> {
        self.read_with(&LockOptions::default()).await
    }

    /// [`read`](Self::read) with per-call overrides.
    pub async fn read_with(&self, options: &LockOptions) -> Result<LockGuard, Error> {
        let shape = Shape::Rw {
            name: &self.name,
            shown: &self.shown,
            writer: None,
        };
        let guard = acquire(&self.client.inner, shape, options).await?;
        let mut reading = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
        reading.retain(LockHandle::is_valid);
        reading.push(guard.handle());
        Ok(guard)
    }

    /// Acquires the write side, alone, retrying under the client's retry policy.
    /// Fails with [`ArgumentError::Upgrade`] while this owner holds the read side.
    pub async fn write(&self) -> Result<LockGuard, Error> {
        self.write_with(&LockOptions::default()).await
    }

    /// One attempt at the write side, no waiting.
    pub async fn try_write(&self) -> Result<LockGuard, Error> {
        let options = LockOptions {
            retry: Some(RetryPolicy::no_retry()),
            ..Default::default()
        };
        self.write_with(&options).await
    }

    /// One attempt at the read side, no waiting.
    pub async fn try_read(&self) -> Result<LockGuard, Error> {
        let options = LockOptions {
            retry: Some(RetryPolicy::no_retry()),
            ..Default::default()
        };
        self.read_with(&options).await
    }

    /// [`write`](Self::write) with per-call overrides.
    pub async fn write_with(&self, options: &LockOptions) -> Result<LockGuard, Error> {
        if self.holds_read_side() {
            return Err(ArgumentError::Upgrade {
                name: self.name.clone(),
            }
            .into());
        }
        let writer = crate::owner::random_id().to_string();
        let shape = Shape::Rw {
            name: &self.name,
            shown: &self.shown,
            writer: Some(&writer),
        };
        acquire(&self.client.inner, shape, options).await
    }

    /// Whether this owner holds the read side now.
    fn holds_read_side(&self) -> bool {
        let mut reading = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
        reading.retain(LockHandle::is_valid);
        !reading.is_empty()
    }
}

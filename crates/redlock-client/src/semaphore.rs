//! A semaphore: at most a number of holders of one name at once, each holding a permit
//! that is a guard like a lock's (renewed, released on drop, with a loss signal).
//!
//! Each permit is a Redlock key of its own, so the bound holds as a lock's exclusion
//! does: see `redlock_core`'s `Coordinator::acquire_permit`.

use redlock_core::{ArgumentError, MAX_PERMITS};

use crate::acquire::{acquire, LockOptions, Shape};
use crate::client::Redlock;
use crate::error::Error;
use crate::guard::LockGuard;
use crate::retry::RetryPolicy;

/// A semaphore of `permits` permits under one name, from [`Redlock::semaphore`].
///
/// ```no_run
/// # async fn demo(client: redlock_client::Redlock) -> Result<(), redlock_client::Error> {
/// let encoders = client.semaphore("encoders", 4)?;
/// let permit = encoders.acquire().await?; // one of at most 4 holders
/// // ... work while `permit.is_valid()` ...
/// permit.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// A permit's guard names its permit in its key (`<key_prefix>semaphore-{name}:<i>`).
/// A waiter tries again after its retry policy's delay: a release does not wake it (that
/// cost more than it gained under contention). Fenced permits carry a token to check per
/// permit.
///
/// With the fair queue ([`LockOptions::fair`](crate::LockOptions::fair), or a client
/// configured with [`fair`](crate::LockConfigBuilder::fair)), waiters queue once per
/// semaphore, and on each node only the oldest try, as many as it has free permits: late
/// comers neither overtake them nor split their votes. They still try again after their
/// policy's delay; nothing is handed over.
#[derive(Clone, Debug)]
pub struct Semaphore {
    client: Redlock,
    name: String,
    shown: String,
    permits: u32,
}

impl Redlock {
    /// The semaphore `name` with `permits` permits: at most `permits` holders at once,
    /// across every client of the same nodes that names it with the same number of
    /// permits. Nothing is sent until a permit is acquired.
    ///
    /// Fails with [`Error::InvalidArgument`] for an empty name, or for zero permits or
    /// more than [`MAX_PERMITS`].
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore, Error> {
        if !(1..=MAX_PERMITS).contains(&permits) {
            return Err(ArgumentError::Permits {
                permits,
                max: MAX_PERMITS,
            }
            .into());
        }
        redlock_core::support::check_key(name)?;
        Ok(Semaphore {
            client: self.clone(),
            name: name.to_string(),
            shown: redlock_core::layout::named_base(
                &self.coordinator().config().semaphore_prefix,
                name,
            ),
            permits,
        })
    }
}

impl Semaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many holders it admits at once.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// What its permits' keys start with, `<key_prefix>semaphore-{name}` (permit `i` is
    /// `<base>:<i>`): how errors and traces name the semaphore.
    pub fn base_key(&self) -> &str {
        &self.shown
    }

    /// Which of this semaphore's permits `guard` holds, from 1 to
    /// [`permits`](Self::permits): for work that goes with the permit (the second of four
    /// GPUs). `None` for a guard of another semaphore or lock.
    pub fn permit(&self, guard: &LockGuard) -> Option<u32> {
        let key = guard.key();
        let i: u32 = key
            .strip_prefix(&self.shown)?
            .strip_prefix(':')?
            .parse()
            .ok()?;
        (1..=self.permits).contains(&i).then_some(i)
    }

    /// Acquires a permit, retrying under the client's retry policy: the permit's guard.
    /// Cancel-safe as [`Redlock::lock`] is.
    pub async fn acquire(&self) -> Result<LockGuard, Error> {
        self.acquire_with(&LockOptions::default()).await
    }

    /// One attempt, no waiting: a permit, or why not.
    pub async fn try_acquire(&self) -> Result<LockGuard, Error> {
        let options = LockOptions {
            retry: Some(RetryPolicy::no_retry()),
            ..Default::default()
        };
        self.acquire_with(&options).await
    }

    /// [`acquire`](Self::acquire) with per-call overrides.
    pub async fn acquire_with(&self, options: &LockOptions) -> Result<LockGuard, Error> {
        let shape = Shape::Permit {
            name: &self.name,
            shown: &self.shown,
            permits: self.permits,
        };
        acquire(&self.client.inner, shape, options).await
    }
}

//! Redlock locks for Rust services: the API to call.
//!
//! Built on [`redlock_core`] (one round over N independent Redis masters), this crate adds
//! the policy a service needs:
//!
//! - [`Redlock::try_lock`] (one attempt) and [`Redlock::lock`] (retries with exponential
//!   backoff and full jitter, a fresh token per attempt, an overall deadline; cancel-safe);
//! - wake-up on release: the holder's release publishes on every node and waiting clients
//!   retry at once, through one shared subscriber connection per node;
//! - [`LockGuard`]: validity, `extend`, an explicit async `release` that reports each node,
//!   release in the background when dropped, and a [`lost`](LockGuard::lost) signal;
//! - automatic renewal by one scheduler per client that renews all due locks in one round
//!   (one command per node), with an optional cap on the total hold time;
//! - [`Redlock::with_lock`]: acquire, renew, run, cancel on loss, release, also on panic;
//! - multi-key locks ([`Redlock::lock_many`]) and reentrant locks by [`Owner`];
//! - [`Redlock::inspect`]: whether a key is held, by whom and for how long, from a quorum
//!   read, and [`LockGuard::check`]: whether it is still held for this guard;
//! - [`Redlock::release_token`] and [`Redlock::extend_token`]: release or extend a lock
//!   from another process, by its stored [`Token`];
//! - a minimum validity ([`LockConfig::min_validity`]): rounds won with less left are
//!   released and retried;
//! - metrics through the `metrics` facade (acquisitions, waits, renewals, held and lost
//!   locks; every name in [`redlock_core::metrics`]) and `debug` tracing spans;
//! - configuration as a plain struct with a builder, durations as humantime text
//!   (`"30s"`) with the `serde` feature.
//!
//! Read the guarantees and assumptions (H1-H4) in [`redlock_core`]'s documentation: in short,
//! independent masters with persistence or delayed restarts, sane clocks, and a holder that
//! stops using the resource as soon as its lock is not valid.
//!
//! ```no_run
//! use redlock_client::{LockConfig, Redlock};
//!
//! # async fn demo() -> Result<(), redlock_client::Error> {
//! let client = Redlock::connect(
//!     LockConfig::builder()
//!         .nodes((7101..=7105).map(|p| format!("redis://127.0.0.1:{p}")))
//!         .build()?,
//! )
//! .await?;
//! let guard = client.lock("reports:daily").await?;
//! // ... guard.is_valid() ...
//! let report = guard.release().await?;
//! println!("{report}");
//! # Ok(()) }
//! ```
//!
//! # Calling from synchronous code
//!
//! There is no blocking wrapper type: the client needs a runtime that keeps running
//! between calls (renewal, wake-up on release, background releases of dropped guards run
//! as tasks), so a wrapper owning a current-thread runtime would stop renewing the moment
//! `lock` returned. Own a multi-threaded runtime instead (one worker thread is enough) and
//! `block_on` each call; `release` guards to know the outcome (a guard dropped anywhere,
//! even on a plain thread, is released in the background in the client's runtime):
//!
//! ```no_run
//! use redlock_client::{LockConfig, Redlock};
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let runtime = tokio::runtime::Builder::new_multi_thread()
//!         .worker_threads(1)
//!         .enable_all()
//!         .build()?;
//!     let config = LockConfig::builder()
//!         .nodes(["redis://127.0.0.1:7101", "redis://127.0.0.1:7102", "redis://127.0.0.1:7103"])
//!         .build()?;
//!     let client = runtime.block_on(Redlock::connect(config))?;
//!     let guard = runtime.block_on(client.lock("nightly-export"))?;
//!     // ... blocking work; the runtime's worker renews the lock meanwhile ...
//!     runtime.block_on(guard.release())?;
//!     Ok(())
//! }
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs, missing_debug_implementations)]

mod acquire;
mod builder;
mod client;
mod config;
mod error;
mod guard;
mod metrics;
mod notify;
mod owner;
mod renew;
mod resource;
mod retry;
mod rwlock;
mod semaphore;
mod shared;

pub use acquire::LockOptions;
pub use builder::LockConfigBuilder;
pub use client::Redlock;
pub use config::LockConfig;
pub use error::{Error, InvalidConfig, LostReason};
pub use guard::{HoldHealth, LockGuard, LockHandle};
pub use owner::Owner;
pub use redlock_core;
pub use redlock_core::{
    ArgumentError, FencingCounter, FencingCounters, FencingToken, HealthPolicy, HealthProblem,
    Holder, Inspection, NodeHealth, NodeOutcome, RoundReport, ServerError, ServerErrorKind,
    TlsConfig, Token, MAX_FENCING_COUNTER, MAX_PERMITS,
};
pub use renew::policy::RenewalPolicy;
pub use resource::{fence_record_key, fenced_set, FENCED_UPDATE_SQL};
pub use retry::{Backoff, RetryPolicy};
pub use rwlock::RwLock;
pub use semaphore::Semaphore;

// The README's examples, compiled as doc tests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

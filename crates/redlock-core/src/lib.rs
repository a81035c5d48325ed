//! One Redlock round over N independent Redis masters, done right.
//!
//! `redlock-core` is the mechanism: a [`Coordinator`] fans a command out to every node
//! concurrently, decides as soon as a quorum (`N/2 + 1`) has accepted or can no longer
//! accept, takes clock drift off the validity, and rolls back on every node whatever a lost
//! (or cancelled) round set, including on nodes that answer late. It never retries: retry,
//! renewal and guards are policy, and live in `redlock-client`.
//!
//! # How it is built
//! - `round`: the one round engine. Every round (acquire one key, several keys or a
//!   reentrant hold; extend one lock or a batch; release; inspect) is one command per
//!   node and one request per lock, each request decided on its own quorum, its validity
//!   computed from the round's `t0` (`drift`), what is left after the decision (late
//!   answers, rollbacks) handed to one background task, and a drop guard for rounds
//!   abandoned before their decision.
//! - `group`: group commit. Plain acquisitions (and releases) of one key that start while
//!   one is in flight go out together in the next round, one script call per node, each
//!   still decided on its own; a lone one is a single `SET NX PX` (`Config::group_commit`).
//! - `connection`: one node's connection and the commands it sends, each bounded by the
//!   node timeout; the one place that builds fred clients for lock nodes (also the
//!   subscribers that [`Waiters::subscribers`](support::Waiters::subscribers) hands out); why a connection failed.
//! - `kind`: the lock kinds (a plain lock of one key, several keys, a reentrant hold), each
//!   the Lua of how a node holds it; `scripts` composes every script a lock needs from a
//!   kind and the modifiers (fenced, in a fair queue, grouped); `lock_spec`: a lock's
//!   identity (keys, token, kind) and the commands built from it; `quorum`, `drift`: the
//!   arithmetic; `coordinator`: the public API.
//! - `fair`: the fair queue (`fair/place.rs`, its values: a waiter's place, the hand-over
//!   token; `fair/mod.rs`, leaving the queue and taking a handed-over lock); `fence`:
//!   fencing tokens and the repair of lost counters.
//! - [`message`] and [`layout`], at the bottom: the release channel's wire format (the Lua
//!   that writes it and the parser the client reads it with) and the name of every key
//!   stored beside a lock key (hash-tagged to share its slot).
//! - [`support`]: what a client crate built on the core uses beside the rounds (the fair
//!   queue's values and the coordinator's [`Waiters`](support::Waiters), the host-suspend
//!   clock, lock names, the checks of a key and a TTL); the crate root lists what services
//!   call.
//! - [`metrics`]: the name of every metric both crates record through the `metrics` facade
//!   (rounds, node answers, rollbacks here; acquisitions and renewals in the client).
//!
//! # Guarantees
//! - never reports success with fewer than a quorum of confirmed `SET NX` (G1);
//! - validity is `ttl - (now - t0) - drift` with `t0` read before the first send, and a
//!   round succeeds only if it is positive (G2);
//! - only ever deletes or extends a key that holds its own token (G3);
//! - after a failed or cancelled acquisition, runs compare-and-delete on all N nodes (G4);
//! - tokens are random UUIDs, unique per attempt (G5).
//!
//! # Assumptions (outside them mutual exclusion can break)
//! - independent members, each a standalone master or a whole cluster (`redis-cluster://`),
//!   the same N for every client (H1);
//! - no key vanishes before its TTL: `appendfsync always` or delayed restarts,
//!   `maxmemory-policy noeviction`, no `FLUSHALL` (H2);
//! - server clock rates within the drift budget, no wall-clock jumps (H3);
//! - the holder stops using the lock before its validity ends (H4): use fencing at the
//!   resource if a holder can pause.
//!
//! ```no_run
//! # async fn demo() -> Result<(), redlock_core::Error> {
//! use std::time::Duration;
//! use redlock_core::{Config, Coordinator, Error};
//!
//! let coordinator = Coordinator::connect(Config {
//!     nodes: (7001..=7005).map(|p| format!("redis://127.0.0.1:{p}")).collect(),
//!     ..Default::default()
//! })
//! .await?;
//! match coordinator.acquire("report:2026-11", Duration::from_secs(10)).await {
//!     Ok(lock) => {
//!         println!("valid for {:?}", lock.remaining());
//!         coordinator.release(&lock).await?;
//!     }
//!     Err(Error::NoQuorum { report }) => println!("not acquired: {report}"),
//!     Err(other) => return Err(other),
//! }
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs, missing_debug_implementations)]

mod acquire;
mod config;
mod connection;
mod coordinator;
mod deadline;
mod drift;
mod error;
mod fair;
mod fence;
mod group;
mod health;
mod hold;
mod inspect;
mod kind;
pub mod layout;
mod lock;
mod lock_spec;
pub mod message;
pub mod metrics;
mod node_name;
mod quorum;
mod report;
mod round;
mod scripts;
mod server_error;
pub mod support;
mod tls;
mod token;

pub use acquire::{Acquisition, PermitAcquisition, RwAcquisition, MAX_PERMITS};
pub use config::{
    Config, HealthPolicy, DEFAULT_FAIR_PREFIX, DEFAULT_FENCE_KEY, DEFAULT_NODE_TIMEOUT,
    DEFAULT_RWLOCK_PREFIX, DEFAULT_SEMAPHORE_PREFIX, MAX_KEY_LEN, MAX_NODE_TIMEOUT, MAX_TTL,
};
pub use coordinator::Coordinator;
#[cfg(feature = "test-util")]
pub use deadline::simulate_host_suspend;
pub use deadline::Deadline;
pub use drift::{drift, validity, DEFAULT_DRIFT_FACTOR, DRIFT_FLOOR};
pub use error::{ArgumentError, ConfigError, Error};
#[cfg(feature = "test-util")]
pub use fence::Safeguard;
pub use fence::{
    repair::REPAIR_WAIT, FencingCounter, FencingCounters, FencingToken, MAX_FENCING_COUNTER,
    WRITE_BACK_WINDOW,
};
pub use health::{ClusterState, HealthProblem, NodeHealth};
pub use hold::EXTEND_BATCH_LOCKS;
pub use inspect::{Holder, Inspection};
pub use lock::{Lock, Renewed};
pub use quorum::quorum;
pub use report::{
    CleanupOutcome, ClosedReason, NodeName, NodeOutcome, NodeReport, RoundKind, RoundReport,
};
pub use server_error::{ServerError, ServerErrorKind};
pub use tls::TlsConfig;
pub use token::{Token, MAX_TOKEN_LEN};

// The README's examples, compiled as doc tests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! The redlock fault lab.
//!
//! Scenarios start a node set (local redis-server processes, or the docker-compose set),
//! put a TCP fault proxy on every (client, node) link, run clients that contend for a lock to
//! update a protected value, and inject faults: kills, pauses, restarts with and without
//! persistence, partitions, latency, held or dropped replies, clock skew, eviction. Every
//! acquisition, release, extension and write is recorded with the lab's monotonic clock, and
//! an observer samples each lock key on each node. The [`checker`] then reports overlapping
//! validity windows, lost updates, stale writes, keys left behind, tokens removed or
//! extended by a non-owner, and fencing tokens that repeat or go backwards in the real-time
//! order of acquisitions (the must-pass scenarios give every second client fenced locks).
//!
//! In the must-pass scenarios the clients run a [mix](Mix) of every path of the client's
//! API (reentrant holds, extensions, renewal, multi-key locks, dropped guards, cancelled
//! calls), and [`soak()`] repeats each until it has reached a number of acquisitions. With
//! the semaphore workload ([`Workload::Semaphore`]) they take permits of a semaphore
//! instead, which the checker's semaphore rule judges; with the read-write workload
//! ([`Workload::RwLock`]) the read and write sides of a read-write lock, which the rule of
//! a writer alone judges.
//!
//! Must-pass scenarios expect zero violations; demonstrations break an assumption of
//! Redlock (H2-H4 in the README) or a step of the fencing design, and expect the checker to
//! report the violation that follows.
//!
//! Run it with `cargo run --release -p redlock-lab -- --help`, or as part of `cargo test`
//! (the `fault_lab` test of the workspace).
#![forbid(unsafe_code)]
#![deny(missing_docs, missing_debug_implementations)]

mod backend;
pub mod checker;
mod error;
mod history;
mod holder;
mod host_clock;
mod lab;
mod logging;
mod mix;
mod observer;
mod outcome;
mod permits;
mod raw;
mod resource;
mod rwlocks;
mod scenario;
mod scenarios;
pub mod soak;
mod suite;
mod workload;

pub use backend::{Backend, BackendKind, Setup, DOCKER_NODES};
pub use error::LabError;
pub use history::{At, Event, FaultKind, History, NodeHold};
pub use holder::{serve_holder, HOLDER_ENV, HOLDER_EXE_ENV};
pub use lab::{Fencing, Lab, Timing, FENCING_COUNTER};
pub use logging::init_tracing;
pub use mix::{Mix, Op, Workload, MANY_EXTRA};
pub use observer::{Observer, Samples};
pub use outcome::Outcome;
pub use permits::{PERMIT_LOOPS, SEMAPHORE};
pub use resource::{Read, Resource};
pub use rwlocks::{RWLOCK, RW_LOOPS, WRITE_EVERY};
pub use scenario::{run, run_with, Driver, Expect, RunOptions, Scenario, ScenarioResult, KEY};
pub use scenarios::all as scenarios;
pub use scenarios::repair_controls;
pub use soak::{soak, soak_summary, SoakResult};
pub use suite::{
    docker_requested, repeat_summary, run_backend, run_repeated, run_repeated_with, summary,
    unexpected, DOCKER_ENV,
};
pub use workload::{contend, contend_each, outcome_label, record_acquired, release, Tally};

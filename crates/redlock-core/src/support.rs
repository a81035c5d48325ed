//! What a client crate built on the core uses beside the rounds (`redlock-client` is
//! one): services call that crate, and need from here at most the fair queue's place when
//! they call the core directly ([`crate::Acquisition::fair`]).
//!
//! - The fair queue and wake-ups: a waiter's [`FairPlace`] (and why one is refused,
//!   [`FairPlaceProblem`]); the lock a release hands over to a fair waiter ([`Handover`],
//!   its token [`handover_token`]); the coordinator's [`Waiters`] (subscribers that hear
//!   releases, leaving the queues, taking a handed-over lock).
//! - The host-suspend clock that every validity counts with ([`host_suspended`],
//!   [`suspend_watch`]; see [`crate::Deadline`]).
//! - How reports and errors name a lock ([`lock_name`], [`NAMED_KEYS`]), and the checks a
//!   key and a TTL get before any round ([`check_key`], [`check_ttl`]).

pub use crate::config::{check_key, check_ttl};
pub use crate::deadline::{host_suspended, suspend_watch};
pub use crate::error::FairPlaceProblem;
pub use crate::fair::{handover_token, FairPlace, Handover, Waiters};
pub use crate::lock_spec::{lock_name, NAMED_KEYS};

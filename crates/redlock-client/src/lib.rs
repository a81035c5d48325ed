//! The API a Rust service calls to take Redlock locks: retries, guards, renewal.
//!
//! Under construction: for now use [`redlock_core`] directly, which runs one round at a time.
#![forbid(unsafe_code)]
#![deny(missing_docs, missing_debug_implementations)]

pub use redlock_core;

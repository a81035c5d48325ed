//! The tracing set-up of the lab's binary and the demo: one subscriber, filtered by
//! `RUST_LOG`, writing to stderr so that logs never mix with the report on stdout.

use tracing_subscriber::EnvFilter;

/// Installs the global tracing subscriber. The filter comes from `RUST_LOG` and defaults to
/// `error`: both binaries print their own report, which the warnings of a run full of
/// injected faults would drown. Logs go to stderr.
///
/// # Panics
///
/// If a global subscriber is already installed: call it once, first thing in `main`.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "error".into()))
        .with_writer(std::io::stderr)
        .init();
}

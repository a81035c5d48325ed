//! The holder process: a lock holder that is a separate OS process, so that a scenario can
//! SIGKILL or SIGSTOP the whole holder (its runtime, its connections, its renewal) rather
//! than drop a guard.
//!
//! # How the holder executable is found
//! The lab runs its own executable again ([`std::env::current_exe`]) with [`HOLDER_ENV`]
//! set, or the executable named by [`HOLDER_EXE_ENV`] when that is set. Whatever runs the
//! scenarios must therefore call [`serve_holder`] first thing in `main`: the `redlock-lab`
//! binary and the workspace's `fault_lab` test both do, so the holder is there whether the
//! lab runs as `cargo run -p redlock-lab` or as `cargo test --test fault_lab`, with no other
//! binary to build or find. An executable that does not serve the holder never sends the
//! handshake, and the scenario fails with an error that says so (it never skips).
//!
//! # What the holder reports
//! One line per event on stdout, `holder <kind> key=value ...`, with every time as
//! `CLOCK_MONOTONIC` nanoseconds (shared by every process of the host, and the clock behind
//! `tokio::time::Instant`), so the scenario records the holder's acquisition, extensions and
//! writes in the history at the times they happened in the holder, not when their lines
//! were read.

mod child;
mod parent;

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use nix::time::{clock_gettime, ClockId};
use tokio::time::Instant;

pub(crate) use parent::HolderProcess;

/// Set (to the holder's mode) in the environment of a holder process.
pub const HOLDER_ENV: &str = "REDLOCK_LAB_HOLDER";
/// The holder's settings: `name=value` pairs separated by `;`.
const SPEC_ENV: &str = "REDLOCK_LAB_HOLDER_SPEC";
/// An executable to run as the holder instead of the current one (it must call
/// [`serve_holder`] first thing in `main`).
pub const HOLDER_EXE_ENV: &str = "REDLOCK_LAB_HOLDER_EXE";
/// Every line of the holder's protocol starts with this word.
const PREFIX: &str = "holder";

/// Serves as a holder process when this process was started as one ([`HOLDER_ENV`] set),
/// and returns its exit code; `None` otherwise. Call it first thing in `main` of anything
/// that runs the lab's scenarios:
///
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     if let Some(code) = redlock_lab::serve_holder() {
///         return code;
///     }
///     // ... run the scenarios ...
///     std::process::ExitCode::SUCCESS
/// }
/// ```
pub fn serve_holder() -> Option<ExitCode> {
    let mode = std::env::var(HOLDER_ENV).ok()?;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return Some(failed(&format!("no tokio runtime: {e}"))),
    };
    let spec = std::env::var(SPEC_ENV).unwrap_or_default();
    Some(match runtime.block_on(child::serve(&mode, &spec)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => failed(&e),
    })
}

fn failed(why: &str) -> ExitCode {
    say("error", &[("why", why.replace(char::is_whitespace, "_"))]);
    ExitCode::FAILURE
}

/// What the holder does once it holds the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Extends the lock every third of its TTL until killed (bounded: see the child).
    Extend,
    /// Reads the fenced resource, checks its validity, waits for a line on stdin (the
    /// moment to pause it), then writes through `fenced_set` and releases.
    WriteFenced,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Extend => "extend",
            Mode::WriteFenced => "write-fenced",
        }
    }

    fn parse(mode: &str) -> Option<Mode> {
        [Mode::Extend, Mode::WriteFenced]
            .into_iter()
            .find(|m| m.as_str() == mode)
    }
}

/// Prints one protocol line (stdout is line-buffered: each line goes out whole).
fn say(kind: &str, fields: &[(&str, String)]) {
    let mut line = format!("{PREFIX} {kind}");
    for (name, value) in fields {
        line.push_str(&format!(" {name}={value}"));
    }
    println!("{line}");
}

/// A protocol line's `key=value` fields.
type Fields = HashMap<String, String>;

/// `CLOCK_MONOTONIC` now, in nanoseconds.
fn mono_now() -> i128 {
    // Cannot fail for CLOCK_MONOTONIC on Linux; 0 would only shift times, never crash.
    clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec())
    })
}

/// `instant` as `CLOCK_MONOTONIC` nanoseconds.
fn mono_of(instant: Instant) -> i128 {
    let (now, mono) = (Instant::now(), mono_now());
    if instant <= now {
        mono - nanos(now - instant)
    } else {
        mono + nanos(instant - now)
    }
}

fn nanos(d: Duration) -> i128 {
    i128::try_from(d.as_nanos()).unwrap_or(i128::MAX)
}

//! A node clock that jumps or runs at another rate: the `clockshim` LD_PRELOAD library and the
//! control file that steers it.
//!
//! Redlock's safety assumes that the servers' clocks run at nearly the same rate (the drift
//! budget). Redis 7 expires keys by its wall clock (`gettimeofday`), so faking that clock in one
//! process is how a test breaks the assumption on purpose. The shim (`shim/clockshim.c`) fakes
//! `gettimeofday`, `time` and `clock_gettime(CLOCK_REALTIME[_COARSE])`; monotonic clocks stay
//! real. It reads the file named by `REDLOCK_CLOCK_FILE`, holding `OFFSET_NS RATE [ANCHOR_NS]`:
//!
//! ```text
//! fake = real + OFFSET_NS + (real - ANCHOR_NS) * (RATE - 1)
//! ```
//!
//! and re-reads it at most every ~10 ms, so a change takes effect within about 10 ms.

mod control;
mod shim;

pub use control::ClockControl;
pub use shim::ClockShim;

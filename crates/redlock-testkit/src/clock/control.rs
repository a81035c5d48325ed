//! Steering a fake clock at run time: the control file the shim reads.

use std::ffi::OsString;
use std::fmt;
use std::fs::Permissions;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use super::shim::ClockShim;
use crate::HarnessError;

/// Environment variable the shim reads to find its control file.
const CONTROL_ENV: &str = "REDLOCK_CLOCK_FILE";
const NS_PER_MS: i64 = 1_000_000;

/// The shim's parameters: `fake = real + offset + (real - anchor) * (rate - 1)`, all in ns.
#[derive(Clone, Copy, Debug, PartialEq)]
struct ClockState {
    offset_ns: i64,
    rate: f64,
    anchor_ns: i64,
}

impl ClockState {
    const REAL: ClockState = ClockState {
        offset_ns: 0,
        rate: 1.0,
        anchor_ns: 0,
    };

    /// `fake - real` at real time `now_ns`.
    fn skew_ns(&self, now_ns: i64) -> f64 {
        // The elapsed time in integers first: as f64, absolute times near 2^60 ns are only
        // precise to a few hundred ns.
        let elapsed = now_ns.saturating_sub(self.anchor_ns) as f64;
        self.offset_ns as f64 + elapsed * (self.rate - 1.0)
    }

    /// Shifted by `by_ms`; `None` if the offset would overflow (about ±292 years).
    fn jumped(self, by_ms: i64) -> Option<ClockState> {
        let offset_ns = by_ms
            .checked_mul(NS_PER_MS)
            .and_then(|by| self.offset_ns.checked_add(by))?;
        Some(ClockState { offset_ns, ..self })
    }

    /// Running at `rate` from `now_ns` on, with no jump at `now_ns`: the skew accumulated so
    /// far is folded into the offset and the anchor moves to `now_ns`. `None` on overflow.
    fn with_rate(self, rate: f64, now_ns: i64) -> Option<ClockState> {
        let skew = self.skew_ns(now_ns).round();
        // i64::MAX as f64 rounds up to 2^63, so `>=` rejects everything the cast would clamp.
        if skew.is_nan() || skew.abs() >= i64::MAX as f64 {
            return None;
        }
        Some(ClockState {
            offset_ns: skew as i64,
            rate,
            anchor_ns: now_ns,
        })
    }

    /// The control file's content.
    fn render(&self) -> String {
        if self.rate == 1.0 {
            // At rate 1 the anchor does not matter.
            return format!("{} 1\n", self.offset_ns);
        }
        // `{}` never uses an exponent, which is long for extreme rates; the shim reads both.
        let mut rate = format!("{}", self.rate);
        if rate.len() > 32 {
            rate = format!("{:e}", self.rate);
        }
        format!("{} {} {}\n", self.offset_ns, rate, self.anchor_ns)
    }
}

/// Real wall-clock time in ns since the Unix epoch, the way the shim reads it.
fn real_now_ns() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
    }
}

/// Steers one fake clock by rewriting its control file (see the module docs for the format).
///
/// The control remembers what it last wrote; [`ClockControl::skew_ms`] is computed from that,
/// not from the file, so hand edits of the file are not reflected there. Every change reaches
/// the process within about 10 ms (the shim's re-read interval). Each write replaces the file
/// atomically (temporary file in the same directory, then rename); when the file is shared
/// with a container, mount its *directory*, since a bind-mounted single file keeps showing the
/// replaced inode.
pub struct ClockControl {
    label: String,
    path: PathBuf,
    state: Mutex<ClockState>,
}

impl ClockControl {
    /// Takes over the control file at `path` (its directory must exist) and sets it to real
    /// time (`0 1`).
    pub fn new(path: impl Into<PathBuf>) -> Result<ClockControl, HarnessError> {
        let path = path.into();
        let label = format!("clock {}", path.display());
        Self::with_label(label, path)
    }

    /// The control of node `name`'s clock, at `path`.
    pub(crate) fn for_node(name: &str, path: PathBuf) -> Result<ClockControl, HarnessError> {
        Self::with_label(format!("{name} clock"), path)
    }

    fn with_label(label: String, path: PathBuf) -> Result<ClockControl, HarnessError> {
        let control = ClockControl {
            label,
            path,
            state: Mutex::new(ClockState::REAL),
        };
        control.reset()?;
        Ok(control)
    }

    /// The control file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves the clock by `by_ms` milliseconds at once (negative: backwards). The rate stays.
    pub fn jump(&self, by_ms: i64) -> Result<(), HarnessError> {
        self.update(|s| {
            s.jumped(by_ms)
                .ok_or_else(|| format!("jump by {by_ms} ms overflows the clock offset"))
        })
    }

    /// Makes the clock run `rate` times as fast as the real one from now on (1.0 = real speed,
    /// 4.0 = four fake seconds per real second). The clock does not jump: the skew accumulated
    /// so far is kept. `rate` must be finite and greater than 0.
    pub fn set_rate(&self, rate: f64) -> Result<(), HarnessError> {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(self.invalid(format!(
                "rate {rate} is invalid: it must be finite and greater than 0 (1.0 = real speed)"
            )));
        }
        let now = real_now_ns();
        self.update(|s| {
            s.with_rate(rate, now)
                .ok_or_else(|| format!("the accumulated skew overflows at rate {rate}"))
        })
    }

    /// Back to real time: no offset, rate 1.
    pub fn reset(&self) -> Result<(), HarnessError> {
        self.update(|_| Ok(ClockState::REAL))
    }

    /// `fake - real` in milliseconds right now, as computed from the last values written
    /// (positive: the node's clock is ahead).
    pub fn skew_ms(&self) -> f64 {
        self.lock().skew_ns(real_now_ns()) / NS_PER_MS as f64
    }

    /// Environment for a process whose clock this controls: `LD_PRELOAD` (the shim first,
    /// then any `LD_PRELOAD` of ours) and `REDLOCK_CLOCK_FILE`.
    pub(crate) fn spawn_env(&self) -> Result<Vec<(OsString, OsString)>, HarnessError> {
        let mut preload = ClockShim::path()?.into_os_string();
        if let Some(inherited) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
            preload.push(":");
            preload.push(inherited);
        }
        Ok(vec![
            ("LD_PRELOAD".into(), preload),
            (CONTROL_ENV.into(), self.path.clone().into_os_string()),
        ])
    }

    fn update(
        &self,
        change: impl FnOnce(ClockState) -> Result<ClockState, String>,
    ) -> Result<(), HarnessError> {
        // Held across the write so concurrent changes reach the file in the order applied.
        let mut state = self.lock();
        let next = change(*state).map_err(|reason| self.invalid(reason))?;
        self.write(&next.render())?;
        *state = next;
        Ok(())
    }

    fn write(&self, content: &str) -> Result<(), HarnessError> {
        let io_err = |action: &str, source| HarnessError::ClockFile {
            clock: self.label.clone(),
            action: format!("{action} {}", self.path.display()),
            source,
        };
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        // 0644: a server running as another user (e.g. in a container) must be able to read it.
        let mut tmp = tempfile::Builder::new()
            .prefix(".clock-")
            .permissions(Permissions::from_mode(0o644))
            .tempfile_in(dir)
            .map_err(|e| io_err("create a temporary file next to", e))?;
        tmp.write_all(content.as_bytes())
            .map_err(|e| io_err("write a temporary file next to", e))?;
        tmp.persist(&self.path)
            .map_err(|e| io_err("replace", e.error))?;
        Ok(())
    }

    fn invalid(&self, reason: String) -> HarnessError {
        HarnessError::InvalidClock {
            clock: self.label.clone(),
            reason,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClockState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for ClockControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClockControl")
            .field("label", &self.label)
            .field("path", &self.path)
            .field("state", &*self.lock())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000_123_456_789;

    #[test]
    fn real_time_renders_as_zero_offset_rate_one() {
        assert_eq!(ClockState::REAL.render(), "0 1\n");
        assert_eq!(ClockState::REAL.skew_ns(NOW), 0.0);
    }

    #[test]
    fn jump_adds_to_the_offset_and_keeps_the_rate() {
        let s = ClockState::REAL.jumped(3_600_000).unwrap();
        assert_eq!(s.render(), "3600000000000 1\n");
        let s = s.jumped(-3_600_500).unwrap();
        assert_eq!(s.offset_ns, -500_000_000);
        assert!(ClockState::REAL.jumped(i64::MAX).is_none());
        let fast = ClockState::REAL.with_rate(2.0, NOW).unwrap();
        assert_eq!(fast.jumped(1).unwrap().rate, 2.0);
    }

    #[test]
    fn rate_change_folds_skew_into_offset_without_a_jump() {
        let s = ClockState::REAL.with_rate(4.0, NOW).unwrap();
        assert_eq!(s.render(), format!("0 4 {NOW}\n"));
        // One real second at 4x: three seconds ahead.
        let later = NOW + 1_000_000_000;
        assert_eq!(s.skew_ns(later), 3e9);
        let slow = s.with_rate(0.5, later).unwrap();
        assert_eq!(slow.skew_ns(later), 3e9, "no jump at the switch");
        assert_eq!(slow.render(), format!("3000000000 0.5 {later}\n"));
        assert_eq!(slow.skew_ns(later + 2_000_000_000), 2e9);
    }

    #[test]
    fn extreme_rates_use_an_exponent() {
        let s = ClockState {
            rate: 1e-40,
            ..ClockState::REAL
        };
        assert_eq!(s.render(), "0 1e-40 0\n");
    }
}

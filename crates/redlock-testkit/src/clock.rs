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

use std::ffi::OsString;
use std::fmt;
use std::fs::{self, DirBuilder, Permissions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::HarnessError;

/// The shim's C source, compiled at run time so the crate needs no build script.
const SOURCE: &str = include_str!("../shim/clockshim.c");
/// Flags the source is written for: warnings are errors, so a compiler that dislikes the source
/// fails loudly instead of producing a subtly different library.
const CFLAGS: &[&str] = &["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror"];
/// Environment variable naming the C compiler (default `cc`); may carry arguments (`ccache gcc`).
const CC_ENV: &str = "CC";
/// Environment variable the shim reads to find its control file.
const CONTROL_ENV: &str = "REDLOCK_CLOCK_FILE";
const NS_PER_MS: i64 = 1_000_000;

/// The clock-faking LD_PRELOAD library, built from C source on first use.
///
/// [`NodeOptions::fake_clock`](crate::NodeOptions::fake_clock) uses it; image builders that
/// need the same library elsewhere compile [`ClockShim::source`] themselves.
#[derive(Debug)]
pub struct ClockShim;

/// Why building the shim failed; kept so every later call in the process reports the same error.
#[derive(Clone, Debug)]
struct BuildFailure {
    step: String,
    detail: String,
    advice: &'static str,
}

impl From<BuildFailure> for HarnessError {
    fn from(f: BuildFailure) -> Self {
        HarnessError::ClockShim {
            step: f.step,
            detail: f.detail,
            advice: f.advice,
        }
    }
}

const ADVICE_CC: &str = "install gcc (`apt-get install -y gcc`) or set CC to a working C compiler";
const ADVICE_TMP: &str =
    "check that the temporary directory (TMPDIR) is writable, or remove the cache directory";

impl ClockShim {
    /// The C source of the shim (glibc only, no other libraries). Build it with
    /// `cc -shared -fPIC -O2 -Wall -Wextra -Werror -o clockshim.so clockshim.c`.
    pub fn source() -> &'static str {
        SOURCE
    }

    /// Path of the compiled shared library.
    ///
    /// Compiled once per process with `$CC` (default `cc`) into
    /// `<temp dir>/redlock-clockshim-<hash of source and flags>/clockshim.so`, which later
    /// processes reuse. The library is written under a temporary name and renamed into place,
    /// so concurrent test processes never see a half-written file.
    pub fn path() -> Result<PathBuf, HarnessError> {
        static BUILT: OnceLock<Result<PathBuf, BuildFailure>> = OnceLock::new();
        BUILT.get_or_init(build).clone().map_err(HarnessError::from)
    }
}

fn build() -> Result<PathBuf, BuildFailure> {
    let mut hash = Fnv::default();
    hash.write(SOURCE.as_bytes());
    for flag in CFLAGS {
        hash.write(flag.as_bytes());
    }
    let dir = std::env::temp_dir().join(format!("redlock-clockshim-{:016x}", hash.0));
    let target = dir.join("clockshim.so");
    let tmp_fail = |step: String, e: std::io::Error| BuildFailure {
        step,
        detail: e.to_string(),
        advice: ADVICE_TMP,
    };
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| tmp_fail(format!("create the cache directory {}", dir.display()), e))?;
    // Written under a unique name, then renamed: concurrent processes write identical bytes.
    let source = tempfile::Builder::new()
        .prefix("clockshim-")
        .suffix(".c")
        .tempfile_in(&dir)
        .and_then(|mut f| f.write_all(SOURCE.as_bytes()).map(|()| f))
        .map_err(|e| tmp_fail(format!("write the shim source into {}", dir.display()), e))?;
    check_private(&dir, source.path())?;
    if target.is_file() {
        return Ok(target);
    }
    let output = tempfile::Builder::new()
        .prefix("clockshim-")
        .suffix(".so.tmp")
        .permissions(Permissions::from_mode(0o755))
        .tempfile_in(&dir)
        .map_err(|e| tmp_fail(format!("create a file in {}", dir.display()), e))?;
    let cc = std::env::var(CC_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "cc".to_owned());
    compile(&cc, source.path(), output.path())?;
    output
        .persist(&target)
        .map_err(|e| tmp_fail(format!("move the shim to {}", target.display()), e.error))?;
    tracing::debug!(path = %target.display(), "clock shim built");
    Ok(target)
}

/// A library we LD_PRELOAD into servers must not come from a directory someone else controls:
/// the cache directory must be owned by us (the owner of the file we just wrote) and writable by
/// nobody else.
fn check_private(dir: &Path, ours: &Path) -> Result<(), BuildFailure> {
    let fail = |detail: String| BuildFailure {
        step: format!("use the cache directory {}", dir.display()),
        detail,
        advice: "remove that directory (another user created it or it is shared) and retry",
    };
    let (dir_meta, file_meta) = match (fs::metadata(dir), fs::metadata(ours)) {
        (Ok(d), Ok(f)) => (d, f),
        (Err(e), _) | (_, Err(e)) => return Err(fail(e.to_string())),
    };
    if dir_meta.uid() != file_meta.uid() || dir_meta.mode() & 0o022 != 0 {
        return Err(fail(format!(
            "it is owned by uid {} with mode {:o}, expected uid {} and no group/other write",
            dir_meta.uid(),
            dir_meta.mode() & 0o7777,
            file_meta.uid()
        )));
    }
    Ok(())
}

/// Runs the compiler `cc` (a program, possibly followed by arguments) on `source`.
fn compile(cc: &str, source: &Path, output: &Path) -> Result<(), BuildFailure> {
    let mut words = cc.split_whitespace();
    let program = words.next().unwrap_or("cc");
    let mut cmd = Command::new(program);
    cmd.args(words)
        .args(CFLAGS)
        .arg("-o")
        .arg(output)
        .arg(source)
        .stdin(Stdio::null());
    let shown = format!("{cmd:?}").replace('"', "");
    let fail = |detail: String| BuildFailure {
        step: format!("compile it with `{shown}`"),
        detail,
        advice: ADVICE_CC,
    };
    let out = cmd
        .output()
        .map_err(|e| fail(format!("could not run {program}: {e}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(fail(format!(
            "{} with stderr:\n{}",
            out.status,
            stderr.trim_end()
        )));
    }
    Ok(())
}

/// FNV-1a: a cache key that, unlike `DefaultHasher`, is the same in every Rust version.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

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

    #[test]
    fn compiler_failures_name_the_command_and_say_what_to_install() {
        let dir = tempfile::tempdir().unwrap();
        let (src, out) = (dir.path().join("bad.c"), dir.path().join("bad.so"));
        fs::write(&src, "this is not C").unwrap();
        let err = HarnessError::from(compile("no-such-compiler-xyz", &src, &out).unwrap_err());
        let msg = err.to_string();
        assert!(msg.contains("could not run no-such-compiler-xyz"), "{msg}");
        assert!(msg.contains("apt-get install -y gcc"), "{msg}");
        let err = HarnessError::from(compile("cc", &src, &out).unwrap_err()).to_string();
        assert!(err.contains("compile it with `cc -shared -fPIC"), "{err}");
        assert!(err.contains("stderr:"), "{err}");
    }

    #[test]
    fn the_shim_builds_and_is_cached() {
        let first = ClockShim::path().unwrap();
        assert!(first.is_file());
        assert_eq!(ClockShim::path().unwrap(), first);
        assert!(ClockShim::source().contains("REDLOCK_CLOCK_FILE"));
    }

    #[test]
    fn fnv_is_stable() {
        let mut h = Fnv::default();
        h.write(b"a");
        assert_eq!(h.0, 0xaf63_dc4c_8601_ec8c);
    }
}

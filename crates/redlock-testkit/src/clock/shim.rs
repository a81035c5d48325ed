//! Building the clock shim: the `clockshim` LD_PRELOAD library, compiled from its C source
//! on first use and cached by the hash of its source and flags.

use std::fs::{self, DirBuilder, Permissions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::HarnessError;

/// The shim's C source, compiled at run time so the crate needs no build script.
const SOURCE: &str = include_str!("../../shim/clockshim.c");
/// Flags the source is written for: warnings are errors, so a compiler that dislikes the source
/// fails loudly instead of producing a subtly different library.
const CFLAGS: &[&str] = &["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror"];
/// Environment variable naming the C compiler (default `cc`); may carry arguments (`ccache gcc`).
const CC_ENV: &str = "CC";

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

#[cfg(test)]
mod tests {
    use super::*;

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

//! Which server binary the harness starts ([`server_binary`]): its name and version, read
//! from its own `--version` line, and whether it was built with TLS. The suite runs against
//! any Redis-compatible server binary given in `REDIS_SERVER` (Redis, Valkey); tests that
//! depend on the server ask here instead of assuming one.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::process::{die_with_spawning_thread, find_redis_server};
use crate::HarnessError;

/// The server binary the harness starts, as it describes itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerBinary {
    /// Where it is (see [`REDIS_SERVER_ENV`](crate::REDIS_SERVER_ENV)).
    pub path: PathBuf,
    /// The server's name, lowercase, from its `--version` line: `redis`, `valkey`.
    pub name: String,
    /// Its version (`v=` of the `--version` line): `7.0.15`, `9.1.2`.
    pub version: String,
}

impl ServerBinary {
    /// The name its processes have in `/proc/PID/stat` (`comm`: the file name, cut to 15
    /// bytes), to tell a node's process from another that took its pid.
    pub fn process_name(&self) -> String {
        let file = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        file.chars()
            .scan(0, |len, c| {
                *len += c.len_utf8();
                (*len <= 15).then_some(c)
            })
            .collect()
    }

    /// `Some(why)` when the binary was built without TLS: it refuses to start with a TLS
    /// port and says so. Found by starting it once with one (no port is opened: the start
    /// fails at once); `None` when it did not say so, whatever else happened, so that a
    /// test is never skipped on a server that has TLS.
    pub fn lacks_tls(&self) -> Option<String> {
        static LACKS: OnceLock<Option<String>> = OnceLock::new();
        LACKS
            .get_or_init(|| {
                let said = says_no_tls(&self.path)?;
                Some(format!(
                    "{} {} ({}) was built without TLS (it says: {said})",
                    self.name,
                    self.version,
                    self.path.display()
                ))
            })
            .clone()
    }
}

/// For a test that needs TLS: `true` when the server binary was built without it, and
/// the test should return at once. It then says so on the test run's own standard error
/// (not captured, so the run's log shows it), naming the test and the server. A server
/// built with TLS runs every such test; so does one whose build could not be told.
pub fn skip_without_tls(test: &str) -> bool {
    let Some(why) = server_binary().ok().and_then(ServerBinary::lacks_tls) else {
        return false;
    };
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: it needs TLS, and {why}; run it against a server built with TLS \
         (Debian's redis-server is)"
    );
    true
}

/// The server binary the harness starts, read once.
pub fn server_binary() -> Result<&'static ServerBinary, HarnessError> {
    static BINARY: OnceLock<ServerBinary> = OnceLock::new();
    if let Some(binary) = BINARY.get() {
        return Ok(binary);
    }
    let path = find_redis_server()?;
    let output = Command::new(&path)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| HarnessError::io(format!("run {} --version", path.display()), e))?;
    let line = String::from_utf8_lossy(&output.stdout);
    let (name, version) = parse_version(&line).ok_or_else(|| HarnessError::BinaryNotFound {
        detail: format!(
            "{} --version printed {:?}, not `<Name> server v=<version> ...`",
            path.display(),
            line.trim()
        ),
    })?;
    Ok(BINARY.get_or_init(|| ServerBinary {
        path,
        name,
        version,
    }))
}

/// `Some(why)` when the server, started with a TLS port, says it has no TLS support: the
/// words of its log line.
fn says_no_tls(path: &Path) -> Option<String> {
    let dir = tempfile::tempdir().ok()?;
    let missing = dir.path().join("missing.pem");
    let mut cmd = Command::new(path);
    cmd.args([
        "--port",
        "0",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
    ])
    .args(["--logfile", ""])
    .arg("--dir")
    .arg(dir.path())
    .args(["--tls-port", "1"])
    .arg("--tls-cert-file")
    .arg(&missing)
    .arg("--tls-key-file")
    .arg(&missing)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    die_with_spawning_thread(&mut cmd);
    let mut child = cmd.spawn().ok()?;
    // It fails at once, with TLS or without; a server still running after this is killed.
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().ok()?.is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().ok()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    no_tls_line(&text)
}

/// What a start-up log says when the build has no TLS: Valkey and Redis 7.2 and later
/// ("Failed finding TLS support.", after "Missing implement of connection type tls");
/// older Redis builds without TLS do not know the `tls-port` directive at all.
fn no_tls_line(log: &str) -> Option<String> {
    if let Some(line) = log.lines().find(|line| line.contains("TLS support")) {
        // After the "pid:role date time level " prefix.
        let words = line.split_once(" # ").map_or(line, |(_, words)| words);
        return Some(words.trim().to_owned());
    }
    let bad_directive = log.lines().any(|l| l.contains("Bad directive"));
    (bad_directive && log.contains(">>> 'tls-port"))
        .then(|| "tls-port: Bad directive or wrong number of arguments".to_owned())
}

/// The name (lowercase) and version of a `--version` line: `Redis server v=7.0.15 sha=...`,
/// `Valkey server v=9.1.2 sha=...`.
fn parse_version(line: &str) -> Option<(String, String)> {
    let mut words = line.split_whitespace();
    let name = words.next()?.to_ascii_lowercase();
    let version = words.find_map(|w| w.strip_prefix("v="))?;
    Some((name, version.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_servers_version_line_is_read() {
        assert_eq!(
            parse_version(
                "Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d7c971a948f0\n"
            ),
            Some(("redis".into(), "7.0.15".into()))
        );
        assert_eq!(
            parse_version(
                "Valkey server v=9.1.2 sha=00000000:1 malloc=libc bits=64 build=1536df31c0395150\n"
            ),
            Some(("valkey".into(), "9.1.2".into()))
        );
        assert_eq!(parse_version("usage: something\n"), None);
        assert_eq!(parse_version(""), None);
    }

    #[test]
    fn a_build_without_tls_is_told_by_its_own_words_only() {
        // Valkey 9.1.2 built without TLS, started with --tls-port.
        let valkey = "11080:M 29 Nov 2026 14:53:07.895 * Running mode=standalone, port=7777.\n\
            11080:M 29 Nov 2026 14:53:07.895 # Missing implement of connection type tls\n\
            11080:M 29 Nov 2026 14:53:07.895 # Failed finding TLS support.\n";
        assert_eq!(
            no_tls_line(valkey).as_deref(),
            Some("Failed finding TLS support.")
        );
        // A build with TLS refuses the missing certificate: not a reason to skip.
        let with_tls = "1:M 29 Nov 2026 14:53:07.895 # Failed to load certificate: missing.pem\n\
            1:M 29 Nov 2026 14:53:07.895 # Failed to configure TLS. Check logs for more info.\n";
        assert_eq!(no_tls_line(with_tls), None);
        // Redis before 7.2 built without TLS.
        let old_redis = "\n*** FATAL CONFIG FILE ERROR (Redis 6.0.16) ***\n\
            Reading the configuration file, at line 2\n>>> 'tls-port \"1\"'\n\
            Bad directive or wrong number of arguments\n";
        assert_eq!(
            no_tls_line(old_redis).as_deref(),
            Some("tls-port: Bad directive or wrong number of arguments")
        );
        // Another bad directive is not about TLS.
        let other = ">>> 'no-such-directive \"1\"'\nBad directive or wrong number of arguments\n";
        assert_eq!(no_tls_line(other), None);
        assert_eq!(no_tls_line(""), None);
    }

    #[test]
    fn the_process_name_is_the_file_name_cut_to_fifteen_bytes() {
        let binary = |path: &str| ServerBinary {
            path: PathBuf::from(path),
            name: "valkey".into(),
            version: "9.1.2".into(),
        };
        assert_eq!(
            binary("/usr/bin/redis-server").process_name(),
            "redis-server"
        );
        assert_eq!(binary("/opt/valkey-server").process_name(), "valkey-server");
        assert_eq!(
            binary("/opt/a-very-long-server-name").process_name(),
            "a-very-long-ser"
        );
    }
}

//! The client's configuration from the four sources, first match wins: flags, environment
//! (both already merged by clap into `Option`s), the TOML file, the defaults.
//!
//! The file is the library's own `LockConfig` in its serde form, read the way the README
//! shows, so a file that works for a service works here unchanged.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use redlock_client::LockConfig;

use crate::cli::{Common, RunArgs};
use crate::error::CliError;

/// The configuration for any command: the file (or the defaults) under the shared flags.
/// Not validated here: `Redlock::connect` validates everything once, with the library's
/// messages.
pub fn load(common: &Common) -> Result<LockConfig, CliError> {
    let mut config = match &common.config {
        Some(path) => read_file(path)?,
        None => LockConfig::default(),
    };
    if let Some(nodes) = &common.nodes {
        // `--nodes ''` or `REDLOCK_NODES=` gives one empty entry; an empty list is then
        // reported as "no nodes" instead of as an unusable empty URL.
        config.nodes = nodes.iter().filter(|n| !n.is_empty()).cloned().collect();
    }
    if let Some(timeout) = common.node_timeout {
        config.node_timeout = timeout;
    }
    if let Some(prefix) = &common.key_prefix {
        config.key_prefix = prefix.clone();
    }
    if let Some(factor) = common.drift_factor {
        config.drift_factor = factor;
    }
    Ok(config)
}

/// `run`'s own settings on top of [`load`]'s.
pub fn for_run(mut config: LockConfig, run: &RunArgs) -> LockConfig {
    if let Some(ttl) = run.ttl {
        config.ttl = ttl;
    }
    if let Some(wait) = run.wait {
        apply_wait(&mut config, wait);
    }
    if run.fenced {
        config.fencing = true;
    }
    config
}

/// `--wait` replaces the retry policy's bounds: "wait up to this long" is the whole bound,
/// so an attempt count from the file must not cut it short.
fn apply_wait(config: &mut LockConfig, wait: Duration) {
    config.retry.max_wait = Some(wait);
    config.retry.max_attempts = None;
}

/// The largest configuration file read: a configuration is a few hundred bytes, and a
/// path to something endless (`/dev/zero`, a log) must end in an error, not in all of
/// memory.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

fn read_file(path: &Path) -> Result<LockConfig, CliError> {
    let error = |source| CliError::ReadConfig {
        path: path.to_path_buf(),
        source,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text))
        .map_err(error)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(error(std::io::Error::other(
            "it is larger than 1 MiB, and a configuration is a few lines",
        )));
    }
    parse(path, &text)
}

fn parse(path: &Path, text: &str) -> Result<LockConfig, CliError> {
    toml::from_str(text).map_err(|e| CliError::ParseConfig {
        path: path.to_path_buf(),
        // toml's message quotes the offending line; a line of `nodes` may hold a password.
        reason: redact_passwords(&e.to_string()),
    })
}

/// `scheme://user:password@host` becomes `scheme://user:***@host` anywhere in `text`.
fn redact_passwords(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("://") {
        let (head, tail) = rest.split_at(start + 3);
        out.push_str(head);
        // The URL ends at a quote, a comma or white space. Its user information ends at
        // its last `@`: a password may hold a `/` that was not percent-encoded, so the
        // authority ends at the first `/` only when no `@` follows it.
        let url_end = tail
            .find(|c: char| c == '"' || c == '\'' || c.is_whitespace() || c == ',')
            .unwrap_or(tail.len());
        let end = match tail[..url_end].rfind('@') {
            Some(at) => at + tail[at..url_end].find('/').unwrap_or(url_end - at),
            None => tail[..url_end].find('/').unwrap_or(url_end),
        };
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                match userinfo.find(':') {
                    Some(colon) => {
                        out.push_str(&userinfo[..=colon]);
                        out.push_str("***");
                    }
                    None => out.push_str(userinfo),
                }
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn common(args: &[&str]) -> Common {
        let mut argv = vec!["redlock"];
        argv.extend_from_slice(args);
        argv.extend_from_slice(&["inspect", "k"]);
        crate::cli::Cli::try_parse_from(argv).unwrap().common
    }

    #[test]
    fn flags_override_the_file_which_overrides_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("redlock.toml");
        std::fs::write(
            &file,
            "nodes = [\"redis://f:1\"]\nttl = \"7s\"\nkey_prefix = \"file:\"\n[retry]\nmax_attempts = 3\n",
        )
        .unwrap();
        let path = file.to_str().unwrap();

        let from_file = load(&common(&["--config", path])).unwrap();
        assert_eq!(from_file.nodes, ["redis://f:1"]);
        assert_eq!(from_file.ttl, Duration::from_secs(7));
        assert_eq!(from_file.key_prefix, "file:");
        // Not in the file: the default.
        assert_eq!(from_file.node_timeout, LockConfig::default().node_timeout);

        let flagged = load(&common(&[
            "--config",
            path,
            "--nodes",
            "redis://a:1,redis://b:2",
            "--key-prefix",
            "flag:",
            "--node-timeout",
            "50ms",
        ]))
        .unwrap();
        assert_eq!(flagged.nodes, ["redis://a:1", "redis://b:2"]);
        assert_eq!(flagged.key_prefix, "flag:");
        assert_eq!(flagged.node_timeout, Duration::from_millis(50));
        assert_eq!(flagged.ttl, Duration::from_secs(7));

        let mut waited = flagged.clone();
        apply_wait(&mut waited, Duration::from_secs(60));
        assert_eq!(waited.retry.max_wait, Some(Duration::from_secs(60)));
        assert_eq!(waited.retry.max_attempts, None);
    }

    #[test]
    fn a_bad_file_is_a_config_error_without_passwords() {
        let path = Path::new("redlock.toml");
        let err = parse(
            path,
            "nodes = [\"redis://:s3cret@h:1\"]\nttl = \"30 parsecs\"\n",
        )
        .unwrap_err();
        assert!(matches!(err, CliError::ParseConfig { .. }), "{err}");
        let err = parse(path, "nodes = [\"redis://:s3cret@h:1\", 5]\n").unwrap_err();
        let shown = err.to_string();
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("redlock.toml"), "{shown}");
        let err = parse(path, "ttl_ms = 5").unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
    }

    #[test]
    fn a_file_without_end_is_an_error_not_all_of_memory() {
        for path in [Path::new("/dev/zero"), Path::new("/dev/urandom")] {
            let err = read_file(path).unwrap_err();
            assert!(matches!(err, CliError::ReadConfig { .. }), "{err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.toml");
        std::fs::write(&big, format!("# {}\n", "x".repeat(1 << 20))).unwrap();
        let err = read_file(&big).unwrap_err().to_string();
        assert!(err.contains("larger than 1 MiB"), "{err}");
        let small = dir.path().join("small.toml");
        std::fs::write(&small, "ttl = \"30s\"\n").unwrap();
        assert_eq!(read_file(&small).unwrap().ttl, Duration::from_secs(30));
    }

    #[test]
    fn a_ttl_of_one_year_as_written_is_accepted() {
        let config = parse(
            Path::new("redlock.toml"),
            "nodes = [\"redis://h:1\"]\nttl = \"1y\"\n",
        )
        .unwrap();
        // It used to be refused: longer than the maximum 31536000s (365 days).
        config.validate().unwrap();
    }

    #[test]
    fn redacts_passwords_in_any_url() {
        assert_eq!(
            redact_passwords("x = \"redis://user:pw@h:1/0\", 'rediss://:pw@h:2' redis://h:3"),
            "x = \"redis://user:***@h:1/0\", 'rediss://:***@h:2' redis://h:3"
        );
        assert_eq!(redact_passwords("no urls"), "no urls");
        // A `/` or `@` in a password that was not percent-encoded.
        assert_eq!(
            redact_passwords("nodes = [\"redis://u:p/w@h:1/0\", \"redis://:a@b/c@h:2\"]"),
            "nodes = [\"redis://u:***@h:1/0\", \"redis://:***@h:2\"]"
        );
    }
}

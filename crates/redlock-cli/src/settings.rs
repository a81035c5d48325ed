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
        config.nodes = node_list(nodes);
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

/// The node URLs of a comma-separated list. A comma may also stand in a URL's password
/// (`redis://:a,b@host:1`), so a piece without a scheme (`://`) belongs to the URL before
/// it: split there, the password's halves would be shown as two unusable URLs. Empty
/// pieces are dropped (`--nodes ''` or `REDLOCK_NODES=` then reads as "no nodes",
/// reported as such, instead of as an unusable empty URL).
pub fn node_list(list: &str) -> Vec<String> {
    let mut nodes: Vec<String> = Vec::new();
    for piece in list.split(',') {
        match nodes.last_mut() {
            Some(url) if !url.is_empty() && !piece.contains("://") => {
                url.push(',');
                url.push_str(piece);
            }
            _ => nodes.push(piece.to_string()),
        }
    }
    // No URL ends in a comma (it ends in its host, port or database): those were empty
    // pieces after it.
    nodes
        .into_iter()
        .map(|url| url.trim_end_matches(',').to_string())
        .filter(|url| !url.is_empty())
        .collect()
}

/// `run`'s own settings on top of [`load`]'s. The grace period must fit (see [`grace`]),
/// and a round won with less validity than the grace and a renewal interval is released
/// and retried (the library's `min_validity`, raised to that): the command would be
/// stopped before the first renewal could extend the lock.
pub fn for_run(mut config: LockConfig, run: &RunArgs) -> Result<LockConfig, CliError> {
    if let Some(ttl) = run.ttl {
        config.ttl = ttl;
    }
    if let Some(wait) = run.wait {
        apply_wait(&mut config, wait);
    }
    if let Some(fenced) = run.fenced {
        config.fencing = fenced;
    }
    let grace = grace(&config, run.grace)?;
    config.min_validity = config
        .min_validity
        .max(Some(grace + renewal_interval(&config)));
    Ok(config)
}

/// How long after an acquisition or renewal the next renewal is due (zero without
/// renewal: the validity only runs down).
fn renewal_interval(config: &LockConfig) -> Duration {
    match config.renewal.enabled {
        true => config.renew_every(),
        false => Duration::ZERO,
    }
}

/// The grace period when `--grace` is not given: this, or half of what the lock leaves
/// (see [`grace`]) where that is less.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// How long the command gets between SIGTERM and SIGKILL: `given` (`--grace`), or
/// [`DEFAULT_GRACE`] capped at half of the room the lock leaves.
///
/// The command must be gone by the end of the lock's validity, so when renewal has not
/// extended the lock by `grace` before that end, the command gets SIGTERM then (see
/// `run.rs`). A healthy lock's validity never comes that close: a renewal is due one
/// renewal interval after the last, and may take a node timeout, out of a validity of at
/// most the TTL minus the drift allowance. What is left of that is the room; a grace that
/// does not fit in it would stop every command while its lock is healthy.
pub fn grace(config: &LockConfig, given: Option<Duration>) -> Result<Duration, CliError> {
    let ttl = config.ttl;
    let interval = renewal_interval(config);
    let room = ttl
        .saturating_sub(redlock_core::drift(ttl, config.drift_factor))
        .saturating_sub(interval)
        .saturating_sub(config.node_timeout);
    match given {
        None => Ok(DEFAULT_GRACE.min(room / 2)),
        Some(grace) if grace < room => Ok(grace),
        Some(grace) => Err(CliError::Grace {
            reason: format!(
                "--grace ({}) does not fit in the lock: the command gets SIGTERM that long \
                 before the lock's validity ends unless a renewal extended it, and a healthy \
                 lock (TTL {}, renewed every {}, node timeout {}) can have as little as {} \
                 left before its renewal is in; lower --grace or raise --ttl",
                humantime::format_duration(grace),
                humantime::format_duration(ttl),
                humantime::format_duration(interval),
                humantime::format_duration(config.node_timeout),
                humantime::format_duration(room),
            ),
        }),
    }
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
        reason: describe(&e, text),
    })
}

/// toml's message and where it points (line and column), without the offending line that
/// toml's own display quotes: a line may hold a password (`nodes`) or a whole private key
/// (`client_key_pem`, misspelt or misplaced). The message itself may quote a value (an
/// "invalid type: string ..."), so URL passwords and private keys are masked in it too.
fn describe(error: &toml::de::Error, text: &str) -> String {
    let message = redact_private_keys(&redact_passwords(error.message().trim()));
    let Some(before) = error.span().and_then(|span| text.get(..span.start)) else {
        return message;
    };
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column}: {message}")
}

/// Every PEM private key in `text` (`-----BEGIN ... PRIVATE KEY-----` up to its `END` line,
/// or to the end of the text) becomes `<private key, not shown>`.
fn redact_private_keys(text: &str) -> String {
    const BEGIN: &str = "-----BEGIN ";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let label_end = rest[start + BEGIN.len()..]
            .find("-----")
            .map(|at| start + BEGIN.len() + at);
        let private = label_end.is_some_and(|end| rest[start..end].contains("PRIVATE KEY"));
        if !private {
            out.push_str(&rest[..start + BEGIN.len()]);
            rest = &rest[start + BEGIN.len()..];
            continue;
        }
        out.push_str(&rest[..start]);
        out.push_str("<private key, not shown>");
        // After the END marker's closing dashes, or nothing left.
        rest = rest[start..]
            .find("-----END ")
            .and_then(|end| {
                let after = start + end + "-----END ".len();
                rest[after..].find("-----").map(|dashes| after + dashes + 5)
            })
            .map_or("", |after| &rest[after..]);
    }
    out.push_str(rest);
    out
}

/// `scheme://user:password@host` becomes `scheme://user:***@host` anywhere in `text`.
fn redact_passwords(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("://") {
        let (head, tail) = rest.split_at(start + 3);
        out.push_str(head);
        // A quoted URL ends at its closing quote (or the line's end): its password may
        // hold any other character, a comma or the other quote included. Any other ends
        // at white space, a quote or a backtick. Its user information ends at its last
        // `@`: a password may hold a `/` that was not percent-encoded, so the authority
        // ends at the first `/` only when no `@` follows it.
        // The character before the scheme may be any (a curly quote pasted from a
        // document): the scheme starts after all of its bytes.
        let scheme = head[..start]
            .char_indices()
            .rev()
            .find(|&(_, c)| !(c.is_ascii_alphanumeric() || "+-.".contains(c)))
            .map_or(0, |(at, c)| at + c.len_utf8());
        let url_end = match head[..scheme].chars().next_back() {
            // A TOML basic string: `\"` inside it is an escaped quote, not its end.
            Some('"') => basic_string_end(tail),
            Some('\'') => tail.find(['\'', '\n']),
            _ => tail.find(|c: char| "\"'`".contains(c) || c.is_whitespace()),
        }
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
                    // A user alone is often a password meant (`redis://secret@host`).
                    None => out.push_str("***"),
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

/// Where a TOML basic string that starts before `text` ends: its first `"` not escaped by
/// a backslash, or the line's end.
fn basic_string_end(text: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            '\n' => return Some(i),
            '"' if !escaped => return Some(i),
            '\\' => escaped = !escaped,
            _ => escaped = false,
        }
    }
    None
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
        for line in [
            "nodes = [\"redis://:s3cret@h:1\", 5]\n",
            // A comma in the password.
            "nodes = [\"redis://:s3,cret@h:1\", 5]\n",
        ] {
            let shown = parse(path, line).unwrap_err().to_string();
            assert!(
                !shown.contains("s3cret") && !shown.contains("cret@"),
                "{shown}"
            );
        }
        let err = parse(path, "nodes = [\"redis://:s3cret@h:1\", 5]\n").unwrap_err();
        let shown = err.to_string();
        assert!(shown.contains("redlock.toml"), "{shown}");
        let err = parse(path, "ttl_ms = 5").unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
    }

    #[test]
    fn a_node_list_splits_at_commas_outside_passwords() {
        assert_eq!(
            node_list("redis://a:1,rediss://u:p@b:2/0"),
            ["redis://a:1", "rediss://u:p@b:2/0"]
        );
        assert_eq!(
            node_list("redis://:se,cr,et@a:1,redis://b:2"),
            ["redis://:se,cr,et@a:1", "redis://b:2"]
        );
        assert_eq!(node_list(""), Vec::<String>::new());
        assert_eq!(node_list("redis://a:1,,"), ["redis://a:1"]);
        assert_eq!(node_list("redis://:a,,b@h:1"), ["redis://:a,,b@h:1"]);
        assert_eq!(node_list(",redis://a:1"), ["redis://a:1"]);
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
        // humantime's year is 365.25 days: a maximum of 365 days must not refuse it.
        config.validate().unwrap();
    }

    #[test]
    fn redacts_passwords_in_any_url() {
        assert_eq!(
            redact_passwords("x = \"redis://user:pw@h:1/0\", 'rediss://:pw@h:2' redis://h:3"),
            "x = \"redis://user:***@h:1/0\", 'rediss://:***@h:2' redis://h:3"
        );
        assert_eq!(redact_passwords("no urls"), "no urls");
        // A comma or the other quote in a quoted password.
        assert_eq!(
            redact_passwords("nodes = [\"redis://:se,cr'et@h:1\", 'redis://:a\"b@h:2']"),
            "nodes = [\"redis://:***@h:1\", 'redis://:***@h:2']"
        );
        // An escaped quote in a double-quoted password (TOML), and a user alone: neither
        // shows. The escaped quote must not end the URL early, or the password shows whole.
        assert_eq!(
            redact_passwords(r#"nodes = ["redis://:a\"b@h:1", "redis://s3cret@h:2"]"#),
            r#"nodes = ["redis://:***@h:1", "redis://***@h:2"]"#
        );
        // A `/` or `@` in a password that was not percent-encoded.
        assert_eq!(
            redact_passwords("nodes = [\"redis://u:p/w@h:1/0\", \"redis://:a@b/c@h:2\"]"),
            "nodes = [\"redis://u:***@h:1/0\", \"redis://:***@h:2\"]"
        );
        // A character of several bytes just before the scheme (curly quotes pasted from a
        // document): the scan must not panic by slicing inside it.
        assert_eq!(
            redact_passwords("1 | nodes = [\u{201c}redis://:pw@h:1\u{201d}]"),
            "1 | nodes = [\u{201c}redis://:***@h:1\u{201d}]"
        );
        for before in ["\u{e9}", "\u{ab}", "\u{df}", "\u{1f512}"] {
            let redacted = redact_passwords(&format!("x = {before}redis://u:pw@h:1"));
            assert_eq!(redacted, format!("x = {before}redis://u:***@h:1"));
        }
    }

    /// A private key pasted into the file (`client_key_pem`) never shows in the error of a
    /// file around it that is not valid: misspelt, misplaced, repeated, or given where
    /// another type is expected. toml's own message quotes the offending line whole.
    #[test]
    fn a_bad_file_never_shows_a_private_key_it_holds() {
        let key = "-----BEGIN PRIVATE KEY-----\\nS3CRET\\n-----END PRIVATE KEY-----\\n";
        let files = [
            format!("client_key_pem = \"{key}\"\n"),
            format!("[tls]\nclient_key_pm = \"{key}\"\n"),
            format!("[tls]\nclient_key_pem = \"{key}\"\nclient_key_pem = \"{key}\"\n"),
            format!("tls = \"{key}\"\n"),
            format!("ttl = \"{key}\"\n"),
            format!(
                "[tls]\nclient_key_pem = \"\"\"\n{}\"\"\"\nx = 1\n",
                key.replace("\\n", "\n")
            ),
            format!(
                "[tls]\nclient_key_pem = 5\nca_pem = \"{}\"\n",
                key.replace("PRIVATE KEY-----\\nS3CRET", "EC PRIVATE KEY-----\\nS3CRET")
            ),
        ];
        for file in files {
            let shown = parse(Path::new("redlock.toml"), &file)
                .expect_err(&file)
                .to_string();
            assert!(!shown.contains("S3CRET"), "{shown}");
            assert!(shown.contains("line "), "{shown}");
        }
        assert_eq!(
            redact_private_keys(
                "a -----BEGIN RSA PRIVATE KEY-----\nS3CRET\n-----END RSA PRIVATE KEY----- b"
            ),
            "a <private key, not shown> b"
        );
        assert_eq!(
            redact_private_keys("-----BEGIN CERTIFICATE-----x-----END CERTIFICATE-----"),
            "-----BEGIN CERTIFICATE-----x-----END CERTIFICATE-----"
        );
        assert_eq!(
            redact_private_keys("\"-----BEGIN PRIVATE KEY-----\nS3CRET"),
            "\"<private key, not shown>"
        );
    }

    /// A config file that toml cannot parse, with a curly quote before a URL, is a
    /// config error, not a panic.
    #[test]
    fn a_config_with_curly_quotes_is_a_parse_error() {
        let err = parse(
            Path::new("redlock.toml"),
            "nodes = [\u{201c}redis://:secret@127.0.0.1:7001\u{201d}]\n",
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, CliError::ParseConfig { .. }), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }
}

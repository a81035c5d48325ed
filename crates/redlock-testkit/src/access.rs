//! Who may reach a node and how: the `redis-server` arguments for a password, ACL users, a
//! TLS listener and a unix socket, the checks on those options, and the redaction that keeps
//! their secrets out of `Debug` output, errors and log tails.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::{HarnessError, NodeOptions, TestPki};

/// What a secret is replaced with.
pub(crate) const REDACTED: &str = "***";

/// File name of the unix socket inside the node's directory.
const SOCKET_FILE: &str = "redis.sock";

/// `sun_path` holds 108 bytes with the terminating NUL; redis-server silently truncates a
/// longer path (and then listens somewhere else), so the harness refuses it up front.
const MAX_SOCKET_PATH: usize = 107;

/// Where a node listens besides its plain port.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Listeners<'a> {
    /// The TLS port and the certificates it presents.
    pub(crate) tls: Option<(u16, &'a TestPki)>,
    /// The unix socket path.
    pub(crate) unix_socket: Option<&'a Path>,
}

/// Rejects options that cannot give a working node, before anything is started. The reasons
/// never quote a secret.
pub(crate) fn validate(opts: &NodeOptions) -> Result<(), HarnessError> {
    let invalid = |reason: String| Err(HarnessError::InvalidOptions { reason });
    if opts.password.as_deref() == Some("") {
        return invalid(
            "NodeOptions::password is empty; use None for a node without a password".to_owned(),
        );
    }
    for (i, rule) in opts.acl_users.iter().enumerate() {
        if rule.split_whitespace().next().is_none() {
            return invalid(format!(
                "NodeOptions::acl_users[{i}] is empty; give a rule line such as \
                 \"locker on >secret ~redlock:* +set\""
            ));
        }
    }
    if let Some(tls) = &opts.tls {
        if tls.server_names.is_empty() {
            return invalid(
                "TlsNodeOptions::server_names is empty; the server certificate needs at least \
                 one subject alternative name (the default is localhost and 127.0.0.1)"
                    .to_owned(),
            );
        }
    }
    Ok(())
}

/// The unix socket path of a node whose directory is `dir`, checked against the `sun_path`
/// limit.
pub(crate) fn socket_path(name: &str, dir: &Path) -> Result<PathBuf, HarnessError> {
    let path = dir.join(SOCKET_FILE);
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(HarnessError::InvalidOptions {
            reason: format!(
                "{name}: the unix socket path {} is {len} bytes, over the {MAX_SOCKET_PATH} a \
                 socket address holds; point TMPDIR at a shorter directory",
                path.display()
            ),
        });
    }
    Ok(path)
}

/// The `redis-server` arguments for the password, the ACL users and the extra listeners.
pub(crate) fn server_args(opts: &NodeOptions, listeners: Listeners<'_>) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    if let Some(password) = &opts.password {
        args.extend(["--requirepass".into(), password.into()]);
    }
    for rule in &opts.acl_users {
        // redis-server joins the words after `--user` into one `user` directive, quoting each
        // word on its own: a rule passed as one argument would become one (invalid) user name.
        args.push("--user".into());
        args.extend(rule.split_whitespace().map(OsString::from));
    }
    if let (Some((port, pki)), Some(tls)) = (listeners.tls, &opts.tls) {
        args.extend([
            "--tls-port".into(),
            port.to_string().into(),
            "--tls-cert-file".into(),
            pki.server_cert_path().into(),
            "--tls-key-file".into(),
            pki.server_key_path().into(),
            "--tls-ca-cert-file".into(),
            pki.ca_path().into(),
            "--tls-auth-clients".into(),
            if tls.require_client_cert { "yes" } else { "no" }.into(),
        ]);
    }
    if let Some(path) = listeners.unix_socket {
        args.extend([
            "--unixsocket".into(),
            path.into(),
            "--unixsocketperm".into(),
            "700".into(),
        ]);
    }
    args
}

/// Every secret of `opts`: the password and the cleartext passwords of the ACL rules
/// (`>pw` adds, `<pw` removes one).
pub(crate) fn secrets(opts: &NodeOptions) -> Vec<String> {
    let mut secrets: Vec<String> = opts.password.iter().cloned().collect();
    for rule in &opts.acl_users {
        secrets.extend(
            rule.split_whitespace()
                .filter_map(|word| word.strip_prefix('>').or_else(|| word.strip_prefix('<')))
                .filter(|pw| !pw.is_empty())
                .map(str::to_owned),
        );
    }
    // Longest first, so a secret that contains another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets
}

/// `text` with every occurrence of every secret replaced by `***` (log tails quote the
/// configuration line redis-server rejected, ACL passwords included).
pub(crate) fn redact(text: &str, secrets: &[String]) -> String {
    secrets
        .iter()
        .filter(|s| !s.is_empty())
        .fold(text.to_owned(), |text, secret| {
            text.replace(secret, REDACTED)
        })
}

/// An ACL rule line with its cleartext passwords replaced: `locker on >*** ~k:* +set`.
pub(crate) fn redact_rule(rule: &str) -> String {
    rule.split_whitespace()
        .map(|word| match word.chars().next() {
            Some(c @ ('>' | '<')) if word.len() > 1 => format!("{c}{REDACTED}"),
            _ => word.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TlsNodeOptions;

    fn strings(args: &[OsString]) -> Vec<&str> {
        args.iter().map(|a| a.to_str().unwrap()).collect()
    }

    #[test]
    fn password_and_acl_users_become_arguments() {
        let opts = NodeOptions {
            password: Some("pw with space".to_owned()),
            acl_users: vec!["locker  on >secret ~redlock:* &* +set".to_owned()],
            ..NodeOptions::default()
        };
        let none = Listeners {
            tls: None,
            unix_socket: None,
        };
        let args = server_args(&opts, none);
        assert_eq!(
            strings(&args),
            [
                "--requirepass",
                "pw with space",
                "--user",
                "locker",
                "on",
                ">secret",
                "~redlock:*",
                "&*",
                "+set"
            ]
        );
        assert!(server_args(&NodeOptions::default(), none).is_empty());
    }

    #[test]
    fn unix_socket_arguments() {
        let path = Path::new("/d/redis.sock");
        let listeners = Listeners {
            tls: None,
            unix_socket: Some(path),
        };
        let args = server_args(&NodeOptions::default(), listeners);
        assert_eq!(
            strings(&args),
            ["--unixsocket", "/d/redis.sock", "--unixsocketperm", "700"]
        );
    }

    #[test]
    fn socket_paths_over_the_limit_are_refused() {
        assert!(socket_path("node-0", Path::new("/tmp/x")).is_ok());
        let long = format!("/{}", "d".repeat(100));
        let err = socket_path("node-0", Path::new(&long)).unwrap_err();
        assert!(err.to_string().contains("TMPDIR"), "{err}");
    }

    #[test]
    fn invalid_options_are_named_without_secrets() {
        let empty_password = NodeOptions {
            password: Some(String::new()),
            ..NodeOptions::default()
        };
        assert!(validate(&empty_password).is_err());
        let empty_rule = NodeOptions {
            acl_users: vec!["  ".to_owned()],
            ..NodeOptions::default()
        };
        assert!(validate(&empty_rule)
            .unwrap_err()
            .to_string()
            .contains("acl_users[0]"));
        let no_names = NodeOptions {
            tls: Some(TlsNodeOptions {
                server_names: Vec::new(),
                ..TlsNodeOptions::default()
            }),
            ..NodeOptions::default()
        };
        assert!(validate(&no_names).is_err());
        let fine = NodeOptions {
            password: Some("pw".to_owned()),
            acl_users: vec!["u on >pw2".to_owned()],
            tls: Some(TlsNodeOptions::default()),
            unix_socket: true,
            ..NodeOptions::default()
        };
        assert!(validate(&fine).is_ok());
    }

    #[test]
    fn secrets_are_redacted_longest_first() {
        let opts = NodeOptions {
            password: Some("pw".to_owned()),
            acl_users: vec!["u on >pw-long <old > ~k:*".to_owned()],
            ..NodeOptions::default()
        };
        assert_eq!(secrets(&opts), ["pw-long", "old", "pw"]);
        let log = ">>> 'user \"u\" \"on\" \">pw-long\"' requirepass pw";
        assert_eq!(
            redact(log, &secrets(&opts)),
            ">>> 'user \"u\" \"on\" \">***\"' requirepass ***"
        );
        assert_eq!(redact_rule("u on >pw <x > ~k:*"), "u on >*** <*** > ~k:*");
    }
}

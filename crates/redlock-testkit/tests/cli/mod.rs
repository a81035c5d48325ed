//! `redis-cli` as an outside client of the harness's nodes (TLS, unix socket, ACL users),
//! shared by the access tests. Found with [`find_redis_cli`]: beside redis-server, else on
//! PATH.
// Each test file uses part of the helper.
#![allow(dead_code)]

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use redlock_testkit::find_redis_cli;

/// What one `redis-cli -e ...` run printed and whether it exited with success.
#[derive(Debug)]
pub struct Reply {
    /// Exit status 0 (`-e`: a command error reply exits non-zero too).
    pub ok: bool,
    /// stdout followed by stderr, trimmed.
    pub text: String,
}

/// Builds one `redis-cli -e` command line.
#[derive(Debug, Default)]
pub struct Cli {
    args: Vec<OsString>,
}

impl Cli {
    /// `-h 127.0.0.1 -p PORT`.
    pub fn tcp(port: u16) -> Cli {
        Cli::default()
            .arg("-h")
            .arg("127.0.0.1")
            .arg("-p")
            .arg(port.to_string())
    }

    /// `-s PATH`.
    pub fn unix(path: &Path) -> Cli {
        Cli::default().arg("-s").arg(path)
    }

    /// `--tls --cacert CA` (plus `--cert`/`--key` with [`Cli::client_cert`]).
    pub fn tls(self, ca: &Path) -> Cli {
        self.arg("--tls").arg("--cacert").arg(ca)
    }

    /// `--cert CERT --key KEY`.
    pub fn client_cert(self, cert: &Path, key: &Path) -> Cli {
        self.arg("--cert").arg(cert).arg("--key").arg(key)
    }

    /// `--pass PASSWORD` (as `default`).
    pub fn password(self, password: &str) -> Cli {
        self.arg("--no-auth-warning").arg("--pass").arg(password)
    }

    /// `--user USER --pass PASSWORD`.
    pub fn user(self, user: &str, password: &str) -> Cli {
        self.arg("--user").arg(user).password(password)
    }

    fn arg(mut self, arg: impl Into<OsString>) -> Cli {
        self.args.push(arg.into());
        self
    }

    /// Runs `command` (e.g. `["PING"]`) and returns what came back.
    pub fn run(&self, command: &[&str]) -> Reply {
        let cli = find_redis_cli().expect("redis-cli (apt-get install -y redis-tools)");
        let out = Command::new(cli)
            .arg("-e")
            .args(&self.args)
            .args(command)
            .output()
            .expect("run redis-cli");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Reply {
            ok: out.status.success(),
            text: text.trim().to_owned(),
        }
    }

    /// Asserts that `PING` gets `PONG`.
    pub fn assert_pong(&self, what: &str) {
        let reply = self.run(&["PING"]);
        assert!(reply.ok && reply.text == "PONG", "{what}: {reply:?}");
    }
}

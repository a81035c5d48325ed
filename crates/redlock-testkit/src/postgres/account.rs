//! The account `initdb` and `postgres` run as.
//!
//! Both refuse to run as root ("cannot be run as root"), and CI containers run the tests as
//! root. Then the harness runs them as the `postgres` system user, which Debian's package
//! creates: it hands the instance's temporary directory to that user (chown) and sets the
//! child's uid and gid with `CommandExt::uid`/`gid`, which std applies between fork and exec
//! (dropping root's supplementary groups too).
//!
//! Why not `runuser -u postgres --`: runuser stays the parent of the server, so the pid the
//! harness holds would be runuser's, signals for a fast shutdown would have to be relayed, and
//! the parent-death signal that takes the server down with a killed test process would reach
//! runuser rather than the server. With `uid`/`gid` the child *is* the server.

use std::path::Path;
use std::process::Command;

use nix::unistd::{Gid, Uid, User};

use crate::HarnessError;

/// The system user created by Debian's `postgresql` package.
const SYSTEM_USER: &str = "postgres";

/// Who the server processes run as.
#[derive(Clone, Debug)]
pub(crate) enum RunAs {
    /// The current user, who is not root.
    Current,
    /// The unprivileged [`SYSTEM_USER`], because the current user is root.
    User {
        /// Account name, for messages.
        name: String,
        /// Its uid.
        uid: Uid,
        /// Its primary group.
        gid: Gid,
    },
}

impl RunAs {
    /// The current user, or [`SYSTEM_USER`] when running as root.
    pub(crate) fn pick() -> Result<RunAs, HarnessError> {
        if !nix::unistd::geteuid().is_root() {
            return Ok(RunAs::Current);
        }
        let missing = |reason: String| HarnessError::PostgresStart {
            step: "pick an unprivileged account to run PostgreSQL as (it refuses to run as root)"
                .to_owned(),
            reason,
            advice: format!(
                "install Debian's package, which creates the `{SYSTEM_USER}` user \
                 (apt-get install -y postgresql), or create it (useradd --system \
                 {SYSTEM_USER}), or run the tests as a non-root user"
            ),
            log_tail: "(none: nothing was run yet)".to_owned(),
        };
        match User::from_name(SYSTEM_USER) {
            Ok(Some(user)) if !user.uid.is_root() => Ok(RunAs::User {
                name: user.name,
                uid: user.uid,
                gid: user.gid,
            }),
            Ok(Some(_)) => Err(missing(format!("the `{SYSTEM_USER}` user has uid 0"))),
            Ok(None) => Err(missing(format!("there is no `{SYSTEM_USER}` user"))),
            Err(e) => Err(missing(format!("looking up `{SYSTEM_USER}` failed: {e}"))),
        }
    }

    /// Makes `dir` (the instance's temporary directory, created by root with mode 0700)
    /// writable by the account: initdb creates the data directory inside it, and the server
    /// its socket, lock and log files.
    pub(crate) fn take_over(&self, dir: &Path) -> Result<(), HarnessError> {
        match self {
            RunAs::Current => Ok(()),
            RunAs::User { name, uid, gid } => {
                std::os::unix::fs::chown(dir, Some(uid.as_raw()), Some(gid.as_raw())).map_err(|e| {
                    HarnessError::io(format!("give {} to the user {name}", dir.display()), e)
                })
            }
        }
    }

    /// Makes `cmd` run as the account.
    pub(crate) fn apply(&self, cmd: &mut Command) {
        if let RunAs::User { uid, gid, .. } = self {
            std::os::unix::process::CommandExt::uid(cmd, uid.as_raw());
            std::os::unix::process::CommandExt::gid(cmd, gid.as_raw());
        }
    }

    /// Advice for a failed start: an unprivileged account must be able to reach the directory.
    pub(crate) fn advice(&self) -> String {
        match self {
            RunAs::Current => String::new(),
            RunAs::User { name, .. } => format!(
                " (running as root, so PostgreSQL runs as the user {name}: every parent of the \
                 temporary directory must be searchable by it; point TMPDIR elsewhere, e.g. \
                 TMPDIR=/tmp, if it is not)"
            ),
        }
    }
}

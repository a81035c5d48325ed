//! What can go wrong, each with the exit code it maps to. Every message says what to do;
//! node URLs appear only redacted (`NodeName`), and the library's own messages already
//! follow both rules.

use std::path::PathBuf;

use redlock_client::{Error as LockError, InvalidConfig, LostReason, NodeOutcome, RoundReport};
use redlock_core::ConfigError;

use crate::exit::Exit;

/// Why `redlock` stopped without doing what was asked.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The configuration file could not be read.
    #[error("cannot read the configuration file {path}: {source}; check the path given by --config or REDLOCK_CONFIG")]
    ReadConfig {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The configuration file is not a valid `LockConfig`.
    #[error("the configuration file {path} is not valid: {reason}; see the README's configuration section for its fields")]
    ParseConfig {
        /// The file.
        path: PathBuf,
        /// The parser's message and where it points (line, column), with URL passwords and
        /// private keys masked: never the offending line itself.
        reason: String,
    },
    /// A value from flags, environment or file cannot work.
    #[error("{0}; fix the flag, environment variable or configuration file that sets it")]
    InvalidConfig(redlock_client::InvalidConfig),
    /// An argument on the command line cannot work: an empty or reserved key, a token that
    /// cannot be stored, a counter out of range.
    #[error("{0}; fix the argument on the command line")]
    InvalidArgument(redlock_client::ArgumentError),
    /// `--grace` does not fit in the lock's validity.
    #[error("{reason}")]
    Grace {
        /// What is wrong and what to change.
        reason: String,
    },
    /// Too few nodes answered usably to decide anything: unreachable, too slow, or
    /// refusing (an ACL without a permission, a replica); the report's advice says which.
    #[error("{what}: fewer than a quorum of nodes gave a usable answer ({report}); {}; `redlock nodes` shows each node", report.advice())]
    Unavailable {
        /// What was being done.
        what: String,
        /// What each node answered.
        report: Box<RoundReport>,
    },
    /// The lock stayed busy for the whole wait (or every round won too little validity).
    #[error("{0}; `redlock run --wait` sets how long to wait, `redlock inspect KEY` shows how long the holder still has")]
    NotAcquired(LockError),
    /// The lock was lost while the command ran, or was about to run out with no renewal
    /// extending it.
    #[error("{}", lock_lost(key, reason, renewal.as_deref()))]
    LockLost {
        /// The full key.
        key: String,
        /// Why.
        reason: LostReason,
        /// Why renewal did not extend the lock, when it was stopped before its validity
        /// ended (the guard's last renewal error: nodes that did not answer, or
        /// `renewal.max_hold` reached).
        renewal: Option<String>,
    },
    /// The command does not exist.
    #[error("command `{program}` not found: check its spelling and PATH, or give its full path")]
    CommandNotFound {
        /// The program as given.
        program: String,
    },
    /// The command exists but could not be started.
    #[error(
        "command `{program}` could not be started: {source}; check that it is an executable file"
    )]
    CannotExecute {
        /// The program as given.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// The command succeeded, but its lock's release failed on a quorum of nodes (refused,
    /// as by an ACL without the scripts, or not answered): the key stays until its TTL.
    #[error("could not confirm the release of \"{key}\": {error}; it expires by itself at the end of its TTL")]
    ReleaseFailed {
        /// The full key.
        key: String,
        /// Why.
        error: LockError,
    },
    /// So many nodes refuse the commands the lock needs (found at connect) that no quorum
    /// is left: nothing could be released.
    #[error("{0}; `redlock nodes` shows each node")]
    CommandsRefused(redlock_client::InvalidConfig),
    /// Any other failure of a round (a release or an inspection that did not reach its goal).
    #[error("{0}")]
    Round(LockError),
    /// The runtime could not be set up (signal handlers, threads).
    #[error("cannot set up the process: {0}; this is an environment problem, not a lock one")]
    Setup(std::io::Error),
}

impl CliError {
    /// The exit code for this error (see `exit.rs`).
    pub fn exit(&self) -> Exit {
        match self {
            CliError::ReadConfig { .. }
            | CliError::ParseConfig { .. }
            | CliError::InvalidConfig(_)
            | CliError::Grace { .. } => Exit::Config,
            CliError::Unavailable { .. }
            | CliError::ReleaseFailed { .. }
            | CliError::CommandsRefused(_) => Exit::Unavailable,
            CliError::InvalidArgument(_) => Exit::Usage,
            CliError::NotAcquired(_) => Exit::NotAcquired,
            CliError::LockLost { .. } => Exit::LockLost,
            CliError::CommandNotFound { .. } => Exit::NotFound,
            CliError::CannotExecute { .. } => Exit::CannotExecute,
            CliError::Round(_) | CliError::Setup(_) => Exit::Unavailable,
        }
    }

    /// Sorts a library error by what the caller can do about it: `what` names the step
    /// for the "unavailable" message.
    pub fn from_lock(what: &str, error: LockError) -> CliError {
        if let LockError::InvalidConfig(invalid) = error {
            // The nodes' ACL, not this command's configuration.
            if let InvalidConfig::Core(ConfigError::CommandsRefused { .. }) = invalid {
                return CliError::CommandsRefused(invalid);
            }
            return CliError::InvalidConfig(invalid);
        }
        if let LockError::InvalidArgument(invalid) = error {
            return CliError::InvalidArgument(invalid);
        }
        if let LockError::LockLost { key, reason } = error {
            return CliError::LockLost {
                key,
                reason,
                renewal: None,
            };
        }
        // A round that fewer than a quorum of nodes answered says nothing about the lock:
        // the nodes, not the lock, are the problem. Checked before "not acquired", because
        // the client calls a round with one answering node of three "not acquired".
        if let Some(report) = error.report().filter(|r| too_few_answers(r)) {
            return CliError::Unavailable {
                what: what.to_string(),
                report: Box::new(report.clone()),
            };
        }
        match error {
            // Every node answered; the last round won with too little validity left.
            LockError::NotAcquired { .. }
            | LockError::DeadlinePassed { .. }
            | LockError::BelowMinValidity { .. } => CliError::NotAcquired(error),
            other => CliError::Round(other),
        }
    }
}

/// Whether so many nodes failed in `report` (no answer in time, connection down, or an
/// error reply) that no quorum could have been reached, whatever the others answered.
pub fn too_few_answers(report: &RoundReport) -> bool {
    let failed = report
        .nodes
        .iter()
        .filter(|n| {
            matches!(
                n.outcome,
                NodeOutcome::TimedOut
                    | NodeOutcome::ConnectionError(_)
                    | NodeOutcome::ServerError(_)
            )
        })
        .count();
    failed > report.nodes.len() - report.quorum
}

/// The message of [`CliError::LockLost`]: what removed the key, or why renewal stopped.
fn lock_lost(key: &str, reason: &LostReason, renewal: Option<&str>) -> String {
    match renewal {
        Some(why) => format!(
            "lock \"{key}\" was about to run out and renewal did not extend it ({why}); the \
             command was stopped before the lock's validity ended. If renewal reached \
             `renewal.max_hold`, raise it or end the command sooner; otherwise `redlock nodes` \
             shows which nodes do not answer"
        ),
        None => format!(
            "lock \"{key}\" was lost while the command ran: {reason}; the command was \
             stopped. Find out what removed the key (a node restarted without persistence, \
             an operator, an expired TTL while the nodes were unreachable) before running it \
             again"
        ),
    }
}

//! The harness error type. Every message says what went wrong and what to do about it.

use std::time::Duration;

/// Everything that can go wrong while starting, faulting or inspecting redis-server nodes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// No usable `redis-server` binary was found.
    #[error(
        "redis-server not found ({detail}): install it with `apt-get install -y redis-server` \
         (Debian) or set REDIS_SERVER to the path of a redis-server binary"
    )]
    BinaryNotFound {
        /// Where the harness looked.
        detail: String,
    },

    /// A local I/O operation (temp dir, log file, free-port probe, spawn, wait) failed.
    #[error("could not {action}: {source}")]
    Io {
        /// What the harness was doing.
        action: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// redis-server exited or misbehaved during start-up.
    #[error(
        "{name} (port {port}) failed to start: {reason}\n\
         --- last lines of the redis-server log ---\n{log_tail}"
    )]
    StartFailed {
        /// Node name (`node-0`, ...).
        name: String,
        /// Port it was started on.
        port: u16,
        /// Why the start is considered failed.
        reason: String,
        /// The last lines redis-server wrote during this start attempt.
        log_tail: String,
    },

    /// Every free port handed out by the OS was taken by someone else before redis-server bound it.
    #[error(
        "{name}: no free loopback port after {attempts} attempts (each port was taken by another \
         process before redis-server could bind it); stop stray servers or retry\n\
         --- last lines of the redis-server log ---\n{log_tail}"
    )]
    PortUnavailable {
        /// Node name.
        name: String,
        /// How many ports were tried.
        attempts: usize,
        /// Log of the last attempt.
        log_tail: String,
    },

    /// redis-server kept running but did not answer `PING` with `PONG` in time.
    #[error(
        "{name} (port {port}) did not answer PING with PONG within {waited:?}; the machine may be \
         overloaded or the server stuck (it has been killed)\n\
         --- last lines of the redis-server log ---\n{log_tail}"
    )]
    NotReady {
        /// Node name.
        name: String,
        /// Port it was started on.
        port: u16,
        /// How long the harness waited.
        waited: Duration,
        /// The last lines redis-server wrote.
        log_tail: String,
    },

    /// The operation needs a running process but the node was killed or has exited.
    #[error(
        "{name}: cannot {action}: the node is not running (it was killed or exited); call \
         restart() first"
    )]
    NotRunning {
        /// Node name.
        name: String,
        /// What was attempted (`pause`, `GET k`, ...).
        action: String,
    },

    /// Sending a signal to the node's process failed.
    #[error("sending {signal} to {name} (pid {pid}) failed: {source}")]
    Signal {
        /// Node name.
        name: String,
        /// Process id.
        pid: u32,
        /// The signal that was sent.
        signal: nix::sys::signal::Signal,
        /// The errno returned by kill(2).
        #[source]
        source: nix::errno::Errno,
    },

    /// An inspection command got no answer in time (typically: the node is paused).
    #[error(
        "{op} on {name} (port {port}) got no answer within {timeout:?}: the node is paused or \
         unresponsive; call resume() (or restart() if it was killed) before inspecting it"
    )]
    Timeout {
        /// Node name.
        name: String,
        /// Port of the node.
        port: u16,
        /// The command, e.g. `GET lock:a`.
        op: String,
        /// The deadline that was exceeded.
        timeout: Duration,
    },

    /// An inspection command failed (connection refused, protocol or server error).
    #[error(
        "{op} on {name} (port {port}) failed: {source}; if the node is paused call resume(), if it \
         was killed call restart()"
    )]
    Redis {
        /// Node name.
        name: String,
        /// Port of the node.
        port: u16,
        /// The command, e.g. `GET lock:a`.
        op: String,
        /// The client error.
        #[source]
        source: fred::error::Error,
    },
}

impl HarnessError {
    /// Builds an [`HarnessError::Io`] from a description of the action.
    pub(crate) fn io(action: impl Into<String>, source: std::io::Error) -> Self {
        HarnessError::Io {
            action: action.into(),
            source,
        }
    }
}

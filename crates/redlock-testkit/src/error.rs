//! The harness error type. Every message says what went wrong and what to do about it.

use std::time::Duration;

/// Everything that can go wrong while starting, faulting or inspecting redis-server nodes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// No usable server binary (`redis-server`, or the one `REDIS_SERVER` names) was found.
    #[error(
        "redis-server not found ({detail}): install it with `apt-get install -y redis-server` \
         (Debian) or set REDIS_SERVER to the path of a server binary (redis-server, \
         valkey-server)"
    )]
    BinaryNotFound {
        /// Where the harness looked.
        detail: String,
    },

    /// [`NodeOptions`](crate::NodeOptions) that cannot give a working node (an empty password
    /// or ACL rule, a TLS certificate without names, a unix socket path that is too long).
    /// Nothing was started. The reason never quotes a secret.
    #[error("invalid node options: {reason}")]
    InvalidOptions {
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// Generating the test certificates of a TLS node set ([`TestPki`](crate::TestPki))
    /// failed.
    #[error(
        "could not generate the test certificates ({step}): {reason}; check \
         TlsNodeOptions::server_names (DNS names or IP addresses)"
    )]
    Certificates {
        /// The step: which key or certificate.
        step: String,
        /// The certificate generator's error.
        reason: String,
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
         --- last lines of the server log ---\n{log_tail}"
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
         --- last lines of the server log ---\n{log_tail}"
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
         --- last lines of the server log ---\n{log_tail}"
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

    /// The clock shim (the LD_PRELOAD library behind `NodeOptions::fake_clock`) could not be
    /// built.
    #[error("clock shim: could not {step}: {detail}\n{advice}")]
    ClockShim {
        /// The step that failed, with the compiler command or the path involved.
        step: String,
        /// What went wrong (for a compiler failure: its exit status and stderr).
        detail: String,
        /// What to do about it.
        advice: &'static str,
    },

    /// A fake-clock change was rejected (bad rate, offset overflow); the clock is unchanged.
    #[error("{clock}: {reason}; the clock was left unchanged")]
    InvalidClock {
        /// Which clock (`node-0 clock`, or `clock <path>`).
        clock: String,
        /// Why the change is invalid.
        reason: String,
    },

    /// Writing a fake clock's control file failed.
    #[error(
        "{clock}: could not {action}: {source}; the clock was left unchanged (check that the \
         directory exists and is writable; a node's directory lives as long as the node)"
    )]
    ClockFile {
        /// Which clock.
        clock: String,
        /// What was attempted, with the file.
        action: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The docker backend cannot run here: `docker` or `docker-compose` is missing, the Docker
    /// daemon is unreachable, or another docker node set of this process is still up.
    #[error("docker node set unavailable: {reason}; {advice}")]
    DockerUnavailable {
        /// What is missing or wrong.
        reason: String,
        /// What to install, start or do.
        advice: String,
    },

    /// A `docker` or `docker-compose` step of the docker node set failed.
    #[error(
        "{name}: could not {action}: {failure}; {advice}\n\
         --- output ---\n{output}"
    )]
    Docker {
        /// The container's service name (`redis1`, ...) or `docker node set`.
        name: String,
        /// What the harness was doing.
        action: String,
        /// The command line (or probe) that failed and how (exit status, timeout, last error).
        failure: String,
        /// What to do about it.
        advice: String,
        /// The command's stderr/stdout or the container log (tail).
        output: String,
    },

    /// A node index outside the set.
    #[error(
        "{set}: cannot {action}: there is no node {index} (the set has {len} nodes: use an \
         index below {len})"
    )]
    NoSuchNode {
        /// Which set.
        set: String,
        /// What was attempted.
        action: String,
        /// The index asked for.
        index: usize,
        /// Number of nodes in the set.
        len: usize,
    },

    /// PostgreSQL's server binaries (`initdb` and `postgres`) were not found.
    #[error(
        "PostgreSQL not found ({detail}): install it with `apt-get install -y postgresql` \
         (Debian) or set REDLOCK_PG_BIN to the directory holding initdb and postgres"
    )]
    PostgresNotFound {
        /// Where the harness looked.
        detail: String,
    },

    /// A step of starting PostgreSQL failed: the account to run as, initdb, the server's
    /// start, its readiness, or finding a port.
    #[error(
        "PostgreSQL: could not {step}: {reason}; {advice}\n\
         --- last lines of its output ---\n{log_tail}"
    )]
    PostgresStart {
        /// The step that failed.
        step: String,
        /// Why.
        reason: String,
        /// What to do about it.
        advice: String,
        /// The last lines initdb or postgres wrote (empty if the step ran neither).
        log_tail: String,
    },

    /// A client could not connect to a running PostgreSQL of the harness.
    #[error(
        "could not connect to PostgreSQL at `{config}`: {source}; the server may have been \
         dropped already (keep the `Postgres` alive while its clients are used)"
    )]
    PostgresClient {
        /// The connection string.
        config: String,
        /// The client error.
        #[source]
        source: tokio_postgres::Error,
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

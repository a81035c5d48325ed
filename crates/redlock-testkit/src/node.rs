//! One redis-server process: start, readiness, faults (kill, pause, resume, restart), reaping.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

use crate::access::{self, Listeners};
use crate::port::{self, PortReservation};
use crate::ready::{self, Probe};
use crate::{process, ClockControl, HarnessError, NodeOptions, TestPki};

/// How long a start or restart may take until the server answers PONG.
pub const READY_TIMEOUT: Duration = Duration::from_secs(5);
/// How many fresh ports a first start tries when the port gets taken under its feet.
const PORT_ATTEMPTS: usize = 5;
/// Pause between readiness probes.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// One redis-server process on `127.0.0.1:port` with its own temporary data directory.
///
/// With [`NodeOptions::tls`] it also listens with TLS on [`Node::tls_port`], with
/// [`NodeOptions::unix_socket`] on [`Node::unix_socket`]; the plain port stays open for the
/// harness. Ports, socket path, certificates and credentials stay the same across restarts.
///
/// All methods take `&self`; the child process sits behind a mutex. Dropping the node sends
/// SIGCONT and SIGKILL, reaps the process and removes its directory. `Debug` shows no secret.
pub struct Node {
    name: String,
    port: PortReservation,
    /// Set with `NodeOptions::tls`.
    pub(crate) tls_port: Option<PortReservation>,
    /// Set with `NodeOptions::unix_socket`; inside `dir`.
    pub(crate) unix_socket: Option<PathBuf>,
    /// The set's certificates, shared by its nodes; set with `NodeOptions::tls`.
    pub(crate) pki: Option<Arc<TestPki>>,
    /// What log tails must not show (see `access::secrets`).
    secrets: Vec<String>,
    binary: PathBuf,
    pub(crate) opts: NodeOptions,
    log: PathBuf,
    proc: Mutex<Option<Proc>>,
    /// Set with `NodeOptions::fake_clock`; its file lives in `dir`, so it survives restarts.
    clock: Option<ClockControl>,
    dir: TempDir,
}

/// The live child and whether it is stopped by SIGSTOP.
#[derive(Debug)]
pub(crate) struct Proc {
    pub(crate) child: Child,
    pub(crate) paused: bool,
}

/// Why one start attempt failed.
pub(crate) enum LaunchError {
    /// The port was bound by another process; a first start may retry on a new port.
    PortTaken(String),
    /// Anything else.
    Fatal(HarnessError),
}

impl Node {
    /// Starts a node named `name`, retrying on fresh ports if a chosen one gets taken. `pki`
    /// is the set's, `Some` exactly when `opts.tls` is.
    pub(crate) async fn start(
        name: String,
        binary: &Path,
        opts: &NodeOptions,
        pki: Option<Arc<TestPki>>,
    ) -> Result<Node, HarnessError> {
        let mut log_tail = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let dir = tempfile::Builder::new()
                .prefix(&format!("redlock-testkit-{name}-"))
                .tempdir()
                .map_err(|e| HarnessError::io("create a temporary data directory", e))?;
            let clock = opts
                .fake_clock
                .then(|| ClockControl::for_node(&name, dir.path().join("clock")))
                .transpose()?;
            let unix_socket = opts
                .unix_socket
                .then(|| access::socket_path(&name, dir.path()))
                .transpose()?;
            let tls_port = pki.is_some().then(port::reserve_free_port).transpose()?;
            let node = Node {
                log: dir.path().join("redis.log"),
                name: name.clone(),
                port: port::reserve_free_port()?,
                tls_port,
                unix_socket,
                pki: pki.clone(),
                secrets: access::secrets(opts),
                binary: binary.to_owned(),
                opts: opts.clone(),
                proc: Mutex::new(None),
                clock,
                dir,
            };
            match node.launch().await {
                Ok(()) => return Ok(node),
                Err(LaunchError::Fatal(e)) => return Err(e),
                Err(LaunchError::PortTaken(tail)) => {
                    tracing::debug!(node = %name, port = node.port(), "port taken, retrying");
                    log_tail = tail;
                }
            }
        }
        Err(HarnessError::PortUnavailable {
            name,
            attempts: PORT_ATTEMPTS,
            log_tail,
        })
    }

    /// Spawns the process (from the calling thread) and waits until it answers PONG.
    /// On failure the process is killed and reaped.
    pub(crate) async fn launch(&self) -> Result<(), LaunchError> {
        let env = match &self.clock {
            Some(clock) => clock.spawn_env().map_err(LaunchError::Fatal)?,
            None => Vec::new(),
        };
        let listeners = Listeners {
            tls: self.tls_port().zip(self.pki.as_deref()),
            unix_socket: self.unix_socket(),
        };
        let args = process::server_args(
            self.port(),
            self.dir.path(),
            &self.log,
            &self.opts,
            &access::server_args(&self.opts, listeners),
        );
        let (child, offset) = process::spawn(&self.binary, &args, self.dir.path(), &self.log, &env)
            .map_err(LaunchError::Fatal)?;
        let pid = child.id();
        *self.lock() = Some(Proc {
            child,
            paused: false,
        });
        let result = self.wait_ready(pid, offset).await;
        if result.is_err() {
            self.kill().map_err(LaunchError::Fatal)?;
        }
        result
    }

    async fn wait_ready(&self, pid: u32, offset: u64) -> Result<(), LaunchError> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.reap_if_exited(pid) {
                let log_tail = self.log_tail_from(offset);
                if process::says_port_in_use(&log_tail) {
                    return Err(LaunchError::PortTaken(log_tail));
                }
                return Err(LaunchError::Fatal(HarnessError::StartFailed {
                    name: self.name.clone(),
                    port: self.port(),
                    reason: format!(
                        "the server exited during start-up ({status}); check the arguments \
                         (NodeOptions::extra_args) against the log below"
                    ),
                    log_tail,
                }));
            }
            match ready::probe(self.port(), self.opts.password.as_deref()).await {
                Probe::Pong { pid: answered } if answered == pid => return Ok(()),
                Probe::Pong { pid: answered } => {
                    return Err(LaunchError::PortTaken(format!(
                        "port {} is answered by another server process (pid {answered})",
                        self.port()
                    )))
                }
                Probe::NotYet => {}
            }
            if started.elapsed() >= READY_TIMEOUT {
                return Err(LaunchError::Fatal(HarnessError::NotReady {
                    name: self.name.clone(),
                    port: self.port(),
                    waited: started.elapsed(),
                    log_tail: self.log_tail_from(offset),
                }));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// The loopback port; it stays the same across restarts. Always plain TCP, also on a TLS
    /// node: the harness probes and inspects every node through it.
    pub fn port(&self) -> u16 {
        self.port.port()
    }

    /// `node-0`, `node-1`, ...
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's data directory (`--dir`), removed when the node is dropped.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The redis-server log file (`--logfile`); restarts append to it.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The control of the node's fake clock, if it was started with
    /// [`NodeOptions::fake_clock`]; `None` otherwise. It stays in effect across
    /// [`Node::restart`].
    pub fn clock(&self) -> Option<&ClockControl> {
        self.clock.as_ref()
    }

    /// The last lines of the log file, for diagnostics, with the node's secrets (password,
    /// ACL passwords) replaced by `***`.
    pub fn log_tail(&self) -> String {
        self.log_tail_from(0)
    }

    /// The last lines written after `offset`, secrets redacted.
    pub(crate) fn log_tail_from(&self, offset: u64) -> String {
        access::redact(&process::log_tail(&self.log, offset), &self.secrets)
    }

    /// Process id of the running server, if it is running.
    pub fn pid(&self) -> Option<u32> {
        self.is_running()
            .then(|| self.lock().as_ref().map(|p| p.child.id()))
            .flatten()
    }

    /// Whether the process is alive (a paused process counts as running). A process that
    /// exited by itself is reaped here.
    pub fn is_running(&self) -> bool {
        let mut state = self.lock();
        match state.as_mut().map(|p| p.child.try_wait()) {
            Some(Ok(None)) => true,
            Some(_) => {
                *state = None;
                false
            }
            None => false,
        }
    }

    /// Whether the process is stopped by [`Node::pause`].
    pub fn is_paused(&self) -> bool {
        self.is_running() && self.lock().as_ref().is_some_and(|p| p.paused)
    }

    pub(crate) fn not_running(&self, action: &str) -> HarnessError {
        HarnessError::NotRunning {
            name: self.name.clone(),
            action: action.to_owned(),
        }
    }

    /// Reaps the process `pid` if it has exited, returning its status.
    fn reap_if_exited(&self, pid: u32) -> Option<ExitStatus> {
        let mut state = self.lock();
        let proc = state.as_mut().filter(|p| p.child.id() == pid)?;
        let status = proc.child.try_wait().ok()??;
        *state = None;
        Some(status)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<Proc>> {
        self.proc.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let state = self.proc.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(mut proc) = state.take() {
            if let Ok(None) = proc.child.try_wait() {
                let pid = Pid::from_raw(proc.child.id() as i32);
                let _ = signal::kill(pid, Signal::SIGCONT);
                let _ = signal::kill(pid, Signal::SIGKILL);
            }
            let _ = proc.child.wait();
        }
    }
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (pid, paused) = match self.proc.try_lock().as_deref() {
            Ok(Some(p)) => (Some(p.child.id()), p.paused),
            _ => (None, false),
        };
        f.debug_struct("Node")
            .field("name", &self.name)
            .field("port", &self.port())
            .field("tls_port", &self.tls_port())
            .field("unix_socket", &self.unix_socket)
            .field("pid", &pid)
            .field("paused", &paused)
            .field("dir", &self.dir.path())
            .finish()
    }
}

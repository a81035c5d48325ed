//! Process faults: kill, pause (SIGSTOP), resume (SIGCONT), restart on the same port, and a
//! delayed restart.
//!
//! Restart faults by name, for Redlock's assumption H2 (no key vanishes before its TTL):
//! - **restart without persistence** (default [`NodeOptions`](crate::NodeOptions)):
//!   [`Node::restart`] brings the node back empty at once, forgetting the locks it held;
//! - **restart with `appendfsync always`**: a node started with
//!   `NodeOptions { appendonly_always: true, .. }` replays its AOF on [`Node::restart`], so
//!   every key acknowledged before even a SIGKILL is still there;
//! - **delayed restart**: [`Node::restart_after`] keeps the node down for a while before it
//!   comes back empty; a delay longer than the largest lock TTL is the operational fix the
//!   Redlock spec gives for running without persistence.

use std::time::Duration;

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use crate::node::{LaunchError, Proc};
use crate::{process, HarnessError, Node};

/// Best-effort wait for SIGSTOP/SIGCONT to take effect (checked through `/proc/PID/stat`).
const SIGNAL_SETTLE: Duration = Duration::from_millis(500);

impl Node {
    /// SIGKILL and reap the process. Idempotent: killing a dead node is a no-op.
    pub fn kill(&self) -> Result<(), HarnessError> {
        let mut state = self.lock();
        let Some(proc) = state.as_mut() else {
            return Ok(());
        };
        if let Ok(None) = proc.child.try_wait() {
            // On failure the process stays owned by the node, so Drop still reaps it.
            self.signal(proc, Signal::SIGKILL)?;
        }
        let Some(mut proc) = state.take() else {
            return Ok(());
        };
        drop(state);
        proc.child
            .wait()
            .map_err(|e| HarnessError::io(format!("wait for {}", self.name()), e))?;
        Ok(())
    }

    /// SIGSTOP: the process keeps its sockets but answers nothing until [`Node::resume`].
    pub fn pause(&self) -> Result<(), HarnessError> {
        let pid = self.signal_running("pause", Signal::SIGSTOP, true)?;
        process::wait_state(pid, SIGNAL_SETTLE, |s| matches!(s, Some('T') | None));
        Ok(())
    }

    /// SIGCONT: undo [`Node::pause`]. Resuming a node that is not paused is a no-op signal.
    pub fn resume(&self) -> Result<(), HarnessError> {
        let pid = self.signal_running("resume", Signal::SIGCONT, false)?;
        process::wait_state(pid, SIGNAL_SETTLE, |s| s != Some('T'));
        Ok(())
    }

    /// Kill the process if it runs, then start it again on the same port with the same data
    /// directory and options, and wait until it answers PONG. Without `appendonly_always` the
    /// data is gone afterwards; with it, this is the "restart with `appendfsync always`" fault:
    /// the AOF is replayed and every acknowledged write survives, even after [`Node::kill`].
    pub async fn restart(&self) -> Result<(), HarnessError> {
        self.kill()?;
        match self.launch().await {
            Ok(()) => Ok(()),
            Err(LaunchError::Fatal(e)) => Err(e),
            Err(LaunchError::PortTaken(log_tail)) => Err(HarnessError::StartFailed {
                name: self.name().to_owned(),
                port: self.port(),
                reason: "its port is now used by another process, so it cannot come back on \
                         the same port; stop that process"
                    .to_owned(),
                log_tail,
            }),
        }
    }

    /// Delayed restart: kill the process now, stay down for `delay`, then [`Node::restart`] on
    /// the same port. Without `appendonly_always` the node comes back empty.
    ///
    /// The node is down (requests fail fast with connection refused) for the whole delay; the
    /// future must be polled to the end for the node to come back, so run it concurrently with
    /// the rest of the scenario (e.g. `tokio::join!`) to act during the downtime. If another
    /// process takes the port meanwhile, the restart fails with [`HarnessError::StartFailed`].
    pub async fn restart_after(&self, delay: Duration) -> Result<(), HarnessError> {
        self.kill()?;
        tokio::time::sleep(delay).await;
        self.restart().await
    }

    fn signal_running(&self, action: &str, sig: Signal, paused: bool) -> Result<u32, HarnessError> {
        if !self.is_running() {
            return Err(self.not_running(action));
        }
        let mut state = self.lock();
        let proc = state.as_mut().ok_or_else(|| self.not_running(action))?;
        self.signal(proc, sig)?;
        proc.paused = paused;
        Ok(proc.child.id())
    }

    fn signal(&self, proc: &Proc, sig: Signal) -> Result<(), HarnessError> {
        let pid = proc.child.id();
        signal::kill(Pid::from_raw(pid as i32), sig).map_err(|source| HarnessError::Signal {
            name: self.name().to_owned(),
            pid,
            signal: sig,
            source,
        })
    }
}

//! Running a command line to completion under a deadline, its output captured: how the docker
//! node set calls `docker`, `docker-compose` and the image build script.
//!
//! A command that outlives its deadline is killed with its whole process group, so a script's
//! children (say the `docker build` of the image script) go with it. The async [`run`] keeps
//! the waiting off tokio's worker threads.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// Lines of command output quoted in errors.
pub(crate) const OUTPUT_LINES: usize = 30;

/// What a finished (or killed) command left.
pub(crate) struct Ran {
    /// `None`: killed at its deadline.
    pub(crate) status: Option<ExitStatus>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Ran {
    /// Whether it exited with status 0.
    pub(crate) fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// How it ended, for an error message: `failed (exit status: 1)` or killed at `deadline`.
    pub(crate) fn outcome(&self, deadline: Duration) -> String {
        match self.status {
            None => format!("did not finish within {deadline:?} and was killed"),
            Some(status) => format!("failed ({status})"),
        }
    }

    /// The last lines of stderr and stdout.
    pub(crate) fn output(&self) -> String {
        let both = format!("{}{}", self.stderr, self.stdout);
        let lines: Vec<&str> = both.lines().collect();
        lines[lines.len().saturating_sub(OUTPUT_LINES)..].join("\n")
    }
}

/// [`run_blocking`] on tokio's blocking pool.
pub(crate) async fn run(cmd: Command, deadline: Duration) -> io::Result<Ran> {
    blocking(move || run_blocking(cmd, deadline)).await?
}

/// Runs `f` on tokio's blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(format!("the blocking task failed: {e}")))
}

/// Runs `cmd` to completion, capturing its output; at `deadline` its whole process group is
/// killed (a script's `docker build` child too).
pub(crate) fn run_blocking(mut cmd: Command, deadline: Duration) -> io::Result<Ran> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = cmd.spawn()?;
    let group = Pid::from_raw(i32::try_from(child.id()).map_err(io::Error::other)?);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let (output, killed) = match rx.recv_timeout(deadline) {
        Ok(output) => (output?, false),
        Err(_) => {
            let _ = killpg(group, Signal::SIGKILL);
            let output = rx
                .recv()
                .map_err(|_| io::Error::other("lost the command's output"))??;
            (output, true)
        }
    };
    Ok(Ran {
        status: (!killed).then_some(output.status),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_past_its_deadline_is_killed() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo started; sleep 30"]);
        let ran = run_blocking(cmd, Duration::from_millis(300)).unwrap();
        assert!(!ran.ok());
        assert!(ran.outcome(Duration::from_millis(300)).contains("killed"));
        assert_eq!(ran.output(), "started");
    }

    #[test]
    fn output_keeps_the_last_lines() {
        let ran = Ran {
            status: None,
            stdout: (0..100).map(|i| format!("{i}\n")).collect(),
            stderr: String::new(),
        };
        assert_eq!(ran.output().lines().count(), OUTPUT_LINES);
        assert!(ran.output().ends_with("99"));
    }
}

//! The command `redlock run` holds the lock for: starting it, passing signals on, and
//! stopping it when the lock is lost.
//!
//! **Process groups.** Stopping a command must stop what it started too: a shell script's
//! `sleep`, a build tool's compilers. So the command runs in a process group of its own
//! and every signal goes to the whole group (like `consul lock`). Terminal signals then
//! reach only `redlock`, which passes each on once.
//!
//! There is one exception: when `redlock` runs in the foreground of a terminal, the command
//! stays in `redlock`'s group. A command in a background group that reads the terminal is
//! stopped by SIGTTIN, and job control (Ctrl-Z, `fg`) would see only `redlock`; keeping the
//! group makes `redlock run` as transparent as `flock(1)`. The terminal already delivers
//! Ctrl-C (SIGINT) to the whole foreground group, command included, so `redlock` does not
//! pass SIGINT on there (the command would see it twice, and many programs take a second
//! Ctrl-C as "quit now"); signals that come from elsewhere (SIGTERM, SIGHUP) are passed on.
//! In that case a lost lock stops the command's own process only.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};

use crate::error::CliError;
use crate::exit::Exit;

/// The running command.
#[derive(Debug)]
pub struct Child {
    process: tokio::process::Child,
    pid: Pid,
    /// Whether it leads a process group of its own (see the module docs).
    own_group: bool,
}

impl Child {
    /// Starts `command` (program and arguments) with `env` added to this process's
    /// environment.
    pub fn spawn(command: &[OsString], env: &[(&str, String)]) -> Result<Child, CliError> {
        let (program, args) = command
            .split_first()
            .expect("clap requires at least the program");
        let own_group = !in_terminal_foreground();
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args).envs(env.iter().map(|(k, v)| (k, v)));
        if own_group {
            cmd.process_group(0);
        }
        let process = cmd.spawn().map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => CliError::CommandNotFound {
                program: program.to_string_lossy().into_owned(),
            },
            _ => CliError::CannotExecute {
                program: program.to_string_lossy().into_owned(),
                source,
            },
        })?;
        let pid = process
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
            .expect("a child that was just spawned has a pid");
        tracing::debug!(%pid, own_group, "command started");
        Ok(Child {
            process,
            pid,
            own_group,
        })
    }

    /// Waits for the command to end. Cancel-safe.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.process.wait().await
    }

    /// Passes a signal that `redlock` received on to the command.
    pub fn forward(&self, signal: Signal) {
        if !self.own_group && signal == Signal::SIGINT {
            // The terminal sent it to the command as well (module docs).
            return;
        }
        tracing::debug!(?signal, "passing the signal on to the command");
        self.signal(signal);
    }

    /// Stops the command: SIGTERM, then SIGKILL once `grace` has passed. In its own group,
    /// the SIGKILL goes to the group even when the command itself ended in time, so that
    /// nothing it started keeps using the resource without the lock.
    pub async fn stop(&mut self, grace: Duration) -> std::io::Result<ExitStatus> {
        self.signal(Signal::SIGTERM);
        let status = match tokio::time::timeout(grace, self.process.wait()).await {
            Ok(status) => status,
            Err(_) => {
                tracing::debug!("the command outlived its grace period: SIGKILL");
                self.signal(Signal::SIGKILL);
                self.process.wait().await
            }
        };
        if self.own_group {
            self.signal(Signal::SIGKILL);
        }
        status
    }

    fn signal(&self, signal: Signal) {
        let target = if self.own_group {
            // A negative pid names the process group.
            Pid::from_raw(-self.pid.as_raw())
        } else {
            self.pid
        };
        // ESRCH: it has ended already, which is what was wanted.
        let _ = kill(target, signal);
    }
}

/// The exit code of a finished command, as shells report it.
pub fn exit_of(status: ExitStatus) -> Exit {
    match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Command(u8::try_from(code & 0xff).unwrap_or(u8::MAX)),
        (None, Some(signal)) => Exit::signalled(signal),
        (None, None) => Exit::Command(u8::MAX),
    }
}

/// Whether this process is in the foreground process group of a terminal on one of its
/// standard streams.
fn in_terminal_foreground() -> bool {
    fn foreground(fd: impl AsFd) -> bool {
        nix::unistd::tcgetpgrp(fd).is_ok_and(|group| group == nix::unistd::getpgrp())
    }
    foreground(std::io::stdin()) || foreground(std::io::stdout()) || foreground(std::io::stderr())
}

/// The signals `redlock` passes on (and that end its wait for the lock). Registered before
/// the wait starts, so none is lost in between; once registered, they no longer end
/// `redlock` by default, which is what lets it release the lock first.
#[derive(Debug)]
pub struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Starts listening.
    pub fn listen() -> std::io::Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal received. Cancel-safe.
    pub async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupt.recv() => Signal::SIGINT,
            _ = self.terminate.recv() => Signal::SIGTERM,
            _ = self.hangup.recv() => Signal::SIGHUP,
        }
    }
}

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
//! Ctrl-C (SIGINT) and `Ctrl-\` (SIGQUIT) to the whole foreground group, command included,
//! so `redlock` does not pass those on there (the command would see each twice, and many
//! programs take a second Ctrl-C as "quit now"); signals that come from elsewhere
//! (SIGTERM, SIGHUP, SIGUSR1, ...) are passed on.
//! In that case a lost lock stops the command's own process only.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::signal::unix::SignalKind;

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
        if !self.own_group && matches!(signal, Signal::SIGINT | Signal::SIGQUIT) {
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

/// The signals `redlock` passes on (and that end its wait for the lock): each whose default
/// action would end `redlock` and that a person or a supervisor sends to stop, reload or
/// poke a program. Registered before the wait starts, so none is lost in between; a
/// registered signal does not end `redlock` by default, which is what lets it release the
/// lock first (a signal left at its default, SIGUSR1 from a log rotator say, would end
/// `redlock` at once and leave the command running without renewal).
pub const PASSED_ON: [Signal; 7] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGALRM,
];

/// The [`PASSED_ON`] signals `redlock` listens for.
///
/// A signal that `redlock` was started with ignored (`nohup` ignores SIGHUP; a shell
/// ignores SIGINT and SIGQUIT for a background job of a script) is left ignored: listening
/// would replace the ignoring with a handler, the command would start with the signal at
/// its default action instead of inheriting "ignored", and `redlock` would pass the signal
/// on to a command that was meant never to see it (`nohup redlock run ...` ended by the
/// logout's SIGHUP).
#[derive(Debug)]
pub struct Signals {
    streams: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    /// Starts listening.
    pub fn listen() -> std::io::Result<Signals> {
        let ignored = ignored_signals();
        let mut streams = Vec::with_capacity(PASSED_ON.len());
        for signal in PASSED_ON {
            if ignored.contains(&signal) {
                tracing::debug!(?signal, "ignored when redlock started: left ignored");
                continue;
            }
            streams.push((
                signal,
                tokio::signal::unix::signal(SignalKind::from_raw(signal as i32))?,
            ));
        }
        Ok(Signals { streams })
    }

    /// The next signal received. Cancel-safe (each stream's `poll_recv` is); pending
    /// forever when every signal was ignored at start.
    pub async fn recv(&mut self) -> Signal {
        std::future::poll_fn(|cx| {
            for (signal, stream) in &mut self.streams {
                if stream.poll_recv(cx).is_ready() {
                    return std::task::Poll::Ready(*signal);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

/// The signals this process was started with ignored: the `SigIgn` mask of
/// `/proc/self/status` (bit N-1 for signal N). Where that cannot be read (no `/proc`),
/// none: every signal is then listened for, ignored at start or not.
fn ignored_signals() -> Vec<Signal> {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return Vec::new();
    };
    ignored_in(&status)
}

fn ignored_in(status: &str) -> Vec<Signal> {
    let mask = status
        .lines()
        .find_map(|line| line.strip_prefix("SigIgn:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    PASSED_ON
        .into_iter()
        .filter(|&signal| {
            let bit = signal as i32 - 1;
            (0..64).contains(&bit) && mask & (1 << bit) != 0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ignored_signals_are_read_from_the_mask() {
        // SIGHUP (1) and SIGQUIT (3) ignored, SIGPIPE (13) too but not passed on anyway.
        let status =
            "Name:\tredlock\nSigBlk:\t0000000000000000\nSigIgn:\t0000000000001005\nSigCgt:\t0\n";
        assert_eq!(ignored_in(status), [Signal::SIGHUP, Signal::SIGQUIT]);
        assert!(ignored_in("Name:\tredlock\n").is_empty());
        assert!(ignored_in("SigIgn:\tnot hex\n").is_empty());
    }
}

//! The scenario's side of a holder process: start it, read its reports into the history,
//! signal it.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::{mono_now, Fields, Mode, HOLDER_ENV, HOLDER_EXE_ENV, PREFIX, SPEC_ENV};
use crate::error::LabError;
use crate::history::{At, Event, FaultKind};
use crate::lab::Lab;
use crate::scenario::KEY;

/// How long a holder may take to start and answer the handshake (a cold start of a debug
/// build on a loaded machine included).
const HANDSHAKE: Duration = Duration::from_secs(10);

/// A running holder process, client `c` of the scenario (its own links), named
/// `client-c` in the history.
#[derive(Debug)]
pub(crate) struct HolderProcess {
    name: String,
    pid: Pid,
    child: Child,
    stdout: Lines<BufReader<ChildStdout>>,
    stdin: Option<ChildStdin>,
}

impl HolderProcess {
    /// Starts the holder as client `c` in `mode`, with the lab's settings for that client
    /// (links, TTL, node timeout, prefix, fencing, seed), and waits for its handshake.
    /// `resource` is the fenced resource's URL and key, for [`Mode::WriteFenced`].
    pub(crate) async fn spawn(
        lab: &Lab,
        c: usize,
        mode: Mode,
        resource: Option<(String, String)>,
    ) -> Result<HolderProcess, LabError> {
        if std::env::var_os(HOLDER_ENV).is_some() {
            return Err(LabError::Setup(format!(
                "this process was started as a lab holder ({HOLDER_ENV} is set) but runs \
                 scenarios: its main must call redlock_lab::serve_holder() first"
            )));
        }
        let exe = executable()?;
        let mut spec = format!(
            "nodes={};ttl_ms={};node_timeout_ms={};prefix={};key={KEY};fenced={};seed={}",
            lab.links.urls(c).join(","),
            lab.timing.ttl.as_millis(),
            lab.timing.node_timeout.as_millis(),
            lab.prefix,
            u8::from(lab.fencing.fenced(c)),
            c + 1,
        );
        if let Some((url, key)) = resource {
            spec.push_str(&format!(";resource={url};resource_key={key}"));
        }
        let mut child = Command::new(&exe)
            .env(HOLDER_ENV, mode.as_str())
            .env(SPEC_ENV, spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                LabError::Setup(format!(
                    "could not start {} as a holder: {e}",
                    exe.display()
                ))
            })?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| LabError::Setup("the holder process has no stdout pipe".to_owned()))?;
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
            .ok_or_else(|| LabError::Setup("the holder process has no pid".to_owned()))?;
        let mut holder = HolderProcess {
            name: format!("client-{c}"),
            pid,
            stdin: child.stdin.take(),
            child,
            stdout: BufReader::new(stdout).lines(),
        };
        if holder.next_report(HANDSHAKE).await.ok().map(|l| l.0) != Some("ready".to_owned()) {
            return Err(LabError::Setup(format!(
                "{} did not answer as a lab holder within {HANDSHAKE:?}: an executable that \
                 runs the lab's scenarios must call redlock_lab::serve_holder() first thing \
                 in main (or set {HOLDER_EXE_ENV} to one that does)",
                exe.display()
            )));
        }
        Ok(holder)
    }

    /// Waits for the report `kind` (within `within`), passing over none: any other report
    /// first, an `error` line or the end of the output is an error.
    pub(crate) async fn expect(
        &mut self,
        kind: &str,
        within: Duration,
    ) -> Result<Fields, LabError> {
        let (got, fields) = self.next_report(within).await?;
        if got != kind {
            return Err(LabError::Schedule(format!(
                "{} reported {got} {fields:?} where {kind} was expected",
                self.name
            )));
        }
        Ok(fields)
    }

    /// The next report (its kind and fields), within `within`; an `error` report or the
    /// end of the output is an error.
    pub(crate) async fn next_report(
        &mut self,
        within: Duration,
    ) -> Result<(String, Fields), LabError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let line = tokio::time::timeout_at(deadline, self.stdout.next_line())
                .await
                .map_err(|_| {
                    LabError::Schedule(format!("{} said nothing for {within:?}", self.name))
                })?
                .map_err(|e| LabError::Setup(format!("reading {}: {e}", self.name)))?
                .ok_or_else(|| {
                    LabError::Schedule(format!("{}'s process ended its output", self.name))
                })?;
            // Anything else on stdout (a binary that does not serve the holder prints its
            // own output) is passed over.
            let mut words = line.split_whitespace();
            if words.next() != Some(PREFIX) {
                continue;
            }
            let kind = words.next().unwrap_or_default().to_owned();
            let fields: Fields = words
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            if kind == "error" {
                return Err(LabError::Schedule(format!(
                    "{}'s process failed: {}",
                    self.name,
                    fields.get("why").map_or("", String::as_str)
                )));
            }
            return Ok((kind, fields));
        }
    }

    /// Sends `signal` to the process, recorded as a fault on no node.
    pub(crate) fn signal(&self, lab: &Lab, signal: Signal) -> Result<(), LabError> {
        lab.history.fault(
            None,
            FaultKind::Other,
            format!("{signal} to {}'s process (pid {})", self.name, self.pid),
        );
        kill(self.pid, signal)
            .map_err(|e| LabError::Setup(format!("{signal} to {}: {e}", self.name)))
    }

    /// Writes the line the holder waits for before its write ([`Mode::WriteFenced`]). A
    /// stopped holder finds it when it runs again.
    pub(crate) async fn go(&mut self) -> Result<(), LabError> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| LabError::Setup("the holder process has no stdin".to_owned()))?;
        stdin
            .write_all(b"go\n")
            .await
            .map_err(|e| LabError::Setup(format!("writing to {}: {e}", self.name)))
    }

    /// Waits for the process to end (after a kill, or its own exit), at most `within`;
    /// kills it if it has not.
    pub(crate) async fn reap(mut self, within: Duration) {
        if tokio::time::timeout(within, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }

    /// Records the `acquired` report; returns the lock's token.
    pub(crate) fn record_acquired(&self, lab: &Lab, f: &Fields) -> Result<String, LabError> {
        let token = field(f, "token")?.to_owned();
        let fencing = match field(f, "fencing")? {
            "-" => None,
            n => Some(n.parse().map_err(|_| bad("fencing", n))?),
        };
        lab.history.record(Event::Acquired {
            client: self.name.clone(),
            token: token.clone(),
            key: field(f, "key")?.to_owned(),
            started: at(lab, f, "t0")?,
            acquired: at(lab, f, "at")?,
            valid_until: at(lab, f, "valid_until")?,
            fencing,
            owner: None,
        });
        Ok(token)
    }

    /// Records an `extended` report of the lock `token`.
    pub(crate) fn record_extended(
        &self,
        lab: &Lab,
        token: &str,
        f: &Fields,
    ) -> Result<(), LabError> {
        let valid_until = match field(f, "valid_until")? {
            "-" => None,
            _ => Some(at(lab, f, "valid_until")?),
        };
        lab.history.record(Event::Extend {
            client: self.name.clone(),
            token: token.to_owned(),
            started: at(lab, f, "started")?,
            ended: at(lab, f, "ended")?,
            valid_until,
        });
        Ok(())
    }

    /// Records a `wrote` or `rejected` report (`kind`) of the lock `token`.
    pub(crate) fn record_write(
        &self,
        lab: &Lab,
        token: &str,
        kind: &str,
        f: &Fields,
    ) -> Result<(), LabError> {
        let read: u64 = field(f, "read")?.parse().map_err(|_| bad("read", ""))?;
        let (read_at, done) = (at(lab, f, "read_at")?, at(lab, f, "at")?);
        lab.history.record(if kind == "wrote" {
            Event::Write {
                client: self.name.clone(),
                token: token.to_owned(),
                read_at,
                wrote_at: done,
                read,
                wrote: read + 1,
            }
        } else {
            Event::WriteRejected {
                client: self.name.clone(),
                token: token.to_owned(),
                fencing: field(f, "fencing")?
                    .parse()
                    .map_err(|_| bad("fencing", ""))?,
                read_at,
                rejected_at: done,
                read,
            }
        });
        Ok(())
    }

    /// Records a `releasing` report of the lock `token`: its claim ends there.
    pub(crate) fn record_releasing(
        &self,
        lab: &Lab,
        token: &str,
        f: &Fields,
    ) -> Result<(), LabError> {
        lab.history.record(Event::ReleaseStarted {
            client: self.name.clone(),
            token: token.to_owned(),
            at: at(lab, f, "at")?,
        });
        Ok(())
    }
}

/// The holder executable: [`HOLDER_EXE_ENV`], else this very executable.
fn executable() -> Result<PathBuf, LabError> {
    if let Some(exe) = std::env::var_os(HOLDER_EXE_ENV) {
        return Ok(PathBuf::from(exe));
    }
    std::env::current_exe().map_err(|e| {
        LabError::Setup(format!(
            "cannot find this executable to run it as the holder ({e}); set {HOLDER_EXE_ENV}"
        ))
    })
}

fn field<'a>(f: &'a Fields, name: &str) -> Result<&'a str, LabError> {
    f.get(name)
        .map(String::as_str)
        .ok_or_else(|| LabError::Setup(format!("a holder report lacks {name}: {f:?}")))
}

fn bad(name: &str, value: &str) -> LabError {
    LabError::Setup(format!("a holder report has a bad {name}: {value:?}"))
}

/// The lab time of the holder's `CLOCK_MONOTONIC` time in field `name`.
fn at(lab: &Lab, f: &Fields, name: &str) -> Result<At, LabError> {
    let value = field(f, name)?;
    let ns: i128 = value.parse().map_err(|_| bad(name, value))?;
    let (now, mono) = (lab.history.now(), mono_now());
    let ahead = |d: i128| Duration::from_nanos(u64::try_from(d).unwrap_or(u64::MAX));
    Ok(if ns <= mono {
        now.saturating_sub(ahead(mono - ns))
    } else {
        now + ahead(ns - mono)
    })
}

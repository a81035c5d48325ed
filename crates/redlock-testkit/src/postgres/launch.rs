//! The steps of one PostgreSQL start: `initdb`, spawning `postgres`, waiting until it accepts
//! connections.

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::process::{Child, Command, Stdio};
// std's Instant, not tokio's: these deadlines bound real processes, and must stay real in a
// test that paused tokio's clock (whose sleeps then return at once).
use std::time::{Duration, Instant};

use tokio_postgres::NoTls;

use super::account::RunAs;
use super::find::PgBin;
use super::{INITDB_TIMEOUT, POSTGRES_READY_TIMEOUT, POSTGRES_USER};
use crate::node::LaunchError;
use crate::{process, HarnessError};

/// Pause between two looks at a starting process.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Deadline for one readiness probe (connect + one query).
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs `initdb` into `data` (inside `dir`), logging to `dir/initdb.log`.
pub(crate) async fn initdb(
    bin: &PgBin,
    run_as: &RunAs,
    dir: &Path,
    data: &Path,
) -> Result<(), HarnessError> {
    let log = dir.join("initdb.log");
    let out =
        File::create(&log).map_err(|e| HarnessError::io(format!("create {}", log.display()), e))?;
    let err = out
        .try_clone()
        .map_err(|e| HarnessError::io(format!("reopen {}", log.display()), e))?;
    let failed = |reason: String| HarnessError::PostgresStart {
        step: "create the database cluster (initdb)".to_owned(),
        reason,
        advice: format!(
            "check the output below; set {} to use other PostgreSQL binaries{}",
            super::PG_BIN_ENV,
            run_as.advice()
        ),
        log_tail: process::log_tail(&log, 0),
    };
    let mut cmd = Command::new(&bin.initdb);
    cmd.arg("-D")
        .arg(data)
        // Trust on loopback (the server listens nowhere else) and a fixed superuser name, so
        // clients need no password; C locale and UTF8 so the host's locale settings (often
        // absent in containers) cannot make initdb fail. --no-sync: the cluster dies with the
        // test, so flushing its ~40 MB to disk would buy nothing.
        .args(["--no-locale", "-E", "UTF8", "--no-sync"])
        .args(["-A", "trust", "-U", POSTGRES_USER])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    run_as.apply(&mut cmd);
    // As another user, spawning fails (EACCES) when that user cannot enter `dir`.
    let mut child = cmd
        .spawn()
        .map_err(|e| failed(format!("could not spawn {}: {e}", bin.initdb.display())))?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(failed(format!("initdb failed ({status})"))),
            Ok(None) => {}
            Err(e) => return Err(HarnessError::io("wait for initdb", e)),
        }
        if started.elapsed() >= INITDB_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(failed(format!(
                "initdb did not finish within {INITDB_TIMEOUT:?} (it has been killed); the \
                 machine may be overloaded"
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Spawns `postgres` on `port` from the calling thread and waits until it accepts connections.
/// On failure the process is killed and reaped.
pub(crate) async fn server(
    bin: &PgBin,
    run_as: &RunAs,
    dir: &Path,
    data: &Path,
    log: &Path,
    port: u16,
) -> Result<Child, LaunchError> {
    let offset = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
    let open_log = || {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| LaunchError::Fatal(HarnessError::io(format!("open {}", log.display()), e)))
    };
    let mut cmd = Command::new(&bin.postgres);
    cmd.arg("-D")
        .arg(data)
        .arg("-p")
        .arg(port.to_string())
        // The socket goes into the instance's own directory: the default, /var/run/postgresql,
        // may be missing or not writable, and is shared with any system-wide server.
        .arg("-k")
        .arg(dir)
        // Durability is not under test: the data dies with the test. Without the flushes a
        // write is a memory copy, so tests measure the fencing logic, not the disk.
        .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
        .args(["-c", "synchronous_commit=off", "-c", "full_page_writes=off"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(open_log()?)
        .stderr(open_log()?);
    run_as.apply(&mut cmd);
    process::die_with_spawning_thread(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| {
        LaunchError::Fatal(HarnessError::PostgresStart {
            step: "start the server".to_owned(),
            reason: format!("could not spawn {}: {e}", bin.postgres.display()),
            advice: format!("check the binary{}", run_as.advice()),
            log_tail: process::log_tail(log, offset),
        })
    })?;
    let result = wait_ready(&mut child, run_as, data, log, offset, port).await;
    if result.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
    result.map(|()| child)
}

async fn wait_ready(
    child: &mut Child,
    run_as: &RunAs,
    data: &Path,
    log: &Path,
    offset: u64,
    port: u16,
) -> Result<(), LaunchError> {
    let started = Instant::now();
    let config = super::tokio_config(port);
    let failed = |step: &str, reason: String| {
        LaunchError::Fatal(HarnessError::PostgresStart {
            step: step.to_owned(),
            reason,
            advice: format!("check the server log below{}", run_as.advice()),
            log_tail: process::log_tail(log, offset),
        })
    };
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let log_tail = process::log_tail(log, offset);
                if process::says_port_in_use(&log_tail) {
                    return Err(LaunchError::PortTaken(log_tail));
                }
                return Err(failed(
                    "start the server",
                    format!("postgres exited during start-up on port {port} ({status})"),
                ));
            }
            Ok(None) => {}
            Err(e) => return Err(LaunchError::Fatal(HarnessError::io("wait for postgres", e))),
        }
        match probe(&config).await {
            Some(answered) if Path::new(&answered) == data => return Ok(()),
            // Another server took the port between the free-port probe and our bind.
            Some(answered) => {
                return Err(LaunchError::PortTaken(format!(
                    "port {port} is answered by another PostgreSQL (data directory {answered})"
                )))
            }
            None => {}
        }
        if started.elapsed() >= POSTGRES_READY_TIMEOUT {
            return Err(failed(
                "wait until the server accepts connections",
                format!(
                    "no connection on port {port} within {POSTGRES_READY_TIMEOUT:?} (the server \
                     has been killed); the machine may be overloaded"
                ),
            ));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Connects once and asks for the data directory, which tells our server from a foreign one.
/// `None` while nothing listens, the server is still starting up, or no answer came in time.
async fn probe(config: &tokio_postgres::Config) -> Option<String> {
    let attempt = async {
        let (client, connection) = config.connect(NoTls).await.ok()?;
        // The client is moved into the query, so it is dropped when the query is done, which
        // lets the connection end; no task outlives the probe.
        let query = async move { client.query_one("SHOW data_directory", &[]).await };
        let (row, _) = futures::join!(query, connection);
        row.ok()?.try_get::<_, String>(0).ok()
    };
    tokio::time::timeout(PROBE_TIMEOUT, attempt)
        .await
        .ok()
        .flatten()
}

//! A real PostgreSQL server on a free loopback port: the fenced resource of the tests.
//!
//! Fencing tokens only help if the resource checks them, and the check that matters is the
//! one a database makes atomically with the write:
//! `UPDATE t SET ..., fence = $token WHERE id = $id AND fence < $token`. Tests run that
//! statement against this server, started the way the Redis nodes are: its own temporary
//! directory, a free port retried when taken, readiness by connecting, shutdown on drop.

mod account;
mod find;
mod launch;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;
use tokio_postgres::NoTls;

use crate::node::LaunchError;
use crate::port::{self, PortReservation};
use crate::{process, HarnessError};
use account::RunAs;

pub use find::PG_BIN_ENV;

/// The superuser `initdb` creates; clients connect as it without a password (trust auth).
pub const POSTGRES_USER: &str = "redlock";
/// The database clients connect to (the one every cluster has).
pub const POSTGRES_DB: &str = "postgres";
/// How long `initdb` may take (about half a second on an idle machine).
pub const INITDB_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the server may take until it accepts connections (well under a second when idle;
/// the margin is for machines busy compiling).
pub const POSTGRES_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a dropped server gets for its fast shutdown before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How many fresh ports a start tries when the port gets taken under its feet.
const PORT_ATTEMPTS: usize = 5;
/// How long a [`Postgres::client`] may take to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One PostgreSQL server (`postgres`) on `127.0.0.1:port`, with its own cluster in a temporary
/// directory.
///
/// ```no_run
/// use redlock_testkit::{HarnessError, Postgres};
///
/// async fn example() -> Result<(), HarnessError> {
///     let pg = Postgres::start().await?;
///     let db = pg.client().await?;
///     db.batch_execute("CREATE TABLE t (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0)")
///         .await
///         .unwrap();
///     Ok(())
/// } // dropping `pg` shuts the server down and removes its directory
/// # fn main() {}
/// ```
///
/// # Binaries
/// `initdb` and `postgres` are looked up in `$REDLOCK_PG_BIN` (a directory; see
/// [`PG_BIN_ENV`]), else next to the `initdb` on `PATH`, else in `pg_config --bindir`, else in
/// Debian's `/usr/lib/postgresql/<major>/bin`, highest major first. On Debian:
/// `apt-get install -y postgresql`.
///
/// # Running as root
/// PostgreSQL refuses to run as root. When the tests run as root, `initdb` and `postgres` run
/// as the `postgres` system user (created by Debian's package): the temporary directory is
/// handed to that user and the processes get its uid and gid. Every parent of the temporary
/// directory (`TMPDIR`, `/tmp` by default) must then be searchable by that user.
///
/// # Process hygiene
/// The server is started with `-c listen_addresses=127.0.0.1` and its Unix socket in its own
/// directory, so it never meets a system-wide server, and without durability (`fsync=off`).
/// Dropping it sends SIGINT (PostgreSQL's fast shutdown, which ends open sessions rather than
/// waiting for them), waits up to 10 s, then kills it. If the test process is killed, the
/// server gets SIGKILL from the parent-death signal, which fires when the thread that called
/// [`Postgres::start`] exits (the same rule as for [`NodeSet`](crate::NodeSet)).
pub struct Postgres {
    port: PortReservation,
    child: Child,
    data: PathBuf,
    log: PathBuf,
    dir: TempDir,
}

impl Postgres {
    /// Creates a cluster with `initdb`, starts `postgres` on a free loopback port and waits
    /// until it accepts connections (at most [`INITDB_TIMEOUT`] plus
    /// [`POSTGRES_READY_TIMEOUT`]).
    ///
    /// If the port is taken before the server binds it, the start is retried on a fresh port
    /// (the cluster is kept). Errors say which step failed and quote the tail of its output.
    pub async fn start() -> Result<Postgres, HarnessError> {
        let bin = find::find_pg_bin()?;
        let run_as = RunAs::pick()?;
        let dir = tempfile::Builder::new()
            .prefix("redlock-testkit-pg-")
            .tempdir()
            .map_err(|e| HarnessError::io("create a temporary directory for PostgreSQL", e))?;
        run_as.take_over(dir.path())?;
        let data = dir.path().join("data");
        let log = dir.path().join("postgres.log");
        launch::initdb(&bin, &run_as, dir.path(), &data).await?;
        let mut log_tail = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = port::reserve_free_port()?;
            match launch::server(&bin, &run_as, dir.path(), &data, &log, port.port()).await {
                Ok(child) => {
                    tracing::debug!(port = port.port(), pid = child.id(), "postgres ready");
                    return Ok(Postgres {
                        port,
                        child,
                        data,
                        log,
                        dir,
                    });
                }
                Err(LaunchError::Fatal(e)) => return Err(e),
                Err(LaunchError::PortTaken(tail)) => {
                    tracing::debug!(port = port.port(), "port taken, retrying postgres");
                    log_tail = tail;
                }
            }
        }
        Err(HarnessError::PostgresStart {
            step: "find a free loopback port".to_owned(),
            reason: format!(
                "after {PORT_ATTEMPTS} attempts: each port was taken by another process before \
                 postgres could bind it"
            ),
            advice: "stop stray servers or retry".to_owned(),
            log_tail,
        })
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port.port()
    }

    /// The connection string in key-value form:
    /// `host=127.0.0.1 port=PORT user=redlock dbname=postgres`, for `tokio_postgres::connect`
    /// (or `.parse::<tokio_postgres::Config>()` to adjust it).
    pub fn config(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user={POSTGRES_USER} dbname={POSTGRES_DB}",
            self.port()
        )
    }

    /// The connection string as a URL: `postgresql://redlock@127.0.0.1:PORT/postgres`, for
    /// `tokio_postgres::connect`, `psql` and other clients.
    pub fn url(&self) -> String {
        format!(
            "postgresql://{POSTGRES_USER}@127.0.0.1:{}/{POSTGRES_DB}",
            self.port()
        )
    }

    /// A new connection as [`POSTGRES_USER`] to [`POSTGRES_DB`], its connection task spawned on
    /// the current tokio runtime (so call it from within one). The task ends when the client
    /// is dropped or the server goes away.
    pub async fn client(&self) -> Result<tokio_postgres::Client, HarnessError> {
        let mut config = tokio_config(self.port());
        config.connect_timeout(CONNECT_TIMEOUT);
        let (client, connection) =
            config
                .connect(NoTls)
                .await
                .map_err(|source| HarnessError::PostgresClient {
                    config: self.config(),
                    source,
                })?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "postgres connection ended with an error");
            }
        });
        Ok(client)
    }

    /// Process id of the server (the postmaster).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The cluster's data directory, removed when the server is dropped.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The server log (its stderr).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last lines of the server log, for diagnostics.
    pub fn log_tail(&self) -> String {
        process::log_tail(&self.log, 0)
    }
}

/// The client configuration for a server of this module on `port`.
fn tokio_config(port: u16) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user(POSTGRES_USER)
        .dbname(POSTGRES_DB);
    config
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // A blocking wait, in async code too: a fast shutdown of a test-sized cluster takes
        // milliseconds, and the directory must not be removed under a running server. std's
        // Instant because this waits on a real process whatever tokio's clock says.
        if let Ok(None) = self.child.try_wait() {
            let pid = Pid::from_raw(self.child.id() as i32);
            // SIGINT, the fast shutdown: SIGTERM (smart shutdown) would wait for every session
            // to end, and clients handed out by `client()` may outlive the server.
            let _ = signal::kill(pid, Signal::SIGINT);
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if let Ok(None) = self.child.try_wait() {
                tracing::warn!(pid = self.child.id(), "postgres ignored SIGINT, killing it");
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
    }
}

impl fmt::Debug for Postgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Postgres")
            .field("port", &self.port())
            .field("pid", &self.child.id())
            .field("dir", &self.dir.path())
            .finish()
    }
}

//! The docker-compose node set: the five Redis masters of `docker-compose.yml`, each in its own
//! container, with container-level faults (kill, start, pause, network disconnect) and
//! optional fake clocks.
//!
//! Heavier than [`NodeSet`](crate::NodeSet) and opt-in: it needs Docker Engine and
//! docker-compose v1 (`docker-compose`, not the `docker compose` plugin). Every Docker call is a
//! plain `docker` / `docker-compose` command line, run on tokio's blocking pool with a deadline
//! after which the command (and its process group) is killed.
//!
//! Container names (`redlock-redis1`..`5`), the network name (`redlock`) and the host ports
//! (`127.0.0.1:7101`..`7105`) are fixed by `docker-compose.yml`, so only one set can run per
//! Docker daemon; within one process, [`DockerSet::up`] refuses a second set while one is alive.

use std::ffi::OsString;
use std::fs::{self, Permissions};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use futures::future::try_join_all;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

use crate::{ClockControl, HarnessError, RedisAt};

/// Compose project name; the data volumes are `redlock-lab_redisN-data`.
const PROJECT: &str = "redlock-lab";
/// Services `redis1`..`redis5` in `docker-compose.yml`.
const NODES: usize = 5;
/// Host port of `redis1`; `redisN` is published on `FIRST_PORT + N - 1`.
const FIRST_PORT: u16 = 7101;
/// The bridge network named in `docker-compose.yml`.
const NETWORK: &str = "redlock";
/// How long `up`, `start` and `connect` wait for PONG. A container starts in about a second;
/// the rest is margin for a small, shared machine.
const READY_WAIT: Duration = Duration::from_secs(20);
/// Pause between two PINGs while waiting.
const READY_POLL: Duration = Duration::from_millis(100);
/// Deadline of one `docker` CLI call (kill, start, pause, network, logs).
const DOCKER_TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline of `docker-compose up` / `down`: a network and five containers.
const COMPOSE_TIMEOUT: Duration = Duration::from_secs(180);
/// Deadline of the image build (an up-to-date image returns at once).
const BUILD_TIMEOUT: Duration = Duration::from_secs(600);
/// Lines of command output or container log quoted in errors.
const OUTPUT_LINES: usize = 30;
/// Set while a [`DockerSet`] of this process is alive.
static UP: AtomicBool = AtomicBool::new(false);

/// How [`DockerSet::up`] configures the containers.
#[derive(Clone, Debug, Default)]
pub struct DockerOptions {
    /// `--appendonly yes --appendfsync always`: data survives a kill and restart. Default
    /// `false`: `--appendonly no --save ""`, a restarted container comes back empty.
    pub appendonly_always: bool,
    /// A [`ClockControl`] per node ([`DockerSet::clock`]) steering the clock shim preloaded into
    /// each container. Default `false`: real clocks.
    pub fake_clock: bool,
}

/// The five containers of `docker-compose.yml` (`redis1`..`redis5` on `127.0.0.1:7101`..`7105`),
/// as independent Redlock masters with container-level faults.
///
/// Dropping the set runs `docker-compose down -v` (containers, network and data volumes go;
/// a failure is logged through `tracing`) and removes the per-run clock directory.
#[derive(Debug)]
pub struct DockerSet {
    compose: Compose,
    nodes: Vec<Container>,
    clocks: Vec<ClockControl>,
    // Fields drop after `Drop::drop` took the containers down, so the mounts are gone by then.
    _clock_dir: TempDir,
    _slot: UpSlot,
}

/// One service of the compose file.
#[derive(Debug)]
struct Container {
    service: String,
    container: String,
    addr: SocketAddr,
}

/// How to call `docker-compose` for this set: the file and the variables it interpolates.
#[derive(Debug)]
struct Compose {
    file: PathBuf,
    env: Vec<(String, OsString)>,
}

/// This process's claim on the one docker node set; released when dropped.
#[derive(Debug)]
struct UpSlot;

impl Drop for UpSlot {
    fn drop(&mut self) {
        UP.store(false, Ordering::SeqCst);
    }
}

impl DockerSet {
    /// Checks that `docker` and `docker-compose` are installed and that the Docker daemon
    /// answers; the error says what to install or start.
    pub fn available() -> Result<(), HarnessError> {
        let unavailable = |reason: String, advice: &str| HarnessError::DockerUnavailable {
            reason,
            advice: advice.to_owned(),
        };
        let mut docker = Command::new("docker");
        docker.args(["version", "--format", "{{.Server.Version}}"]);
        match run_blocking(docker, DOCKER_TIMEOUT) {
            Err(e) => {
                return Err(unavailable(
                    format!("the docker CLI could not be run ({e})"),
                    "install Docker Engine (Debian: `apt-get install -y docker.io`)",
                ))
            }
            Ok(ran) if !ran.ok() => {
                return Err(unavailable(
                    format!(
                        "the Docker daemon did not answer `docker version`: {}",
                        ran.output().trim()
                    ),
                    "start it (`systemctl start docker`, or `dockerd &` without systemd) and \
                     make sure this user may use /var/run/docker.sock (root or group docker)",
                ))
            }
            Ok(_) => {}
        }
        let mut compose = Command::new("docker-compose");
        compose.args(["version", "--short"]);
        match run_blocking(compose, DOCKER_TIMEOUT) {
            Ok(ran) if ran.ok() => Ok(()),
            Ok(ran) => Err(unavailable(
                format!("`docker-compose version` failed: {}", ran.output().trim()),
                "reinstall docker-compose v1 (Debian: `apt-get install -y docker-compose`)",
            )),
            Err(e) => Err(unavailable(
                format!("docker-compose could not be run ({e})"),
                "install docker-compose v1 (Debian: `apt-get install -y docker-compose`)",
            )),
        }
    }

    /// Builds the image (`docker/build-image.sh`, a no-op when up to date), takes down any
    /// leftover of an earlier run (`down -v`, so every set starts empty), then runs
    /// `docker-compose -p redlock-lab -f <repo>/docker-compose.yml up -d --force-recreate` and
    /// waits (up to 20 s) until all five nodes answer PING on `127.0.0.1:7101..7105`.
    ///
    /// Fails with [`HarnessError::DockerUnavailable`] when Docker is missing or another set of
    /// this process is still alive, and with [`HarnessError::Docker`] when a step fails (on
    /// failure the containers are taken down again).
    pub async fn up(opts: DockerOptions) -> Result<DockerSet, HarnessError> {
        blocking(Self::available)
            .await
            .map_err(|e| HarnessError::io("check that Docker is available", e))??;
        if UP.swap(true, Ordering::SeqCst) {
            return Err(HarnessError::DockerUnavailable {
                reason: "another DockerSet of this process is still up".to_owned(),
                advice: "drop it before calling DockerSet::up again (container names and ports \
                         are fixed, so one set per Docker daemon)"
                    .to_owned(),
            });
        }
        let slot = UpSlot;
        let root = repo_root();
        let file = root.join("docker-compose.yml");
        if !file.is_file() {
            return Err(set_error(
                "find the compose file",
                file.display().to_string(),
                "does not exist".to_owned(),
                "run the tests from a full checkout of the repository",
                String::new(),
            ));
        }
        build_image(&root).await?;
        let clock_dir = clock_dir(&root)?;
        let compose = Compose::new(file, &opts, clock_dir.path());
        let nodes: Vec<Container> = (1..=NODES).map(Container::new).collect();
        let clocks = if opts.fake_clock {
            nodes
                .iter()
                .map(|n| {
                    ClockControl::for_node(
                        &n.service,
                        clock_dir.path().join(&n.service).join("control"),
                    )
                })
                .collect::<Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        // Leftovers of a run that could not clean up would keep their data (volumes) or block
        // the fixed names; a failure here shows up again, with its cause, in `up` below.
        let _ = compose.run(&["down", "-v", "--timeout", "2"]).await;
        // Built before `up`, so that whatever fails from here on, dropping it takes the
        // containers down again.
        let set = DockerSet {
            compose,
            nodes,
            clocks,
            _clock_dir: clock_dir,
            _slot: slot,
        };
        let args = ["up", "-d", "--force-recreate"];
        let ran = set
            .compose
            .run(&args)
            .await
            .map_err(|e| set.compose.error(&args, e))?;
        if !ran.ok() {
            return Err(set_error(
                "start the containers",
                set.compose.shown(&args),
                ran.outcome(COMPOSE_TIMEOUT),
                "if another copy of the set holds the names redlock-redis1..5 or the ports \
                 7101..7105 (`docker ps -a --filter name=redlock-redis`), take it down with \
                 `docker-compose down -v` in its directory",
                ran.output(),
            ));
        }
        try_join_all((0..NODES).map(|i| set.wait_ready(i, "start"))).await?;
        tracing::debug!(urls = ?set.urls(), "docker node set ready");
        Ok(set)
    }

    /// Number of nodes (5).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the set has no nodes (never: it always has 5).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// `redis://127.0.0.1:PORT` of every node, in index order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://{}", n.addr))
            .collect()
    }

    /// Host address of node `i` (`127.0.0.1:7101 + i`). Panics if `i >= len()`.
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.at(i).addr
    }

    /// Service name of node `i` (`redis1`..`redis5`). Panics if `i >= len()`.
    pub fn name(&self, i: usize) -> &str {
        &self.at(i).service
    }

    /// Container name of node `i` (`redlock-redis1`..), for `docker` commands of your own.
    /// Panics if `i >= len()`.
    pub fn container(&self, i: usize) -> &str {
        &self.at(i).container
    }

    /// A [`RedisAt`] handle for node `i` (inspection, eviction, `TIME`). Panics if
    /// `i >= len()`.
    pub fn redis(&self, i: usize) -> RedisAt {
        let node = self.at(i);
        RedisAt::new(node.service.clone(), node.addr)
    }

    /// The fake clock of node `i`: `Some` when the set was started with
    /// [`DockerOptions::fake_clock`] and `i < len()`. It stays in effect across restarts.
    pub fn clock(&self, i: usize) -> Option<&ClockControl> {
        self.clocks.get(i)
    }

    /// `docker kill` (SIGKILL) node `i`. Idempotent: killing a stopped node is a no-op. It
    /// stays down until [`DockerSet::start`].
    pub async fn kill(&self, i: usize) -> Result<(), HarnessError> {
        self.docker(i, "kill", &["kill"], &[], &["is not running"])
            .await
    }

    /// `docker start` node `i`, then wait (up to 20 s) until it answers PING. Without
    /// `appendonly_always` a killed node comes back empty.
    pub async fn start(&self, i: usize) -> Result<(), HarnessError> {
        self.docker(i, "start", &["start"], &[], &[]).await?;
        self.wait_ready(i, "start").await
    }

    /// Kill node `i`, then start it again at once ("restart without persistence" unless
    /// `appendonly_always`).
    pub async fn restart(&self, i: usize) -> Result<(), HarnessError> {
        self.kill(i).await?;
        self.start(i).await
    }

    /// Delayed restart: kill node `i` now, keep it down for `delay`, then start it. The node
    /// is down for the whole delay; poll the future to the end (e.g. inside `tokio::join!`).
    pub async fn restart_after(&self, i: usize, delay: Duration) -> Result<(), HarnessError> {
        self.kill(i).await?;
        tokio::time::sleep(delay).await;
        self.start(i).await
    }

    /// `docker pause` node `i` (cgroup freezer): connections are accepted by Docker's port
    /// forwarding but nothing answers, so requests time out. Pausing a paused node is a no-op.
    pub async fn pause(&self, i: usize) -> Result<(), HarnessError> {
        self.docker(i, "pause", &["pause"], &[], &["is already paused"])
            .await
    }

    /// `docker unpause` node `i`: undo [`DockerSet::pause`]. Resuming a node that is not
    /// paused is a no-op.
    pub async fn resume(&self, i: usize) -> Result<(), HarnessError> {
        self.docker(i, "resume", &["unpause"], &[], &["is not paused"])
            .await
    }

    /// `docker network disconnect redlock <container>`: node `i` loses its network, which
    /// also unpublishes its host port, so connections are refused. Disconnecting a
    /// disconnected node is a no-op.
    pub async fn disconnect(&self, i: usize) -> Result<(), HarnessError> {
        self.docker(
            i,
            "disconnect",
            &["network", "disconnect", NETWORK],
            &[],
            &["is not connected"],
        )
        .await
    }

    /// `docker network connect redlock <container>`: undo [`DockerSet::disconnect`]. Docker
    /// publishes the port again; when the node runs and is not paused, this waits (up to
    /// 20 s) until it answers PING. Connecting a connected node is a no-op.
    pub async fn connect(&self, i: usize) -> Result<(), HarnessError> {
        self.docker(
            i,
            "connect",
            &["network", "connect", NETWORK],
            &[],
            &["already exists in network"],
        )
        .await?;
        let state = self
            .docker_output(
                i,
                "inspect",
                &[
                    "inspect",
                    "--format",
                    "{{.State.Running}} {{.State.Paused}}",
                ],
            )
            .await?;
        if state.trim() == "true false" {
            self.wait_ready(i, "connect").await?;
        }
        Ok(())
    }

    /// Node `i`, panicking with a clear message for an index out of range (like slice
    /// indexing; the fallible methods return [`HarnessError::NoSuchNode`] instead).
    fn at(&self, i: usize) -> &Container {
        self.nodes.get(i).unwrap_or_else(|| {
            panic!(
                "docker node set: there is no node {i} (the set has {} nodes)",
                self.nodes.len()
            )
        })
    }

    fn node(&self, i: usize, action: &str) -> Result<&Container, HarnessError> {
        self.nodes.get(i).ok_or_else(|| HarnessError::NoSuchNode {
            set: "docker node set".to_owned(),
            action: action.to_owned(),
            index: i,
            len: self.nodes.len(),
        })
    }

    /// `docker <args> [extra] <container>`; an error whose output contains one of `no_op` is a
    /// success (the node already is in the requested state).
    async fn docker(
        &self,
        i: usize,
        action: &str,
        args: &[&str],
        extra: &[&str],
        no_op: &[&str],
    ) -> Result<(), HarnessError> {
        let node = self.node(i, action)?;
        let mut all: Vec<&str> = args.to_vec();
        all.extend_from_slice(extra);
        all.push(&node.container);
        let ran = run_docker(&all).await;
        match ran {
            Ok(ran) if ran.ok() => Ok(()),
            Ok(ran) if no_op.iter().any(|s| ran.stderr.contains(s)) => Ok(()),
            Ok(ran) => Err(node.error(action, &all, ran.outcome(DOCKER_TIMEOUT), ran.output())),
            Err(e) => Err(node.error(
                action,
                &all,
                format!("could not be run ({e})"),
                String::new(),
            )),
        }
    }

    /// `docker <args> <container>`, returning its stdout.
    async fn docker_output(
        &self,
        i: usize,
        action: &str,
        args: &[&str],
    ) -> Result<String, HarnessError> {
        let node = self.node(i, action)?;
        let mut all: Vec<&str> = args.to_vec();
        all.push(&node.container);
        match run_docker(&all).await {
            Ok(ran) if ran.ok() => Ok(ran.stdout),
            Ok(ran) => Err(node.error(action, &all, ran.outcome(DOCKER_TIMEOUT), ran.output())),
            Err(e) => Err(node.error(
                action,
                &all,
                format!("could not be run ({e})"),
                String::new(),
            )),
        }
    }

    /// PING node `i` until PONG or [`READY_WAIT`]; the error quotes the container log.
    async fn wait_ready(&self, i: usize, action: &str) -> Result<(), HarnessError> {
        let node = self.node(i, action)?;
        let redis = self.redis(i);
        let started = tokio::time::Instant::now();
        loop {
            let last = match redis.ping().await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if started.elapsed() >= READY_WAIT {
                let log = match run_docker(&["logs", "--tail", "30", &node.container]).await {
                    Ok(ran) => ran.output(),
                    Err(e) => format!("(docker logs failed: {e})"),
                };
                return Err(HarnessError::Docker {
                    name: node.service.clone(),
                    action: format!("{action} it: it never answered PING"),
                    failure: format!(
                        "`PING {}` got no PONG within {READY_WAIT:?} (last error: {last})",
                        node.addr
                    ),
                    advice: format!(
                        "check `docker ps -a --filter name={}` and the container log below",
                        node.container
                    ),
                    output: log,
                });
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }
}

impl Drop for DockerSet {
    fn drop(&mut self) {
        let args = ["down", "-v", "--timeout", "2"];
        match run_blocking(self.compose.command(&args), COMPOSE_TIMEOUT) {
            Ok(ran) if ran.ok() => tracing::debug!("docker node set taken down"),
            Ok(ran) => tracing::warn!(
                command = %self.compose.shown(&args),
                outcome = %ran.outcome(COMPOSE_TIMEOUT),
                output = %ran.output(),
                "could not take the docker node set down; run the command by hand"
            ),
            Err(error) => tracing::warn!(
                command = %self.compose.shown(&args),
                %error,
                "could not take the docker node set down; run the command by hand"
            ),
        }
    }
}

impl Container {
    /// Service `redis{n}` (1-based).
    fn new(n: usize) -> Container {
        Container {
            service: format!("redis{n}"),
            container: format!("redlock-redis{n}"),
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port(n))),
        }
    }

    fn error(&self, action: &str, args: &[&str], outcome: String, output: String) -> HarnessError {
        HarnessError::Docker {
            name: self.service.clone(),
            action: action.to_owned(),
            failure: format!("`docker {}` {outcome}", args.join(" ")),
            advice: format!(
                "check the container with `docker ps -a --filter name={c}` and `docker logs {c}` \
                 (was the set taken down by someone else?)",
                c = self.container
            ),
            output,
        }
    }
}

impl Compose {
    fn new(file: PathBuf, opts: &DockerOptions, clock_dir: &Path) -> Compose {
        let appendonly = if opts.appendonly_always { "yes" } else { "no" };
        let mut env = vec![
            ("REDLOCK_APPENDONLY".to_owned(), OsString::from(appendonly)),
            ("REDLOCK_CLOCK_DIR".to_owned(), clock_dir.as_os_str().into()),
        ];
        // The ports are fixed here; a REDLOCK_PORT_N of the caller's environment must not
        // move a node away from the address this set reports.
        for n in 1..=NODES {
            env.push((format!("REDLOCK_PORT_{n}"), port(n).to_string().into()));
        }
        Compose { file, env }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("docker-compose");
        cmd.arg("-p")
            .arg(PROJECT)
            .arg("-f")
            .arg(&self.file)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    async fn run(&self, args: &[&str]) -> io::Result<Ran> {
        let cmd = self.command(args);
        blocking(move || run_blocking(cmd, COMPOSE_TIMEOUT)).await?
    }

    fn shown(&self, args: &[&str]) -> String {
        format!(
            "docker-compose -p {PROJECT} -f {} {}",
            self.file.display(),
            args.join(" ")
        )
    }

    fn error(&self, args: &[&str], e: io::Error) -> HarnessError {
        set_error(
            "run docker-compose",
            self.shown(args),
            format!("could not be run ({e})"),
            "install docker-compose v1 (Debian: `apt-get install -y docker-compose`)",
            String::new(),
        )
    }
}

/// Runs `docker/build-image.sh` (idempotent).
async fn build_image(root: &Path) -> Result<(), HarnessError> {
    let script = root.join("docker").join("build-image.sh");
    let shown = format!("bash {}", script.display());
    let mut cmd = Command::new("bash");
    cmd.arg(&script);
    let advice = "run the script by hand to see its whole output";
    match blocking(move || run_blocking(cmd, BUILD_TIMEOUT))
        .await
        .and_then(|ran| ran)
    {
        Ok(ran) if ran.ok() => Ok(()),
        Ok(ran) => Err(set_error(
            "build the image",
            shown,
            ran.outcome(BUILD_TIMEOUT),
            advice,
            ran.output(),
        )),
        Err(e) => Err(set_error(
            "build the image",
            shown,
            format!("could not be run ({e})"),
            "install bash",
            String::new(),
        )),
    }
}

/// A fresh directory `<repo>/target/redlock-lab-clock-XXXXXX` with one world-readable
/// subdirectory per node, mounted on `/clock` in its container. Under `target/` rather than
/// the system temp dir because Docker setups that run the daemon in a VM share the project
/// tree more often than `/tmp`.
fn clock_dir(root: &Path) -> Result<TempDir, HarnessError> {
    let parent = root.join("target");
    fs::create_dir_all(&parent)
        .map_err(|e| HarnessError::io(format!("create {}", parent.display()), e))?;
    let dir = tempfile::Builder::new()
        .prefix("redlock-lab-clock-")
        .permissions(Permissions::from_mode(0o755))
        .tempdir_in(&parent)
        .map_err(|e| {
            HarnessError::io(
                format!("create a clock directory in {}", parent.display()),
                e,
            )
        })?;
    for n in 1..=NODES {
        let sub = dir.path().join(format!("redis{n}"));
        fs::create_dir(&sub)
            .and_then(|()| fs::set_permissions(&sub, Permissions::from_mode(0o755)))
            .map_err(|e| HarnessError::io(format!("create {}", sub.display()), e))?;
    }
    Ok(dir)
}

/// Host port of `redis{n}` (1-based; `n` is at most [`NODES`]).
fn port(n: usize) -> u16 {
    FIRST_PORT + (n as u16 - 1)
}

/// The repository root (where `docker-compose.yml` lives), two levels above this crate.
fn repo_root() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .ancestors()
        .nth(2)
        .unwrap_or(crate_dir)
        .to_path_buf()
}

fn set_error(
    action: &str,
    command: String,
    outcome: String,
    advice: &str,
    output: String,
) -> HarnessError {
    HarnessError::Docker {
        name: "docker node set".to_owned(),
        action: action.to_owned(),
        failure: format!("`{command}` {outcome}"),
        advice: advice.to_owned(),
        output,
    }
}

/// What a finished (or killed) command left.
struct Ran {
    /// `None`: killed at its deadline.
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    fn outcome(&self, deadline: Duration) -> String {
        match self.status {
            None => format!("did not finish within {deadline:?} and was killed"),
            Some(status) => format!("failed ({status})"),
        }
    }

    /// The last lines of stderr and stdout.
    fn output(&self) -> String {
        let both = format!("{}{}", self.stderr, self.stdout);
        let lines: Vec<&str> = both.lines().collect();
        lines[lines.len().saturating_sub(OUTPUT_LINES)..].join("\n")
    }
}

async fn run_docker(args: &[&str]) -> io::Result<Ran> {
    let mut cmd = Command::new("docker");
    cmd.args(args);
    blocking(move || run_blocking(cmd, DOCKER_TIMEOUT)).await?
}

/// Runs `f` on tokio's blocking pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(format!("the blocking task failed: {e}")))
}

/// Runs `cmd` to completion, capturing its output; at `deadline` its whole process group is
/// killed (a script's `docker build` child too).
fn run_blocking(mut cmd: Command, deadline: Duration) -> io::Result<Ran> {
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
    fn nodes_are_numbered_from_one_on_fixed_ports() {
        let third = Container::new(3);
        assert_eq!(third.service, "redis3");
        assert_eq!(third.container, "redlock-redis3");
        assert_eq!(third.addr.to_string(), "127.0.0.1:7103");
    }

    #[test]
    fn compose_pins_persistence_and_ports() {
        let opts = DockerOptions::default();
        let compose = Compose::new("c.yml".into(), &opts, Path::new("clk"));
        let env: Vec<(String, String)> = compose
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string_lossy().into_owned()))
            .collect();
        assert!(env.contains(&("REDLOCK_APPENDONLY".into(), "no".into())));
        assert!(env.contains(&("REDLOCK_CLOCK_DIR".into(), "clk".into())));
        assert!(env.contains(&("REDLOCK_PORT_5".into(), "7105".into())));
        assert_eq!(
            compose.shown(&["up", "-d"]),
            "docker-compose -p redlock-lab -f c.yml up -d"
        );
    }

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

//! Finding, spawning and observing redis-server processes (std::process, Linux only).

use std::ffi::{OsStr, OsString};
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::{HarnessError, NodeOptions};

/// Environment variable overriding the redis-server binary.
pub const REDIS_SERVER_ENV: &str = "REDIS_SERVER";

/// How many log lines start-up errors include.
const LOG_TAIL_LINES: usize = 30;

/// Locates redis-server: `$REDIS_SERVER` (a path, or a bare name looked up on PATH), else PATH.
pub(crate) fn find_redis_server() -> Result<PathBuf, HarnessError> {
    locate(
        std::env::var_os(REDIS_SERVER_ENV).as_deref(),
        std::env::var_os("PATH").as_deref(),
    )
}

fn locate(env: Option<&OsStr>, path_var: Option<&OsStr>) -> Result<PathBuf, HarnessError> {
    let search_path = |name: &OsStr| {
        path_var
            .into_iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join(name))
            .find(|p| is_executable(p))
    };
    match env.filter(|v| !v.is_empty()) {
        Some(value) if Path::new(value).components().count() == 1 => {
            search_path(value).ok_or_else(|| HarnessError::BinaryNotFound {
                detail: format!("{REDIS_SERVER_ENV}={value:?} is not on PATH"),
            })
        }
        Some(value) if is_executable(Path::new(value)) => Ok(PathBuf::from(value)),
        Some(value) => Err(HarnessError::BinaryNotFound {
            detail: format!("{REDIS_SERVER_ENV}={value:?} is not an executable file"),
        }),
        None => {
            search_path(OsStr::new("redis-server")).ok_or_else(|| HarnessError::BinaryNotFound {
                detail: format!("not on PATH and {REDIS_SERVER_ENV} is not set"),
            })
        }
    }
}

/// Locates `redis-cli`, for tests that talk to a node the way an outside client does (TLS,
/// unix socket, ACL users): next to the redis-server the harness uses (see
/// [`REDIS_SERVER_ENV`]), else on `PATH`. Debian ships it with redis-server (`redis-tools`),
/// built with TLS.
pub fn find_redis_cli() -> Result<PathBuf, HarnessError> {
    let beside_server = find_redis_server()
        .ok()
        .and_then(|server| Some(server.parent()?.join("redis-cli")))
        .filter(|cli| is_executable(cli));
    let on_path = || {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .map(|dir| dir.join("redis-cli"))
            .find(|p| is_executable(p))
    };
    beside_server
        .or_else(on_path)
        .ok_or_else(|| HarnessError::BinaryNotFound {
            detail: "redis-cli is neither beside redis-server nor on PATH".to_owned(),
        })
}

pub(crate) fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The redis-server command line for one node; `access` (password, ACL users, TLS and unix
/// listeners) goes before `opts.extra_args`, which stay last so they can override anything.
pub(crate) fn server_args(
    port: u16,
    dir: &Path,
    log: &Path,
    opts: &NodeOptions,
    access: &[OsString],
) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |a: &dyn AsRef<OsStr>| args.push(a.as_ref().to_os_string());
    push(&"--port");
    push(&port.to_string());
    for a in ["--bind", "127.0.0.1", "--daemonize", "no", "--save", ""] {
        push(&a);
    }
    if opts.appendonly_always {
        for a in ["--appendonly", "yes", "--appendfsync", "always"] {
            push(&a);
        }
    } else {
        push(&"--appendonly");
        push(&"no");
    }
    for a in ["--maxmemory-policy", "noeviction", "--protected-mode", "no"] {
        push(&a);
    }
    push(&"--dir");
    push(&dir);
    push(&"--logfile");
    push(&log);
    for a in access {
        push(a);
    }
    for a in &opts.extra_args {
        push(a);
    }
    args
}

/// Spawns redis-server with `args` (see [`server_args`]) from the *calling thread* with the
/// extra environment `env` and returns it with the log length before the spawn (the offset
/// where this run's log output starts).
pub(crate) fn spawn(
    binary: &Path,
    args: &[OsString],
    dir: &Path,
    log: &Path,
    env: &[(OsString, OsString)],
) -> Result<(Child, u64), HarnessError> {
    let offset = fs::metadata(log).map(|m| m.len()).unwrap_or(0);
    let open_log = || {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| HarnessError::io(format!("open log file {}", log.display()), e))
    };
    // stdout/stderr go to the log file too: fatal config errors are printed to stderr before
    // redis-server opens --logfile.
    let mut cmd = Command::new(binary);
    cmd.args(args)
        .current_dir(dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(open_log()?)
        .stderr(open_log()?);
    die_with_spawning_thread(&mut cmd);
    let child = cmd
        .spawn()
        .map_err(|e| HarnessError::io(format!("spawn {}", binary.display()), e))?;
    Ok((child, offset))
}

/// Makes the child receive SIGKILL when the thread that spawned it exits.
///
/// PR_SET_PDEATHSIG fires when the spawning *thread* exits, not when the process does. Nodes are
/// spawned from the thread that calls `NodeSet::start`/`Node::restart`: a test thread, the thread
/// blocking on a runtime, or a tokio worker, all of which live as long as the test. Do not start
/// nodes from short-lived threads (e.g. `spawn_blocking`, whose threads exit when idle) and keep
/// them: the nodes would be killed when that thread goes away. Normal clean-up is `Drop for Node`;
/// this only covers a test process that is killed outright.
#[allow(unsafe_code)]
pub(crate) fn die_with_spawning_thread(cmd: &mut Command) {
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child between fork and exec, where only
    // async-signal-safe operations are allowed. It makes two plain syscalls through nix
    // (prctl(PR_SET_PDEATHSIG), getppid) and builds io::Errors from raw errno values; it
    // allocates nothing and takes no locks.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            // The parent died before prctl took effect: do not outlive it.
            if nix::unistd::getppid() != parent {
                return Err(io::Error::from_raw_os_error(nix::libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// The last lines the server wrote to `log` after `offset`.
pub(crate) fn log_tail(log: &Path, offset: u64) -> String {
    let mut text = Vec::new();
    let read = fs::File::open(log).and_then(|mut f| {
        f.seek(SeekFrom::Start(offset))?;
        f.read_to_end(&mut text)
    });
    if let Err(e) = read {
        return format!("(could not read {}: {e})", log.display());
    }
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        return "(the server wrote nothing)".to_owned();
    }
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// Whether a start-up log says the port was already bound by someone else.
pub(crate) fn says_port_in_use(log_tail: &str) -> bool {
    log_tail.contains("Address already in use")
}

/// Process state letter from `/proc/PID/stat` (`R`, `S`, `T`, `Z`, ...), if readable.
pub(crate) fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": comm may contain spaces or parentheses, so split at the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Polls the process state until `done` holds, for at most `limit` (best effort).
pub(crate) fn wait_state(pid: u32, limit: Duration, done: impl Fn(Option<char>) -> bool) {
    let deadline = Instant::now() + limit;
    while !done(proc_state(pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_args_disable_persistence() {
        let args = server_args(
            7000,
            Path::new("d"),
            Path::new("d/l"),
            &NodeOptions::default(),
            &[],
        );
        let s: Vec<_> = args.iter().map(|a| a.to_str().unwrap()).collect();
        let joined = s.join(" ");
        assert!(joined.starts_with("--port 7000 --bind 127.0.0.1 --daemonize no --save  "));
        assert!(joined.contains("--appendonly no"));
        assert!(!joined.contains("appendfsync"));
        assert!(joined.contains("--protected-mode no --dir d --logfile d/l"));
    }

    #[test]
    fn appendonly_always_and_extra_args() {
        let opts = NodeOptions {
            appendonly_always: true,
            extra_args: vec!["--hz".into(), "50".into()],
            ..NodeOptions::default()
        };
        let access = [OsString::from("--requirepass"), OsString::from("pw")];
        let joined = server_args(1, Path::new("d"), Path::new("l"), &opts, &access)
            .iter()
            .map(|a| a.to_str().unwrap().to_owned())
            .collect::<Vec<_>>()
            .join(" ");
        assert!(joined.contains("--appendonly yes --appendfsync always"));
        assert!(joined.ends_with("--logfile l --requirepass pw --hz 50"));
    }

    /// What each server writes when its port is taken (Redis 7.0, Valkey 9.1).
    #[test]
    fn a_taken_port_is_read_from_either_servers_log() {
        let redis = "1:M 29 Nov 2026 14:53:14.395 # Warning: Could not create server TCP \
            listening socket *:7777: bind: Address already in use\n\
            1:M 29 Nov 2026 14:53:14.395 # Failed listening on port 7777 (TCP), aborting.";
        let valkey = "1:M 29 Nov 2026 14:53:14.395 * Running mode=standalone, port=7777.\n\
            1:M 29 Nov 2026 14:53:14.395 # Warning: Could not create server TCP listening \
            socket *:7777: bind: Address already in use\n\
            1:M 29 Nov 2026 14:53:14.395 # Failed listening on port 7777 (tcp), aborting.";
        assert!(says_port_in_use(redis));
        assert!(says_port_in_use(valkey));
        assert!(!says_port_in_use("1:M # Failed finding TLS support."));
    }

    #[test]
    fn missing_binary_says_how_to_install() {
        let err = locate(None, Some(OsStr::new(""))).unwrap_err().to_string();
        assert!(err.contains("install it with `apt-get install -y redis-server` (Debian)"));
        assert!(err.contains("or set REDIS_SERVER"));
        let err = locate(Some(OsStr::new("no-such-redis")), None).unwrap_err();
        assert!(matches!(err, HarnessError::BinaryNotFound { .. }));
        let err = locate(Some(OsStr::new("./no/such/redis")), None).unwrap_err();
        assert!(err.to_string().contains("not an executable file"));
    }
}

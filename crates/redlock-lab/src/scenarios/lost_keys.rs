//! Demonstrations where a lock key vanishes early from nodes of the holder's quorum: a
//! majority's wall clock stepped forward (H3), and a machine crash within the second that
//! `appendfsync everysec` leaves unsynced (H2). Both run [`hold_then_steal`], so the second
//! client wins in every round while the first still holds.

use std::path::{Path, PathBuf};

use fred::prelude::{ClientLike, Value};
use futures::future::BoxFuture;

use super::steal::{hold_then_steal, Break};
use crate::backend::{Backend, Setup};
use crate::error::LabError;
use crate::history::FaultKind;
use crate::lab::{Fencing, Lab, Timing};
use crate::raw;
use crate::resource::Resource;
use crate::scenario::{Expect, Outcome, Scenario, KEY};

/// What a mutual-exclusion break shows: two holders at once, and the update of one lost.
const OVERLAP: &[&str] = &["overlap", "lost update"];

const THREE: Setup = Setup {
    nodes: 3,
    persistent: false,
    fake_clock: false,
    clusters: &[],
};

/// Where Redis 7 keeps its multi-part AOF, under its `--dir`.
const AOF_DIR: &str = "appendonlydir";
const MANIFEST: &str = "appendonly.aof.manifest";

pub(super) fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            setup: Setup {
                fake_clock: true,
                ..THREE
            },
            ..demo(
                "majority_clock_jump_forward",
                "H3: no wall-clock steps on the servers (beyond the drift allowance)",
                "two of three nodes' wall clocks step 2 s (two TTLs) forward while client 0 holds: its keys there expire at once and client 1 wins those two nodes while the first still holds",
                majority_clock_jump_forward,
            )
        },
        Scenario {
            setup: Setup {
                persistent: true,
                ..THREE
            },
            timing: Timing {
                // On the docker set the crash (kill, two `docker cp`, start) and the second
                // client's reconnection take two to three seconds on a loaded host: the
                // holder's validity must outlast them for the second holder to overlap.
                // Nothing waits this TTL out.
                ttl: std::time::Duration::from_secs(5),
                ..Timing::default()
            },
            ..demo(
                "restart_with_appendfsync_everysec",
                "H2: no key vanishes before its TTL (appendfsync always: everysec may lose the last second of writes in a crash)",
                "with appendfsync everysec, a node of client 0's two-node quorum crashes within the second after the lock's write (kill -9 plus the AOF cut back to before that write, as a machine crash loses what was not yet fsynced) and restarts: the key is gone and client 1 wins",
                restart_with_appendfsync_everysec,
            )
        },
    ]
}

fn demo(
    name: &'static str,
    breaks: &'static str,
    shows: &'static str,
    run: crate::scenario::Driver,
) -> Scenario {
    Scenario {
        name,
        shows,
        expect: Expect::Violation {
            breaks,
            caught_as: OVERLAP,
        },
        setup: THREE,
        clients: 2,
        fencing: Fencing::Off,
        timing: Timing::default(),
        soak: None,
        semaphore: None,
        rwlock: false,
        run,
    }
}

fn majority_clock_jump_forward(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move { hold_then_steal(lab, Break::JumpClocks, &Resource::default()).await })
}

fn restart_with_appendfsync_everysec(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        appendfsync(lab, "everysec").await?;
        let outcome = hold_then_steal(lab, Break::CrashLosingAofTail, &Resource::default()).await;
        // A docker set is kept for the next scenario: put its nodes back as they started.
        appendfsync(lab, "always").await?;
        outcome
    })
}

/// `CONFIG SET appendfsync <mode>` on every node of the scenario.
async fn appendfsync(lab: &Lab, mode: &str) -> Result<(), LabError> {
    for n in 0..lab.node_count() {
        let url = format!("redis://{}", lab.nodes().addr(n));
        let redis = raw::connect(&url, lab.timing.node_timeout * 10).await?;
        let set: Result<Value, _> = redis
            .custom(
                fred::cmd!("CONFIG"),
                vec!["SET".to_owned(), "appendfsync".to_owned(), mode.to_owned()],
            )
            .await;
        raw::close(&redis, lab.timing.node_timeout).await;
        set?;
    }
    Ok(())
}

/// The machine crash `appendfsync everysec` does not survive, on node `n` within the second
/// after the write of `token`: the process is killed (kill -9 alone loses nothing, since the
/// kernel keeps what Redis wrote; everysec only fsyncs once a second, so a machine crash
/// loses the page cache's last second), the AOF is cut back to before that write (the worst
/// case of that second, so that it happens every run), and the node starts again.
pub(super) async fn crash_losing_aof_tail(
    lab: &Lab,
    n: usize,
    token: &str,
) -> Result<(), LabError> {
    let name = lab.nodes().name(n).to_owned();
    lab.history.fault(
        Some(n),
        FaultKind::KeyLoss,
        format!("crash {name} within the second after the lock's write: kill -9, AOF cut back"),
    );
    lab.nodes().kill(n).await?;
    match &lab.backend {
        Backend::Local(set) => cut_aof(&set.node(n).dir().join(AOF_DIR), token)?,
        Backend::Docker(set) => {
            let container = set.container(n);
            let scratch = tempfile::tempdir()
                .map_err(|e| LabError::Setup(format!("a scratch directory: {e}")))?;
            let inside = format!("{container}:/data/{AOF_DIR}");
            docker(&["cp", &inside, &scratch.path().display().to_string()]).await?;
            let dir = scratch.path().join(AOF_DIR);
            cut_aof(&dir, token)?;
            docker(&["cp", &format!("{}/.", dir.display()), &inside]).await?;
        }
        Backend::Members(_) => {
            return Err(LabError::Setup(
                "a crash that cuts an AOF needs single servers, not cluster members".into(),
            ))
        }
    }
    lab.nodes().restart(n).await?;
    lab.history
        .fault(Some(n), FaultKind::KeyLossEnd, format!("{name} is back"));
    // The point of the crash: the key is gone. Should the node have kept it, the
    // demonstration would fail for a reason that has nothing to do with the checker.
    if lab
        .nodes()
        .redis(n)
        .get(&lab.full_key(KEY))
        .await?
        .as_deref()
        == Some(token)
    {
        return Err(LabError::Setup(format!(
            "{name} still holds the lock's key after the crash: the AOF cut did not take"
        )));
    }
    Ok(())
}

async fn docker(args: &[&str]) -> Result<(), LabError> {
    let out = tokio::process::Command::new("docker")
        .args(args)
        .output()
        .await
        .map_err(|e| LabError::Setup(format!("docker {}: {e}", args.join(" "))))?;
    if !out.status.success() {
        return Err(LabError::Setup(format!(
            "docker {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Cuts the incremental AOF file in `dir` (named by the manifest) at the first command that
/// carries `token`, or at the MULTI that opens its transaction. Fails when no command
/// carries it: then there is nothing the crash could lose, and the demonstration would be
/// of something else.
fn cut_aof(dir: &Path, token: &str) -> Result<(), LabError> {
    let io = |what: &str, path: &Path, e: std::io::Error| {
        LabError::Setup(format!("{what} {}: {e}", path.display()))
    };
    let manifest = dir.join(MANIFEST);
    let listed = std::fs::read_to_string(&manifest).map_err(|e| io("read", &manifest, e))?;
    let incr: PathBuf = listed
        .lines()
        .filter(|l| l.ends_with("type i"))
        .filter_map(|l| l.split_whitespace().nth(1))
        .next_back()
        .map(|f| dir.join(f))
        .ok_or_else(|| {
            LabError::Setup(format!("{} names no incremental AOF", manifest.display()))
        })?;
    let aof = std::fs::read(&incr).map_err(|e| io("read", &incr, e))?;
    let at = cut_point(&aof, token.as_bytes()).ok_or_else(|| {
        LabError::Setup(format!(
            "no command in {} carries the lock's token: the write never reached the AOF",
            incr.display()
        ))
    })?;
    std::fs::write(&incr, &aof[..at]).map_err(|e| io("write", &incr, e))
}

/// Where to cut `aof` (RESP commands, one after another) so that the first command with an
/// argument equal to `token`, and everything after, is gone; at the MULTI right before it,
/// if there is one, so that no transaction is left open.
fn cut_point(aof: &[u8], token: &[u8]) -> Option<usize> {
    let mut at = 0;
    let mut multi_at = None;
    while at < aof.len() {
        let (args, next) = command(aof, at)?;
        if args.contains(&token) {
            return Some(multi_at.unwrap_or(at));
        }
        multi_at = args
            .first()
            .filter(|a| a.eq_ignore_ascii_case(b"MULTI"))
            .map(|_| at);
        at = next;
    }
    None
}

/// The RESP command (`*N`, then N `$len` bulk strings) at `at`: its arguments and where the
/// next command starts.
fn command(aof: &[u8], at: usize) -> Option<(Vec<&[u8]>, usize)> {
    let (count, mut at) = header(aof, at, b'*')?;
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        let (len, start) = header(aof, at, b'$')?;
        args.push(aof.get(start..start + len)?);
        at = start + len + 2;
    }
    Some((args, at))
}

/// A `<kind><number>\r\n` line at `at`: the number and where the line ends.
fn header(aof: &[u8], at: usize, kind: u8) -> Option<(usize, usize)> {
    if *aof.get(at)? != kind {
        return None;
    }
    let end = at + aof.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
    let number = std::str::from_utf8(&aof[at + 1..end]).ok()?.parse().ok()?;
    Some((number, end + 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(args: &[&str]) -> String {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        out
    }

    #[test]
    fn the_cut_drops_the_tokens_command_and_its_open_multi() {
        let before = resp(&["SELECT", "0"]) + &resp(&["SET", "other", "x"]);
        let tail = resp(&["MULTI"]) + &resp(&["SET", "k", "tok", "PXAT", "1"]) + &resp(&["EXEC"]);
        let aof = format!("{before}{tail}");
        assert_eq!(cut_point(aof.as_bytes(), b"tok"), Some(before.len()));
        let bare = format!("{before}{}", resp(&["SET", "k", "tok"]));
        assert_eq!(cut_point(bare.as_bytes(), b"tok"), Some(before.len()));
        assert_eq!(cut_point(before.as_bytes(), b"tok"), None);
    }
}

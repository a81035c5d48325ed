//! The holder process's side: take the lock with the scenario's settings, report it, then
//! extend it until killed, or write a fenced resource once told to.

use std::time::Duration;

use fred::prelude::KeysInterface;
use redlock_client::{fenced_set, FencingToken, LockConfig, LockGuard, Redlock};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::{mono_now, mono_of, say, Mode};
use crate::raw;
use crate::workload::WRITE_MARGIN;

/// A killed holder never reaches this many extensions (a few per scenario round); one whose
/// scenario died without killing it stops here instead of holding the lock for ever.
const MAX_EXTENSIONS: usize = 60;

/// The holder's settings, as [`super::HolderProcess::spawn`] wrote them.
struct Spec {
    nodes: Vec<String>,
    ttl: Duration,
    node_timeout: Duration,
    prefix: String,
    key: String,
    fenced: bool,
    seed: u64,
    resource: Option<(String, String)>,
}

impl Spec {
    fn parse(spec: &str) -> Result<Spec, String> {
        let fields: Vec<(&str, &str)> = spec.split(';').filter_map(|f| f.split_once('=')).collect();
        let get = |name: &str| {
            fields
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
                .ok_or_else(|| format!("{} lacks {name}", super::SPEC_ENV))
        };
        let ms = |name: &str| -> Result<Duration, String> {
            get(name)?
                .parse()
                .map(Duration::from_millis)
                .map_err(|e| format!("{name}: {e}"))
        };
        Ok(Spec {
            nodes: get("nodes")?.split(',').map(str::to_owned).collect(),
            ttl: ms("ttl_ms")?,
            node_timeout: ms("node_timeout_ms")?,
            prefix: get("prefix")?,
            key: get("key")?,
            fenced: get("fenced")? == "1",
            seed: get("seed")?.parse().map_err(|e| format!("seed: {e}"))?,
            resource: get("resource").ok().zip(get("resource_key").ok()),
        })
    }
}

/// Runs the holder; an error is reported by the caller as an `error` line.
pub(super) async fn serve(mode: &str, spec: &str) -> Result<(), String> {
    // Dies with the scenario's process, whatever happens to it.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    let mode = Mode::parse(mode).ok_or_else(|| format!("unknown holder mode {mode:?}"))?;
    let spec = Spec::parse(spec)?;
    say("ready", &[("pid", std::process::id().to_string())]);
    let config = LockConfig::builder()
        .nodes(spec.nodes.clone())
        .ttl(spec.ttl)
        .node_timeout(spec.node_timeout)
        .key_prefix(spec.prefix.clone())
        .no_renewal()
        .max_wait(spec.ttl * 2)
        .fencing(spec.fenced)
        .seed(spec.seed)
        .build()
        .map_err(|e| e.to_string())?;
    let client = Redlock::connect(config).await.map_err(|e| e.to_string())?;
    let guard = client.lock(&spec.key).await.map_err(|e| e.to_string())?;
    report_acquired(&guard);
    let done = match mode {
        Mode::Extend => extend_until_killed(&guard, spec.ttl).await,
        Mode::WriteFenced => write_fenced(&guard, &spec).await,
    };
    say("releasing", &[("at", mono_now().to_string())]);
    let _ = guard.release().await;
    client.shutdown().await;
    done
}

/// The acquisition as the lab records it: the winning round's `t0` (recovered from the
/// reported validity, as [`crate::workload::record_acquired`] does), the return of `lock()`
/// and the end of validity.
fn report_acquired(guard: &LockGuard) {
    let at = mono_now();
    let lock = guard.lock();
    let report = lock.report();
    let before = match report.validity {
        Some(left) => left + report.elapsed,
        None => lock.ttl(),
    };
    let t0 = lock.valid_until().checked_sub(before).map_or(at, mono_of);
    let fencing = guard
        .fencing_token()
        .map_or("-".to_owned(), |f| f.get().to_string());
    say(
        "acquired",
        &[
            ("token", lock.token().as_str().to_owned()),
            ("key", guard.key()),
            ("fencing", fencing),
            ("t0", t0.to_string()),
            ("at", at.to_string()),
            ("valid_until", mono_of(guard.valid_until()).to_string()),
        ],
    );
}

/// Extends every third of the TTL, as a renewing holder does, reporting each extension as
/// soon as it returns (so a kill right after a report never hides one).
async fn extend_until_killed(guard: &LockGuard, ttl: Duration) -> Result<(), String> {
    for _ in 0..MAX_EXTENSIONS {
        tokio::time::sleep(ttl / 3).await;
        let started = mono_now();
        let extended = guard.extend(None).await;
        let ended = mono_now();
        let valid_until = match &extended {
            Ok(()) => mono_of(guard.valid_until()).to_string(),
            Err(_) => "-".to_owned(),
        };
        say(
            "extended",
            &[
                ("started", started.to_string()),
                ("ended", ended.to_string()),
                ("valid_until", valid_until),
            ],
        );
        extended.map_err(|e| format!("extension failed: {e}"))?;
    }
    Err(format!("not killed after {MAX_EXTENSIONS} extensions"))
}

/// Read, check the validity (a well-behaved holder), wait for the go (the moment the
/// scenario stops the process), write through `fenced_set`.
async fn write_fenced(guard: &LockGuard, spec: &Spec) -> Result<(), String> {
    let (url, key) = spec
        .resource
        .as_ref()
        .ok_or("write-fenced needs resource and resource_key")?;
    let fencing: FencingToken = guard.fencing_token().ok_or("the lock is not fenced")?;
    let redis = raw::connect(url, spec.node_timeout * 4)
        .await
        .map_err(|e| e.to_string())?;
    let value: Option<String> = redis.get(key).await.map_err(|e| e.to_string())?;
    let read = value.map_or(Ok(0), |v| v.parse::<u64>().map_err(|e| e.to_string()))?;
    let read_at = mono_now();
    if guard.remaining().is_none_or(|left| left < WRITE_MARGIN) {
        return Err("too little validity left to write".into());
    }
    say("checked", &[("read", read.to_string())]);
    let mut go = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut go)
        .await
        .map_err(|e| e.to_string())?;
    let written = fenced_set(&redis, key, &(read + 1).to_string(), fencing)
        .await
        .map_err(|e| e.to_string())?;
    say(
        if written { "wrote" } else { "rejected" },
        &[
            ("read", read.to_string()),
            ("read_at", read_at.to_string()),
            ("at", mono_now().to_string()),
            ("fencing", fencing.get().to_string()),
        ],
    );
    raw::close(&redis, spec.node_timeout).await;
    Ok(())
}

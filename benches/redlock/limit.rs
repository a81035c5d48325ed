//! The servers' own limit for P5, measured with `redis-benchmark` (Debian package
//! redis-tools, installed with redis-server) in the same run, on the same nodes.
//!
//! A lock cycle costs each node one `SET key token NX PX ttl` and one `EVALSHA` of the
//! compare-and-delete script. Each command is benchmarked on every node at once (one
//! redis-benchmark per node, running concurrently, as a lock client loads every node at
//! once), with 256 requests in flight per node (16 connections x 16 pipelined), the depth of
//! P5. The limit in cycles per second is, per node, `1 / (1/set_rate + 1/evalsha_rate)`,
//! and the set's limit is the slowest node's. The release script runs on random keys, most
//! of which it does not hold, so it skips the `DEL`: the limit is slightly optimistic, which
//! makes our share of it conservative.

use std::process::{Command, Output, Stdio};

use redlock_testkit::{ClusterSet, NodeSet};
use serde::Serialize;

use crate::error::{BenchError, Context};
use crate::floor::{Floor, Wait};
use crate::progress;
use crate::subjects::TTL;

const CONNECTIONS: u32 = 16;
const PIPELINE: u32 = 16;
const KEYSPACE: u32 = 100_000;
/// A token of the length ours and the floor use (a UUID in hex).
const TOKEN: &str = "0123456789abcdef0123456789abcdef";

const INSTALL: &str = "install redis-benchmark (Debian: apt-get install -y redis-tools; it \
                       comes with redis-server) and make sure it is on PATH";

/// The limit and how it was measured.
#[derive(Debug, Clone, Serialize)]
pub struct ServerLimit {
    pub method: String,
    pub commands: Vec<String>,
    pub per_node: Vec<NodeLimit>,
    /// The slowest node's cycles per second.
    pub cycles_per_second: f64,
}

/// One node's rates, measured while every node was loaded at once.
#[derive(Debug, Clone, Serialize)]
pub struct NodeLimit {
    pub node: String,
    pub set_per_second: f64,
    pub evalsha_per_second: f64,
    pub cycles_per_second: f64,
}

/// Benchmarks `SET NX PX` and the release `EVALSHA` on every node, `requests` each.
pub async fn measure(set: &NodeSet, requests: u64) -> Result<ServerLimit, BenchError> {
    // Loads the compare-and-delete script on every node, so EVALSHA finds it.
    let floor = Floor::connect(&set.urls(), TTL, Wait::All).await?;
    let ttl_ms = TTL.as_millis().to_string();
    let key = "bench:limit:__rand_int__";
    let set_cmd = vec!["SET", key, TOKEN, "NX", "PX", &ttl_ms];
    let eval_cmd = vec!["EVALSHA", floor.unlock_sha(), "1", key, TOKEN];
    let ports: Vec<u16> = set.iter().map(|n| n.port()).collect();
    let set_rates = run_everywhere(&ports, false, requests, &set_cmd).await?;
    let eval_rates = run_everywhere(&ports, false, requests, &eval_cmd).await?;
    let per_node: Vec<NodeLimit> = set
        .iter()
        .zip(set_rates.iter().zip(&eval_rates))
        .map(|(node, (&s, &e))| NodeLimit {
            node: node.name().to_string(),
            set_per_second: s,
            evalsha_per_second: e,
            cycles_per_second: 1.0 / (1.0 / s + 1.0 / e),
        })
        .collect();
    let cycles_per_second = per_node
        .iter()
        .map(|n| n.cycles_per_second)
        .fold(f64::INFINITY, f64::min);
    progress!(
        "P5 servers' limit (redis-benchmark, every node at once): {cycles_per_second:.0} cycles/s"
    );
    Ok(ServerLimit {
        method: format!(
            "redis-benchmark on every node at once, {CONNECTIONS} connections x {PIPELINE} \
             pipelined = {} in flight per node, {requests} requests per node and command, keys \
             random among {KEYSPACE}; cycles/s = 1 / (1/SET rate + 1/EVALSHA rate), slowest node",
            CONNECTIONS * PIPELINE
        ),
        commands: vec![set_cmd.join(" "), eval_cmd.join(" ")],
        per_node,
        cycles_per_second,
    })
}

/// P10's servers' limit on members that are whole clusters, in cycles per second: the
/// same two commands, benchmarked with `redis-benchmark --cluster` on every member at once
/// (its keys carry a `{tag}` that it sets to each master's slots in turn, so a member's
/// rate is all of its masters'; plain `redis-benchmark` on clusters of one master, which
/// it does not take as a cluster); a member's cycles per second from its two rates as
/// above, and the slowest member's.
pub async fn measure_clusters(clusters: &[ClusterSet], requests: u64) -> Result<f64, BenchError> {
    // Loads the compare-and-delete script on every master.
    let masters: Vec<String> = clusters
        .iter()
        .flat_map(|c| {
            c.masters()
                .into_iter()
                .map(|m| format!("redis://127.0.0.1:{}", m.port()))
        })
        .collect();
    let floor = Floor::connect(&masters, TTL, Wait::All).await?;
    let ttl_ms = TTL.as_millis().to_string();
    let key = "bench:limit:{tag}:__rand_int__";
    let set_cmd = vec!["SET", key, TOKEN, "NX", "PX", &ttl_ms];
    let eval_cmd = vec!["EVALSHA", floor.unlock_sha(), "1", key, TOKEN];
    let ports: Vec<u16> = clusters.iter().map(|c| c.master(0).port()).collect();
    // redis-benchmark takes no cluster of one node; that node serves every slot, so the
    // key's literal `{tag}` is served there.
    let several = clusters.iter().any(|c| c.shard_count() > 1);
    let set_rates = run_everywhere(&ports, several, requests, &set_cmd).await?;
    let eval_rates = run_everywhere(&ports, several, requests, &eval_cmd).await?;
    let cycles_per_second = set_rates
        .iter()
        .zip(&eval_rates)
        .map(|(s, e)| 1.0 / (1.0 / s + 1.0 / e))
        .fold(f64::INFINITY, f64::min);
    progress!(
        "P10 servers' limit (redis-benchmark --cluster, every member at once): \
         {cycles_per_second:.0} cycles/s"
    );
    Ok(cycles_per_second)
}

/// Runs one redis-benchmark per port (with `--cluster`: per cluster, from that node), all
/// at once; returns each one's requests per second.
async fn run_everywhere(
    ports: &[u16],
    cluster: bool,
    requests: u64,
    command: &[&str],
) -> Result<Vec<f64>, BenchError> {
    let args: Vec<Vec<String>> = ports
        .iter()
        .map(|port| {
            let mut args: Vec<String> = [
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-n",
                &requests.to_string(),
                "-c",
                &CONNECTIONS.to_string(),
                "-P",
                &PIPELINE.to_string(),
                "-r",
                &KEYSPACE.to_string(),
                "--csv",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if cluster {
                args.push("--cluster".to_string());
            }
            args.extend(command.iter().map(|s| s.to_string()));
            args
        })
        .collect();
    let name = command[0].to_string();
    tokio::task::spawn_blocking(move || {
        let children = args
            .iter()
            .map(|a| {
                Command::new("redis-benchmark")
                    .args(a)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .during("starting redis-benchmark", INSTALL)
            })
            .collect::<Result<Vec<_>, _>>()?;
        children
            .into_iter()
            .zip(&args)
            .map(|(child, a)| {
                let port = &a[3];
                let step = format!("redis-benchmark {name} against port {port}");
                let out = child.wait_with_output().during(&step, INSTALL)?;
                rate(&out).during(
                    step,
                    "run the same redis-benchmark command by hand to see why",
                )
            })
            .collect()
    })
    .await
    .during("waiting for redis-benchmark", "see the message above")?
}

/// The `rps` column of redis-benchmark's CSV output.
fn rate(out: &Output) -> Result<f64, String> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    stdout
        .lines()
        .filter(|l| !l.starts_with("\"test\""))
        .find_map(|l| l.split("\",\"").nth(1)?.trim_matches('"').parse().ok())
        .ok_or_else(|| format!("no rate in its output: {}", stdout.trim()))
}

//! `redlock nodes`: each node's reachability, latency and health (does it meet what the
//! algorithm assumes: an independent standalone master whose keys do not vanish early).

use std::time::Duration;

use redlock_client::{NodeHealth, Redlock};
use serde::Serialize;

use crate::cli::NodesArgs;
use crate::console;
use crate::exit::Exit;

/// Checks every node and prints the result. Exit: all healthy 0, some not but a quorum
/// reachable 1, fewer than a quorum reachable 69.
pub async fn nodes(client: &Redlock, args: &NodesArgs) -> Exit {
    let health = client.health().await;
    let view = View::of(&health);
    if args.json {
        console::print_json(&view);
    } else {
        console::print(&view.text());
    }
    view.exit()
}

/// The JSON form (and the source of the text form).
#[derive(Debug, Serialize)]
struct View {
    /// How many nodes a lock needs.
    quorum: usize,
    /// How many answered.
    reachable: usize,
    /// How many answered with no problem found.
    healthy: usize,
    /// Every node, in configuration order.
    nodes: Vec<NodeView>,
}

/// One node.
#[derive(Debug, Serialize)]
struct NodeView {
    /// The URL, password masked.
    node: String,
    /// Whether it answered.
    reachable: bool,
    /// How long it took to answer, in milliseconds (fractional).
    latency_ms: Option<f64>,
    /// Why it did not answer.
    error: Option<String>,
    /// The server software (`valkey`, `redis`).
    server: Option<String>,
    /// The server's own version (Valkey's, not the Redis one it reports for compatibility).
    version: Option<String>,
    role: Option<String>,
    mode: Option<String>,
    /// For a member that is a whole cluster: `cluster_state` (`ok`, `fail`), the worst its
    /// masters report.
    cluster_state: Option<String>,
    /// For a member that is a whole cluster: how many of the 16384 slots are served.
    cluster_slots_ok: Option<u32>,
    /// For a member that is a whole cluster: the fewest replicas connected to one of its
    /// masters.
    cluster_fewest_replicas: Option<u32>,
    appendonly: Option<bool>,
    appendfsync: Option<String>,
    maxmemory_policy: Option<String>,
    /// Whether the server offers `DELIFEQ` (native compare-and-delete); unknown when
    /// `COMMAND INFO` is not allowed.
    compare_and_delete: Option<bool>,
    /// Reachable and no problem found.
    healthy: bool,
    /// Each setting that breaks an assumption, with what to do.
    problems: Vec<String>,
}

impl View {
    fn of(health: &[NodeHealth]) -> View {
        let nodes: Vec<NodeView> = health
            .iter()
            .map(|h| NodeView {
                node: h.node.to_string(),
                reachable: h.reachable.is_ok(),
                latency_ms: h.reachable.as_ref().ok().map(|d| millis(*d)),
                error: h.reachable.as_ref().err().map(ToString::to_string),
                server: h.server.clone(),
                version: h.version.clone(),
                role: h.role.clone(),
                mode: h.mode.clone(),
                cluster_state: h.cluster.as_ref().and_then(|c| c.state.clone()),
                cluster_slots_ok: h.cluster.as_ref().and_then(|c| c.slots_ok),
                cluster_fewest_replicas: h.cluster.as_ref().and_then(|c| c.fewest_replicas),
                appendonly: h.appendonly,
                appendfsync: h.appendfsync.clone(),
                maxmemory_policy: h.maxmemory_policy.clone(),
                compare_and_delete: h.compare_and_delete,
                healthy: h.is_healthy(),
                problems: h.problems.iter().map(ToString::to_string).collect(),
            })
            .collect();
        View {
            quorum: redlock_core::quorum(nodes.len()),
            reachable: nodes.iter().filter(|n| n.reachable).count(),
            healthy: nodes.iter().filter(|n| n.healthy).count(),
            nodes,
        }
    }

    fn exit(&self) -> Exit {
        if self.reachable < self.quorum {
            Exit::Unavailable
        } else if self.healthy < self.nodes.len() {
            Exit::No
        } else {
            Exit::Success
        }
    }

    fn text(&self) -> String {
        let unknown = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".into());
        let width = self.nodes.iter().map(|n| n.node.len()).max().unwrap_or(0);
        let mut out = String::new();
        for node in &self.nodes {
            let line = match (node.latency_ms, &node.error) {
                (Some(ms), _) => format!(
                    "{:<9} {ms:>7.2}ms  {} {}, {}, {}, appendonly {}, appendfsync {}, maxmemory-policy {}",
                    if node.healthy { "ok" } else { "PROBLEMS" },
                    unknown(&node.server),
                    unknown(&node.version),
                    match &node.cluster_state {
                        Some(state) => format!(
                            "cluster (state {state}, {} of 16384 slots served)",
                            node.cluster_slots_ok
                                .map_or_else(|| "?".to_string(), |n| n.to_string())
                        ),
                        None => unknown(&node.mode),
                    },
                    unknown(&node.role),
                    match node.appendonly {
                        Some(true) => "yes",
                        Some(false) => "no",
                        None => "?",
                    },
                    unknown(&node.appendfsync),
                    unknown(&node.maxmemory_policy),
                ),
                (None, error) => format!(
                    "{:<9} {}",
                    "DOWN",
                    error.as_deref().unwrap_or("no answer")
                ),
            };
            out.push_str(&format!("{:<width$}  {line}\n", node.node));
            for problem in &node.problems {
                out.push_str(&format!("{:<width$}    - {problem}\n", ""));
            }
        }
        let n = self.nodes.len();
        out.push_str(&format!(
            "{} of {n} nodes reachable (a lock needs {}), {} healthy{}\n",
            self.reachable,
            self.quorum,
            self.healthy,
            match self.exit() {
                Exit::Unavailable => ": too few nodes reachable to take any lock",
                Exit::No => ": see the problems above",
                _ => "",
            }
        ));
        out
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

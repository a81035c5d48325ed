//! `redlock inspect`: whether a key is held, for how long a quorum holds it, and each node's
//! view, as text or JSON.

use std::time::Duration;

use humantime::format_duration;
use redlock_client::{Inspection, NodeOutcome, Redlock};
use redlock_core::NodeName;
use serde::Serialize;

use crate::cli::InspectArgs;
use crate::console;
use crate::error::CliError;
use crate::exit::Exit;

/// Reads the key from every node and prints what they say. Exit: held 0, not held 1,
/// too few answers to tell 69.
pub async fn inspect(client: &Redlock, args: &InspectArgs) -> Result<Exit, CliError> {
    if let Some(permits) = args.permits {
        return inspect_permits(client, args, permits).await;
    }
    if args.rw {
        return inspect_rw(client, args).await;
    }
    let inspection = client
        .inspect(&args.key)
        .await
        .map_err(|e| CliError::from_lock(&format!("inspecting \"{}\"", args.key), e))?;
    let view = View::of(&inspection);
    if args.json {
        console::print_json(&view);
    } else {
        console::print(&view.text());
    }
    Ok(match inspection.held {
        Some(true) => Exit::Success,
        Some(false) => Exit::No,
        None => Exit::Unavailable,
    })
}

/// Reads each permit of the semaphore `args.key` of `permits` permits, and prints what
/// the nodes say of each. Exit: some permit held 0, none 1, too few answers to tell of one
/// 69.
async fn inspect_permits(
    client: &Redlock,
    args: &InspectArgs,
    permits: u32,
) -> Result<Exit, CliError> {
    let semaphore = client
        .semaphore(&args.key, permits)
        .map_err(|e| CliError::from_lock("naming the semaphore", e))?;
    let mut views = Vec::with_capacity(permits as usize);
    for i in 1..=permits {
        let key = format!("{}:{i}", semaphore.base_key());
        let inspection = client
            .coordinator()
            .inspect(&key)
            .await
            .map_err(|e| CliError::from_lock(&format!("inspecting \"{key}\""), e.into()))?;
        views.push(View::of(&inspection));
    }
    let held = views.iter().filter(|v| v.held == Some(true)).count();
    let unknown = views.iter().any(|v| v.held.is_none());
    if args.json {
        console::print_json(&serde_json::json!({
            "semaphore": semaphore.base_key(),
            "permits": permits,
            "held": held,
            "each": views,
        }));
    } else {
        let mut out = format!(
            "{}: {held} of {permits} permits held\n",
            semaphore.base_key()
        );
        for view in &views {
            out.push_str(&view.text());
        }
        console::print(&out);
    }
    Ok(match (held, unknown) {
        (0, true) => Exit::Unavailable,
        (0, false) => Exit::No,
        _ => Exit::Success,
    })
}

/// Reads both sides of the read-write lock `args.key`, writer then readers, and prints
/// what the nodes say of each. Exit: a side held 0, neither 1, too few answers to tell 69.
async fn inspect_rw(client: &Redlock, args: &InspectArgs) -> Result<Exit, CliError> {
    let rwlock = client
        .rwlock(&args.key)
        .map_err(|e| CliError::from_lock("naming the read-write lock", e))?;
    let mut views = Vec::with_capacity(2);
    let mut readers = 0;
    for side in ["write", "read"] {
        let key = format!("{}:{side}", rwlock.base_key());
        let inspection = client
            .coordinator()
            .inspect(&key)
            .await
            .map_err(|e| CliError::from_lock(&format!("inspecting \"{key}\""), e.into()))?;
        if side == "read" {
            readers = live_readers(&inspection);
        }
        views.push(View::of(&inspection));
    }
    let held = views.iter().any(|v| v.held == Some(true));
    let unknown = views.iter().any(|v| v.held.is_none());
    if args.json {
        console::print_json(&serde_json::json!({
            "rwlock": rwlock.base_key(),
            "readers": readers,
            "write": views[0],
            "read": views[1],
        }));
    } else {
        let mut out = format!("{}: {readers} reader(s) on a quorum\n", rwlock.base_key());
        for view in &views {
            out.push_str(&view.text());
        }
        console::print(&out);
    }
    Ok(match (held, unknown) {
        (true, _) => Exit::Success,
        (false, true) => Exit::Unavailable,
        (false, false) => Exit::No,
    })
}

/// How many readers a quorum of nodes hold: the quorum-th largest count of live readers a
/// node answered with.
fn live_readers(inspection: &Inspection) -> usize {
    let mut counts: Vec<usize> = inspection
        .holders
        .iter()
        .map(|h| match h {
            Some(redlock_client::Holder::Readers(tokens)) => tokens.len(),
            _ => 0,
        })
        .collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    let quorum = redlock_core::quorum(counts.len());
    counts.get(quorum.saturating_sub(1)).copied().unwrap_or(0)
}

/// One node's answer in an [`Inspection`]: the key's TTL there (`None`: absent;
/// `Duration::MAX`: no expiry), or why it did not answer.
type NodeTtl = (NodeName, Result<Option<Duration>, NodeOutcome>);

/// The JSON form (and the source of the text form). Durations in whole milliseconds.
#[derive(Debug, Serialize)]
pub struct View {
    /// The full key, with the prefix.
    key: String,
    /// `true` / `false`, or `null` when too few nodes answered to tell.
    held: Option<bool>,
    /// How long a quorum still holds the key; `null` when not held or without expiry.
    remaining_ms: Option<u64>,
    /// How many nodes must hold the key for it to be held.
    quorum: usize,
    /// Every node, in configuration order.
    nodes: Vec<NodeView>,
}

/// One node's view of the key.
#[derive(Debug, Serialize)]
struct NodeView {
    /// The node's URL, password masked.
    node: String,
    /// Whether the node holds the key; `null` when it did not answer.
    held: Option<bool>,
    /// The key's TTL on this node; `null` when absent, unanswered, or without expiry.
    ttl_ms: Option<u64>,
    /// Why the node did not answer, when it did not.
    error: Option<String>,
}

impl View {
    fn of(inspection: &Inspection) -> View {
        View::new(
            &inspection.key,
            inspection.held,
            inspection.remaining,
            &inspection.nodes,
        )
    }

    fn new(key: &str, held: Option<bool>, remaining: Option<Duration>, nodes: &[NodeTtl]) -> View {
        let views = nodes
            .iter()
            .map(|(name, ttl)| match ttl {
                Ok(ttl) => NodeView {
                    node: name.to_string(),
                    held: Some(ttl.is_some()),
                    ttl_ms: ttl.and_then(millis),
                    error: None,
                },
                Err(outcome) => NodeView {
                    node: name.to_string(),
                    held: None,
                    ttl_ms: None,
                    error: Some(outcome.to_string()),
                },
            })
            .collect();
        View {
            key: key.to_string(),
            held,
            remaining_ms: remaining.and_then(millis),
            quorum: redlock_core::quorum(nodes.len()),
            nodes: views,
        }
    }

    fn text(&self) -> String {
        let n = self.nodes.len();
        let mut out = match (self.held, self.remaining_ms) {
            (Some(true), Some(ms)) => format!(
                "{}: held, for {} more on a quorum ({} of {n} nodes)\n",
                self.key,
                show(ms),
                self.quorum
            ),
            (Some(true), None) => format!(
                "{}: held, without expiry on a quorum ({} of {n} nodes): not a lock this library set; remove it by hand if it is stale\n",
                self.key, self.quorum
            ),
            (Some(false), _) => format!("{}: not held\n", self.key),
            (None, _) => format!(
                "{}: unknown, too few nodes answered (a quorum is {} of {n}); check the nodes with `redlock nodes`\n",
                self.key, self.quorum
            ),
        };
        let width = self.nodes.iter().map(|n| n.node.len()).max().unwrap_or(0);
        for node in &self.nodes {
            let state = match (&node.error, node.held, node.ttl_ms) {
                (Some(error), _, _) => format!("no answer: {error}"),
                (None, Some(true), Some(ms)) => format!("holds it, {} left", show(ms)),
                (None, Some(true), None) => "holds it, without expiry".to_string(),
                _ => "does not hold it".to_string(),
            };
            out.push_str(&format!("  {:<width$}  {state}\n", node.node));
        }
        out
    }
}

/// Whole milliseconds; `None` for "no expiry" (`Duration::MAX` in an inspection).
fn millis(d: Duration) -> Option<u64> {
    (d != Duration::MAX).then(|| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A TTL as people read it: whole milliseconds, no finer.
fn show(ms: u64) -> String {
    format_duration(Duration::from_millis(ms)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_json_of_a_held_key() {
        let nodes = [
            (
                NodeName::redacted("redis://:pw@a:1"),
                Ok(Some(Duration::from_millis(1600))),
            ),
            (
                NodeName::redacted("redis://b:2"),
                Ok(Some(Duration::from_millis(1500))),
            ),
            (
                NodeName::redacted("redis://c:3"),
                Err(NodeOutcome::TimedOut),
            ),
        ];
        let view = View::new(
            "redlock:job",
            Some(true),
            Some(Duration::from_millis(1500)),
            &nodes,
        );
        let text = view.text();
        assert!(
            text.starts_with("redlock:job: held, for 1s 500ms more on a quorum (2 of 3 nodes)"),
            "{text}"
        );
        assert!(
            text.contains("redis://:***@a:1  holds it, 1s 600ms left"),
            "{text}"
        );
        assert!(text.contains("no answer: timed out"), "{text}");
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["held"], true);
        assert_eq!(json["remaining_ms"], 1500);
        assert_eq!(json["nodes"][2]["held"], serde_json::Value::Null);
        assert_eq!(json["nodes"][2]["error"], "timed out");
        assert!(!json.to_string().contains("pw"));
    }
}

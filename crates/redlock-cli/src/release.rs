//! `redlock release --token`: removes a lock by its token, for an operator cleaning up after
//! a holder that crashed (or hangs) with a long TTL. Compare-and-delete on every node, so a
//! stale token never removes a newer holder's lock.

use redlock_client::{NodeOutcome, Redlock, RoundReport, Token};
use serde::Serialize;

use crate::cli::ReleaseArgs;
use crate::console;
use crate::error::CliError;
use crate::exit::Exit;

/// Releases and prints what each node did. Exit: removed from some node 0, held with that
/// token nowhere 1, fewer than a quorum confirmed 69.
pub async fn release(client: &Redlock, args: &ReleaseArgs) -> Result<Exit, CliError> {
    let token = Token::from_string(args.token.clone());
    let report = client
        .release_token(&args.key, &token)
        .await
        .map_err(|e| CliError::from_lock(&format!("releasing \"{}\"", args.key), e))?;
    // The round returns once a quorum confirmed; the rest answer within a node timeout,
    // and an operator wants to know about every node.
    let report = report.settled().await;
    let view = View::of(&report);
    if args.json {
        console::print_json(&view);
    } else {
        console::print(&view.text());
    }
    Ok(if view.removed > 0 {
        Exit::Success
    } else {
        Exit::No
    })
}

/// The JSON form (and the source of the text form).
#[derive(Debug, Serialize)]
struct View {
    /// The full key.
    key: String,
    /// On how many nodes the key held the token and was deleted.
    removed: usize,
    /// Every node: what it did.
    nodes: Vec<NodeView>,
}

#[derive(Debug, Serialize)]
struct NodeView {
    /// The URL, password masked.
    node: String,
    /// `released` (deleted), `not_held` (absent or another token), or `error`.
    outcome: &'static str,
    /// The error, for `error`.
    error: Option<String>,
}

impl View {
    fn of(report: &RoundReport) -> View {
        let nodes: Vec<NodeView> = report
            .nodes
            .iter()
            .map(|n| {
                let (outcome, error) = match &n.outcome {
                    NodeOutcome::Released => ("released", None),
                    NodeOutcome::NotHeld => ("not_held", None),
                    other => ("error", Some(other.to_string())),
                };
                NodeView {
                    node: n.node.to_string(),
                    outcome,
                    error,
                }
            })
            .collect();
        View {
            key: report.key.to_string(),
            removed: nodes.iter().filter(|n| n.outcome == "released").count(),
            nodes,
        }
    }

    fn text(&self) -> String {
        let n = self.nodes.len();
        let mut out = if self.removed > 0 {
            format!(
                "released \"{}\": removed from {} of {n} nodes\n",
                self.key, self.removed
            )
        } else {
            format!(
                "nothing to release: no node holds \"{}\" with that token (it expired, was released, or another holder has it now)\n",
                self.key
            )
        };
        let width = self.nodes.iter().map(|n| n.node.len()).max().unwrap_or(0);
        for node in &self.nodes {
            let what = match (node.outcome, &node.error) {
                ("released", _) => "removed".to_string(),
                ("not_held", _) => "not held with that token".to_string(),
                (_, error) => format!("no answer: {}", error.as_deref().unwrap_or("?")),
            };
            out.push_str(&format!("  {:<width$}  {what}\n", node.node));
        }
        out
    }
}

//! `redlock fence`: each node's fencing counter, what a fenced lock makes of them, and the
//! operator's repair after a quorum of nodes lost theirs (`--raise-to N`).

use redlock_client::{FencingCounter, FencingCounters, Redlock};
use serde::Serialize;

use crate::cli::FenceArgs;
use crate::console;
use crate::error::CliError;
use crate::exit::Exit;

/// Reads (or raises, then reads) every node's counter and prints them. Exit: tokens can be
/// issued 0, the counters must be raised 1, too few answers to tell (or a node the raise
/// did not reach) 69.
pub async fn fence(client: &Redlock, args: &FenceArgs) -> Result<Exit, CliError> {
    let core = client.coordinator();
    let counters = match args.raise_to {
        Some(at_least) => core
            .raise_fencing_counters(at_least)
            .await
            .map_err(|e| CliError::from_lock("raising the fencing counters", e.into()))?,
        None => core.fencing_counters().await,
    };
    let view = View::of(&core.config().fence_key, &counters, args.raise_to);
    if args.json {
        console::print_json(&view);
    } else {
        console::print(&view.text());
    }
    let unreached = view
        .nodes
        .iter()
        .any(|n| n.error.is_some() && !n.out_of_range);
    let out_of_range = view.nodes.iter().any(|n| n.out_of_range);
    Ok(match view.state {
        State::Lost => Exit::No,
        _ if args.raise_to.is_some() && unreached => Exit::Unavailable,
        // Raising never lowers a counter: only an operator's hand mends it.
        _ if args.raise_to.is_some() && out_of_range => Exit::No,
        State::Ok | State::New => Exit::Success,
        State::Unknown => Exit::Unavailable,
    })
}

/// What a fenced lock makes of the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum State {
    /// A quorum has counters.
    Ok,
    /// No node has one: tokens start at 1.
    New,
    /// A quorum lost its counters: raise them.
    Lost,
    /// Too few nodes answered.
    Unknown,
}

/// The JSON form (and the source of the text form).
#[derive(Debug, Serialize)]
struct View {
    /// The counter's key on every node.
    key: String,
    /// `ok`, `new`, `lost` or `unknown` (see [`State`]).
    state: State,
    /// The token the next fenced lock would get; `null` when none can be issued now.
    next_token: Option<u64>,
    /// The `--raise-to` value, when given.
    raised_to: Option<u64>,
    /// Every node, in configuration order.
    nodes: Vec<NodeView>,
}

/// One node's counter.
#[derive(Debug, Serialize)]
struct NodeView {
    /// The node's URL, password masked.
    node: String,
    /// The counter; `null` when the node has none or did not answer.
    counter: Option<u64>,
    /// Why the node did not answer, or why its counter is not counted.
    error: Option<String>,
    /// A counter written before the server's last restart (it came back from older data),
    /// not counted until a repair gives the node a counter again.
    stale: Option<u64>,
    /// Milliseconds left on the lease of a repair of the node's counter in progress.
    repair_ms: Option<u64>,
    /// Its counter is above the maximum: it answered, and raising cannot mend it.
    #[serde(skip)]
    out_of_range: bool,
}

impl View {
    fn of(key: &str, counters: &FencingCounters, raised_to: Option<u64>) -> View {
        let nodes: Vec<NodeView> = counters
            .nodes
            .iter()
            .map(|(node, raw)| {
                let (counter, error) = match raw {
                    FencingCounter::At(value) => (Some(*value), None),
                    FencingCounter::NoAnswer(outcome) => (None, Some(outcome.to_string())),
                    FencingCounter::OutOfRange(value) => (
                        None,
                        Some(format!(
                            "its counter {value} is above {}, past where the nodes' scripts \
                             count exactly (set by hand or by another program): it is not \
                             counted until you set it, with redis-cli, to at least the \
                             highest token handed out and at most that maximum",
                            redlock_client::MAX_FENCING_COUNTER
                        )),
                    ),
                    _ => (None, None),
                };
                let repair = counters.repairs.iter().find(|(n, _)| n == node);
                NodeView {
                    node: node.to_string(),
                    counter,
                    error,
                    stale: match raw {
                        FencingCounter::Stale(value) => Some(*value),
                        _ => None,
                    },
                    repair_ms: repair
                        .map(|(_, left)| u64::try_from(left.as_millis()).unwrap_or(u64::MAX)),
                    out_of_range: matches!(raw, FencingCounter::OutOfRange(_)),
                }
            })
            .collect();
        let seeded = nodes.iter().any(|n| n.counter.is_some());
        let state = match (counters.next, counters.lost) {
            (_, true) => State::Lost,
            (Some(_), _) if seeded => State::Ok,
            (Some(_), _) => State::New,
            (None, false) => State::Unknown,
        };
        View {
            key: key.to_string(),
            state,
            next_token: counters.next.map(|token| token.get()),
            raised_to,
            nodes,
        }
    }

    fn text(&self) -> String {
        let mut out = match (self.state, self.next_token) {
            (State::Ok, Some(next)) => {
                format!(
                    "fencing counters ({}): the next fenced lock gets token {next}\n",
                    self.key
                )
            }
            (State::New, _) => format!(
                "fencing counters ({}): no node has one yet; the first fenced lock gets token 1\n",
                self.key
            ),
            (State::Lost, _) => format!(
                "fencing counters ({}): no token can be issued: fewer than a quorum of nodes \
                 have a counter beside some that have one, so a quorum lost its counters at \
                 once (restarts without persistence, FLUSHALL, evictions; losses one at a time \
                 are repaired automatically) and the highest token handed out may be gone with \
                 them. Raise every counter to at least the highest token your protected \
                 resources have accepted: redlock fence --raise-to N\n",
                self.key
            ),
            _ => format!(
                "fencing counters ({}): too few nodes answered to tell which token comes next\n",
                self.key
            ),
        };
        let width = self.nodes.iter().map(|n| n.node.len()).max().unwrap_or(0);
        for node in &self.nodes {
            let mut what = match (node.counter, &node.error, node.stale) {
                (Some(counter), _, _) => counter.to_string(),
                (None, Some(error), _) => format!("no answer: {error}"),
                (None, None, Some(stale)) => format!(
                    "stale counter {stale} (written before the server's last restart: it came \
                     back from older data); not counted until repaired"
                ),
                (None, None, None) => "no counter (lost its data, or never fenced)".to_string(),
            };
            if let Some(ms) = node.repair_ms {
                what.push_str(&format!(
                    "; repair in progress ({:.1} s left on its lease)",
                    ms as f64 / 1000.0
                ));
            } else if node.counter.is_none() && node.error.is_none() && self.state == State::Ok {
                what.push_str("; the next fenced lock starts its repair");
            }
            out.push_str(&format!("  {:<width$}  {what}\n", node.node));
        }
        if let Some(n) = self.raised_to {
            let unreached = self
                .nodes
                .iter()
                .filter(|n| n.error.is_some() && !n.out_of_range)
                .count();
            let out_of_range = self.nodes.iter().filter(|n| n.out_of_range).count();
            if out_of_range > 0 {
                out.push_str(&format!(
                    "{out_of_range} node(s) have a counter above the maximum, which raising \
                     never lowers: set it by hand (see its line); running this again does not \
                     mend it\n"
                ));
            }
            if unreached > 0 {
                out.push_str(&format!(
                    "raised to at least {n} on the nodes that answered; {unreached} did not: run \
                     this again once they are back\n"
                ));
            } else if out_of_range == 0 {
                let highest = self.nodes.iter().filter_map(|n| n.counter).max();
                out.push_str(&match highest {
                    Some(highest) if highest > n => format!(
                        "raised every node's counter to {highest}: the highest a node had, \
                         above the {n} asked for (a counter is never left below another's)\n"
                    ),
                    _ => format!("raised every node's counter to {n}\n"),
                });
            }
        }
        out
    }
}

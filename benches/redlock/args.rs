//! Command-line flags: `[--quick] [--out DIR] [--only P1,P4] [--subjects ours,floor]`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::subjects::Kind;

/// The scenario families, in the order they run.
pub const FAMILIES: [&str; 10] = ["P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8", "P9", "P10"];

/// The redlock benchmark: ours beside the raw fred floor and rslock, on nodes it starts.
#[derive(Debug, Clone, Parser)]
#[command(bin_name = "./scripts/bench.sh")]
pub struct Args {
    /// A few seconds per scenario family, to prove the bench still runs (CI).
    #[arg(long)]
    pub quick: bool,
    /// Where results.json, results.md and latency.svg go [default: bench-results for the
    /// full run, target/bench-quick for --quick].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Run only these scenario families (P1..P10), comma-separated.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = family)]
    only: Vec<String>,
    /// Run only these contenders (floor, floor-quorum, ours, ours-polling, ours-defaults,
    /// ours-fenced, ours-fair, ours-ungrouped, ours-permit, ours-permit-fair, ours-read,
    /// ours-write, per-node-limit, per-node-limit-trimmed, rslock), comma-separated: to
    /// profile one of them, say `--only P5 --subjects ours`. Tables and targets then lack
    /// the others' figures.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = subject)]
    subjects: Vec<Kind>,
    /// P4's critical section: how long each holder keeps the lock (a tokio sleep, which
    /// lasts up to a timer tick longer), as `1ms` or `250us`; `0s` holds it for no time at
    /// all, so that the hand-offs alone set the rate.
    #[arg(long, value_name = "DURATION", default_value = "1ms", value_parser = humantime::parse_duration)]
    pub p4_section: Duration,
    /// P6: only the target's case (10,000 locks held five minutes), not the two one-minute
    /// cases beside it that explain its RSS: for a machine lent for a short time.
    #[arg(long)]
    pub p6_target_only: bool,
    /// Instead of the scenarios: this many uncontended lock+unlock cycles of each contender
    /// that `--subjects` names, on five fresh nodes, with no report. What
    /// `scripts/instructions.sh` runs under callgrind to count each contender's own
    /// instructions per cycle, a figure that other work on the machine does not move.
    #[arg(long, value_name = "N")]
    pub cycles: Option<u64>,
    /// Added by `cargo bench` itself; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

impl Args {
    /// The output directory.
    pub fn out(&self) -> PathBuf {
        self.out.clone().unwrap_or_else(|| {
            PathBuf::from(if self.quick {
                "target/bench-quick"
            } else {
                "bench-results"
            })
        })
    }

    /// Whether the family `P1`..`P10` is to run (all of them without `--only`).
    pub fn runs(&self, family: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|f| f == family)
    }

    /// `kinds` without the contenders that `--subjects` leaves out.
    pub fn subjects(&self, kinds: &[Kind]) -> Vec<Kind> {
        kinds
            .iter()
            .copied()
            .filter(|k| self.subjects.is_empty() || self.subjects.contains(k))
            .collect()
    }
}

fn subject(item: &str) -> Result<Kind, String> {
    let name = item.trim();
    Kind::ALL
        .into_iter()
        .find(|k| k.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown contender {item:?}: use {}", names.join(", "))
        })
}

fn family(item: &str) -> Result<String, String> {
    let name = item.trim().to_ascii_uppercase();
    if FAMILIES.contains(&name.as_str()) {
        Ok(name)
    } else {
        Err(format!(
            "unknown scenario family {item:?}: use P1, P2, P3, P4, P5, P6, P7, P8, P9 or P10, comma-separated"
        ))
    }
}

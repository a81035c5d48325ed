//! The results of a run, its settings, and the output files (the tables are built in
//! `markdown.rs`, the plot in `plot.rs`).

use std::path::Path;

use redlock_core::DEFAULT_NODE_TIMEOUT;
use serde::Serialize;

use crate::error::{BenchError, Context, CHECK_OUT_DIR};
use crate::handoff::Handoff;
use crate::latency::{LatencyCase, ADDED_ONE_WAY, FAULTY};
use crate::machine::Machine;
use crate::permits::Permits;
use crate::renewal::Renewal;
use crate::rwlock::ReadWrite;
use crate::scale::Scale;
use crate::subjects::{RSLOCK_RESPONSE_TIMEOUT, TTL};
use crate::targets::Target;
use crate::throughput::Throughput;

/// Everything one run measured, with its settings and where it ran.
#[derive(Debug, Serialize)]
pub struct Results {
    pub mode: &'static str,
    pub reproduce: String,
    pub machine: Machine,
    pub settings: Settings,
    pub latency: Vec<LatencyCase>,
    pub handoff: Option<Handoff>,
    pub throughput: Option<Throughput>,
    pub renewal: Vec<Renewal>,
    pub permits: Option<Permits>,
    pub read_write: Option<ReadWrite>,
    pub scale: Option<Scale>,
    pub targets: Vec<Target>,
}

/// The settings that make the contenders comparable, and the faults injected.
#[derive(Debug, Serialize)]
pub struct Settings {
    pub ttl_ms: u64,
    pub ours_node_timeout_ms: u64,
    pub ours_retry: String,
    pub rslock_version: &'static str,
    pub rslock_node_timeout: &'static str,
    pub rslock_retry: &'static str,
    pub p2_fault: String,
    pub p3_fault: String,
    pub runtime: &'static str,
}

impl Settings {
    /// The settings this bench runs with.
    pub fn of_this_bench() -> Settings {
        Settings {
            ttl_ms: TTL.as_millis() as u64,
            ours_node_timeout_ms: DEFAULT_NODE_TIMEOUT.as_millis() as u64,
            ours_retry: "one attempt in P1-P3 and P5 (try_lock); in P4, P7 and P8 its defaults \
                         (backoff with full jitter, 50 ms doubling to 1 s, give up after 10 s)"
                .into(),
            rslock_version: "0.10",
            rslock_node_timeout: RSLOCK_RESPONSE_TIMEOUT,
            rslock_retry: "one attempt in P1-P3 and P5; in P4 its defaults (3 attempts 0-200 ms \
                           apart per lock call, looped by acquire until it wins)",
            p2_fault: format!(
                "node-{FAULTY} paused with SIGSTOP after the clients connected and warmed up"
            ),
            p3_fault: format!(
                "node-{FAULTY} reached through a TCP proxy delaying each direction by {} ms \
                 (+{} ms per round trip)",
                ADDED_ONE_WAY.as_millis(),
                2 * ADDED_ONE_WAY.as_millis()
            ),
            runtime: "Release build; one tokio runtime (a worker per core) for all contenders",
        }
    }
}

impl Results {
    pub fn write(&self, dir: &Path) -> Result<(), BenchError> {
        std::fs::create_dir_all(dir)
            .during(format!("creating {}", dir.display()), CHECK_OUT_DIR)?;
        let json = serde_json::to_string_pretty(self)
            .during("encoding the results as JSON", "fix the bench")?;
        let path = dir.join("results.json");
        std::fs::write(&path, json + "\n")
            .during(format!("writing {}", path.display()), CHECK_OUT_DIR)?;
        let path = dir.join("results.md");
        std::fs::write(&path, self.markdown())
            .during(format!("writing {}", path.display()), CHECK_OUT_DIR)
    }
}

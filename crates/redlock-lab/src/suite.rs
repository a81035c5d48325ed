//! Running the suite on one or both backends and printing the summary.

use std::fmt::Write as _;

use crate::backend::{BackendKind, Nodes};
use crate::scenario::{self, Expect, Scenario, ScenarioResult};

/// The environment variable that asks for the docker backend: `1` runs it and fails when
/// Docker is unusable; unset or `0` skips it with a message.
pub const DOCKER_ENV: &str = "REDLOCK_LAB_DOCKER";

/// Whether the docker backend was asked for through [`DOCKER_ENV`].
pub fn docker_requested() -> bool {
    std::env::var(DOCKER_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Runs `scenarios` on `backend` in order, printing a line per scenario to stderr.
pub async fn run_backend(backend: BackendKind, scenarios: &[Scenario]) -> Vec<ScenarioResult> {
    let mut results = Vec::new();
    let mut reuse: Option<Nodes> = None;
    for s in scenarios {
        eprintln!("[lab] {backend}: {} ...", s.name);
        let (result, nodes) = scenario::run(backend, s, reuse.take()).await;
        eprintln!(
            "[lab] {backend}: {} -> {} acquisitions, {} violation(s), {} in {:.1}s",
            s.name,
            result.acquisitions,
            result.violations.len(),
            if result.passed() {
                "as expected"
            } else {
                "UNEXPECTED"
            },
            result.elapsed.as_secs_f64()
        );
        if let Some(error) = &result.error {
            eprintln!("[lab]   error: {error}");
        }
        reuse = nodes;
        results.push(result);
    }
    results
}

/// The summary table (Markdown) and, under it, what each demonstration broke and the first
/// violations of every scenario that found some.
pub fn summary(results: &[ScenarioResult]) -> String {
    let mut out = String::new();
    out.push_str(
        "| scenario | backend | acquisitions | writes | violations found | expected | result |\n",
    );
    out.push_str("|---|---|---:|---:|---:|---|---|\n");
    for r in results {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            r.backend,
            r.acquisitions,
            r.writes,
            r.violations.len(),
            r.expect,
            if r.error.is_some() {
                "ERROR"
            } else if r.passed() {
                "ok"
            } else {
                "FAILED"
            }
        );
    }
    for r in results {
        if r.violations.is_empty() && r.error.is_none() && r.notes.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n{} ({}):", r.name, r.backend);
        if let Expect::Violation { breaks } = r.expect {
            let _ = writeln!(out, "  breaks {breaks}");
        }
        for note in &r.notes {
            let _ = writeln!(out, "  note: {note}");
        }
        if let Some(error) = &r.error {
            let _ = writeln!(out, "  error: {error}");
        }
        let mut by_category: Vec<(&str, usize)> = Vec::new();
        for v in &r.violations {
            match by_category.iter_mut().find(|(c, _)| *c == v.category()) {
                Some((_, n)) => *n += 1,
                None => by_category.push((v.category(), 1)),
            }
        }
        if !by_category.is_empty() {
            let list: Vec<String> = by_category
                .iter()
                .map(|(c, n)| format!("{n} {c}"))
                .collect();
            let _ = writeln!(out, "  found: {}", list.join(", "));
        }
        for v in r.violations.iter().take(8) {
            let _ = writeln!(out, "  - {v}");
        }
    }
    out
}

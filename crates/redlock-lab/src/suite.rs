//! Running the suite on one or both backends and printing the summary.

use std::fmt::Write as _;

use crate::backend::{Backend, BackendKind};
use crate::scenario::{self, Expect, RunOptions, Scenario, ScenarioResult};

/// The environment variable that asks for the docker backend: `1` runs it and fails when
/// Docker is unusable; unset or `0` skips it with a message.
pub const DOCKER_ENV: &str = "REDLOCK_LAB_DOCKER";

/// Whether the docker backend was asked for through [`DOCKER_ENV`].
pub fn docker_requested() -> bool {
    std::env::var(DOCKER_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Runs `scenarios` on `backend` in order, printing a line per scenario to stderr.
pub async fn run_backend(backend: BackendKind, scenarios: &[Scenario]) -> Vec<ScenarioResult> {
    run_repeated(backend, scenarios, 1).await
}

/// Runs each of `scenarios` `times` times in a row on `backend` (all runs of the first
/// scenario, then all of the next), printing a line per run to stderr. See
/// [`repeat_summary`] for the per-scenario count.
pub async fn run_repeated(
    backend: BackendKind,
    scenarios: &[Scenario],
    times: usize,
) -> Vec<ScenarioResult> {
    run_repeated_with(backend, scenarios, times, &RunOptions::default()).await
}

/// [`run_repeated`] with `options` (the workload).
pub async fn run_repeated_with(
    backend: BackendKind,
    scenarios: &[Scenario],
    times: usize,
    options: &RunOptions,
) -> Vec<ScenarioResult> {
    let mut results = Vec::new();
    let mut reuse: Option<Backend> = None;
    for s in scenarios {
        if backend == BackendKind::Docker && !s.setup.clusters.is_empty() {
            eprintln!(
                "[lab] {backend}: {} skipped: its cluster members run on local processes only",
                s.name
            );
            continue;
        }
        for run in 1..=times {
            let label = if times > 1 {
                format!("{} (run {run}/{times})", s.name)
            } else {
                s.name.to_owned()
            };
            eprintln!("[lab] {backend}: {label} ...");
            let (result, nodes) = scenario::run_with(backend, s, reuse.take(), options).await;
            eprintln!(
                "[lab] {backend}: {label} -> {} acquisitions, {} violation(s), {} in {:.1}s",
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
            for step in &result.host_clock {
                eprintln!("[lab]   {step}");
            }
            reuse = nodes;
            results.push(result);
        }
    }
    results
}

/// Per scenario and backend (in order of first appearance): how many runs ended as expected,
/// the range of violations found and the run times; then the details of every run that did
/// not end as expected.
pub fn repeat_summary<'a>(results: impl IntoIterator<Item = &'a ScenarioResult>) -> String {
    let mut groups: Vec<Vec<&ScenarioResult>> = Vec::new();
    for r in results {
        match groups
            .iter_mut()
            .find(|g| g[0].name == r.name && g[0].backend == r.backend)
        {
            Some(group) => group.push(r),
            None => groups.push(vec![r]),
        }
    }
    let mut out = String::new();
    out.push_str(
        "| scenario | backend | runs | as expected | violations found (min-max) | expected | time per run (mean / max) |\n",
    );
    out.push_str("|---|---|---:|---:|---:|---|---:|\n");
    for group in &groups {
        let first = group[0];
        let passed = group.iter().filter(|r| r.passed()).count();
        let found = group.iter().map(|r| r.violations.len());
        let (min, max) = (found.clone().min().unwrap_or(0), found.max().unwrap_or(0));
        let total: f64 = group.iter().map(|r| r.elapsed.as_secs_f64()).sum();
        let longest = group
            .iter()
            .map(|r| r.elapsed.as_secs_f64())
            .fold(0.0, f64::max);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {passed}/{} | {min}-{max} | {} | {:.2}s / {longest:.2}s |",
            first.name,
            first.backend,
            group.len(),
            group.len(),
            first.expect,
            total / group.len() as f64,
        );
    }
    for group in &groups {
        for (i, r) in group.iter().enumerate() {
            if !r.passed() || !r.host_clock.is_empty() {
                let _ = writeln!(
                    out,
                    "\n{} ({}), run {} of {}:",
                    r.name,
                    r.backend,
                    i + 1,
                    group.len()
                );
                details(&mut out, r);
            }
        }
    }
    out
}

/// The summary table (Markdown) and, under it, what each demonstration broke and the first
/// violations of every scenario that found some.
pub fn summary<'a>(results: impl IntoIterator<Item = &'a ScenarioResult>) -> String {
    let results: Vec<&ScenarioResult> = results.into_iter().collect();
    let mut out = String::new();
    out.push_str(
        "| scenario | backend | acquisitions | fenced | writes | violations found | expected | result |\n",
    );
    out.push_str("|---|---|---:|---:|---:|---:|---|---|\n");
    for r in &results {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            r.backend,
            r.acquisitions,
            r.fenced,
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
    for r in &results {
        if r.violations.is_empty()
            && r.error.is_none()
            && r.notes.is_empty()
            && r.ops.is_empty()
            && r.host_clock.is_empty()
        {
            continue;
        }
        let _ = writeln!(out, "\n{} ({}):", r.name, r.backend);
        details(&mut out, r);
    }
    out
}

/// Every run of `results` that did not end as expected, with its details, or an empty
/// string when all did. Printed last, so that a log's tail names what failed: the summary's
/// details come before the repetition table, and cover only each demonstration's first run.
pub fn unexpected<'a>(results: impl IntoIterator<Item = &'a ScenarioResult>) -> String {
    let mut out = String::new();
    for r in results.into_iter().filter(|r| !r.passed()) {
        let _ = writeln!(
            out,
            "\nNOT AS EXPECTED: {} ({}), {} violation(s), expected {}:",
            r.name,
            r.backend,
            r.violations.len(),
            r.expect
        );
        details(&mut out, r);
    }
    out
}

/// What a demonstration broke and must show, the driver's notes, the error, and the
/// violations found (by category, then the first few).
fn details(out: &mut String, r: &ScenarioResult) {
    if let Expect::Violation { breaks, caught_as } = r.expect {
        let _ = writeln!(out, "  breaks {breaks}");
        let _ = writeln!(out, "  must show: {}", caught_as.join(", "));
        let missing = r.missing();
        if !missing.is_empty() {
            let _ = writeln!(out, "  NOT SHOWN: {}", missing.join(", "));
        }
    }
    for note in &r.notes {
        let _ = writeln!(out, "  note: {note}");
    }
    for step in &r.host_clock {
        let _ = writeln!(out, "  host clock: {step}");
    }
    for v in &r.explained {
        let _ = writeln!(out, "  explained by the host clock, not counted: {v}");
    }
    if !r.ops.is_empty() {
        let ops: Vec<String> = r
            .ops
            .iter()
            .map(|((op, outcome), n)| format!("{op} {outcome} {n}"))
            .collect();
        let _ = writeln!(out, "  mix: {}", ops.join("; "));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios;

    #[test]
    fn unexpected_names_each_run_that_did_not_end_as_expected_and_nothing_else() {
        let all = scenarios();
        let safe = all.iter().find(|s| s.expect == Expect::Safe).unwrap();
        let demo = all.iter().find(|s| s.expect != Expect::Safe).unwrap();
        let passed = ScenarioResult::empty(BackendKind::Local, safe);
        assert_eq!(unexpected([&passed]), "");

        let mut failed = ScenarioResult::empty(BackendKind::Docker, safe);
        failed.error = Some("the replica was not promoted".into());
        // A demonstration that found nothing did not show what it must.
        let quiet = ScenarioResult::empty(BackendKind::Local, demo);
        let out = unexpected([&passed, &failed, &quiet]);
        assert!(
            out.contains(&format!("NOT AS EXPECTED: {} (docker)", safe.name)),
            "{out}"
        );
        assert!(out.contains("error: the replica was not promoted"), "{out}");
        assert!(
            out.contains(&format!("NOT AS EXPECTED: {} (local)", demo.name)),
            "{out}"
        );
        assert!(out.contains("NOT SHOWN"), "{out}");
        assert_eq!(out.matches("NOT AS EXPECTED").count(), 2, "{out}");
    }
}

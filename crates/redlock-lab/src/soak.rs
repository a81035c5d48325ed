//! Soak mode: each must-pass scenario runs again and again, its fault schedule with it,
//! until it has reached a number of acquisitions.
//!
//! Each repetition is a whole scenario run: fresh (or flushed) nodes, a fresh history and
//! observer, checked on its own. A schedule looped inside one run would have to undo its
//! own faults (restart killed nodes, wait out their TTLs) before starting again, and one
//! history of every repetition would grow with the soak; run by run, each history is a
//! few thousand acquisitions at most and the checker sees exactly what the schedule
//! promises. The results add up per scenario.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, BackendKind};
use crate::scenario::{run_with, Expect, RunOptions, Scenario, ScenarioResult};

/// Runs that won nothing in a row before a soak gives a scenario up (instead of looping
/// forever).
const BARREN_RUNS: usize = 3;
/// Runs that ended with an error in a row before a soak gives a scenario up. A lone run
/// that could not finish its schedule (a lab-side timeout on starved cores, a holder
/// process that said nothing in time) is recorded, its violations counted, and the soak
/// goes on.
const ERRORED_RUNS: usize = 3;
/// Violations of one run shown on stderr as the soak goes.
const SHOWN: usize = 5;

/// One scenario's soak: its runs added up.
#[derive(Debug)]
pub struct SoakResult {
    /// The runs' sums (violations and notes of every run, acquisitions and writes
    /// added, wall time from the first start to the last end).
    pub total: ScenarioResult,
    /// How many runs it took.
    pub runs: usize,
    /// The runs that ended with an error and were gone past: the run's number and the
    /// error. (An error that made the soak give up is the total's.)
    pub errored: Vec<(usize, String)>,
}

/// Runs each must-pass scenario of `scenarios` on `backend` until it has at least
/// `min_acquisitions`, with `workload` (the soak timing of each scenario that has one).
/// Prints a progress line per run to stderr. Demonstrations are left out: they break an
/// assumption on purpose, and `--repeat` is their soak.
pub async fn soak(
    backend: BackendKind,
    scenarios: &[Scenario],
    min_acquisitions: usize,
    options: &RunOptions,
) -> Vec<SoakResult> {
    let options = RunOptions {
        soak: true,
        ..options.clone()
    };
    let mut results = Vec::new();
    let mut reuse: Option<Backend> = None;
    for s in scenarios.iter().filter(|s| s.expect == Expect::Safe) {
        let started = Instant::now();
        let mut total: Option<ScenarioResult> = None;
        let (mut runs, mut barren, mut failing) = (0, 0, 0);
        // Acquisitions of the runs that ended without an error: a run whose faults failed
        // part way contended with fewer faults than its scenario says, so it does not
        // count toward `min_acquisitions`.
        let mut counted = 0;
        let mut errored = Vec::new();
        loop {
            let (result, nodes) = run_with(backend, s, reuse.take(), &options).await;
            reuse = nodes;
            // A soak runs long: what a run found is shown as it is found, not only at the end.
            for v in result.violations.iter().take(SHOWN) {
                eprintln!("[soak]   run {}: {v}", runs + 1);
            }
            if let Some(error) = &result.error {
                eprintln!("[soak]   run {}: error: {error}", runs + 1);
            }
            for step in &result.host_clock {
                eprintln!("[soak]   run {}: {step}", runs + 1);
            }
            for v in result.explained.iter().take(SHOWN) {
                eprintln!(
                    "[soak]   run {}: explained by the host clock: {v}",
                    runs + 1
                );
            }
            runs += 1;
            barren = if result.acquisitions == 0 {
                barren + 1
            } else {
                0
            };
            let mut result = result;
            let error = result.error.take();
            failing = if error.is_some() { failing + 1 } else { 0 };
            if error.is_none() {
                counted += result.acquisitions;
            }
            let total = match &mut total {
                Some(total) => {
                    add(total, result);
                    total
                }
                None => total.insert(result),
            };
            total.elapsed = started.elapsed();
            eprintln!(
                "[soak] {backend}: {}: run {runs}: {counted} of {min_acquisitions} acquisitions \
                 (in runs without an error; {} in all), {} violation(s), {:.1}s",
                s.name,
                total.acquisitions,
                total.violations.len(),
                total.elapsed.as_secs_f64()
            );
            if let Some(error) = error {
                if failing >= ERRORED_RUNS {
                    total.error = Some(format!(
                        "{ERRORED_RUNS} runs in a row ended with an error, the last: {error}"
                    ));
                    break;
                }
                errored.push((runs, error));
            }
            if counted >= min_acquisitions {
                break;
            }
            if barren >= BARREN_RUNS {
                total.error = Some(format!(
                    "{BARREN_RUNS} runs in a row won no lock: the soak gave up at {} \
                     acquisitions",
                    total.acquisitions
                ));
                break;
            }
        }
        let total = total.expect("at least one run");
        eprintln!(
            "[soak] {backend}: {} done: {runs} runs, {} acquisitions, {} fenced, {} writes, {} \
             violation(s), {:.1}s",
            s.name,
            total.acquisitions,
            total.fenced,
            total.writes,
            total.violations.len(),
            total.elapsed.as_secs_f64()
        );
        results.push(SoakResult {
            total,
            runs,
            errored,
        });
    }
    results
}

fn add(total: &mut ScenarioResult, run: ScenarioResult) {
    total.acquisitions += run.acquisitions;
    total.fenced += run.fenced;
    total.writes += run.writes;
    total.violations.extend(run.violations);
    total.host_clock.extend(run.host_clock);
    total.explained.extend(run.explained);
    // The notes of a run say how it went; those of the last run stand for the others.
    total.notes = run.notes;
    for (op, count) in run.ops {
        *total.ops.entry(op).or_default() += count;
    }
}

/// The soak table (Markdown): per scenario and backend, the runs, acquisitions, writes,
/// violations and wall time; then the mix's operations by outcome, summed over every
/// scenario of each backend, and the details of every scenario that did not pass.
pub fn soak_summary<'a>(results: impl IntoIterator<Item = &'a SoakResult>) -> String {
    let results: Vec<&SoakResult> = results.into_iter().collect();
    let mut out = String::new();
    out.push_str(
        "| scenario | backend | runs | acquisitions | fenced | writes | violations | wall time | result |\n",
    );
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---|\n");
    for r in &results {
        let t = &r.total;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            t.name,
            t.backend,
            r.runs,
            t.acquisitions,
            t.fenced,
            t.writes,
            t.violations.len(),
            minutes(t.elapsed),
            if t.error.is_some() {
                "ERROR".to_owned()
            } else if !t.passed() {
                "FAILED".to_owned()
            } else {
                let mut result = "ok".to_owned();
                if !r.errored.is_empty() {
                    result.push_str(&format!("; {} run(s) ended with an error", r.errored.len()));
                }
                if !t.host_clock.is_empty() {
                    result.push_str(&format!(
                        "; the host clock stepped {} time(s), {} violation(s) explained",
                        t.host_clock.len(),
                        t.explained.len()
                    ));
                }
                result
            }
        );
    }
    let mut ops: BTreeMap<(BackendKind, &str, &str), u64> = BTreeMap::new();
    for r in &results {
        for ((op, outcome), count) in &r.total.ops {
            *ops.entry((r.total.backend, op, outcome)).or_default() += count;
        }
    }
    if !ops.is_empty() {
        out.push_str("\n| backend | operation | outcome | count |\n|---|---|---|---:|\n");
        for ((backend, op, outcome), count) in ops {
            let _ = writeln!(out, "| {backend} | {op} | {outcome} | {count} |");
        }
    }
    for r in &results {
        let t = &r.total;
        if t.passed() && t.host_clock.is_empty() && r.errored.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n{} ({}), {} runs:", t.name, t.backend, r.runs);
        if let Some(error) = &t.error {
            let _ = writeln!(out, "  error: {error}");
        }
        for (run, error) in &r.errored {
            let _ = writeln!(out, "  run {run} ended with an error (gone past): {error}");
        }
        for step in t.host_clock.iter().take(8) {
            let _ = writeln!(out, "  host clock: {step}");
        }
        for v in t.explained.iter().take(8) {
            let _ = writeln!(out, "  explained by the host clock, not counted: {v}");
        }
        for v in t.violations.iter().take(8) {
            let _ = writeln!(out, "  - {v}");
        }
    }
    out
}

fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    match s / 60 {
        0 => format!("{:.1} s", d.as_secs_f64()),
        m => format!("{m} min {:02} s", s % 60),
    }
}

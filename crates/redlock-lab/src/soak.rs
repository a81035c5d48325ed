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
    // Each scenario's runs are awaited here, not in a helper: a soak's future nests every
    // run's, and each async layer deepens the compiler's layout queries for its callers.
    for s in scenarios.iter().filter(|s| s.expect == Expect::Safe) {
        let started = Instant::now();
        let mut soaking = Soaking::default();
        loop {
            let (result, nodes) = run_with(backend, s, reuse.take(), &options).await;
            reuse = nodes;
            show_findings(soaking.runs + 1, &result);
            let error = soaking.add(result, started);
            soaking.show_progress(backend, s.name, min_acquisitions);
            if soaking.done(error, min_acquisitions) {
                break;
            }
        }
        results.push(soaking.finish(backend, s.name));
    }
    results
}

/// A soak shows what a run found as it is found (it runs long), not only at the end.
fn show_findings(run: usize, result: &ScenarioResult) {
    for v in result.violations.iter().take(SHOWN) {
        eprintln!("[soak]   run {run}: {v}");
    }
    if let Some(error) = &result.error {
        eprintln!("[soak]   run {run}: error: {error}");
    }
    for step in &result.host_clock {
        eprintln!("[soak]   run {run}: {step}");
    }
    for v in result.explained.iter().take(SHOWN) {
        eprintln!("[soak]   run {run}: explained by the host clock: {v}");
    }
}

/// One scenario's soak so far: the runs added up, and the counts that decide when it ends.
#[derive(Default)]
struct Soaking {
    /// The runs' sums (`None` before the first run).
    total: Option<ScenarioResult>,
    runs: usize,
    /// Runs in a row that won nothing.
    barren: usize,
    /// Runs in a row that ended with an error.
    failing: usize,
    /// Acquisitions of the runs that ended without an error: a run whose faults failed
    /// part way contended with fewer faults than its scenario says, so it does not count
    /// toward the soak's number.
    counted: usize,
    /// The runs that ended with an error and were gone past.
    errored: Vec<(usize, String)>,
}

impl Soaking {
    /// Adds the next run's `result` to the total (wall time since `started`); returns the
    /// run's error, taken out of the result.
    fn add(&mut self, mut result: ScenarioResult, started: Instant) -> Option<String> {
        self.runs += 1;
        self.barren = if result.acquisitions == 0 {
            self.barren + 1
        } else {
            0
        };
        let error = result.error.take();
        self.failing = if error.is_some() { self.failing + 1 } else { 0 };
        if error.is_none() {
            self.counted += result.acquisitions;
        }
        let total = match &mut self.total {
            Some(total) => {
                add(total, result);
                total
            }
            None => self.total.insert(result),
        };
        total.elapsed = started.elapsed();
        error
    }

    /// The progress line of `name`'s soak after a run.
    fn show_progress(&self, backend: BackendKind, name: &str, min_acquisitions: usize) {
        let Some(total) = &self.total else {
            return;
        };
        eprintln!(
            "[soak] {backend}: {name}: run {}: {} of {min_acquisitions} acquisitions \
             (in runs without an error; {} in all), {} violation(s), {:.1}s",
            self.runs,
            self.counted,
            total.acquisitions,
            total.violations.len(),
            total.elapsed.as_secs_f64()
        );
    }

    /// The soak of `name`, ended: its result, and its summary line on stderr.
    fn finish(self, backend: BackendKind, name: &str) -> SoakResult {
        let Soaking {
            total,
            runs,
            errored,
            ..
        } = self;
        let total = total.expect("at least one run");
        eprintln!(
            "[soak] {backend}: {name} done: {runs} runs, {} acquisitions, {} fenced, {} \
             writes, {} violation(s), {:.1}s",
            total.acquisitions,
            total.fenced,
            total.writes,
            total.violations.len(),
            total.elapsed.as_secs_f64()
        );
        SoakResult {
            total,
            runs,
            errored,
        }
    }

    /// The runs' sums; there has been a run.
    fn total(&mut self) -> &mut ScenarioResult {
        self.total.as_mut().expect("at least one run")
    }

    /// Whether the soak ends after the run that ended with `error`: it has counted
    /// `min_acquisitions`, or gives up (too many runs in a row that failed or won nothing,
    /// said in the total's error). A lone error is recorded and gone past.
    fn done(&mut self, error: Option<String>, min_acquisitions: usize) -> bool {
        if let Some(error) = error {
            if self.failing >= ERRORED_RUNS {
                self.total().error = Some(format!(
                    "{ERRORED_RUNS} runs in a row ended with an error, the last: {error}"
                ));
                return true;
            }
            self.errored.push((self.runs, error));
        }
        if self.counted >= min_acquisitions {
            return true;
        }
        if self.barren >= BARREN_RUNS {
            let total = self.total();
            total.error = Some(format!(
                "{BARREN_RUNS} runs in a row won no lock: the soak gave up at {} \
                 acquisitions",
                total.acquisitions
            ));
            return true;
        }
        false
    }
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

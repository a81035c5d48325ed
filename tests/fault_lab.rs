//! The fault lab as part of the test suite: every scenario on the local backend, and on the
//! docker-compose backend when `REDLOCK_LAB_DOCKER=1` (CI sets it; there a missing Docker
//! engine fails the run instead of skipping it).
//!
//! On the local backend every demonstration runs 20 times in a row (`REDLOCK_LAB_REPEAT`
//! changes the count; `1` runs each once), and must end as expected every time: a
//! demonstration that fires only sometimes proves nothing and fails CI at random.
//!
//! Runs without the libtest harness so it can print one summary table for the whole run.
//! Arguments that do not start with `-` filter scenarios by name, like test filters;
//! `--must-pass` runs only the must-pass scenarios (CI runs them so against a second server
//! binary, `scripts/test-server.sh`).

use std::process::ExitCode;

use redlock_lab::{
    docker_requested, repeat_summary, run_backend, run_repeated, scenarios, summary, unexpected,
    BackendKind, Expect, Scenario, DOCKER_ENV,
};
use redlock_testkit::DockerSet;

/// How many times in a row each demonstration runs on the local backend.
const REPEAT: usize = 20;
/// The environment variable that overrides [`REPEAT`].
const REPEAT_ENV: &str = "REDLOCK_LAB_REPEAT";

fn main() -> ExitCode {
    // Started again as the holder process of the client crash and pause scenarios.
    if let Some(code) = redlock_lab::serve_holder() {
        return code;
    }
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let mut all = scenarios();
    if std::env::args().any(|a| a == "--must-pass") {
        all.retain(|s| !matches!(s.expect, Expect::Violation { .. }));
    }
    if !filters.is_empty() {
        all.retain(|s| filters.iter().any(|f| s.name.contains(f.as_str())));
    }
    if all.is_empty() {
        // `cargo test NAME` passes its filter to every test binary: one that matches no
        // scenario runs none, and says so.
        eprintln!("fault lab: no scenario matches {filters:?}; `redlock-lab --list` lists them");
        return ExitCode::SUCCESS;
    }
    let repeat = match std::env::var(REPEAT_ENV) {
        Err(_) => REPEAT,
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n >= 1 => n,
            _ => {
                eprintln!("{REPEAT_ENV}={v:?}: expected a whole number, 1 or more");
                return ExitCode::FAILURE;
            }
        },
    };
    let (demos, must_pass): (Vec<Scenario>, Vec<Scenario>) = all
        .iter()
        .copied()
        .partition(|s| matches!(s.expect, Expect::Violation { .. }));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let docker = docker_requested();
    if docker {
        if let Err(e) = DockerSet::available() {
            eprintln!("{DOCKER_ENV} asks for the docker backend, but it cannot run: {e}");
            return ExitCode::FAILURE;
        }
    } else {
        eprintln!(
            "fault lab: docker backend skipped (set {DOCKER_ENV}=1 to run the same scenarios \
             against the docker-compose node set)"
        );
    }
    let (local, local_demos, on_docker) = runtime.block_on(async {
        let local = run_backend(BackendKind::Local, &must_pass).await;
        let local_demos = run_repeated(BackendKind::Local, &demos, repeat).await;
        let on_docker = if docker {
            run_backend(BackendKind::Docker, &all).await
        } else {
            Vec::new()
        };
        (local, local_demos, on_docker)
    });
    // The table shows the first of each demonstration's local runs; the repetition table
    // counts all of them.
    let table = local
        .iter()
        .chain(local_demos.iter().step_by(repeat))
        .chain(&on_docker);
    println!("\nfault lab summary\n\n{}", summary(table));
    if repeat > 1 && !local_demos.is_empty() {
        println!(
            "\ndemonstrations, {repeat} runs each in a row (local)\n\n{}",
            repeat_summary(&local_demos)
        );
    }
    let failed = unexpected(local.iter().chain(&local_demos).chain(&on_docker));
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        print!("{failed}");
        eprintln!("fault lab: some runs did not end as expected (listed above)");
        ExitCode::FAILURE
    }
}

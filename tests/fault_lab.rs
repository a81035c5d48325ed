//! The fault lab as part of the test suite: every scenario on the local backend, and on the
//! docker-compose backend when `REDLOCK_LAB_DOCKER=1` (CI sets it; there a missing Docker
//! engine fails the run instead of skipping it).
//!
//! Runs without the libtest harness so it can print one summary table for the whole run.
//! Arguments that do not start with `-` filter scenarios by name, like test filters.

use std::process::ExitCode;

use redlock_lab::{docker_requested, run_backend, scenarios, summary, BackendKind, DOCKER_ENV};
use redlock_testkit::DockerSet;

fn main() -> ExitCode {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let mut all = scenarios();
    if !filters.is_empty() {
        all.retain(|s| filters.iter().any(|f| s.name.contains(f.as_str())));
    }
    if all.is_empty() {
        return ExitCode::SUCCESS;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut backends = vec![BackendKind::Local];
    if docker_requested() {
        if let Err(e) = DockerSet::available() {
            eprintln!("{DOCKER_ENV} asks for the docker backend, but it cannot run: {e}");
            return ExitCode::FAILURE;
        }
        backends.push(BackendKind::Docker);
    } else {
        eprintln!(
            "fault lab: docker backend skipped (set {DOCKER_ENV}=1 to run the same scenarios \
             against the docker-compose node set)"
        );
    }
    let results = runtime.block_on(async {
        let mut results = Vec::new();
        for backend in backends {
            results.extend(run_backend(backend, &all).await);
        }
        results
    });
    println!("\nfault lab summary\n\n{}", summary(&results));
    if results.iter().all(|r| r.passed()) {
        ExitCode::SUCCESS
    } else {
        eprintln!("fault lab: some scenarios did not end as expected (see the table above)");
        ExitCode::FAILURE
    }
}

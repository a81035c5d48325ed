//! `redlock-lab`: runs the fault-lab scenarios and prints the summary table.

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use redlock_lab::{
    init_tracing, repeat_summary, run_repeated, scenarios, summary, BackendKind, Expect,
};
use redlock_testkit::DockerSet;

/// Fault-injection scenarios with a safety checker, against local redis-server processes
/// or the docker-compose node set.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Which node set(s) to run against.
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    backend: Backend,
    /// Run only scenarios whose name contains this (repeatable).
    #[arg(long = "scenario")]
    scenarios: Vec<String>,
    /// Run only the demonstrations (the scenarios that must show a violation).
    #[arg(long)]
    demos: bool,
    /// Run each selected scenario this many times in a row and report, per scenario, how
    /// many runs ended as expected (e.g. `--demos --repeat 20` to show that every
    /// demonstration fires every time). Fails if any run did not.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// List the scenarios and exit.
    #[arg(long)]
    list: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    Local,
    Docker,
    All,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    init_tracing();
    let args = Args::parse();
    let mut all = scenarios();
    if args.demos {
        all.retain(|s| matches!(s.expect, Expect::Violation { .. }));
    }
    if !args.scenarios.is_empty() {
        all.retain(|s| args.scenarios.iter().any(|f| s.name.contains(f.as_str())));
        if all.is_empty() {
            eprintln!("no scenario matches {:?}; try --list", args.scenarios);
            return ExitCode::from(2);
        }
    }
    if args.list {
        for s in &all {
            println!("{:<40} {:<28} {}", s.name, s.expect.to_string(), s.shows);
        }
        return ExitCode::SUCCESS;
    }
    let backends: &[BackendKind] = match args.backend {
        Backend::Local => &[BackendKind::Local],
        Backend::Docker => &[BackendKind::Docker],
        Backend::All => &[BackendKind::Local, BackendKind::Docker],
    };
    if backends.contains(&BackendKind::Docker) {
        if let Err(e) = DockerSet::available() {
            eprintln!("the docker backend cannot run: {e}");
            return ExitCode::FAILURE;
        }
    }
    let times = args.repeat as usize;
    let mut results = Vec::new();
    for backend in backends {
        results.extend(run_repeated(*backend, &all, times).await);
    }
    if times > 1 {
        println!("{}", repeat_summary(&results));
    } else {
        println!("{}", summary(&results));
    }
    if results.iter().all(|r| r.passed()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

//! `redlock-lab`: runs the fault-lab scenarios and prints the summary table.

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use redlock_lab::{
    init_tracing, repeat_summary, run_repeated_with, scenarios, soak, soak_summary, summary,
    unexpected, BackendKind, Expect, Mix, RunOptions, Workload,
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
    /// Soak: run each selected must-pass scenario again and again (its fault schedule
    /// with it, fresh nodes each run) until it has at least this many acquisitions, with a
    /// progress line per run; the table then sums the runs. Demonstrations are left out.
    #[arg(long, value_name = "N")]
    min_acquisitions: Option<usize>,
    /// The must-pass scenarios' workload: the operations' weights as `name=weight,...`
    /// (plain, reentrant, reentrant_concurrent, extend_longer, extend_shorter, renewed, many, dropped,
    /// cancelled, fair; those not named get 0). Defaults to the default mix.
    #[arg(long, value_name = "WEIGHTS", conflicts_with = "plain")]
    mix: Option<String>,
    /// The mix's seed (each client draws its operations from it).
    #[arg(long, default_value_t = 17)]
    seed: u64,
    /// Plain lock/release cycles instead of the mix.
    #[arg(long)]
    plain: bool,
    /// The must-pass scenarios' clients take permits of a semaphore of K permits instead of
    /// locks (two acquisition loops per client, the second in the fair queue, no fencing),
    /// and the checker counts its holders; the scenarios that follow a schedule of their own
    /// keep it. The semaphore scenarios (`--scenario semaphore_`) take permits without it.
    #[arg(long, value_name = "K", conflicts_with_all = ["plain", "mix"],
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    semaphore: Option<u32>,
    /// The must-pass scenarios' clients take a read-write lock's read side most of the time
    /// and its write side one take in four instead of locks (two acquisition loops per
    /// client, the second in the fair queue, no fencing), and the checker judges that a
    /// writer is alone; the scenarios that follow a schedule of their own keep it. The
    /// read-write scenarios (`--scenario rwlock_`) take its sides without it.
    #[arg(long, conflicts_with_all = ["plain", "mix", "semaphore"])]
    rwlock: bool,
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

fn main() -> ExitCode {
    // Started again as the holder process of the client crash and pause scenarios.
    if let Some(code) = redlock_lab::serve_holder() {
        return code;
    }
    run()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn run() -> ExitCode {
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
    let workload = if let Some(permits) = args.semaphore {
        Workload::Semaphore(permits)
    } else if args.rwlock {
        Workload::RwLock
    } else if args.plain {
        Workload::Plain
    } else {
        match args.mix.as_deref().map(|spec| Mix::parse(spec, args.seed)) {
            None => Workload::Mix(Mix {
                seed: args.seed,
                ..Mix::default()
            }),
            Some(Ok(mix)) => Workload::Mix(mix),
            Some(Err(e)) => {
                eprintln!("--mix {e}");
                return ExitCode::from(2);
            }
        }
    };
    let options = RunOptions {
        workload,
        ..RunOptions::default()
    };
    if let Some(min) = args.min_acquisitions {
        let mut results = Vec::new();
        for backend in backends {
            results.extend(soak(*backend, &all, min, &options).await);
        }
        println!("{}", soak_summary(&results));
        return if results.iter().all(|r| r.total.passed()) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let times = args.repeat as usize;
    let mut results = Vec::new();
    for backend in backends {
        results.extend(run_repeated_with(*backend, &all, times, &options).await);
    }
    if times > 1 {
        println!("{}", repeat_summary(&results));
    } else {
        println!("{}", summary(&results));
    }
    // Last, so that the end of the output names what failed (a repeated run's table has
    // no details).
    let failed = unexpected(&results);
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        print!("{failed}");
        ExitCode::FAILURE
    }
}

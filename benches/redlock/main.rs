//! The redlock benchmark: this workspace's client beside the raw-command floor and the
//! `rslock` crate, on redis-server nodes started by the harness, in one run.
//!
//! ```text
//! cargo bench --bench redlock -- [--quick] [--out DIR] [--only P1,P4]
//! ```
//!
//! P1 uncontended cycle, P2 one node hung, P3 one node slow, P4 contended hand-off, P5 many
//! keys beside the servers' own limit, P6 many locks under automatic renewal, P7 a
//! semaphore's permits under contention, P8 a read-write lock under contention, P9 the
//! uncontended cycle over members that are whole clusters, P10 lock throughput over cluster
//! members as shards and client processes are added. Writes
//! `results.json`, `results.md` and `latency.svg` to the output directory, prints progress
//! to stderr and the Markdown tables to stdout. Not a test: nothing here asserts a timing.

mod args;
mod error;
mod floor;
mod handoff;
mod latency;
mod limit;
mod machine;
mod markdown;
mod per_node;
mod permits;
mod plan;
mod plot;
mod procfs;
mod renewal;
mod report;
mod rwlock;
mod scale;
mod stats;
mod subjects;
mod targets;
mod throughput;

use std::future::Future;
use std::process::ExitCode;
use std::sync::OnceLock;

use redlock_testkit::NodeSet;
use tokio::time::Instant;

use crate::args::Args;
use crate::error::{BenchError, Context, SEE_ABOVE};
use crate::latency::LatencyCase;
use crate::plan::Plan;
use crate::report::{Results, Settings};
use crate::subjects::Kind;

/// Prints a progress line to stderr, stamped with the time since the start.
macro_rules! progress {
    ($($arg:tt)*) => {
        $crate::progress_line(format_args!($($arg)*))
    };
}
pub(crate) use progress;

static START: OnceLock<Instant> = OnceLock::new();
/// Seconds the parent had run when it started this process (P6 children), so that their
/// progress lines continue the parent's clock.
static OFFSET: OnceLock<f64> = OnceLock::new();

pub(crate) fn progress_line(line: std::fmt::Arguments<'_>) {
    let start = START.get_or_init(Instant::now);
    let offset = OFFSET.get().copied().unwrap_or(0.0);
    eprintln!("[{:>6.1}s] {line}", offset + start.elapsed().as_secs_f64());
}

/// Seconds since this process (or, in a child, its parent) started.
pub(crate) fn clock() -> f64 {
    OFFSET.get().copied().unwrap_or(0.0) + START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// Makes this child's progress lines continue its parent's clock.
pub(crate) fn continue_clock(parent_secs: f64) {
    let _ = OFFSET.set(parent_secs);
}

/// What to do when a run sees more holders at once than may hold (P4, P7, P8).
const EXCLUSION_BUG: &str = "this is a mutual-exclusion bug: run the fault lab \
                             (./scripts/test.sh) and report it with results.json";

fn main() -> ExitCode {
    START.get_or_init(Instant::now);
    // The libraries' tracing on standard error, only when asked for: to count a contended
    // run's lost attempts, wake-ups and pauses, never for figures (it slows the run).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
    }
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some(renewal::CHILD_FLAG) {
        // One P6 case in a process of its own; its figures go to stdout as JSON.
        let spec = argv.get(1).cloned().unwrap_or_default();
        return block_on_and_print(async move { renewal::child(&spec).await });
    }
    if argv.first().map(String::as_str) == Some(scale::CHILD_FLAG) {
        // One P10 client process; its count goes to stdout as JSON.
        let spec = argv.get(1).cloned().unwrap_or_default();
        return block_on_and_print(async move { scale::child(&spec).await });
    }
    // clap prints the usage for --help, and for a bad flag an error naming it, then exits.
    let args = <Args as clap::Parser>::parse();
    block_on_and_print(async move { run(&args).await })
}

/// How many failed cycles in a row `--cycles` runs again before it gives up.
const CYCLE_RETRIES: u32 = 3;

/// `--cycles N`: N uncontended cycles of each chosen contender, one after the other, on a
/// key of its own (a failed one runs again, up to `CYCLE_RETRIES` in a row); the output
/// names what ran, and nothing is measured here (the caller, callgrind, counts).
async fn only_cycles(args: &Args, cycles: u64) -> Result<String, BenchError> {
    let set = NodeSet::start(5)
        .await
        .during("starting 5 redis-server nodes", SEE_ABOVE)?;
    let mut ran = Vec::new();
    for kind in args.subjects(&Kind::ALL) {
        let subject = subjects::Subject::connect(kind, &set.urls()).await?;
        let mut key = format!("cycles:{}", kind.name());
        let step = || format!("a lock+unlock cycle of {}", kind.name());
        let mut done = 0;
        let mut failed_in_a_row = 0;
        while done < cycles {
            // Bounded as in P1, so that a hung cycle ends the run instead of hanging it.
            match tokio::time::timeout(latency::CYCLE_DEADLINE, subject.cycle(&key)).await {
                Ok(Ok(())) => {
                    done += 1;
                    failed_in_a_row = 0;
                }
                // A node timeout under callgrind's slowdown on a busy machine: the cycle
                // rolled back, and one more in a thousand moves the count by a thousandth.
                Ok(Err(_)) if failed_in_a_row < CYCLE_RETRIES => {
                    failed_in_a_row += 1;
                    // A key of its own: a failed release leaves the last one held.
                    key = format!("cycles:{}:retry:{done}:{failed_in_a_row}", kind.name());
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Ok(Err(why)) => return Err(BenchError::new(step(), why, SEE_ABOVE)),
                Err(_) => {
                    let why = format!("no answer within {:?}", latency::CYCLE_DEADLINE);
                    let advice =
                        "the nodes or the machine stalled: run it again on a quieter machine";
                    return Err(BenchError::new(step(), why, advice));
                }
            }
        }
        subject.close().await;
        ran.push(format!("{}: {cycles} cycles", kind.name()));
    }
    Ok(ran.join("\n"))
}

/// Runs `work` on a multi-thread runtime (a worker per core) and prints what it returns.
fn block_on_and_print(work: impl Future<Output = Result<String, BenchError>>) -> ExitCode {
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .during(
            "starting the tokio runtime",
            "check the system's thread limits",
        )
        .and_then(|runtime| runtime.block_on(work));
    match result {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<String, BenchError> {
    if let Some(cycles) = args.cycles {
        return only_cycles(args, cycles).await;
    }
    let plan = Plan::new(args.quick);
    let machine = machine::Machine::describe();
    progress!(
        "{} run on {} ({} cores), {}; outputs to {}",
        if args.quick { "quick" } else { "full" },
        machine.cpu_model,
        machine.cores,
        machine.redis_server,
        args.out().display()
    );
    let busy: f64 = machine
        .load_average_start
        .split(' ')
        .next()
        .and_then(|l| l.parse().ok())
        .unwrap_or(0.0);
    if busy > machine.cores as f64 / 2.0 {
        progress!(
            "warning: load average {} on {} cores: other work will show in the figures",
            machine.load_average_start,
            machine.cores
        );
    }
    let set = NodeSet::start(5)
        .await
        .during("starting 5 redis-server nodes", SEE_ABOVE)?;
    let urls = set.urls();
    let mut latency: Vec<LatencyCase> = Vec::new();
    let mut handoff = None;
    let mut throughput = None;
    let mut renewal = Vec::new();
    let mut permits = None;
    let mut read_write = None;
    let mut scale = None;
    let p1_kinds = args.subjects(&[
        Kind::Floor,
        Kind::FloorQuorum,
        Kind::Ours,
        Kind::OursFenced,
        Kind::OursFair,
        Kind::OursPolling,
        Kind::OursDefaults,
        // A lone cycle never waits for a group: the same path with grouping off shows it.
        Kind::OursUngrouped,
        Kind::OursPermit,
        Kind::OursRead,
        Kind::OursWrite,
        Kind::Rslock,
    ]);
    let fault_kinds = args.subjects(&[Kind::Ours, Kind::Rslock]);

    if args.runs("P1") {
        latency.extend(latency::healthy(&set, &p1_kinds, plan.p1).await?);
        flush(&set).await?;
        let three = NodeSet::start(3)
            .await
            .during("starting 3 redis-server nodes", SEE_ABOVE)?;
        latency.extend(latency::healthy(&three, &p1_kinds, plan.p1).await?);
    }
    if args.runs("P9") {
        // Cluster members: ours only (the floor and rslock take single servers).
        let kinds = args.subjects(&[Kind::Ours]);
        let acked = args.subjects(&[Kind::OursReplicaAcks]);
        latency.extend(latency::clusters(&kinds, &acked, plan.p1).await?);
    }
    if args.runs("P2") || args.runs("P3") {
        // The control's healthy nodes, so that it shares the faulty scenarios' moments.
        let control = NodeSet::start(5)
            .await
            .during("starting 5 redis-server nodes for the control", SEE_ABOVE)?;
        if args.runs("P2") {
            latency.extend(latency::one_node_hung(&set, &control, &fault_kinds, plan.p2).await?);
            flush(&set).await?;
        }
        if args.runs("P3") {
            latency.extend(latency::one_node_slow(&set, &control, &fault_kinds, plan.p3).await?);
            flush(&set).await?;
        }
    }
    if args.runs("P4") {
        let kinds = args.subjects(&[Kind::Ours, Kind::OursFair, Kind::OursPolling, Kind::Rslock]);
        let (warmup, time) = (plan.contention_warmup, plan.contention_time);
        handoff = Some(handoff::run(&urls, &kinds, args.p4_section, warmup, time).await?);
        flush(&set).await?;
    }
    if args.runs("P5") {
        let kinds = args.subjects(&[
            Kind::Floor,
            Kind::Ours,
            Kind::OursPolling,
            Kind::OursUngrouped,
            Kind::Rslock,
        ]);
        let cases =
            throughput::run(&urls, &kinds, plan.throughput_warmup, plan.throughput_time).await?;
        flush(&set).await?;
        let server_limit = match limit::measure(&set, plan.benchmark_requests).await {
            Ok(limit) => Some(limit),
            Err(e) => {
                progress!("P5: servers' limit not measured: {e}");
                None
            }
        };
        throughput = Some(throughput::Throughput::new(cases, server_limit));
        flush(&set).await?;
    }

    if args.p6_target_only && !args.runs("P6") {
        progress!("--p6-target-only: P6 is not among the families that --only names; ignored");
    }
    if args.runs("P6") {
        // The target's case is the plan's first.
        let cases = if args.p6_target_only {
            &plan.renewal_cases[..plan.renewal_cases.len().min(1)]
        } else {
            &plan.renewal_cases[..]
        };
        for &(locks, node_timeout, arenas, hold) in cases {
            // One failed case should not cost the rest of the run: it is reported and
            // left out of the outputs.
            match renewal::run(&set, locks, hold, node_timeout, arenas).await {
                Ok(case) => renewal.push(case),
                Err(e) => progress!("P6: case left out: {e}"),
            }
            flush(&set).await?;
        }
    }

    let (warmup, time) = (plan.contention_warmup, plan.contention_time);
    let kinds = args.subjects(&permits::KINDS);
    if args.runs("P7") && !kinds.is_empty() {
        permits = Some(permits::run(&urls, &kinds, warmup, time).await?);
        flush(&set).await?;
    }
    let kinds = args.subjects(&rwlock::KINDS);
    if args.runs("P8") && !kinds.is_empty() {
        read_write = Some(rwlock::run(&urls, &kinds, warmup, time).await?);
        flush(&set).await?;
    }

    // Ours only, at its defaults: the floor and rslock take single servers.
    if args.runs("P10") && !args.subjects(&[Kind::Ours]).is_empty() {
        let processes = machine.cores.max(2);
        let (warmup, time) = (plan.throughput_warmup, plan.throughput_time);
        let requests = plan.benchmark_requests;
        scale = Some(scale::run(&plan.scale_shards, processes, warmup, time, requests).await?);
    }

    let mut machine = machine;
    machine.load_average_end = machine::load_average();
    let targets = targets::evaluate(&latency, handoff.as_ref(), throughput.as_ref(), &renewal);
    let results = Results {
        mode: if args.quick { "quick" } else { "full" },
        reproduce: if args.quick {
            "./scripts/bench.sh --quick".into()
        } else {
            "./scripts/bench.sh".into()
        },
        machine,
        settings: Settings::of_this_bench(),
        latency,
        handoff,
        throughput,
        renewal,
        permits,
        read_write,
        scale,
        targets,
    };
    let out = args.out();
    results.write(&out)?;
    let svg = out.join("latency.svg");
    plot::draw(&results, &svg)?;
    progress!(
        "wrote {}, {} and {}",
        out.join("results.json").display(),
        out.join("results.md").display(),
        svg.display()
    );
    // Speed is reported, never asserted; mutual exclusion is: two holders at once in P4
    // fail the run (the figures are written first, for the diagnosis).
    if let Some(c) = results
        .permits
        .iter()
        .flat_map(|p| &p.cases)
        .find(|c| c.most_holders > c.admits as usize)
    {
        return Err(BenchError::new(
            format!("P7 with {}", c.label),
            format!(
                "{} workers held at once where {} may",
                c.most_holders, c.admits
            ),
            EXCLUSION_BUG,
        ));
    }
    if let Some(c) = results
        .read_write
        .iter()
        .flat_map(|p| &p.cases)
        .find(|c| c.overlaps > 0)
    {
        return Err(BenchError::new(
            format!("P8 with {}", c.label),
            format!(
                "a writer held beside another holder {} times ({} holders at most)",
                c.overlaps, c.most_holders
            ),
            EXCLUSION_BUG,
        ));
    }
    if let Some(h) = &results.handoff {
        if let Some(c) = h.cases.iter().find(|c| c.overlaps > 0) {
            return Err(BenchError::new(
                format!("P4 with {}", c.label),
                format!(
                    "two workers held the lock at once ({} overlapping critical sections)",
                    c.overlaps
                ),
                EXCLUSION_BUG,
            ));
        }
    }
    Ok(results.markdown())
}

/// Empties every node between scenarios, so that one scenario's keys (and the commands a
/// hung node ran late) do not meet the next.
async fn flush(set: &NodeSet) -> Result<(), BenchError> {
    for node in set.iter() {
        node.flushall().await.during(
            format!("FLUSHALL on {} between scenarios", node.name()),
            SEE_ABOVE,
        )?;
    }
    Ok(())
}

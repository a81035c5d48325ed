//! Runs one fault-lab scenario on local nodes and writes its run log: every event the lab
//! recorded (acquisitions, releases, extensions, writes, faults) and the checker's verdict,
//! one JSON object a line. `scripts/lab-timeline.py` draws the log as an SVG timeline (the
//! fault lab chapter of the guide shows one).
//!
//! ```sh
//! cargo run --example lab_timeline -- paused_holder_writes > docs/lab/paused_holder_writes.jsonl
//! python3 scripts/lab-timeline.py docs/lab/paused_holder_writes.jsonl docs/lab/paused_holder_writes.svg
//! ```

use std::process::ExitCode;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use redlock_lab::{
    run_with, scenarios, serve_holder, BackendKind, Driver, Event, Lab, LabError, Outcome,
    RunOptions,
};
use serde_json::{json, Value};

/// The chosen scenario's own driver, which [`recording`] runs.
static DRIVER: OnceLock<Driver> = OnceLock::new();
/// The history as the driver left it.
static EVENTS: Mutex<Vec<Event>> = Mutex::new(Vec::new());

/// The scenario's driver, then a copy of the history it recorded.
fn recording(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        let driver = DRIVER.get().expect("the driver is set before the run");
        let outcome = driver(lab).await;
        *EVENTS.lock().unwrap_or_else(PoisonError::into_inner) = lab.history.events();
        outcome
    })
}

fn ms(at: Duration) -> f64 {
    (at.as_secs_f64() * 1e6).round() / 1e3
}

/// One event as a JSON object; `None` for the kinds the timeline does not draw.
fn event(e: &Event) -> Option<Value> {
    Some(match e {
        Event::Acquired {
            client,
            token,
            started,
            acquired,
            valid_until,
            fencing,
            ..
        } => json!({"event": "acquired", "client": client, "token": token,
            "started_ms": ms(*started), "acquired_ms": ms(*acquired),
            "valid_until_ms": ms(*valid_until), "fencing": fencing}),
        Event::ReleaseStarted { client, token, at } => {
            json!({"event": "release", "client": client, "token": token, "at_ms": ms(*at)})
        }
        Event::Extend {
            client,
            token,
            started,
            ended,
            valid_until,
        } => json!({"event": "extend", "client": client, "token": token,
            "started_ms": ms(*started), "ended_ms": ms(*ended),
            "valid_until_ms": valid_until.map(ms)}),
        Event::Write {
            client,
            token,
            read_at,
            wrote_at,
            read,
            wrote,
        } => json!({"event": "write", "client": client, "token": token,
            "read_ms": ms(*read_at), "wrote_ms": ms(*wrote_at), "read": read, "wrote": wrote}),
        Event::WriteRejected {
            client,
            token,
            fencing,
            read_at,
            rejected_at,
            read,
        } => json!({"event": "write_rejected", "client": client, "token": token,
            "fencing": fencing, "read_ms": ms(*read_at), "rejected_ms": ms(*rejected_at),
            "read": read}),
        Event::Fault { at, node, what, .. } => {
            json!({"event": "fault", "at_ms": ms(*at), "node": node, "what": what})
        }
        _ => return None,
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn run(name: String) -> ExitCode {
    let Some(mut scenario) = scenarios().into_iter().find(|s| s.name == name) else {
        eprintln!("no scenario named {name:?}: `cargo run -p redlock-lab -- --list` lists them");
        return ExitCode::from(2);
    };
    DRIVER.set(scenario.run).expect("set once");
    scenario.run = recording;
    let (result, _nodes) =
        run_with(BackendKind::Local, &scenario, None, &RunOptions::default()).await;
    if let Some(error) = &result.error {
        eprintln!("the scenario failed to run: {error}");
        return ExitCode::FAILURE;
    }
    println!(
        "{}",
        json!({"event": "scenario", "name": result.name, "backend": result.backend.to_string(),
            "expect": result.expect.to_string(), "shows": scenario.shows})
    );
    let events = std::mem::take(&mut *EVENTS.lock().unwrap_or_else(PoisonError::into_inner));
    for line in events.iter().filter_map(event) {
        println!("{line}");
    }
    for violation in &result.violations {
        println!(
            "{}",
            json!({"event": "violation", "category": violation.category(),
                "what": violation.to_string()})
        );
    }
    println!(
        "{}",
        json!({"event": "verdict", "passed": result.passed(), "acquisitions": result.acquisitions,
            "writes": result.writes, "violations": result.violations.len(),
            "missing": result.missing()})
    );
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    // The scenarios with a holder process start this executable again in holder mode.
    if let Some(code) = serve_holder() {
        return code;
    }
    let name = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "paused_holder_writes".into());
    run(name)
}

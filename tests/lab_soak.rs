//! The soak's bookkeeping, over real local nodes: a run that ends with an error is recorded
//! and gone past; only runs that keep ending with one make the soak give up.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use redlock_lab::{
    soak, BackendKind, Event, Expect, Fencing, Lab, LabError, Outcome, RunOptions, Scenario, Setup,
    Timing, KEY,
};

/// Acquisitions each run of the drivers below records.
const PER_RUN: usize = 4;

fn scenario(name: &'static str, run: redlock_lab::Driver) -> Scenario {
    Scenario {
        name,
        shows: "the soak's handling of a run that ends with an error",
        expect: Expect::Safe,
        setup: Setup {
            nodes: 3,
            persistent: false,
            fake_clock: false,
            clusters: &[],
        },
        clients: 1,
        fencing: Fencing::Off,
        timing: Timing {
            ttl: Duration::from_millis(100),
            node_timeout: Duration::from_millis(50),
            run_for: Duration::from_millis(10),
        },
        soak: None,
        semaphore: None,
        rwlock: false,
        run,
    }
}

/// Records `PER_RUN` acquisitions one after the other (no overlap, nothing on the nodes).
fn record_acquisitions(lab: &Lab) {
    static TOKENS: AtomicUsize = AtomicUsize::new(0);
    for _ in 0..PER_RUN {
        let now = lab.history.now();
        lab.history.record(Event::Acquired {
            client: "client-0".into(),
            token: format!("token-{}", TOKENS.fetch_add(1, Ordering::SeqCst)),
            key: lab.full_key(KEY),
            started: now,
            acquired: now,
            valid_until: now,
            fencing: None,
            owner: None,
        });
        std::thread::sleep(Duration::from_millis(1));
    }
}

static FIRST_FAILS: AtomicUsize = AtomicUsize::new(0);

/// Its first run ends with an error after its acquisitions; the others pass.
fn first_run_fails(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        record_acquisitions(lab);
        if FIRST_FAILS.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(LabError::Schedule(
                "the first run's holder said nothing".into(),
            ));
        }
        Ok(Outcome::default())
    })
}

/// Every run ends with an error.
fn always_fails(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        record_acquisitions(lab);
        Err(LabError::Schedule("the holder said nothing".into()))
    })
}

/// The errored run's acquisitions are reported but do not count toward the soak's target:
/// a run whose faults failed part way contended with fewer faults than its scenario says
/// (they used to count, so that a soak could reach its target on such runs).
#[tokio::test]
async fn a_run_that_ends_with_an_error_is_recorded_and_the_soak_goes_on() {
    let s = scenario("first_run_fails", first_run_fails);
    let results = soak(
        BackendKind::Local,
        &[s],
        3 * PER_RUN,
        &RunOptions::default(),
    )
    .await;
    let r = &results[0];
    assert_eq!(r.runs, 4, "{r:?}");
    assert_eq!(r.total.acquisitions, 4 * PER_RUN);
    assert_eq!(r.total.error, None);
    assert_eq!(r.errored.len(), 1, "{:?}", r.errored);
    assert_eq!(r.errored[0].0, 1);
    assert!(r.errored[0].1.contains("said nothing"), "{:?}", r.errored);
    let table = redlock_lab::soak_summary(&results);
    assert!(table.contains("1 run(s) ended with an error"), "{table}");
    assert!(table.contains("run 1 ended with an error"), "{table}");
}

#[tokio::test]
async fn runs_that_keep_ending_with_an_error_make_the_soak_give_up() {
    let s = scenario("always_fails", always_fails);
    let results = soak(
        BackendKind::Local,
        &[s],
        100 * PER_RUN,
        &RunOptions::default(),
    )
    .await;
    let r = &results[0];
    assert_eq!(r.runs, 3, "{r:?}");
    let error = r.total.error.as_deref().unwrap_or_default();
    assert!(error.contains("3 runs in a row"), "{error}");
    assert!(!r.total.passed());
    assert!(redlock_lab::soak_summary(&results).contains("ERROR"));
}

/// Wins nothing: what a library whose every `lock()` failed under the faults would record.
fn wins_nothing(_lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async { Ok(Outcome::default()) })
}

/// A must-pass scenario in which no lock was won checked nothing, and fails for it: it used
/// to pass (no violation, no error), whatever the library did.
#[tokio::test]
async fn a_must_pass_scenario_that_won_nothing_fails() {
    let (result, _) = redlock_lab::run(
        BackendKind::Local,
        &scenario("wins_nothing", wins_nothing),
        None,
    )
    .await;
    assert_eq!(result.acquisitions, 0);
    assert!(!result.passed(), "{result:?}");
    assert!(
        result
            .violations
            .iter()
            .any(|v| v.to_string().contains("checked nothing")),
        "{:?}",
        result.violations
    );
    // One that won passes.
    let (result, _) = redlock_lab::run(
        BackendKind::Local,
        &scenario("wins", records_and_passes),
        None,
    )
    .await;
    assert!(result.passed(), "{result:?}");
}

/// Records its acquisitions and passes.
fn records_and_passes(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        record_acquisitions(lab);
        Ok(Outcome::default())
    })
}

/// Judges a rule of its own (and finds it broken), then fails.
fn judged_then_fails(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        record_acquisitions(lab);
        let outcome = Outcome {
            notes: vec!["judged before the error".into()],
            violations: vec![redlock_lab::checker::Violation::Rule(
                "false success: a lock won while a majority was down".into(),
            )],
        };
        Err(LabError::Schedule("a node did not come back".into()).with_outcome(outcome))
    })
}

/// A driver's own rule violations found before an error are reported with it: they used to
/// be dropped with the error (a false success found in `majority_down` before a restart
/// failed left only the restart's error), and a soak, which goes past an errored run,
/// never counted them.
#[tokio::test]
async fn a_drivers_violations_found_before_an_error_are_reported_with_it() {
    let (result, _) = redlock_lab::run(
        BackendKind::Local,
        &scenario("judged_then_fails", judged_then_fails),
        None,
    )
    .await;
    let error = result.error.as_deref().unwrap_or_default();
    assert!(error.contains("did not come back"), "{result:?}");
    assert!(
        result
            .violations
            .iter()
            .any(|v| v.to_string().contains("false success")),
        "{:?}",
        result.violations
    );
    assert!(result.notes.iter().any(|n| n.contains("judged")));
    let results = soak(
        BackendKind::Local,
        &[scenario("judged_then_fails", judged_then_fails)],
        PER_RUN,
        &RunOptions::default(),
    )
    .await;
    assert!(
        results[0]
            .total
            .violations
            .iter()
            .any(|v| v.to_string().contains("false success")),
        "{:?}",
        results[0]
    );
}

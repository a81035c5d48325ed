//! Nodes that restart: a minority down past the TTL, restarts that keep their keys
//! (appendfsync always), and a majority down, during which no lock may be won.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::{sleep, Instant};

use super::super::{at, contend_lab, contend_under, contend_under_then, shutdown};
use super::sleep_to;
use crate::checker::Violation;
use crate::error::LabError;
use crate::history::{At, Event};
use crate::lab::Lab;
use crate::resource::Resource;
use crate::scenario::Outcome;

pub(super) fn restart_after_ttl(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        let start = Instant::now();
        // Longer than any lock's TTL (H2), extended ones included.
        let down = lab.max_ttl().mul_f64(1.3);
        sleep_to(start, at(lab, 0.15)).await;
        let first = lab.restart_after(0, down);
        let second = async {
            sleep_to(start, at(lab, 0.3)).await;
            lab.restart_after(1, down).await
        };
        let (a, b) = tokio::join!(first, second);
        a.and(b)
    }))
}

pub(super) fn restart_with_appendfsync_always(
    lab: &Lab,
) -> BoxFuture<'_, Result<Outcome, LabError>> {
    // A release sent while a node was down could not delete its key there (nor could the
    // tries sent again, a container's restart outlasting them); the node brings the key
    // back from its append-only file, and there it expires with its TTL, as documented.
    // So the clients contend on until a longest TTL (and a margin) has passed since the
    // last restart, however long the restarts took: those keys are gone by the leftover
    // scan, and the releases made after the restarts must still leave nothing behind.
    let tail = lab.max_ttl() + lab.timing.ttl / 2;
    Box::pin(contend_under_then(
        lab,
        3,
        async {
            let start = Instant::now();
            for (n, when) in [(0, 0.2), (1, 0.4), (2, 0.6)] {
                sleep_to(start, at(lab, when)).await;
                lab.restart(n).await?;
            }
            Ok(())
        },
        tail,
    ))
}

pub(super) fn majority_down(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        let clients = lab.clients(3).await?;
        let resource = Arc::new(Resource::default());
        // Longer than any lock's TTL (H2), extended ones included.
        let down = lab.max_ttl().mul_f64(1.5);
        let outage = Mutex::new(Outage::default());
        let until = Instant::now() + lab.timing.run_for;
        let (first, faults) = tokio::join!(
            contend_lab(lab, &resource, &clients, until),
            take_majority_down(lab, down, &outage)
        );
        // Keep contending for two TTLs after the majority is back, however long the
        // restarts took, to see the recovery.
        let then = contend_lab(
            lab,
            &resource,
            &clients,
            Instant::now() + lab.timing.ttl * 2,
        )
        .await;
        shutdown(&clients).await;
        let outage = *outage.lock().unwrap_or_else(PoisonError::into_inner);
        let events = lab.history.events();
        let mut outcome = Outcome {
            notes: Vec::new(),
            violations: false_successes(&events, outage),
        };
        // A false success found before a client's error, or the faults', still counts.
        let (first, then, back) = match (first, then, faults) {
            (Ok(first), Ok(then), Ok(back)) => (first, then, back),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return Err(e.with_outcome(outcome)),
        };
        outcome.notes.push(format!(
            "{} won, {} gave up",
            first.acquired + then.acquired,
            first.failed + then.failed
        ));
        let recovered = events.iter().find_map(|e| match e {
            Event::Acquired { acquired, .. } if *acquired >= back => Some(*acquired - back),
            _ => None,
        });
        match recovered {
            Some(after) => outcome.notes.push(format!(
                "first lock {} ms after the majority was back (TTL {} ms)",
                after.as_millis(),
                lab.timing.ttl.as_millis()
            )),
            None => outcome.violations.push(Violation::Rule(
                "no lock was won within two TTLs after the majority came back: no recovery".into(),
            )),
        }
        Ok(outcome)
    })
}

/// When all three nodes were down, and when the first could be back (three of five up: a
/// quorum again), as far as the faults got: a kill or restart that fails must not take the
/// false-success rule with it.
#[derive(Clone, Copy, Debug, Default)]
struct Outage {
    down_from: Option<At>,
    /// `None`: no node came back.
    back_from: Option<At>,
}

/// Kills nodes 0-2 at a fifth of the run, restarts them after `down`, and notes the
/// outage's window in `outage` as it goes. Returns when the restarts had all returned.
async fn take_majority_down(
    lab: &Lab,
    down: Duration,
    outage: &Mutex<Outage>,
) -> Result<At, LabError> {
    let note = |f: &dyn Fn(&mut Outage)| {
        f(&mut outage.lock().unwrap_or_else(PoisonError::into_inner));
    };
    let start = Instant::now();
    sleep_to(start, at(lab, 0.2)).await;
    for n in 0..3 {
        lab.kill(n).await?;
    }
    let down_from = lab.history.now();
    note(&|w| w.down_from = Some(down_from));
    sleep(down).await;
    // The window ends when the restarts begin: a node answers before its restart call
    // returns (that call waits for it to answer, and a container's for docker too), so a
    // round that reached a restarted node in between won on a real quorum. Ended at the
    // first call's return, the rule called such a win a false success (docker, CI of
    // 2026-11-28). With no restart that succeeded, no node came back, and the window has
    // no end.
    let restarting = lab.history.now();
    // Concurrently: a container restart takes a second or more.
    let restarts = (0..3).map(|n| lab.restart_after(n, Duration::ZERO));
    let restarts = futures::future::join_all(restarts).await;
    if restarts.iter().any(Result::is_ok) {
        note(&|w| w.back_from = Some(restarting));
    }
    for restart in restarts {
        restart?;
    }
    Ok(lab.history.now())
}

/// Each lock won in a round that started while the majority was down and ended before it
/// could be back.
fn false_successes(events: &[Event], outage: Outage) -> Vec<Violation> {
    let mut found = Vec::new();
    for event in events {
        if let Event::Acquired {
            client,
            started,
            acquired,
            ..
        } = event
        {
            // No end: no node came back.
            let down = outage.down_from.is_some_and(|from| *started > from)
                && outage.back_from.is_none_or(|back| *acquired < back);
            if down {
                found.push(Violation::Rule(format!(
                    "false success: {client} won a lock in a round started at {started:?}, \
                     while three of five nodes were down"
                )));
            }
        }
    }
    found
}

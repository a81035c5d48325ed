//! A fair queue whose head cannot win: every answer it gets comes after the node timeout
//! (its commands run at once), so its rounds time out while it refreshes its place at the
//! head of the key's queue. The library's waiter steps back after three lost rounds that
//! no node refused (`fair_head_answers_late`, must pass); a waiter built on the core's
//! fair acquisition that never steps back holds every waiter behind it up for as long as
//! it waits (`naive_fair_head_never_steps_back`, a demonstration).
//!
//! Both judge the same rule besides the checker's: the other clients' locks on the key
//! while the head's answers came late come at no less than a twentieth of their rate
//! before and after. With the step-back they come at about half of it in trial runs; with a
//! client that does not step back at a fortieth or less, and with the naive head (which
//! heads the queue from its first attempt) at none.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use redlock_client::LockConfig;
use redlock_core::support::FairPlace;
use redlock_core::{Acquisition, Coordinator};
use redlock_testkit::LinkFault;
use tokio::time::{sleep, Instant};

use super::{at, contend_lab_each, shutdown};
use crate::checker::Violation;
use crate::error::LabError;
use crate::history::{At, Event};
use crate::lab::Lab;
use crate::resource::Resource;
use crate::scenario::{Outcome, KEY};

/// How many clients contend in [`fair_head_answers_late`] (and link indices the
/// demonstration uses: the naive head on client 0's links, two clients on the others').
pub(super) const FAIR_HEAD_CLIENTS: usize = 3;

/// The slowest the other clients may win the key while the head's answers come late, as a
/// share of their rate outside that window.
const LEAST_SHARE: f64 = 0.05;

/// Three fair clients (the first fenced, so a release frees the key for its round rather
/// than handing it over); from a fifth to 70 % of the run every answer client 0 gets
/// comes three node timeouts late. Once it heads the key's queue it cannot win, and it
/// steps back (it leaves the queues, which wakes the next waiter, and queues again behind
/// it). The clients go on until [`Lab::leave_settle`] has passed since the fault, as after
/// any fault that can cut off a leave. The checker judges overlap, tokens and keys left
/// as everywhere (the step-back's leaves and the late rollbacks must leave nothing), and
/// the queue must keep moving for the others (see the module).
pub(super) fn fair_head_answers_late(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(fair_head(lab, Head::Library))
}

/// [`fair_head_answers_late`] with a head that never steps back: a waiter built on the
/// core's fair acquisition (`redlock_core::support::FairPlace`, one ticket for all its attempts) on
/// client 0's links, trying every 50 ms while its answers come late; two library clients
/// contend on the others. Once it heads the queue they wait until its answers come on time
/// again, and the rule reports the stall.
pub(super) fn naive_fair_head_never_steps_back(
    lab: &Lab,
) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(fair_head(lab, Head::Naive))
}

/// Who heads the queue with late answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Head {
    /// Client 0, a library client like the others.
    Library,
    /// A core waiter that never steps back.
    Naive,
}

async fn fair_head(lab: &Lab, head: Head) -> Result<Outcome, LabError> {
    let first = match head {
        Head::Library => 0,
        Head::Naive => 1,
    };
    let mut clients = Vec::with_capacity(FAIR_HEAD_CLIENTS);
    for c in first..FAIR_HEAD_CLIENTS {
        clients.push(lab.client_with(c, |b| b.fair(true)).await?);
    }
    // Connected before its links slow down: a node whose identity is not known at
    // connect gets no commands until it is.
    let naive = match head {
        Head::Library => None,
        Head::Naive => Some(naive_head(lab).await?),
    };
    let resource = Arc::new(Resource::default());
    let start = Instant::now();
    let (from, to) = (start + at(lab, 0.2), start + at(lab, 0.7));
    let late = async {
        tokio::time::sleep_until(from).await;
        for n in 0..lab.node_count() {
            lab.link(
                0,
                n,
                LinkFault::Latency {
                    to_server: Duration::ZERO,
                    to_client: lab.timing.node_timeout * 3,
                },
            );
        }
        match &naive {
            None => tokio::time::sleep_until(to).await,
            Some((core, config)) => never_step_back(lab, core, config, to).await,
        }
        for n in 0..lab.node_count() {
            lab.link(0, n, LinkFault::Pass);
        }
    };
    // The library's client 0 may have left its entry behind on a node while its answers
    // were late: the clients go on past its patience. The naive head leaves at `to`.
    let until = match head {
        Head::Library => (start + lab.timing.run_for).max(to + lab.leave_settle()),
        Head::Naive => start + lab.timing.run_for,
    };
    let (tallies, ()) = tokio::join!(contend_lab_each(lab, &resource, &clients, until), late);
    shutdown(&clients).await;
    if let Some((core, _)) = naive {
        core.close().await;
    }
    let won: Vec<u64> = tallies?.iter().map(|t| t.acquired).collect();
    // Judged from two node timeouts into the window: a round in flight when the answers
    // turned late ends within a node timeout, and its win owes nothing to the queue. Such
    // wins (one or two within a few ms of the window's start, in every run) count neither
    // inside nor outside; counted inside, they let the naive head's stall pass the rule
    // on a loaded machine, where the others also won less often outside the window.
    // (At most a quarter of the window, however the lab's timing is set.)
    let lead_in = (lab.timing.node_timeout * 2).min(to.saturating_duration_since(from) / 4);
    let judged_from = lab.history.at(from + lead_in);
    let window = (judged_from, lab.history.at(to));
    let skipped = (lab.history.at(from), judged_from);
    // From the clients' start (connecting and seeding come before it, and win nothing),
    // less the lead-in.
    let span = until
        .saturating_duration_since(start)
        .saturating_sub(lead_in);
    let others = |client: &str| head == Head::Naive || client != "client-0";
    let (inside, outside) = wins_of(lab, window, skipped, others);
    let rates = Rates::of(window, span, inside, outside);
    let mut outcome = Outcome {
        notes: vec![format!(
            "locks won per client: {won:?}; the others' wins of the key while the head's \
             answers came late: {inside}, before and after: {outside}{}",
            // The rule's margin, in every run: how near a passing run came to it.
            rates.map_or(String::new(), |r| {
                let (rate_in, rate_out) = r.per_second();
                format!(
                    " ({rate_in:.1}/s against {rate_out:.1}/s: {:.2} of it, the rule's floor \
                     {LEAST_SHARE})",
                    rate_in / rate_out
                )
            })
        )],
        violations: Vec::new(),
    };
    if let Some(violation) = rates.and_then(Rates::stalled) {
        outcome.violations.push(violation);
    }
    Ok(outcome)
}

/// The naive head's coordinator, on client 0's links, and its client configuration.
async fn naive_head(lab: &Lab) -> Result<(Coordinator, LockConfig), LabError> {
    let config = lab.config(0).fair(true).build()?;
    let core = Coordinator::connect(config.core())
        .await
        .map_err(|e| LabError::Setup(format!("the naive head could not connect: {e}")))?;
    Ok((core, config))
}

/// The naive head waits: it tries for the key every 50 ms under one fair place until `to`,
/// releases what it wins at once, then leaves the queue.
///
/// Its place has ticket 1, below any other waiter's (theirs are the wall clock in ms), so it
/// heads the queue from its first attempt.
/// Under a place of the window's start it would queue behind the waiters already there, who
/// win the key once or twice before it heads the queue; on a loaded machine, where the
/// others win less often outside the window too, that can be more than the rule's twentieth
/// (about one demonstration run in 20 in CI), and the demonstration would prove nothing.
async fn never_step_back(lab: &Lab, core: &Coordinator, config: &LockConfig, to: Instant) {
    let key = lab.full_key(KEY);
    let keys = [key.as_str()];
    let place = FairPlace {
        ticket: 1,
        ..FairPlace::now("naive-head", config.fair_patience())
    };
    while Instant::now() < to {
        let attempt = Acquisition {
            fair: Some(place),
            ..Acquisition::new(&keys, lab.timing.ttl)
        };
        if let Ok(lock) = core.acquire_with(attempt).await {
            // Its answers are late: a won round is one that started before they were.
            let _ = core.release(&lock).await;
        }
        sleep(Duration::from_millis(50)).await;
    }
    let _ = core.waiters().leave(&key, place.waiter).await;
}

/// The acquisitions of the scenario's key by the clients `counted` names: how many were
/// won inside `window`, and how many outside it and outside `skipped`.
fn wins_of(
    lab: &Lab,
    (from, to): (At, At),
    skipped: (At, At),
    counted: impl Fn(&str) -> bool,
) -> (u64, u64) {
    let key = lab.full_key(KEY);
    let (mut inside, mut outside) = (0, 0);
    for event in lab.history.events() {
        if let Event::Acquired {
            client,
            key: won,
            acquired,
            ..
        } = event
        {
            if won != key || !counted(&client) || (skipped.0..skipped.1).contains(&acquired) {
                continue;
            }
            if (from..to).contains(&acquired) {
                inside += 1;
            } else {
                outside += 1;
            }
        }
    }
    (inside, outside)
}

/// The others' wins inside the window and outside it, and how long each lasted (seconds).
#[derive(Clone, Copy, Debug)]
struct Rates {
    inside: u64,
    outside: u64,
    window: f64,
    rest: f64,
}

impl Rates {
    /// `inside` wins over `window` and `outside` wins over the rest of a run of length
    /// `span`; `None` when either span is empty or nothing was won outside (nothing to
    /// compare with).
    fn of((from, to): (At, At), span: At, inside: u64, outside: u64) -> Option<Rates> {
        let window = to.saturating_sub(from).as_secs_f64();
        let rest = span.saturating_sub(to.saturating_sub(from)).as_secs_f64();
        (window > 0.0 && rest > 0.0 && outside > 0).then_some(Rates {
            inside,
            outside,
            window,
            rest,
        })
    }

    /// Wins per second inside the window, and outside it.
    fn per_second(&self) -> (f64, f64) {
        (
            self.inside as f64 / self.window,
            self.outside as f64 / self.rest,
        )
    }

    /// The rule: the wins inside come at no less than [`LEAST_SHARE`] of the rate outside.
    fn stalled(self) -> Option<Violation> {
        let Rates {
            inside,
            outside,
            window,
            rest,
        } = self;
        let (rate_in, rate_out) = self.per_second();
        (rate_in < rate_out * LEAST_SHARE).then(|| {
            Violation::Rule(format!(
                "the fair queue stalled behind a head that could not win: the other clients won \
                 the key {rate_in:.1} times a second while its answers came late ({inside} in \
                 {window:.1} s), against {rate_out:.1} before and after ({outside} in {rest:.1} s); \
                 at least {LEAST_SHARE} of that rate was expected"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_compares_the_rates_inside_and_outside_the_window() {
        let window = (Duration::from_secs(1), Duration::from_secs(3));
        let span = Duration::from_secs(6);
        let stalled = |inside, outside| Rates::of(window, span, inside, outside)?.stalled();
        // 4 s outside at 20/s: 2 s inside need 2 wins (1/s).
        assert!(stalled(2, 80).is_none());
        let v = stalled(1, 80).expect("0.5/s is below a twentieth of 20/s");
        assert!(v.to_string().contains("stalled"), "{v}");
        assert!(
            v.to_string().contains("(1 in 2.0 s)") && v.to_string().contains("(80 in 4.0 s)"),
            "{v}"
        );
        assert!(stalled(0, 0).is_none(), "nothing to compare with");
    }
}

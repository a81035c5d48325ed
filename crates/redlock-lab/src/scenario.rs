//! A scenario: a named workload with faults, what it is expected to show, and how it is run
//! and checked.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use futures::future::BoxFuture;
use redlock_testkit::Links;
use tokio::time::error::Elapsed;
use tokio::time::Instant;

use crate::backend::{Backend, BackendKind, Setup};
use crate::checker::{
    self, explained_by_host_clock, host_clock_faults, HostClockStep, Leftover, Observation,
    Violation,
};
use crate::error::LabError;
use crate::history::{Event, History};
use crate::host_clock::HostClockWatch;
use crate::lab::{Fencing, Lab, Timing, FENCING_COUNTER};
use crate::mix::{Workload, MANY_EXTRA};
use crate::observer::Observer;
/// The drivers' report, named with the scenario they run in.
pub(crate) use crate::outcome::Outcome;
use crate::permits::{declare, permit_keys};
use crate::rwlocks::{declare_rwlock, rw_keys};

/// The one key every scenario contends for (under the scenario's own prefix).
pub const KEY: &str = "resource";
/// A scenario that runs longer than this is stopped and reported as an error.
const SCENARIO_LIMIT: Duration = Duration::from_secs(90);
/// Time for queued rollbacks and releases to land before the leftover scan.
const SETTLE: Duration = Duration::from_millis(200);

/// What a scenario is expected to show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Zero violations.
    Safe,
    /// A demonstration: the checker must report the violations that follow from breaking
    /// an assumption of Redlock.
    Violation {
        /// The assumption broken, as in the README (H1-H4).
        breaks: &'static str,
        /// The categories ([`crate::checker::Violation::category`]) the checker must report, each at least
        /// once: the consequence of the break, so that a violation of another kind (say a
        /// key left behind) cannot pass for it.
        caught_as: &'static [&'static str],
    },
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expect::Safe => f.write_str("0 (must pass)"),
            Expect::Violation { breaks, .. } => {
                let h = breaks.split(':').next().unwrap_or(breaks);
                write!(f, ">0 (demo, breaks {h})")
            }
        }
    }
}

/// The driver: runs the workload and the faults, shuts its clients down, returns.
pub type Driver = for<'a> fn(&'a Lab) -> BoxFuture<'a, Result<Outcome, LabError>>;

/// A named scenario.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    /// Its name, saying what it does (e.g. `minority_paused`).
    pub name: &'static str,
    /// One sentence on what it shows.
    pub shows: &'static str,
    /// Safe, or a demonstration of a broken assumption.
    pub expect: Expect,
    /// The nodes it needs.
    pub setup: Setup,
    /// How many clients (each with its own links).
    pub clients: usize,
    /// Which clients take fenced locks. With any, the scenario must produce fenced
    /// acquisitions (else the token rule would have checked nothing, and that is reported).
    pub fencing: Fencing,
    /// TTL, node timeout and run time.
    pub timing: Timing,
    /// The timing in soak mode, when it differs: scenarios that wait a TTL out take a
    /// shorter one there, to reach many acquisitions in reasonable time.
    pub soak: Option<Timing>,
    /// A semaphore scenario: its clients take permits of a semaphore of this many permits
    /// ([`Workload::Semaphore`]), whatever workload the run was given.
    pub semaphore: Option<u32>,
    /// A read-write lock scenario: its clients take the sides of a read-write lock
    /// ([`Workload::RwLock`]), whatever workload the run was given.
    pub rwlock: bool,
    /// The driver.
    pub run: Driver,
}

/// How a scenario is run: its clients' workload, and whether it is one run of a soak.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// What the contending clients of the must-pass scenarios run: the mix by default
    /// (demonstrations follow their own schedule either way).
    pub workload: Workload,
    /// A run of a soak: the scenario's [`Scenario::soak`] timing, where it has one.
    pub soak: bool,
}

/// The result of one scenario on one backend.
#[derive(Debug)]
pub struct ScenarioResult {
    /// The scenario's name.
    pub name: &'static str,
    /// The backend.
    pub backend: BackendKind,
    /// What was expected.
    pub expect: Expect,
    /// Locks won.
    pub acquisitions: usize,
    /// Locks won with a fencing token.
    pub fenced: usize,
    /// Writes to the protected value.
    pub writes: usize,
    /// Violations found.
    pub violations: Vec<Violation>,
    /// Steps of the host's wall clock seen during the run (H3 broken for every node at once
    /// by the environment): reported, and the overlaps they explain set apart.
    pub host_clock: Vec<HostClockStep>,
    /// Violations that [`host_clock`](Self::host_clock) explains
    /// ([`explained_by_host_clock`]): listed, not counted against the library.
    pub explained: Vec<Violation>,
    /// Driver remarks.
    pub notes: Vec<String>,
    /// Set when the scenario could not run to the end.
    pub error: Option<String>,
    /// Wall time.
    pub elapsed: Duration,
    /// How the mix's operations ended: (operation, outcome) and how many times.
    pub ops: BTreeMap<(&'static str, String), u64>,
}

impl ScenarioResult {
    /// Whether the result matches the expectation.
    pub fn passed(&self) -> bool {
        self.error.is_none()
            && match self.expect {
                Expect::Safe => self.violations.is_empty(),
                Expect::Violation { .. } => {
                    !self.violations.is_empty() && self.missing().is_empty()
                }
            }
    }

    /// The categories a demonstration must show that the checker did not report.
    pub fn missing(&self) -> Vec<&'static str> {
        match self.expect {
            Expect::Safe => Vec::new(),
            Expect::Violation { caught_as, .. } => caught_as
                .iter()
                .copied()
                .filter(|c| !self.violations.iter().any(|v| v.category() == *c))
                .collect(),
        }
    }
}

/// Runs `scenario` on `kind` with the default [`RunOptions`] (the mix). `reuse` is a
/// docker node set from the previous scenario; the set is handed back for the next one.
pub async fn run(
    kind: BackendKind,
    scenario: &Scenario,
    reuse: Option<Backend>,
) -> (ScenarioResult, Option<Backend>) {
    run_with(kind, scenario, reuse, &RunOptions::default()).await
}

/// [`run`] with `options`.
///
/// Every step that awaits is awaited here, not in a helper: the future of a whole run is
/// nested in its callers' (a test's `block_on`, a soak), and each async layer deepens the
/// compiler's layout queries for them, which are close to their limit.
pub async fn run_with(
    kind: BackendKind,
    scenario: &Scenario,
    reuse: Option<Backend>,
    options: &RunOptions,
) -> (ScenarioResult, Option<Backend>) {
    let started = Instant::now();
    let own;
    let workload = match (scenario.semaphore, scenario.rwlock) {
        (Some(permits), _) => Some(Workload::Semaphore(permits)),
        (None, true) => Some(Workload::RwLock),
        // With cluster members, plain cycles on the one key: the observer samples it on the
        // master of its slot, where the mix's other keys are not.
        (None, false) if !scenario.setup.clusters.is_empty() => Some(Workload::Plain),
        (None, false) => None,
    };
    let options = match workload {
        Some(workload) => {
            own = RunOptions {
                workload,
                ..options.clone()
            };
            &own
        }
        None => options,
    };
    let mut result = ScenarioResult::empty(kind, scenario);
    let backend = match Backend::start(kind, scenario.setup, reuse).await {
        Ok(backend) => backend,
        Err(e) => {
            result.error = Some(format!("starting the nodes failed: {e}"));
            return (result, None);
        }
    };
    // The nodes the scenario uses: the docker set has more.
    let mut addrs = backend.nodes().addrs();
    addrs.truncate(scenario.setup.nodes);
    let links = match Links::start(scenario.clients, &addrs).await {
        Ok(links) => links,
        Err(e) => {
            result.error = Some(format!("starting the fault proxies failed: {e}"));
            return (result, Some(backend));
        }
    };
    let Recording {
        lab,
        observer,
        host_clock,
    } = Recording::start(scenario, options, backend, links);
    let seeded = match (scenario.expect, scenario.fencing) {
        (Expect::Safe, fencing) if fencing != Fencing::Off => lab.seed_fencing_counters().await,
        _ => Ok(()),
    };
    let ran = match seeded {
        Ok(()) => tokio::time::timeout(SCENARIO_LIMIT, (scenario.run)(&lab)).await,
        Err(e) => Ok(Err(e)),
    };
    result.take_outcome(ran);
    heal(&lab).await;
    tokio::time::sleep(SETTLE).await;
    let observations = observer.stop().await;
    let leftovers = leftovers_after_fair_queues_expire(&lab).await;
    result.host_clock = host_clock.stop();
    judge(
        &lab,
        scenario,
        options,
        &observations,
        &leftovers,
        &mut result,
    );
    result.elapsed = started.elapsed();
    let Lab { backend, links, .. } = lab;
    drop(links);
    (result, Some(backend))
}

impl ScenarioResult {
    /// `scenario`'s result on `kind` before it has run: nothing counted, nothing found.
    pub(crate) fn empty(kind: BackendKind, scenario: &Scenario) -> ScenarioResult {
        ScenarioResult {
            name: scenario.name,
            backend: kind,
            expect: scenario.expect,
            acquisitions: 0,
            fenced: 0,
            writes: 0,
            violations: Vec::new(),
            host_clock: Vec::new(),
            explained: Vec::new(),
            notes: Vec::new(),
            error: None,
            elapsed: Duration::ZERO,
            ops: BTreeMap::new(),
        }
    }

    /// What the driver reported, or why it failed or did not finish within
    /// [`SCENARIO_LIMIT`] (`ran`).
    fn take_outcome(&mut self, ran: Result<Result<Outcome, LabError>, Elapsed>) {
        match ran {
            Ok(Ok(outcome)) => {
                self.notes = outcome.notes;
                self.violations = outcome.violations;
            }
            Ok(Err(LabError::Judged { error, outcome })) => {
                self.error = Some(error.to_string());
                self.notes = outcome.notes;
                self.violations = outcome.violations;
            }
            Ok(Err(e)) => self.error = Some(e.to_string()),
            Err(_) => self.error = Some(format!("did not finish within {SCENARIO_LIMIT:?}")),
        }
    }
}

/// A scenario's lab recording: its nodes, fault proxies and history, with the observer
/// sampling its keys and the host clock watched.
struct Recording {
    lab: Lab,
    observer: Observer,
    host_clock: HostClockWatch,
}

impl Recording {
    /// The lab of `scenario` on `backend`, with its clients' `links` to the nodes: a fresh
    /// history, the host clock's watch and the observer started.
    fn start(
        scenario: &Scenario,
        options: &RunOptions,
        backend: Backend,
        links: Links,
    ) -> Recording {
        let timing = match (options.soak, scenario.soak) {
            (true, Some(soak)) => soak,
            _ => scenario.timing,
        };
        let history = History::new();
        let host_clock = HostClockWatch::start(&history);
        let prefix = format!("lab:{}:", scenario.name);
        // The multi-key locks' other keys too, under the mix: their tokens must stay put as
        // well while held.
        let mut keys = vec![format!("{prefix}{KEY}")];
        if matches!(options.workload, Workload::Mix(_)) && scenario.expect == Expect::Safe {
            keys.extend(MANY_EXTRA.iter().map(|k| format!("{prefix}{k}")));
        }
        // The semaphore's permits, declared for the checker's semaphore rule.
        if let Some(permits) = options.workload.permits() {
            keys.extend(permit_keys(&prefix, permits));
            declare(&history, &prefix, permits);
        }
        // The read-write lock, declared for the checker's rule of a writer alone; its
        // writer's key is a string of the writer's token, observed as a lock's key is.
        if options.workload == Workload::RwLock {
            let [writers, ..] = rw_keys(&prefix);
            keys.push(writers);
            declare_rwlock(&history, &prefix);
        }
        let observed: Vec<SocketAddr> = (0..scenario.setup.nodes)
            .map(|n| backend.observed_at(n, &keys[0]))
            .collect();
        let observer = Observer::start(&history, &observed, &keys);
        let lab = Lab {
            backend,
            links,
            history,
            prefix,
            timing,
            setup: scenario.setup,
            fencing: scenario.fencing,
            observed: observer.samples(),
            workload: options.workload.clone(),
            soak: options.soak,
            failed_over: Default::default(),
        };
        Recording {
            lab,
            observer,
            host_clock,
        }
    }
}

/// Checks the run's history against the observer's samples and the keys left behind, and
/// counts it: the checker's violations come first, then the driver's (already in
/// `result`), then those of the rules that a run which checked nothing breaks.
fn judge(
    lab: &Lab,
    scenario: &Scenario,
    options: &RunOptions,
    observations: &[Observation],
    leftovers: &[Leftover],
    result: &mut ScenarioResult,
) {
    let events = lab.history.events();
    let mut checked = events.clone();
    checked.extend(host_clock_faults(&result.host_clock, lab.node_count()));
    let found = checker::check(&checked, observations, leftovers);
    let (mut found, explained) = explained_by_host_clock(found, &result.host_clock);
    found.append(&mut result.violations);
    result.violations = found;
    result.explained = explained;
    result.acquisitions = lab.history.acquisitions();
    result.fenced = lab.history.fenced_acquisitions();
    // A workload without fenced operations (`--mix fair=1`) cannot take a token: nothing
    // for the rule to check, and nothing missing either.
    if scenario.fencing != Fencing::Off
        && result.fenced == 0
        && result.error.is_none()
        && options.workload.may_fence()
    {
        result.violations.push(Violation::Rule(
            "fencing was on, but no acquisition got a fencing token: the token rule checked \
             nothing"
                .into(),
        ));
    }
    result.writes = events
        .iter()
        .filter(|e| matches!(e, Event::Write { .. }))
        .count();
    // A must-pass scenario in which nothing was won passed nothing: every rule is about
    // holders, and a library whose every `lock()` failed under the faults would pass them
    // all.
    if scenario.expect == Expect::Safe && result.acquisitions == 0 && result.error.is_none() {
        result.violations.push(Violation::Rule(
            "no acquisition succeeded: the safety rules checked nothing".into(),
        ));
    }
    for (name, permits, most) in checker::most_at_once(&events, &checker::holders(&events)) {
        result.notes.push(format!(
            "semaphore {name}: at most {most} holder(s) at once, of {permits} permit(s)"
        ));
    }
    for (name, readers, writers) in checker::rwlock_counts(&events, &checker::holders(&events)) {
        result.notes.push(format!(
            "read-write lock {name}: at most {readers} reader(s) at once, {writers} writer(s)"
        ));
        // A declared lock none of whose holders the rule saw judged nothing (its keys are
        // not those the library uses).
        if readers + writers == 0 && result.acquisitions > 0 && scenario.expect == Expect::Safe {
            result.violations.push(Violation::Rule(format!(
                "read-write lock {name}: no holder on its keys, the rule of a writer alone \
                 checked nothing"
            )));
        }
    }
    for event in &events {
        if let Event::Op { op, outcome, .. } = event {
            *result.ops.entry((*op, outcome.clone())).or_default() += 1;
        }
    }
}

/// Lifts link faults and resumes paused nodes, so the leftover scan can reach every node
/// that is up.
async fn heal(lab: &Lab) {
    lab.links.heal_all();
    for n in 0..lab.node_count() {
        // Resuming a node that is not paused is a no-op; a killed node stays down.
        let _ = lab.nodes().resume(n).await;
    }
}

/// [`leftovers`], once the fair queues that may still expire have had the time to.
///
/// A fair waiter that leaves its queue while a node is down (killed, partitioned) cannot
/// take its entry off that node; the entry, and the queue's keys, expire there with the
/// waiter's patience (`LockConfig::fair_patience`), which is the promise. So a queue key
/// with a TTL within the patience is waited for (at most the patience), and what is still
/// there afterwards, or a queue key without a TTL or with a longer one, is left behind.
///
/// After a cluster member's failover ([`Lab::failed_over`]) a lock key within the TTL is
/// waited for too: a release that the old master had not passed on to its replica is lost
/// with it, and the key lives on until its TTL, which is the promise there (a release sends
/// no `WAIT`).
async fn leftovers_after_fair_queues_expire(lab: &Lab) -> Vec<Leftover> {
    let found = leftovers(lab).await;
    let fair = lab.full_key("fair-");
    let patience = lab.fair_patience();
    let failed_over = lab.failed_over.load(std::sync::atomic::Ordering::SeqCst);
    let wait = found
        .iter()
        .filter_map(|l| {
            let pttl = Duration::from_millis(u64::try_from(l.pttl).ok()?);
            let expires = if l.key.starts_with(&fair) {
                pttl <= patience
            } else {
                failed_over && pttl <= lab.max_ttl()
            };
            expires.then_some(pttl)
        })
        .max();
    match wait {
        Some(wait) => {
            tokio::time::sleep(wait + SETTLE).await;
            leftovers(lab).await
        }
        None => found,
    }
}

/// Every key under the scenario's prefix still on a reachable node, but the fencing counter
/// and its companions (its stamp, which is meant to stay, and a repair's marker, which
/// expires with its lease if the repair stopped).
async fn leftovers(lab: &Lab) -> Vec<Leftover> {
    let mut found = Vec::new();
    let counter = lab.full_key(FENCING_COUNTER);
    let nodes = lab.nodes();
    for n in 0..lab.node_count() {
        if !nodes.is_up(n).await {
            continue;
        }
        // Every master of a cluster member.
        for redis in lab.backend.scanned(n) {
            let Ok(keys) = redis.keys(&format!("{}*", lab.prefix)).await else {
                tracing::warn!(node = %nodes.name(n), "leftover scan failed");
                continue;
            };
            for key in keys.into_iter().filter(|k| !k.starts_with(&counter)) {
                found.push(Leftover {
                    node: nodes.name(n).to_owned(),
                    value: redis.get(&key).await.ok().flatten(),
                    pttl: redis.pttl(&key).await.unwrap_or(-2),
                    key,
                });
            }
        }
    }
    found
}

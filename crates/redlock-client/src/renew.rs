//! Automatic renewal: one scheduler task per client, which renews every due lock with one
//! batched extension (one script call per node for every few hundred locks, see
//! `Coordinator::renew_many`) instead of one task and one command per lock. A won renewal
//! moves the lock's deadline on and keeps no report, so a tick's memory does not grow with
//! the locks held.
//!
//! A lock is renewed every `renew_every` (a third of the TTL by default), so two renewals
//! can fail before its validity runs out. A renewal refused by a majority of nodes (the key
//! is gone or someone else's) marks the lock lost at once. A renewal that fails for want of
//! answers is retried sooner while the lock is still valid; if the validity runs out first,
//! the guard's lost signal fires. Meanwhile the guard's health is `RenewalFailing` (see
//! [`HoldHealth`](crate::HoldHealth)), `Healthy` again at the next renewal that succeeds.
//! Renewal stops for good when the client is closed (shut down, or its runtime stopped):
//! its locks are then `RenewalFailing` and say why, until their validity runs out.
//! With `max_hold`, renewal stops once the lock has been
//! held that long, and the lock then expires with its last validity (the Redlock spec asks
//! that extensions be bounded).
//!
//! Whether, how often and for how long locks are renewed is the user's
//! [`RenewalPolicy`](policy::RenewalPolicy), in [`policy`]: plain data that the configuration
//! holds without depending on this scheduler.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use redlock_core::{ClosedReason, Coordinator, Deadline, Error as CoreError, Renewed};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::Instrument;

use crate::error::LostReason;
use crate::guard::{refused_by_majority, HoldState};
use crate::metrics::{self, Renewal};

pub(crate) mod policy;

/// Locks renewed per call of `renew_many` in a tick: half an extension batch (128), so that
/// a tick has one small batch's commands, replies and records alive at a time, and the
/// memory allocator's high-water mark stays low (a renewal tick of 10,000 locks is then 79
/// round trips in a row, which a renewal interval of seconds affords). Larger slices leave
/// the process holding more memory after a hold (the benchmark's P6, in
/// docs/benchmarks.md).
const TICK_SLICE: usize = redlock_core::EXTEND_BATCH_LOCKS / 2;

/// The most slices of a tick in flight at once. A tick sends its slices the most urgent
/// locks first, one after another while each can wait for the round before it, and the
/// next one at once (up to this many in flight) when its most urgent lock's validity ends
/// within two node timeouts. Always one after another, a tick's later slices would start
/// their rounds a round (or many) late, while the renewal rule (a renewal starts before the
/// TTL minus the drift allowance minus a node timeout) leaves room for one round: of 129
/// locks falling due together as late as the rule allows, the last one would lapse with
/// every node healthy. Always several at once, a tick keeps several slices' records alive,
/// and the process holds more memory after a hold (the benchmark's P6, in
/// docs/benchmarks.md).
const TICK_SLICES_IN_FLIGHT: usize = 64;

/// How often and for how long one lock is renewed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RenewalPlan {
    pub(crate) every: Duration,
    pub(crate) hold_until: Option<Instant>,
}

struct Entry {
    shared: Arc<HoldState>,
    plan: RenewalPlan,
    /// When its next renewal is due; a host suspend since it was planned brings it forward
    /// as it does the validity, so a renewal that fell due while the host slept runs as
    /// soon as the host resumes (see [`redlock_core::support::suspend_watch`]).
    due: Deadline,
}

/// The deadline of a renewal due at `at` by the monotonic clock now.
fn due_at(at: Instant) -> Deadline {
    Deadline::new(at, redlock_core::support::host_suspended())
}

/// The handle to a client's renewal scheduler. The task ends when the client is dropped.
#[derive(Debug)]
pub(crate) struct Renewer {
    tx: mpsc::UnboundedSender<(Arc<HoldState>, RenewalPlan)>,
}

impl Renewer {
    pub(crate) fn start(core: Coordinator) -> Renewer {
        let (tx, rx) = mpsc::unbounded_channel();
        let scheduled = Scheduled {
            rx,
            entries: Vec::new(),
        };
        tokio::spawn(run(core, scheduled));
        Renewer { tx }
    }

    pub(crate) fn add(&self, shared: Arc<HoldState>, plan: RenewalPlan) {
        // The scheduler ended (its runtime shut down, or it panicked): nothing will renew
        // this lock, and its holder must not read "healthy" until the validity runs out.
        if let Err(mpsc::error::SendError((shared, _))) = self.tx.send((shared, plan)) {
            shared.renewal_failed(
                "the renewal task has stopped (its runtime shut down); the lock expires at the \
                 end of its validity"
                    .to_string(),
            );
        }
    }
}

async fn run(core: Coordinator, mut scheduled: Scheduled) {
    let Scheduled { rx, entries } = &mut scheduled;
    let mut suspend = None;
    loop {
        // Watched only while there is something to renew (a thread of the process reads
        // the clocks while anyone watches), and before the due times are read, so that no
        // suspend between the two goes unheard.
        if entries.is_empty() {
            suspend = None;
        } else if suspend.is_none() {
            suspend = Some(redlock_core::support::suspend_watch());
        }
        let next = entries
            .iter()
            .map(|e| e.due)
            .reduce(|a, b| if a.ends_after(b) { b } else { a })
            .map(Deadline::instant);
        tokio::select! {
            added = rx.recv() => match added {
                Some((shared, plan)) => {
                    let due = due_at(next_due(&core, &shared, plan.every, Instant::now()));
                    entries.push(Entry { due, shared, plan });
                }
                // Every handle and guard is gone: nothing left to tell.
                None => {
                    entries.clear();
                    return;
                }
            },
            // The host was suspended: the due times came nearer (read again above), and the
            // sleep below, on the monotonic clock, would run a renewal up to the whole
            // suspend late by the servers' clocks, after the validity had run out, instead
            // of right after the resume, while the nodes still held the keys.
            _ = suspended(&mut suspend) => {}
            _ = sleep_until(next), if next.is_some() => {
                if let Some(reason) = core.closed() {
                    // No renewal can reach a node again: say so once, and stop.
                    renewal_stopped(entries.iter().map(|e| &e.shared), &reason.to_string());
                    entries.clear();
                } else {
                    renew_due(&core, entries).await;
                }
            }
        }
    }
}

/// The scheduler's locks, and those sent to it and not received yet. It is made before
/// the task starts, so that when the task ends with locks still held (the runtime that
/// ran it shut down, and the client's tasks with it, perhaps before the task ran at all),
/// each is told that renewal stopped: its health is `RenewalFailing` from then on instead
/// of `Healthy` until its validity runs out.
struct Scheduled {
    rx: mpsc::UnboundedReceiver<(Arc<HoldState>, RenewalPlan)>,
    entries: Vec<Entry>,
}

impl Drop for Scheduled {
    fn drop(&mut self) {
        let why = ClosedReason::RuntimeStopped.to_string();
        renewal_stopped(self.entries.iter().map(|e| &e.shared), &why);
        while let Ok((shared, _)) = self.rx.try_recv() {
            renewal_stopped([&shared], &why);
        }
    }
}

/// Tells each lock still held among `locks` that its renewal stopped, because `why`.
fn renewal_stopped<'a>(locks: impl IntoIterator<Item = &'a Arc<HoldState>>, why: &str) {
    for shared in locks {
        if !shared.done.load(Ordering::SeqCst) {
            shared.renewal_failed(format!(
                "renewal stopped: {why}; the lock expires at the end of its validity"
            ));
        }
    }
}

/// Completes when `watch` (a [`redlock_core::support::suspend_watch`]) says the host was suspended;
/// never without one.
async fn suspended(watch: &mut Option<watch::Receiver<Duration>>) {
    if let Some(rx) = watch {
        if rx.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

/// When a lock's next renewal is due: `every` after its validity began (its acquisition's
/// or last renewal's `t0`, which its validity counts from), and no later than `every` after
/// `now`. The configuration's rule (a renewal starts before the TTL minus the drift
/// allowance minus a node timeout) counts from that `t0`: counted from when the round's
/// answer came (`now`), a renewal started a whole round later, or more after a fenced
/// acquisition's write-back or for a hand-over whose validity counts from an earlier
/// attempt, and a lock renewed as late as the rule allows could expire with every node
/// healthy.
fn next_due(core: &Coordinator, shared: &HoldState, every: Duration, now: Instant) -> Instant {
    let t0 = shared.validity_start(core.drift(shared.ttl));
    (t0 + every).min(now + every)
}

/// The TTL of a lock's renewal at `now`: its own, or what is left of its `max_hold` when
/// that is less, so that no renewal makes it valid past the cap. `None` once too little is
/// left for a renewal to leave any validity (or the cap has passed).
fn renewal_ttl(
    core: &Coordinator,
    entry: (&HoldState, &RenewalPlan),
    now: Instant,
) -> Option<Duration> {
    let ttl = entry.0.ttl;
    let Some(until) = entry.1.hold_until else {
        return Some(ttl);
    };
    let left = until.saturating_duration_since(now);
    if left >= ttl {
        return Some(ttl);
    }
    let config = core.config();
    redlock_core::support::check_ttl(left, config.drift_factor, config.node_timeout).ok()
}

async fn renew_due(core: &Coordinator, entries: &mut Vec<Entry>) {
    let now = Instant::now();
    drop_unrenewable(core, entries, now);
    let mut due = due_entries(entries, now);
    if due.is_empty() {
        return;
    }
    // The most urgent first (see `TICK_SLICES_IN_FLIGHT`).
    due.sort_unstable();
    let span = tick_span(core, entries, &due);
    let mut counts = TickCounts::default();
    let mut after = now;
    // Two node timeouts: a slice that cannot wait for one more round before its own.
    let urgent_within = core.config().node_timeout * 2;
    let mut waiting = due.chunks(TICK_SLICE).peekable();
    let mut slices = futures::stream::FuturesUnordered::new();
    loop {
        while let Some(next) = waiting.peek() {
            // Sorted: the slice's first lock is its most urgent.
            let urgent = next
                .first()
                .is_some_and(|&(valid_until, _)| valid_until <= Instant::now() + urgent_within);
            if !(slices.is_empty() || urgent && slices.len() < TICK_SLICES_IN_FLIGHT) {
                break;
            }
            let slice = next
                .iter()
                .map(|&(_, i)| (i, entries[i].shared.clone(), entries[i].plan))
                .collect();
            slices.push(renew_slice(core, span.clone(), slice));
            waiting.next();
        }
        let Some(renewed) = slices.next().await else {
            break;
        };
        after = after.max(renewed.answered);
        apply_slice(core, entries, &span, renewed, &mut counts);
    }
    drop(slices);
    let TickCounts {
        renewed,
        refused,
        failed,
    } = counts;
    span.record("renewed", renewed);
    span.record("refused", refused);
    span.record("failed", failed);
    span.record("elapsed_us", (after - now).as_micros() as u64);
    tracing::debug!(parent: &span, renewed, refused, failed, "renewal tick");
    entries.retain(|e| e.shared.status.borrow().lost.is_none());
}

/// Drops from `entries` the locks that are not renewed any more at `now`: released, lost
/// (marked so here when their validity ran out), or at their `max_hold`.
fn drop_unrenewable(core: &Coordinator, entries: &mut Vec<Entry>, now: Instant) {
    entries.retain(|e| {
        // Its validity ran out before a renewal got through: lost, whether or not anyone
        // awaits `lost()`, and not renewed from then on (a renewal of it would fail every
        // quarter interval for ever while the nodes stay unreachable, and one that got
        // through later must not make it valid again).
        if !e.shared.done.load(Ordering::SeqCst) && e.shared.valid_until() <= now {
            e.shared.mark_lost(LostReason::Expired);
        }
        let held = !e.shared.done.load(Ordering::SeqCst) && e.shared.status.borrow().lost.is_none();
        // `max_hold` reached, or so nearly that no renewal could leave validity: renewal
        // stops, and the holder's health says so (the lock ends with its validity).
        if held && renewal_ttl(core, (&e.shared, &e.plan), now).is_none() {
            e.shared.renewal_failed(
                "renewal stopped: the lock has been held for max_hold; it expires at the end \
                 of its validity"
                    .to_string(),
            );
            return false;
        }
        held
    });
}

/// The entries due at `now`, by index, each with the end of its validity. Everything due
/// within a quarter of its own interval rides along: renewing a little early costs
/// nothing, and it keeps renewals of many locks in few rounds.
fn due_entries(entries: &[Entry], now: Instant) -> Vec<(Instant, usize)> {
    (0..entries.len())
        .filter(|&i| entries[i].due.instant() <= now + entries[i].plan.every / 4)
        .map(|i| (entries[i].shared.valid_until(), i))
        .collect()
}

/// The span of a tick that renews the `due` locks among `entries`.
fn tick_span(core: &Coordinator, entries: &[Entry], due: &[(Instant, usize)]) -> tracing::Span {
    let span = tracing::debug_span!(
        "redlock.renew",
        // The key of a tick that renews one lock; a larger tick's keys are in its rounds'
        // events and in the warnings of the locks that fail.
        key = tracing::field::Empty,
        locks = due.len(),
        nodes = core.config().nodes.len(),
        renewed = tracing::field::Empty,
        refused = tracing::field::Empty,
        failed = tracing::field::Empty,
        elapsed_us = tracing::field::Empty,
    );
    if let [(_, i)] = due {
        span.record("key", entries[*i].shared.current().key());
    }
    span
}

/// Due locks renewed together: each entry's index, its lock and its plan.
type Slice = Vec<(usize, Arc<HoldState>, RenewalPlan)>;

/// A slice renewed.
struct SliceRenewed {
    slice: Slice,
    /// The results of the locks it renewed, in order.
    results: Vec<Result<Renewed, CoreError>>,
    /// Each lock's renewal TTL (`None`: not renewed).
    ttls: Vec<Option<Duration>>,
    /// When the answers were in.
    answered: Instant,
}

/// Renews a slice of the due locks (half an extension batch), in `span`. A tick has a few
/// in flight, so that it holds copies of a few hundred locks at once, not of every lock
/// held.
async fn renew_slice(core: &Coordinator, span: tracing::Span, slice: Slice) -> SliceRenewed {
    let locks: Vec<_> = slice
        .iter()
        .map(|(_, shared, _)| shared.current())
        .collect();
    // Each slice's own start: a TTL capped by `max_hold` and counted from the tick's
    // start would reach past the cap by the rounds before it. Where the cap comes too
    // near meanwhile for a renewal to leave any validity, the lock is not renewed
    // (`None`): a renewal with the TTL taken at the tick's start would make it valid past
    // the cap by as long as the rounds before it.
    let slice_start = Instant::now();
    let ttls: Vec<Option<Duration>> = slice
        .iter()
        .map(|(_, shared, plan)| renewal_ttl(core, (shared, plan), slice_start))
        .collect();
    let requests: Vec<_> = locks
        .iter()
        .zip(&ttls)
        .filter_map(|(lock, ttl)| ttl.map(|ttl| (lock, ttl)))
        .collect();
    let results = if requests.is_empty() {
        Vec::new()
    } else {
        core.renew_many(&requests).instrument(span).await
    };
    SliceRenewed {
        slice,
        results,
        ttls,
        answered: Instant::now(),
    }
}

/// How a tick's renewals ended, for its span and log.
#[derive(Default)]
struct TickCounts {
    renewed: u32,
    refused: u32,
    failed: u32,
}

/// Takes a slice's results on: each lock renewed, refused or failed (counted in `counts`),
/// and its next renewal due.
fn apply_slice(
    core: &Coordinator,
    entries: &mut [Entry],
    span: &tracing::Span,
    SliceRenewed {
        slice,
        results,
        ttls,
        answered,
    }: SliceRenewed,
    counts: &mut TickCounts,
) {
    let mut results = results.into_iter();
    for (&(i, ..), ttl) in slice.iter().zip(ttls) {
        let entry = &mut entries[i];
        let Some(ttl) = ttl else {
            // `max_hold` came too near while the tick's earlier slices were out: not
            // renewed. Due at once, so the next tick stops its renewal and says why.
            entry.due = due_at(answered);
            continue;
        };
        let Some(result) = results.next() else {
            break;
        };
        if entry.shared.done.load(Ordering::SeqCst) {
            // Released (or dropped) while this tick was in flight: its extension may
            // have reached a node after the release and found the key gone, which says
            // nothing about a hold its holder let go. Not a renewal, refused or
            // otherwise.
            continue;
        }
        match result {
            Ok(renewal) => {
                counts.renewed += 1;
                metrics::renewal(Renewal::Renewed);
                entry.shared.renewed(&renewal);
                entry.due = due_at(next_due(core, &entry.shared, entry.plan.every, answered));
                if ttl < entry.shared.ttl {
                    // The last renewal, up to `max_hold`: the next tick stops renewal.
                    entry.plan.hold_until = Some(answered);
                    entry.due = due_at(answered);
                }
            }
            Err(CoreError::NoQuorum { report }) if refused_by_majority(&report) => {
                counts.refused += 1;
                metrics::renewal(Renewal::Refused);
                tracing::warn!(parent: span, report = %report, "renewal refused by a majority: the lock is lost");
                entry.shared.mark_lost(LostReason::Refused);
            }
            Err(_) if core.closed().is_some() => {
                // Closed while this tick was out: still due, so the next tick, at
                // once, stops renewal and says why.
                counts.failed += 1;
                metrics::renewal(Renewal::Failed);
            }
            Err(e) => {
                counts.failed += 1;
                metrics::renewal(Renewal::Failed);
                tracing::warn!(parent: span, error = %e, "renewal failed; retrying while the lock is still valid");
                entry.shared.renewal_failed(e.to_string());
                entry.due =
                    due_at(answered + (entry.plan.every / 4).max(Duration::from_millis(10)));
            }
        }
    }
}

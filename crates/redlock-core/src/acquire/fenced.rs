//! The fencing step of a fenced acquisition, once its round is won: the token from the
//! nodes' counters, its write-back to a quorum, and the release of a lock that gets none;
//! with the counters' reads and raise that operators use.

use std::time::Duration;

use fred::types::Value;
use tokio::time::Instant;

use crate::coordinator::Coordinator;
use crate::deadline::Deadline;
use crate::error::{ArgumentError, Error};
use crate::fence::{self, FencingCounters, FencingToken, NodeFence, Safeguard};
use crate::lock::Lock;
use crate::lock_spec::LockSpec;
use crate::report::{NodeName, RoundKind, RoundReport};
use crate::round::{Command, Decided};
use crate::scripts::{FENCE_READ, FENCE_RECORD};

/// How many write-backs a fenced acquisition tries, each above the counters the last one
/// found, before it gives up its lock ([`Error::NotFenced`]); it stops sooner when the
/// lock's validity runs out. More than one only when other fenced acquisitions (of any
/// key: the counter is shared) record tokens at the same moment: each token goes to one
/// of them, so concurrent ones take turns, one round trip each. Within one client they do
/// so in order (a node's commands go over one connection), so sixteen fenced acquisitions
/// started together all get their tokens.
const RECORD_TRIES: u32 = 16;

impl Coordinator {
    /// A fenced acquisition once its round is decided: the lock with its token, written
    /// back to a quorum (see [`fence`](Self::fence)) within the caller's `deadline` if it
    /// has one; otherwise the won lock is released again, and the error says why.
    pub(super) async fn fenced_lock(
        &self,
        decided: Decided,
        spec: LockSpec,
        ttl: Duration,
        bounds: Bounds,
        deadline: Option<Instant>,
    ) -> Result<Lock, Error> {
        let counters = counters_in(&decided.values);
        // Won or not, the round read the counters: a node found without one is repaired.
        self.repair_missing(counters.iter().copied(), -1);
        let lock = decided.into_lock(spec, ttl, None)?;
        // From here until the lock is handed out or released again, a dropped future must
        // not leave the won keys behind until their TTL.
        let mut won = ReleaseOnDrop {
            coordinator: self,
            lock: Some(lock.clone()),
        };
        // The last time the counters fell short, kept for a deadline that cuts the reads.
        let short = std::sync::Mutex::new(None);
        let fencing = self.fence(&counters, &lock, &short, bounds);
        let fenced = match deadline {
            None => fencing.await,
            Some(deadline) => match tokio::time::timeout_at(deadline, fencing).await {
                Ok(fenced) => fenced,
                // The caller's deadline: the rounds still in flight roll back or settle in
                // the background, and so does the release of the won lock.
                Err(_) => return Err(deadline_passed(&lock, &short)),
            },
        };
        match fenced {
            Ok(token) => {
                won.lock = None;
                self.inner.fencing.handed_out(token);
                Ok(Lock {
                    fencing_token: Some(token),
                    ..lock
                })
            }
            // Within a caller's deadline, the release runs in the background (`won` is
            // dropped with the lock in it).
            Err(error) if deadline.is_some() => Err(error),
            Err(error) => Err(won.unfence(error).await),
        }
    }

    /// The fencing step of a won acquisition: the token from the counters the round read
    /// (or from every node's, when too few of those had one), written back to a quorum while
    /// the lock is still valid. `Err` ([`Error::NotFenced`] or
    /// [`Error::FencingCountersLost`]): why the lock gets no token, with the last report.
    /// `short` keeps the last shortfall seen, for a caller's deadline that cuts this short.
    ///
    /// Its write-back seeds the nodes without a counter only for a new node set's first
    /// token (every node answered without one): see [`FENCE_RECORD`].
    async fn fence(
        &self,
        counters: &[Option<i64>],
        lock: &Lock,
        short: &std::sync::Mutex<Option<fence::Shortfall>>,
        bounds: Bounds,
    ) -> Result<FencingToken, Error> {
        let mut read = Reading {
            token: fence::next_token(counters, self.quorum()),
            // Whether the token is a new node set's first: from counters of which none is set.
            new_set: fence::new_set(counters),
            missing_on: Vec::new(),
        };
        if read.token.is_err() && counters.iter().any(Option::is_none) {
            // Too few of the nodes that answered before the decision have a counter (a
            // new node set, or a node that lost its data was among the first to answer):
            // the nodes that had not answered yet may make up the quorum. Ask them all
            // (rare: a new node set's first tokens, or nodes that lost their data). A
            // counter read later is never lower, so this read is as good as the round's.
            read = self.read_again().await;
        }
        let (token, new_set) = self.read_while_short(read, lock, short).await?;
        // Recording now: a deadline from here on cuts the write-back, not the reads.
        *short.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let (token, recorded) = self.write_back(token, new_set, lock).await?;
        in_bounds(token, recorded, lock, bounds)
    }

    /// Every node's fencing counter read again (a node found without one, or with a stale
    /// one, is repaired), and what the fencing step makes of them.
    async fn read_again(&self) -> Reading {
        let (report, counters) = self.read_counters().await;
        self.repair_missing(counters.iter().copied(), -2);
        let new_set = fence::new_set(&counters);
        let missing_on = report
            .nodes
            .iter()
            .zip(&counters)
            .filter(|(_, counter)| **counter == Some(-1))
            .map(|(node, _)| node.node.clone())
            .collect();
        Reading {
            token: fence::next_token(&counters, self.quorum()),
            new_set,
            missing_on,
        }
    }

    /// The token of the fencing step's last `read`, read again while the counters fall
    /// short with every node answering and the lock valid, with whether it is a new node
    /// set's first. `short` keeps each read's shortfall. `Err`: why the lock gets no token
    /// ([`Error::FencingCountersLost`] once every read fell short, else
    /// [`Error::NotFenced`]).
    async fn read_while_short(
        &self,
        mut read: Reading,
        lock: &Lock,
        short: &std::sync::Mutex<Option<fence::Shortfall>>,
    ) -> Result<(FencingToken, bool), Error> {
        // Every node answered, and too few have a counter beside some that have one: a
        // quorum lost its counters, which only an operator can mend, or a new node set's
        // first write-back (another acquisition's) is still on its way to the others, and
        // seeds them within its node timeout. Read again three times over one node timeout
        // before saying which (`Error::FencingCountersLost`).
        let quarter = self.inner.config.node_timeout / 4;
        let pauses = [quarter, quarter, 2 * quarter];
        let mut reads = 0;
        for pause in pauses {
            // The last read's shortfall, none once a read gave a token.
            *short.lock().unwrap_or_else(|e| e.into_inner()) = read.token.as_ref().err().cloned();
            match &read.token {
                Err(shortfall) if shortfall.every_node_answered() && lock.is_valid() => {
                    tokio::time::sleep(pause).await;
                    read = self.read_again().await;
                    reads += 1;
                }
                _ => break,
            }
        }
        let report = || Box::new(RoundReport::clone(&lock.report));
        match read.token {
            Ok(token) => Ok((token, read.new_set)),
            // Only after every read: a lock whose validity ran out first says "retry".
            Err(shortfall) if shortfall.every_node_answered() && reads == pauses.len() => {
                Err(Error::FencingCountersLost {
                    report: report(),
                    seeded: shortfall.seeded,
                    missing: shortfall.unseeded,
                    missing_on: read.missing_on,
                })
            }
            Err(shortfall) => Err(Error::NotFenced {
                report: report(),
                reason: shortfall.to_string(),
            }),
        }
    }

    /// `token` written back to the nodes' counters until a quorum records it: each try
    /// that another fenced acquisition passed goes above the counters it found, up to
    /// [`RECORD_TRIES`] tries and while the lock is valid. The token recorded, with its
    /// write-back; `Err` ([`Error::NotFenced`]): why none was.
    async fn write_back(
        &self,
        mut token: FencingToken,
        mut new_set: bool,
        lock: &Lock,
    ) -> Result<(FencingToken, Decided), Error> {
        let mut tries = 1;
        loop {
            // Past 2^53 the nodes' scripts (which count in doubles) cannot tell one token
            // from the next: none is written there (written, it would put every counter
            // out of range, and no later acquisition could get a token).
            if token.get() > fence::MAX_FENCING_COUNTER {
                return Err(Error::NotFenced {
                    report: Box::new(RoundReport::clone(&lock.report)),
                    reason: format!(
                        "the fencing counters have reached {} (2^53), the highest token the \
                         nodes can record; no token can be issued above it",
                        fence::MAX_FENCING_COUNTER
                    ),
                });
            }
            let recorded = self.record(token, new_set).await;
            self.repair_missing(recorded.values.iter().map(counter_of), -2);
            if recorded.won {
                return Ok((token, recorded));
            }
            let found = counters_in(&recorded.values);
            // The counters this round read were passed since: another fenced acquisition
            // (of any key) recorded this token, or a higher one, on nodes this write-back
            // needed. Its token is not ours to share, so go above the highest counter the
            // write-back found, while the lock is valid.
            let ahead = found.iter().copied().filter_map(fence::usable).max();
            match ahead {
                Some(highest) if tries < RECORD_TRIES && lock.is_valid() => {
                    let ours = i64::try_from(token.get()).unwrap_or(i64::MAX);
                    token = fence::above(highest.max(ours));
                    // Another acquisition recorded a token: the node set is not new.
                    new_set = false;
                    tries += 1;
                }
                _ => return Err(not_recorded(tries, &found, recorded.report)),
            }
        }
    }

    /// Starts a repair of each node whose counter `counters` shows missing (or stale),
    /// unless one runs; `stale_too` is -2 when stale counters show (reads and write-backs
    /// compare the stamp; the acquisition's own read does not), else -1. Only when another
    /// node answered with a counter: a new node set has none anywhere, and its first
    /// token's write-back seeds every node.
    fn repair_missing<I>(&self, counters: I, stale_too: i64)
    where
        I: IntoIterator<Item = Option<i64>>,
        I::IntoIter: Clone,
    {
        let counters = counters.into_iter();
        if !counters.clone().any(|c| c.is_some_and(|c| c >= 0)) {
            return;
        }
        for (node, counter) in counters.enumerate() {
            match counter {
                Some(c) if c == -1 || c == stale_too => self.repair_counter(node, c),
                _ => {}
            }
        }
    }

    /// Every node's fencing counter (`Some(-1)`: none; `Some(-2)`: a stale one; `None`: no
    /// answer), waiting for every node up to the node timeout, with the read's report.
    async fn read_counters(&self) -> (RoundReport, Vec<Option<i64>>) {
        let (report, read) = self.read_fence().await;
        (report, read.iter().map(|n| n.map(|n| n.counter)).collect())
    }

    /// Every node's fencing state ([`NodeFence`]; `None`: no answer), waiting for every
    /// node up to the node timeout, with the read's report.
    pub(crate) async fn read_fence(&self) -> (RoundReport, fence::repair::Read) {
        let fencing = &self.inner.fencing;
        let command = Command::Script {
            script: &FENCE_READ,
            keys: fencing.keys.to_vec(),
            args: Vec::new(),
        };
        let name = self.inner.config.fence_key.as_str().into();
        let round = self.untimed_round(RoundKind::Inspect, command, name);
        let read = self.run_one(round).await;
        let states = read
            .values
            .iter()
            .map(|value| value.as_ref().and_then(NodeFence::from_value))
            .collect();
        (read.report, states)
    }

    /// Every node's fencing counter (one key per node set: the configured `fence_key`),
    /// waiting for every node up to the node timeout, and the token a fenced acquisition
    /// would get from them. What an operator reads when fenced acquisitions fail with
    /// [`Error::FencingCountersLost`] (the `redlock fence` command shows it).
    pub async fn fencing_counters(&self) -> FencingCounters {
        let (report, read) = self.read_fence().await;
        FencingCounters::of(&report.nodes, &read, self.quorum())
    }

    /// Raises every node's fencing counter to at least `at_least`, and to at least the
    /// highest counter any node has, raise-only (a higher counter stays, a missing one is
    /// set), then reads them all again: the repair after a quorum of nodes lost their
    /// counters ([`Error::FencingCountersLost`]). Give the highest token the protected
    /// resources have accepted (or any higher number: tokens only need to increase). A
    /// node that does not answer keeps what it had; the counters returned show which, and
    /// raising again is safe.
    ///
    /// Fails with [`ArgumentError::FencingCounter`] for 0 or a value above
    /// [`MAX_FENCING_COUNTER`](crate::MAX_FENCING_COUNTER) (nothing is sent).
    pub async fn raise_fencing_counters(&self, at_least: u64) -> Result<FencingCounters, Error> {
        if !(1..=fence::MAX_FENCING_COUNTER).contains(&at_least) {
            return Err(ArgumentError::FencingCounter { value: at_least }.into());
        }
        // Never below a counter some node has: a quorum of the raised nodes alone would
        // otherwise hand out tokens below it.
        // (A counter out of range is not: see `fence::usable`.)
        let highest = self
            .read_counters()
            .await
            .1
            .into_iter()
            .filter_map(fence::usable)
            .max();
        let target = highest.map_or(at_least, |h| at_least.max(u64::try_from(h).unwrap_or(0)));
        let written = self.record(FencingToken::new(target), true).await;
        written.report.settled().await;
        Ok(self.fencing_counters().await)
    }

    /// Writes `token` back to every node's fencing counter, raise-only, seeding the nodes
    /// without one when `seed` (see [`FENCE_RECORD`]); won at a quorum.
    async fn record(&self, token: FencingToken, seed: bool) -> crate::round::Decided {
        let fencing = &self.inner.fencing;
        let token = i64::try_from(token.get()).unwrap_or(i64::MAX);
        let seed = seed || fencing.off(Safeguard::NoSeedOnWriteBack);
        let check = !fencing.off(Safeguard::Incarnation);
        let flag = |on: bool| Value::from(if on { "1" } else { "0" });
        let command = Command::Script {
            script: &FENCE_RECORD,
            keys: fencing.counter_keys(),
            args: vec![Value::from(token), flag(seed), flag(check)],
        };
        let name = self.inner.config.fence_key.as_str().into();
        let round = self.untimed_round(RoundKind::Fence, command, name);
        self.run_one(round).await
    }

    /// Releases a lock that was won but gets no token; returns `why`.
    async fn unfence(&self, lock: &Lock, why: Error) -> Error {
        if let Err(e) = self.release(lock).await {
            tracing::warn!(error = %e, "release of an unfenced lock failed; the key expires with its TTL");
        }
        why
    }
}

/// What a fenced acquisition's token must meet besides a quorum's write-back.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    /// The end of the write-back window ([`fence::WRITE_BACK_WINDOW`] from the start).
    pub(super) window: Deadline,
    /// The highest token this coordinator handed out before the acquisition began: its
    /// token must be higher.
    pub(super) floor: u64,
}

/// A fenced acquisition's won lock until it is handed out: if the acquisition's future is
/// dropped in between (while the token is read or written back), the lock is released in
/// the background, so that a cancelled fenced `lock` leaves no key behind either.
struct ReleaseOnDrop<'a> {
    coordinator: &'a Coordinator,
    lock: Option<Lock>,
}

impl ReleaseOnDrop<'_> {
    /// Releases the lock now (it gets no token) and returns `why`. The lock stays here
    /// until the release is done: a call cancelled meanwhile still releases it (in `drop`).
    async fn unfence(&mut self, why: Error) -> Error {
        let Some(lock) = &self.lock else {
            return why;
        };
        let error = self.coordinator.unfence(lock, why).await;
        self.lock = None;
        error
    }
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            self.coordinator.release_in_background(lock);
        }
    }
}

/// The fencing counters the nodes returned (`Some(-1)`: the node has none; `None`: no
/// answer).
fn counters_in(values: &[Option<Value>]) -> Vec<Option<i64>> {
    values.iter().map(counter_of).collect()
}

/// One node's counter in [`counters_in`]'s terms.
fn counter_of(value: &Option<Value>) -> Option<i64> {
    match value {
        Some(Value::Integer(counter)) => Some(*counter),
        _ => None,
    }
}

/// Why a fenced acquisition whose caller's deadline passed during its fencing step gets
/// no token: with the acquisition round's report, and the counters' last shortfall (taken
/// from `short`) when the deadline cut their reads.
fn deadline_passed(lock: &Lock, short: &std::sync::Mutex<Option<fence::Shortfall>>) -> Error {
    let report = RoundReport::clone(&lock.report);
    let short = short.lock().unwrap_or_else(|e| e.into_inner()).take();
    let reason = match short {
        // Cut while reading the counters again (see `fence`): which of the two it is stays
        // unknown.
        Some(short) if short.every_node_answered() => format!(
            "the call's deadline passed while the fencing counters were read \
             again: {short}. Either a new node set's first token is still being \
             written back (retry), or a quorum lost its counters, which only an \
             operator mends: `redlock fence` shows them, `redlock fence \
             --raise-to N` raises them"
        ),
        _ => "the call's deadline passed while the fencing token was recorded".to_string(),
    };
    Error::NotFenced {
        report: Box::new(report),
        reason,
    }
}

/// What a read of the fencing counters gives the fencing step.
struct Reading {
    /// The token they give, or why none.
    token: Result<FencingToken, fence::Shortfall>,
    /// Whether the token is a new node set's first: from counters of which none is set.
    new_set: bool,
    /// The nodes the read found without a counter, to name them.
    missing_on: Vec<NodeName>,
}

/// Why a token that `tries` write-backs did not get recorded by a quorum gets none: the
/// last write-back `found` these counters, with its `report`.
fn not_recorded(tries: u32, found: &[Option<i64>], report: RoundReport) -> Error {
    // Nodes without an intact counter, which only a repair seeds.
    let unseeded = found.iter().filter(|c| matches!(c, Some(-1 | -2))).count();
    let reason = format!(
        "fewer than a quorum of nodes recorded the token ({tries} write-back(s)); \
         other fenced acquisitions raised the counters meanwhile, nodes did \
         not answer, or {unseeded} node(s) have no intact counter (they lost \
         their data or restarted from older data, and are being repaired in \
         the background): retry"
    );
    Error::NotFenced {
        report: Box::new(report),
        reason,
    }
}

/// `token`, recorded by a quorum in `recorded`, if it meets the lock's validity and the
/// fenced acquisition's `bounds`; else why it is not handed out.
fn in_bounds(
    token: FencingToken,
    recorded: Decided,
    lock: &Lock,
    bounds: Bounds,
) -> Result<FencingToken, Error> {
    if !lock.is_valid() {
        let reason = "the lock's validity ran out while the token was recorded".to_string();
        return Err(Error::NotFenced {
            report: Box::new(recorded.report),
            reason,
        });
    }
    // A repair of a node that acknowledged this token just before losing its data
    // waits out this window before it reads the counters (see `fence::repair`).
    if bounds.window.remaining().is_none() {
        let reason = format!(
            "the token's write-back quorum was complete only after the write-back window \
             ({:?} from the acquisition's start), when a repair of a node's counter may \
             no longer see it: retry",
            fence::WRITE_BACK_WINDOW
        );
        return Err(Error::NotFenced {
            report: Box::new(recorded.report),
            reason,
        });
    }
    if token.get() <= bounds.floor {
        return Err(Error::FencingTokenBehind {
            report: Box::new(recorded.report),
            token: token.get(),
            handed_out: bounds.floor,
        });
    }
    Ok(token)
}

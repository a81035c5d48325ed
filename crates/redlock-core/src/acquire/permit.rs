//! A semaphore over the quorum: at most `permits` holders of one name at any instant.
//!
//! Each permit is an ordinary Redlock key, `<semaphore_prefix>{name}:<i>` for `i` from 1
//! to `permits` (see `layout::permit_keys`), so a permit's safety is a lock's: no two
//! holders of one permit inside their validity, hence at most `permits` holders of the
//! name. One round proposes every permit to every node, in an order that starts at a random
//! permit (so that contenders spread over the permits); each node takes the first free one
//! of that order for the round's token (`scripts::PERMIT_TAKE`). The round counts the
//! votes of each permit apart, as a batch of one request per permit: at most one permit
//! reaches a quorum (two quorums share a node, and a node takes one permit per round), and
//! every other permit is rolled back on every node by compare-and-delete with the token,
//! late answers too. The permit won is a plain lock of its key: it is extended, renewed and
//! released as any lock of one key. A fenced permit reads the fencing counters in the same
//! round (`scripts::PERMIT_TAKE_FENCED`) and gets its token as a fenced lock does, from the
//! node set's one counter: a resource keeps the highest token per permit.
//!
//! A fair acquisition ([`PermitAcquisition::fair`]) waits in the semaphore's one fair
//! queue (`scripts::PERMIT_TAKE_QUEUED`): on each node, only the oldest waiters try, as many
//! as the node has free permits, so that late comers neither overtake them nor split their
//! votes. As in a lock's fair queue (see `fair`), the queue only decides who tries.
//!
//! Why not a per-node limit of `permits` with a majority: with three nodes and two permits,
//! three contenders can each win a different two-node majority, three holders of two
//! permits. A per-node limit of `floor(permits * quorum / N)` is safe but leaves fewer
//! permits than asked for (five nodes, ten permits: six). Slots give exactly `permits`.

use std::time::Duration;

use fred::types::{Key, Value};
use tokio::time::Instant;

use crate::config::check_key;
use crate::coordinator::Coordinator;
use crate::error::{ArgumentError, Error};
use crate::fair::FairPlace;
use crate::kind;
use crate::layout::{permit_keys, queue_keys};
use crate::lock::Lock;
use crate::lock_spec::{ttl_ms, LockSpec};
use crate::report::RoundKind;
use crate::round::command::Command;
use crate::round::plan::Round;
use crate::round::{self, Decided};
use crate::scripts::{
    PERMIT_TAKE, PERMIT_TAKE_FENCED, PERMIT_TAKE_QUEUED, PERMIT_TAKE_QUEUED_FENCED,
};
use crate::token::Token;

/// The most permits a semaphore may have: every round proposes each of them to every node,
/// and its reply has one flag per permit.
pub const MAX_PERMITS: u32 = 1024;

/// One acquisition of a semaphore's permit ([`Coordinator::acquire_permit_with`]).
///
/// ```
/// use std::time::Duration;
/// use redlock_core::PermitAcquisition;
///
/// let fenced = PermitAcquisition {
///     fenced: true,
///     ..PermitAcquisition::new("encoders", 4, Duration::from_secs(10))
/// };
/// assert_eq!(fenced.permits, 4);
/// ```
#[derive(Debug, Clone)]
pub struct PermitAcquisition<'a> {
    /// The semaphore's name: its permits are `<semaphore_prefix>{name}:<i>`.
    pub name: &'a str,
    /// How many holders the semaphore admits at once, from 1 to [`MAX_PERMITS`]. Every
    /// client must name the semaphore with the same number.
    pub permits: u32,
    /// The token stored under the permit won. Defaults to a fresh random one.
    pub token: Token,
    /// The permit's TTL.
    pub ttl: Duration,
    /// Whether the permit gets a fencing token ([`Lock::fencing_token`]), taken from the
    /// node set's one counter as a lock's is: it increases with every fenced acquisition
    /// of the node set, so a resource that keeps the highest token per permit (the
    /// permit's key, [`Lock::key`]) rejects a stale holder of that permit. Keep one highest
    /// token per permit, not one per semaphore: the permits' holders are legitimate at
    /// once. Defaults to `false`.
    pub fenced: bool,
    /// For a fenced acquisition: when its fencing step must be over (see
    /// [`Acquisition::deadline`](crate::Acquisition::deadline)). Defaults to `None`.
    pub deadline: Option<Instant>,
    /// For a fair acquisition: the waiter's place in the semaphore's fair queue, for every
    /// attempt of its wait (see the module docs). Its hand-over number is ignored: nothing
    /// is handed over in a semaphore's queue. Defaults to `None`.
    pub fair: Option<FairPlace<'a>>,
}

impl<'a> PermitAcquisition<'a> {
    /// An unfenced acquisition of a permit of semaphore `name` of `permits` permits, for
    /// `ttl`, with a fresh random token.
    pub fn new(name: &'a str, permits: u32, ttl: Duration) -> Self {
        PermitAcquisition {
            name,
            permits,
            token: Token::random(),
            ttl,
            fenced: false,
            deadline: None,
            fair: None,
        }
    }
}

impl Coordinator {
    /// One acquisition round for a permit of semaphore `name`, which has `permits`
    /// permits, for `ttl` (see the module docs): the permit's lock, whose key names the
    /// permit (`<semaphore_prefix>{name}:<i>`), or the error of a lost round (every permit
    /// held by others on too many nodes, or the nodes split between permits). No retries:
    /// that is the client's policy. A round split between permits rolls back everything
    /// it took.
    ///
    /// Fails with [`Error::Argument`] for an empty or too long name, zero permits or more
    /// than [`MAX_PERMITS`], or an unusable TTL, before anything is sent.
    pub async fn acquire_permit(
        &self,
        name: &str,
        permits: u32,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        self.acquire_permit_with(PermitAcquisition::new(name, permits, ttl))
            .await
    }

    /// [`acquire_permit`](Self::acquire_permit) as `what` describes: a caller's token,
    /// fencing. A fenced permit is handed out only once its token was written back to a
    /// quorum, as a fenced lock is (see [`acquire_with`](Self::acquire_with)).
    pub async fn acquire_permit_with(&self, what: PermitAcquisition<'_>) -> Result<Lock, Error> {
        let config = &self.inner.config;
        if !(1..=MAX_PERMITS).contains(&what.permits) {
            return Err(ArgumentError::Permits {
                permits: what.permits,
                max: MAX_PERMITS,
            }
            .into());
        }
        check_key(what.name)?;
        what.token.check()?;
        what.token.check_not_handover()?;
        let ttl = config.check_ttl(what.ttl)?;
        if let Some(place) = &what.fair {
            place.check()?;
        }
        let keys = proposed(permit_keys(
            &config.semaphore_prefix,
            what.name,
            what.permits,
        ));
        let mut specs = Vec::with_capacity(keys.len());
        for key in &keys {
            check_key(key)?;
            specs.push(LockSpec::of_kind(
                &kind::PERMIT,
                &[key],
                what.token.clone(),
                None,
            )?);
        }
        let bounds = what.fenced.then(|| self.fencing_bounds()).transpose()?;
        // The queue a permit's release passes the key on from: one per semaphore.
        let queue = what.fair.as_ref().map(|place| {
            let base = kind::Kind::queue_of(&kind::PERMIT, &keys[0]);
            (queue_keys(&config.fair_prefix, base), place)
        });
        let round = self.permit_round(&keys, &specs, ttl, (what.fenced, queue));
        let decided = round::run(&self.inner.connections, round, &self.inner.work).await;
        let (decided, spec) = won_permit(decided, specs);
        match bounds {
            None => decided.into_lock(spec, ttl, None),
            Some(bounds) => {
                self.fenced_lock(decided, spec, ttl, bounds, what.deadline)
                    .await
            }
        }
    }

    /// The round that proposes every permit (`keys`, in order; `specs` their locks) to
    /// every node for `ttl`: one request per permit, each rolled back where it is not won;
    /// reading the fencing counters too when `fenced`, and behind a turn in the semaphore's
    /// fair `queue` (its keys, and the waiter's place) when there is one.
    fn permit_round(
        &self,
        keys: &[String],
        specs: &[LockSpec],
        ttl: Duration,
        (fenced, queue): (bool, Option<([Key; 3], &FairPlace<'_>)>),
    ) -> Round {
        let config = &self.inner.config;
        let mut fred_keys: Vec<Key> = keys.iter().map(|k| Key::from(k.as_str())).collect();
        let token = &specs[0].token;
        let mut args = vec![
            Value::String(token.as_fred().clone()),
            Value::from(ttl_ms(ttl)),
        ];
        let queued = queue.is_some();
        if let Some((queue_keys, place)) = queue {
            fred_keys.extend(queue_keys);
            args.extend(place.args());
        }
        if fenced {
            fred_keys.push(Key::from(config.fence_key.as_str()));
        }
        let script = match (fenced, queued) {
            (false, false) => &PERMIT_TAKE,
            (true, false) => &PERMIT_TAKE_FENCED,
            (false, true) => &PERMIT_TAKE_QUEUED,
            (true, true) => &PERMIT_TAKE_QUEUED_FENCED,
        };
        Round {
            kind: RoundKind::Acquire,
            alternatives: true,
            command: Command::Script {
                script,
                keys: fred_keys,
                args,
            },
            requests: specs.iter().map(|spec| spec.acquire_request(ttl)).collect(),
            drift_factor: config.drift_factor,
        }
    }
}

/// Every permit's key, in the order one round proposes them: starting at a random one.
fn proposed(mut keys: Vec<String>) -> Vec<String> {
    let start = rand::Rng::gen_range(&mut rand::thread_rng(), 0..keys.len());
    keys.rotate_left(start);
    keys
}

/// The permit that won its quorum, or the one that came closest (the most nodes took it)
/// when none did, with its lock's identity.
fn won_permit(decided: Vec<Decided>, specs: Vec<LockSpec>) -> (Decided, LockSpec) {
    let best = decided
        .iter()
        .enumerate()
        .max_by_key(|(_, d)| (d.won, d.report.accepted))
        .map_or(0, |(i, _)| i);
    decided
        .into_iter()
        .zip(specs)
        .nth(best)
        .expect("a round decides each of its permits")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_proposes_every_permit_once_starting_anywhere() {
        let keys: Vec<String> = (1..=5).map(|i| i.to_string()).collect();
        let mut starts = std::collections::HashSet::new();
        for _ in 0..200 {
            let order = proposed(keys.clone());
            let mut sorted = order.clone();
            sorted.sort();
            assert_eq!(sorted, keys);
            // A rotation: each permit is followed by the next, the last by the first.
            let at = keys.iter().position(|k| *k == order[0]).unwrap();
            assert!(order
                .iter()
                .enumerate()
                .all(|(i, k)| *k == keys[(at + i) % 5]));
            starts.insert(at);
        }
        assert_eq!(starts.len(), 5, "{starts:?}");
    }

    /// The design not taken, as the negative control of the module's argument: a per-node
    /// limit of `permits` and a majority lets three contenders each win a different
    /// majority of three nodes, three holders of two permits; permits as keys, each node
    /// taking one per round, let at most two of them win.
    #[test]
    fn a_per_node_limit_with_a_majority_admits_more_holders_than_permits() {
        let (permits, quorum) = (2, 2);
        let majorities = [[0, 1], [1, 2], [2, 0]];
        let mut limit = [0; 3];
        let mut limited_holders = 0;
        let mut slots: [[Option<usize>; 2]; 3] = [[None; 2]; 3];
        let mut slot_holders = 0;
        for (contender, majority) in majorities.iter().enumerate() {
            if majority.iter().all(|&n| limit[n] < permits) {
                majority.iter().for_each(|&n| limit[n] += 1);
                limited_holders += 1;
            }
            // Each node of the majority takes its first free permit for the contender; it
            // holds one permit if a quorum took the same one.
            let mut taken = [0; 2];
            for &n in majority {
                if let Some(free) = slots[n].iter().position(Option::is_none) {
                    slots[n][free] = Some(contender);
                    taken[free] += 1;
                }
            }
            if taken.iter().any(|&votes| votes >= quorum) {
                slot_holders += 1;
            } else {
                // Lost: rolled back on every node.
                for node in &mut slots {
                    node.iter_mut()
                        .filter(|s| **s == Some(contender))
                        .for_each(|s| *s = None);
                }
            }
        }
        assert_eq!(limited_holders, 3, "the per-node limit admits one too many");
        assert!(slot_holders <= permits, "{slot_holders}");
    }
}

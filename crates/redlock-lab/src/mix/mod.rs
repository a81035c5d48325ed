//! The workload mix: every path of the client's API under the checker.
//!
//! Plain `lock()`/`release()` cycles exercise one path. The mix draws each client's next
//! operation from weighted [`Op`]s with a seeded generator (the same seed gives each
//! client the same sequence of operations; what the nodes answer still varies): reentrant
//! holds shared by one [`Owner`](redlock_client::Owner), manual extensions longer and
//! shorter than the TTL, renewed holds longer than the TTL, multi-key locks over
//! overlapping key sets, guards dropped without release and `lock()` calls cancelled
//! mid-wait. Every operation and how it ended is recorded ([`Event::Op`]), and so is every
//! acquisition, extension, renewal seen, write and release, for the checker.
//!
//! [`Event::Op`]: crate::Event::Op

mod ops;
mod reader;

use rand::rngs::StdRng;
use rand::Rng;

pub(crate) use ops::{contend_mixed, contend_mixed_each};

/// The keys the multi-key locks add to the contended key: `{resource, a}` and
/// `{resource, b}` overlap in the contended key (which the checker judges) and exclude
/// each other there; two sets with the same extra key overlap in both.
pub const MANY_EXTRA: [&str; 2] = ["a", "b"];

/// One kind of operation of the mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// `lock`, write, `release`.
    Plain,
    /// A `lock_reentrant` hold, then a second hold of the same owner taken while the first
    /// is held (a nested acquisition), a write under each, released in a random order with
    /// a write under the remaining hold in between.
    Reentrant,
    /// [`Op::Reentrant`] with both holds' `lock_reentrant` calls at once. Two fenced rounds
    /// of one owner that run at once both win and may hand out the same fencing token: one
    /// owner's lease, won together, which the fencing rule allows (see `checker::fencing`
    /// and the fault-lab notes); nested holds still need tokens of their own.
    ReentrantConcurrent,
    /// `lock`, `extend` to twice the TTL, a read of the nodes, write, `release`.
    ExtendLonger,
    /// `lock`, `extend` to half the TTL (changes nothing: extensions never shorten), a
    /// read of the nodes, write, `release`.
    ExtendShorter,
    /// `lock_with` renewal on, held for 1.5 of its TTL while writing (renewed every third
    /// of it); each renewal seen is recorded and followed by a read of the nodes.
    Renewed,
    /// `lock_many` over the contended key and one of [`MANY_EXTRA`], write, `release`.
    Many,
    /// `lock`, write, then the guard dropped without `release` (released in the
    /// background).
    Dropped,
    /// `lock` under a `tokio::time::timeout` of 1-30 ms, which fires mid-wait (or
    /// mid-round) when the key is held; a lock won in time is used and released.
    Cancelled,
    /// `lock_with` the fair queue (`fair`, unfenced even on a fenced client), write,
    /// `release`: the queue's scripts and the targeted wake-up, beside clients that take the
    /// same key without the queue.
    Fair,
    /// Three `lock` calls of one client at once on the contended key, each written under
    /// and released when won: the client's group commit sends the first call's `SET NX`
    /// and the two that start while it is in flight together in its next round (one
    /// script per node, the same key twice: at most one of them wins), and their releases
    /// likewise.
    Grouped,
}

impl Op {
    /// Every operation, in the order of [`Mix::default`]'s weights.
    pub const ALL: [Op; 11] = [
        Op::Plain,
        Op::Reentrant,
        Op::ReentrantConcurrent,
        Op::ExtendLonger,
        Op::ExtendShorter,
        Op::Renewed,
        Op::Many,
        Op::Dropped,
        Op::Cancelled,
        Op::Fair,
        Op::Grouped,
    ];

    /// Its name in the history, the summary and `--mix`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Plain => "plain",
            Op::Reentrant => "reentrant",
            Op::ReentrantConcurrent => "reentrant_concurrent",
            Op::ExtendLonger => "extend_longer",
            Op::ExtendShorter => "extend_shorter",
            Op::Renewed => "renewed",
            Op::Many => "many",
            Op::Dropped => "dropped",
            Op::Cancelled => "cancelled",
            Op::Fair => "fair",
            Op::Grouped => "grouped",
        }
    }
}

/// Weights and a seed: each client draws its next operation with probability weight / sum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mix {
    /// A weight per operation; 0 leaves it out.
    pub weights: Vec<(Op, u32)>,
    /// Client `c` draws from a generator seeded with `seed` and `c`.
    pub seed: u64,
}

impl Default for Mix {
    /// Plain cycles most often; a renewed hold lasts about fifty plain cycles (the other
    /// clients wait it out), so it is drawn rarely, or it would take most of the run.
    fn default() -> Self {
        Mix {
            weights: vec![
                (Op::Plain, 60),
                (Op::Reentrant, 20),
                (Op::ReentrantConcurrent, 10),
                (Op::ExtendLonger, 10),
                (Op::ExtendShorter, 10),
                (Op::Renewed, 1),
                (Op::Many, 20),
                (Op::Dropped, 10),
                (Op::Cancelled, 20),
                (Op::Fair, 20),
                (Op::Grouped, 10),
            ],
            seed: 17,
        }
    }
}

impl Mix {
    /// Parses `name=weight,...` (names as [`Op::name`]); operations not named get 0.
    pub fn parse(spec: &str, seed: u64) -> Result<Mix, String> {
        let mut weights = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, weight) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?}: expected name=weight"))?;
            let op = Op::ALL
                .into_iter()
                .find(|op| op.name() == name.trim())
                .ok_or_else(|| {
                    let names: Vec<&str> = Op::ALL.iter().map(|op| op.name()).collect();
                    format!("{name:?}: not an operation (one of {})", names.join(", "))
                })?;
            let weight = weight
                .trim()
                .parse()
                .map_err(|_| format!("{part:?}: the weight must be a whole number"))?;
            weights.push((op, weight));
        }
        let mix = Mix { weights, seed };
        if mix.total() == 0 {
            return Err(format!("{spec:?}: every weight is 0"));
        }
        Ok(mix)
    }

    fn total(&self) -> u64 {
        self.weights.iter().map(|(_, w)| u64::from(*w)).sum()
    }

    /// The generator of client `c`.
    pub(crate) fn rng(&self, c: usize) -> StdRng {
        rand::SeedableRng::seed_from_u64(
            self.seed ^ (c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        )
    }

    /// Draws an operation.
    pub(crate) fn pick(&self, rng: &mut StdRng) -> Op {
        let mut at = rng.gen_range(0..self.total().max(1));
        for (op, weight) in &self.weights {
            if at < u64::from(*weight) {
                return *op;
            }
            at -= u64::from(*weight);
        }
        Op::Plain
    }
}

/// What the contending clients of a must-pass scenario run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Plain `lock`/`release` cycles only ([`contend`](crate::contend)).
    Plain,
    /// The mix (the default).
    Mix(Mix),
    /// Permits of a semaphore ([`SEMAPHORE`](crate::SEMAPHORE)) of this many permits
    /// instead of locks: [`PERMIT_LOOPS`](crate::PERMIT_LOOPS) acquisition loops per
    /// client, half of them in the fair queue; no fencing.
    Semaphore(u32),
    /// The read and write sides of a read-write lock ([`RWLOCK`](crate::RWLOCK)) instead of
    /// locks: [`RW_LOOPS`](crate::RW_LOOPS) acquisition loops per client, one take in
    /// [`WRITE_EVERY`](crate::WRITE_EVERY) the write side, half the loops in the fair
    /// queue; no fencing.
    RwLock,
}

impl Default for Workload {
    fn default() -> Self {
        Workload::Mix(Mix::default())
    }
}

impl Workload {
    /// Whether a fenced client running it can take a fencing token: every operation but
    /// [`Op::Fair`] (always unfenced) locks as the client is configured; permits and the
    /// read-write workload's sides are never fenced.
    pub fn may_fence(&self) -> bool {
        match self {
            Workload::Plain => true,
            Workload::Mix(mix) => mix.weights.iter().any(|&(op, w)| w > 0 && op != Op::Fair),
            Workload::Semaphore(_) | Workload::RwLock => false,
        }
    }

    /// Whether its clients take anything but locks (permits, a read-write lock's sides):
    /// those take no fencing token in the lab, and no fair queue from the configuration
    /// (their workloads ask for it per call).
    pub fn takes_no_locks(&self) -> bool {
        matches!(self, Workload::Semaphore(_) | Workload::RwLock)
    }

    /// The permits of the semaphore its clients take, for the semaphore workload.
    pub fn permits(&self) -> Option<u32> {
        match self {
            Workload::Semaphore(permits) => Some(*permits),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_names_the_weights_and_leaves_the_rest_out() {
        let mix = Mix::parse("plain=3, renewed=1", 5).unwrap();
        assert_eq!(mix.weights, [(Op::Plain, 3), (Op::Renewed, 1)]);
        assert!(Mix::parse("plain=0", 5).is_err());
        assert!(Mix::parse("steal=1", 5).is_err());
        assert!(Mix::parse("plain", 5).is_err());
    }

    #[test]
    fn only_a_mix_of_fair_locks_alone_cannot_fence() {
        assert!(Workload::Plain.may_fence());
        assert!(Workload::default().may_fence());
        assert!(Workload::Mix(Mix::parse("fair=1, plain=1", 5).unwrap()).may_fence());
        assert!(!Workload::Mix(Mix::parse("fair=1", 5).unwrap()).may_fence());
        assert!(!Workload::Semaphore(3).may_fence());
        assert!(!Workload::RwLock.may_fence());
    }

    #[test]
    fn a_seed_fixes_each_clients_sequence() {
        let mix = Mix::default();
        let draw = |c| {
            let mut rng = mix.rng(c);
            (0..50).map(|_| mix.pick(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(draw(0), draw(0));
        assert_ne!(draw(0), draw(1));
        // Every operation comes up.
        let many = {
            let mut rng = mix.rng(0);
            (0..5000).map(|_| mix.pick(&mut rng)).collect::<Vec<_>>()
        };
        for (op, weight) in &mix.weights {
            assert_eq!(many.contains(op), *weight > 0, "{op:?}");
        }
    }
}

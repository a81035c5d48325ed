//! When `lock` tries again: the retry policy, and its backoff as plain data.
//!
//! The policy is split in three so each limit is tested on its own:
//! - `max_attempts` counts rounds, including the first;
//! - `max_wait` is an overall deadline from the start of the first round, which the caller
//!   measures with `tokio::time::Instant` (so tests can pause and advance the clock);
//! - the delays between rounds come from [`Backoff`], an infinite iterator of durations that
//!   knows nothing of attempts, deadlines or time. The caller cuts a delay short when a
//!   release notification for the key arrives.
//!
//! Jitter matters more than the exponent here: every waiter on a contended key was refused
//! by the same round, and without jitter they would all come back at the same instant and
//! split the votes again.

use std::iter::FusedIterator;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::InvalidConfig;

/// How `lock` retries a round that did not reach a quorum.
///
/// Attempts are limited by [`max_attempts`](Self::max_attempts) and the waiting by
/// [`max_wait`](Self::max_wait), whichever runs out first. Between two attempts the caller
/// sleeps for the next delay of [`backoff`](Self::backoff), but never past the deadline,
/// and wakes early when the holder's release is announced (see `LockConfig::notify`). With
/// notifications on, the second attempt at a plain lock of one key queues the waiter on the
/// nodes, so that releases announce themselves to it: it comes after the first delay, but
/// at most a node timeout after the first attempt. A woken attempt that loses pauses before
/// the next one for up to one round, doubled for each such loss. After two such losses (or
/// once that window reaches `max_delay`), the waiter leaves the queue and only polls for
/// the rest of the call: the key is taken back at once after its releases, and rounds run
/// at each wake-up would come far more often than the backoff's, only to lose or split the
/// vote.
///
/// Defaults: `max_attempts` `None`, `max_wait` `Some(10s)`, `base_delay` 50 ms, `max_delay`
/// 1 s, `seed` `None`.
///
/// ```
/// use std::time::Duration;
/// use redlock_client::RetryPolicy;
///
/// let policy = RetryPolicy {
///     max_attempts: Some(5),
///     seed: Some(7),
///     ..RetryPolicy::default()
/// };
/// policy.validate().unwrap();
/// // Four attempts after the first, so at most four delays are ever used.
/// let delays: Vec<Duration> = policy.backoff().take(4).collect();
/// for (delay, cap_ms) in delays.iter().zip([50, 100, 200, 400]) {
///     assert!(*delay <= Duration::from_millis(cap_ms));
/// }
/// // The same seed gives the same delays.
/// assert_eq!(delays, policy.backoff().take(4).collect::<Vec<_>>());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct RetryPolicy {
    /// The most rounds `lock` runs, the first included: `Some(1)` means no retry. `None`
    /// leaves the count unlimited, and then `max_wait` must be set. Defaults to `None`.
    pub max_attempts: Option<u32>,
    /// The overall deadline, counted from the start of the first attempt: no attempt, and
    /// no sleep between attempts, starts at or after it, and sleeps (the backoff delay, the
    /// spread after a wake-up) are cut short to end at it. An attempt in flight at the
    /// deadline finishes, so `lock` returns at most one attempt's duration after the
    /// deadline: one node timeout (a round waits for no node longer, and a fenced attempt's
    /// token step is cut at that same instant, its lock then released in the background),
    /// or two for a plain lock of one key whose attempt joined a grouped round and waited
    /// for the round in flight first (see `LockConfig::group_commit`). A lock won
    /// below `min_validity` by the last attempt is released in the background. The first
    /// attempt always runs, so `Some(0s)` means no retry. `None` leaves the time unlimited,
    /// and then `max_attempts` must be set. Defaults to 10 s.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub max_wait: Option<Duration>,
    /// The cap of the first delay; each later cap doubles. Defaults to 50 ms.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub base_delay: Duration,
    /// The largest cap, which the doubling stops at. Defaults to 1 s.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub max_delay: Duration,
    /// A fixed seed for the jitter, for tests and reproducible runs. Leave it `None` in
    /// production: clients sharing a seed would retry in lockstep, which is what the jitter
    /// is there to prevent. Defaults to `None` (seeded from the OS).
    pub seed: Option<u64>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: None,
            // Long enough to outlast a holder that releases normally, short enough that a
            // caller stuck behind a crashed holder (who must wait out its TTL) hears about it.
            max_wait: Some(Duration::from_secs(10)),
            // A round on a local network takes a few milliseconds; 50 ms lets the holder's
            // round finish before the first retry without leaving the lock idle for long.
            base_delay: Duration::from_millis(50),
            max_delay: Duration::from_secs(1),
            seed: None,
        }
    }
}

impl RetryPolicy {
    /// Exactly one attempt: `lock` fails at once when the first round is lost.
    pub fn no_retry() -> Self {
        RetryPolicy {
            max_attempts: Some(1),
            ..RetryPolicy::default()
        }
    }

    /// Checks the policy: at least one attempt, some bound on the retries, and delays that
    /// are positive and ordered.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        let invalid = |reason: String| Err(InvalidConfig::Retry { reason });
        if self.max_attempts == Some(0) {
            return invalid(
                "max_attempts is 0, so the lock would never be tried: use 1 for a single \
                 attempt without retry, or more"
                    .into(),
            );
        }
        if self.max_attempts.is_none() && self.max_wait.is_none() {
            return invalid(
                "neither max_attempts nor max_wait is set, so a lock that is never released \
                 would be retried forever: set max_wait (for example 10s) or max_attempts"
                    .into(),
            );
        }
        if self.base_delay.is_zero() {
            return invalid(
                "base_delay is zero, so the first retries would hammer the nodes in a busy \
                 loop: use a few milliseconds (for example 50ms)"
                    .into(),
            );
        }
        if self.max_delay < self.base_delay {
            return invalid(format!(
                "max_delay ({}) is shorter than base_delay ({}): raise max_delay to at least \
                 base_delay",
                humantime::format_duration(self.max_delay),
                humantime::format_duration(self.base_delay),
            ));
        }
        Ok(())
    }

    /// The delays to sleep between attempts, seeded from [`seed`](Self::seed) when it is set.
    pub fn backoff(&self) -> Backoff {
        let rng = match self.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            // Seeded from the thread's generator (itself seeded from the operating system):
            // no system call per lock call, as `from_entropy` made. Jitter needs no more.
            None => StdRng::from_seed(rand::random()),
        };
        Backoff {
            rng,
            base_delay: self.base_delay,
            max_delay: self.max_delay,
            step: 0,
        }
    }
}

/// Exponential backoff with full jitter, as an infinite iterator of delays.
///
/// The `k`-th delay (`k = 0, 1, ...`) is uniform in `[0, min(max_delay, base_delay * 2^k)]`,
/// at nanosecond resolution: "full jitter" from the AWS Architecture Blog's *Exponential
/// Backoff And Jitter*, which spreads competing clients best for the least total wait. The
/// arithmetic saturates, so the iterator never panics however long it runs.
///
/// With a seed, the sequence is fixed for a given version of `rand` (its `StdRng`), which
/// is what tests rely on; it may change when `rand` is upgraded.
#[derive(Debug, Clone)]
pub struct Backoff {
    rng: StdRng,
    base_delay: Duration,
    max_delay: Duration,
    step: u32,
}

impl Backoff {
    /// The cap of the current step, `min(max_delay, base_delay * 2^step)`.
    fn cap(&self) -> Duration {
        let doubled = match 1u32.checked_shl(self.step) {
            Some(factor) => self.base_delay.saturating_mul(factor),
            // 2^32 and beyond: past any useful `max_delay` for a positive base delay.
            None => Duration::MAX,
        };
        doubled.min(self.max_delay)
    }
}

impl Backoff {
    /// The pause of a waiter woken by a release before its round: uniform in `[0, max]`
    /// (`max` is its last round's duration, see `Redlock::lock`), drawn from this backoff's
    /// own generator, so that a seeded policy fixes the spreads as well as the delays, for
    /// a given sequence of delays and wake-ups.
    pub(crate) fn spread(&mut self, max: Duration) -> Duration {
        let max = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(self.rng.gen_range(0..=max))
    }
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        // Durations beyond u64::MAX nanoseconds (584 years) are clamped rather than wrapped.
        let cap = u64::try_from(self.cap().as_nanos()).unwrap_or(u64::MAX);
        let delay = Duration::from_nanos(self.rng.gen_range(0..=cap));
        self.step = self.step.saturating_add(1);
        Some(delay)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}

impl FusedIterator for Backoff {}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn seeded(seed: u64) -> RetryPolicy {
        RetryPolicy {
            seed: Some(seed),
            ..RetryPolicy::default()
        }
    }

    fn caps(policy: &RetryPolicy, n: usize) -> Vec<Duration> {
        let mut backoff = policy.backoff();
        (0..n)
            .map(|_| {
                let cap = backoff.cap();
                backoff.next();
                cap
            })
            .collect()
    }

    #[test]
    fn defaults() {
        let p = RetryPolicy::default();
        assert_eq!(p.max_attempts, None);
        assert_eq!(p.max_wait, Some(10_000 * MS));
        assert_eq!(p.base_delay, 50 * MS);
        assert_eq!(p.max_delay, 1000 * MS);
        assert_eq!(p.seed, None);
        assert_eq!(p.validate(), Ok(()));
        assert_eq!(RetryPolicy::no_retry().max_attempts, Some(1));
        assert_eq!(RetryPolicy::no_retry().validate(), Ok(()));
    }

    #[test]
    fn exact_sequence_for_a_fixed_seed() {
        // Pinned from rand 0.8's StdRng (ChaCha12); a rand upgrade may change these.
        let delays: Vec<Duration> = seeded(42).backoff().take(8).collect();
        assert_eq!(delays, PINNED_SEED_42);
    }

    const PINNED_SEED_42: [Duration; 8] = [
        Duration::from_nanos(27_136_261),
        Duration::from_nanos(63_646_510),
        Duration::from_nanos(81_180_352),
        Duration::from_nanos(13_737_127),
        Duration::from_nanos(331_965_477),
        Duration::from_nanos(737_424_428),
        Duration::from_nanos(849_251_605),
        Duration::from_nanos(131_278_889),
    ];

    #[test]
    fn caps_double_then_saturate_at_max_delay() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&m| Duration::from_millis(m))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            caps(&RetryPolicy::default(), 8),
            ms(&[50, 100, 200, 400, 800, 1000, 1000, 1000])
        );
        let exact = RetryPolicy {
            base_delay: 125 * MS,
            max_delay: 1000 * MS,
            ..RetryPolicy::default()
        };
        assert_eq!(caps(&exact, 6), ms(&[125, 250, 500, 1000, 1000, 1000]));
    }

    #[test]
    fn every_delay_is_within_its_cap_and_the_caps_are_reached() {
        let policy = RetryPolicy::default();
        let caps = caps(&policy, 12);
        let mut largest = vec![Duration::ZERO; caps.len()];
        for seed in 0..500 {
            for (k, delay) in seeded(seed).backoff().take(caps.len()).enumerate() {
                assert!(delay <= caps[k], "seed {seed}, step {k}: {delay:?}");
                largest[k] = largest[k].max(delay);
            }
        }
        // Full jitter spreads over the whole range: with 500 draws the largest is close to
        // the cap, so the delays really grow and then level off at max_delay.
        for (k, (max, cap)) in largest.iter().zip(&caps).enumerate() {
            assert!(*max >= cap.mul_f64(0.95), "step {k}: {max:?} of {cap:?}");
        }
    }

    #[test]
    fn same_seed_same_sequence_different_seeds_differ() {
        let a: Vec<_> = seeded(7).backoff().take(20).collect();
        let b: Vec<_> = seeded(7).backoff().take(20).collect();
        let c: Vec<_> = seeded(8).backoff().take(20).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        // A clone continues from where the original is.
        let mut original = seeded(7).backoff();
        original.next();
        let rest: Vec<_> = original.clone().take(19).collect();
        assert_eq!(rest, a[1..]);
    }

    /// Finding 1: the spread of a woken waiter comes from the seeded generator, so two
    /// clients with the same seed and the same sequence of delays and wake-ups pause
    /// alike (drawn from `thread_rng`, it would differ between them).
    #[test]
    fn spreads_follow_the_seed_interleaved_with_delays() {
        let run = |seed: u64| {
            let mut backoff = seeded(seed).backoff();
            let mut seen = Vec::new();
            for round in 1..=10u32 {
                seen.push(backoff.next().expect("infinite"));
                if round % 3 != 0 {
                    // Woken by a release after a round of `round` ms.
                    let spread = backoff.spread(round * MS);
                    assert!(spread <= round * MS, "{spread:?}");
                    seen.push(spread);
                }
            }
            seen
        };
        assert_eq!(run(11), run(11));
        assert_ne!(run(11), run(12));
        // A zero-length round gives no spread, and never panics.
        assert_eq!(seeded(1).backoff().spread(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn unseeded_backoffs_differ() {
        let a: Vec<_> = RetryPolicy::default().backoff().take(20).collect();
        let b: Vec<_> = RetryPolicy::default().backoff().take(20).collect();
        assert_ne!(a, b);
    }

    #[test]
    fn huge_steps_and_durations_do_not_panic() {
        let mut late = seeded(1).backoff();
        late.step = u32::MAX - 2;
        for delay in late.by_ref().take(5) {
            assert!(delay <= 1000 * MS);
        }
        assert_eq!(late.step, u32::MAX);
        assert_eq!(late.cap(), 1000 * MS);

        let huge = RetryPolicy {
            base_delay: Duration::MAX / 2,
            max_delay: Duration::MAX,
            ..seeded(1)
        };
        assert_eq!(huge.validate(), Ok(()));
        let mut backoff = huge.backoff();
        backoff.step = 40;
        assert_eq!(backoff.cap(), Duration::MAX);
        assert!(backoff.take(3).all(|d| d <= Duration::from_nanos(u64::MAX)));
    }

    #[test]
    fn validation_errors() {
        let reason = |p: RetryPolicy| match p.validate() {
            Err(InvalidConfig::Retry { reason }) => reason,
            other => panic!("expected a retry error, got {other:?}"),
        };
        let zero = RetryPolicy {
            max_attempts: Some(0),
            ..RetryPolicy::default()
        };
        assert!(reason(zero).contains("max_attempts is 0"));
        let forever = RetryPolicy {
            max_attempts: None,
            max_wait: None,
            ..RetryPolicy::default()
        };
        assert!(reason(forever).contains("set max_wait"));
        let busy = RetryPolicy {
            base_delay: Duration::ZERO,
            ..RetryPolicy::default()
        };
        assert!(reason(busy).contains("base_delay is zero"));
        let inverted = RetryPolicy {
            base_delay: 200 * MS,
            max_delay: 100 * MS,
            ..RetryPolicy::default()
        };
        assert_eq!(
            reason(inverted),
            "max_delay (100ms) is shorter than base_delay (200ms): raise max_delay to at \
             least base_delay"
        );
        // Either bound alone is enough; a zero deadline means a single attempt.
        for ok in [
            RetryPolicy {
                max_attempts: Some(3),
                max_wait: None,
                ..RetryPolicy::default()
            },
            RetryPolicy {
                max_wait: Some(Duration::ZERO),
                ..RetryPolicy::default()
            },
            RetryPolicy {
                base_delay: 100 * MS,
                max_delay: 100 * MS,
                ..RetryPolicy::default()
            },
        ] {
            assert_eq!(ok.validate(), Ok(()), "{ok:?}");
        }
    }
}

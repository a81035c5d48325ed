//! Clock drift and validity arithmetic.
//!
//! A key set on a node whose clock runs at rate `r_i` expires after `ttl / r_i` of real time,
//! while the client believes it holds the lock for `(ttl - drift) / r_c`. Safety needs
//! `drift >= ttl * (1 - r_c / r_i)`: the default factor of 1 % covers clocks within about
//! 0.5 % of real time.

use std::time::Duration;

use tokio::time::Instant;

/// The fixed part of the drift: Redis expires keys with 1 ms precision, and short TTLs need
/// a floor that a proportional factor alone would not give them.
pub const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// The default drift factor (1 %), as in antirez's reference client.
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;

/// The drift allowance for a TTL: `ttl * factor + 2 ms`.
///
/// `factor` must be in `[0, 1)`; configuration is validated before this is reached, and an
/// out-of-range factor is clamped here rather than allowed to panic.
pub fn drift(ttl: Duration, factor: f64) -> Duration {
    let factor = if factor.is_finite() {
        factor.clamp(0.0, 0.999_999)
    } else {
        0.0
    };
    // Saturating throughout: `drift` is public and may be handed any TTL, and
    // `Duration::mul_f64` panics where the product does not fit.
    Duration::try_from_secs_f64(ttl.as_secs_f64() * factor)
        .unwrap_or(Duration::MAX)
        .saturating_add(DRIFT_FLOOR)
}

/// What is left of a lock's validity: `ttl - elapsed - drift`, or `None` when that is zero or
/// negative (the lock must then be treated as not acquired).
pub fn validity(ttl: Duration, elapsed: Duration, drift: Duration) -> Option<Duration> {
    ttl.checked_sub(elapsed)
        .and_then(|rest| rest.checked_sub(drift))
        .filter(|v| !v.is_zero())
}

/// The validity left at the decision of a round that started at `t0` and was decided
/// `elapsed` later, with its deadline `t0 + ttl - drift`; `None` when nothing is left. The
/// one place where a round's validity is computed.
pub(crate) fn lease(
    ttl: Duration,
    drift_factor: f64,
    t0: Instant,
    elapsed: Duration,
) -> Option<(Duration, Instant)> {
    let left = validity(ttl, elapsed, drift(ttl, drift_factor))?;
    // `t0 + elapsed` is now; `left` is at most the TTL, which is checked to be at most a
    // year, so the deadline cannot overflow.
    Some((left, t0 + elapsed + left))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn drift_is_one_percent_plus_two_ms_by_default() {
        assert_eq!(drift(10_000 * MS, DEFAULT_DRIFT_FACTOR), 102 * MS);
        assert_eq!(drift(500 * MS, DEFAULT_DRIFT_FACTOR), 7 * MS);
        assert_eq!(drift(500 * MS, 0.0), 2 * MS);
    }

    #[test]
    fn drift_never_panics_on_bad_factors() {
        for f in [f64::NAN, f64::INFINITY, -1.0, 1.0, 7.5] {
            let d = drift(1000 * MS, f);
            assert!(
                d >= DRIFT_FLOOR && d < 1000 * MS + DRIFT_FLOOR,
                "factor {f}: {d:?}"
            );
        }
    }

    #[test]
    fn drift_of_the_longest_durations_saturates() {
        assert_eq!(drift(Duration::MAX, 0.0), DRIFT_FLOOR);
        assert!(drift(Duration::MAX, 0.5) >= Duration::MAX / 2);
        assert!(drift(Duration::MAX, 0.999_999) > Duration::MAX / 2);
        assert_eq!(validity(Duration::MAX, Duration::MAX, Duration::MAX), None);
    }

    #[test]
    fn a_lease_ends_at_t0_plus_ttl_minus_drift() {
        let t0 = Instant::now();
        let (left, until) = lease(1000 * MS, 0.01, t0, 10 * MS).unwrap();
        assert_eq!(left, 978 * MS);
        assert_eq!(until, t0 + 988 * MS);
        assert_eq!(lease(1000 * MS, 0.01, t0, 988 * MS), None);
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        assert_eq!(validity(1000 * MS, 10 * MS, 12 * MS), Some(978 * MS));
    }

    #[test]
    fn validity_is_none_when_nothing_is_left() {
        assert_eq!(validity(1000 * MS, 988 * MS, 12 * MS), None, "exactly zero");
        assert_eq!(
            validity(1000 * MS, 2000 * MS, 12 * MS),
            None,
            "elapsed beyond ttl"
        );
        assert_eq!(
            validity(1000 * MS, 995 * MS, 12 * MS),
            None,
            "drift eats the rest"
        );
    }
}

//! The checks every key and TTL gets before any round, and their bounds.

use std::time::Duration;

use crate::drift::drift;
use crate::error::ArgumentError;

/// The longest key a round accepts, in bytes.
///
/// Redis takes keys up to 512 MB, but every round sends the key to every node, several
/// times; a longer key is almost always a bug (an unbounded value used as a lock name).
/// Hash long resource names into a key instead.
pub const MAX_KEY_LEN: usize = 4096;

/// The longest TTL a round accepts: a year as humantime counts one (365.25 days), so that
/// a configuration's `"1y"` is accepted. Locks are leases: a TTL of a year is a bug, and
/// keeping TTLs bounded keeps every `Instant` computed from them far from overflow.
pub const MAX_TTL: Duration = Duration::from_secs(31_557_600);

/// Checks a TTL: not zero, at most [`MAX_TTL`], and long enough that the drift allowance
/// plus one node timeout leave some validity. Returns it truncated to whole milliseconds.
pub fn check_ttl(
    ttl: Duration,
    drift_factor: f64,
    node_timeout: Duration,
) -> Result<Duration, ArgumentError> {
    let ttl = Duration::from_millis(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
    if ttl.is_zero() {
        return Err(ArgumentError::ZeroTtl);
    }
    if ttl > MAX_TTL {
        return Err(ArgumentError::TtlTooLong { ttl, max: MAX_TTL });
    }
    let drift = drift(ttl, drift_factor);
    // A round that waits one full node timeout must still end with validity left, or every
    // round with one slow node would be lost by construction.
    if ttl <= drift.saturating_add(node_timeout) {
        return Err(ArgumentError::TtlTooShort {
            ttl,
            drift,
            node_timeout,
        });
    }
    Ok(ttl)
}

/// Checks a lock key: not empty, at most [`MAX_KEY_LEN`] bytes.
pub fn check_key(key: &str) -> Result<(), ArgumentError> {
    if key.is_empty() {
        return Err(ArgumentError::EmptyKey);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(ArgumentError::KeyTooLong {
            len: key.len(),
            max: MAX_KEY_LEN,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_checks() {
        let t = Duration::from_millis(100);
        assert!(matches!(
            check_ttl(Duration::ZERO, 0.01, t),
            Err(ArgumentError::ZeroTtl)
        ));
        assert!(matches!(
            check_ttl(Duration::from_micros(900), 0.01, t),
            Err(ArgumentError::ZeroTtl)
        ));
        assert!(matches!(
            check_ttl(Duration::from_millis(100), 0.01, t),
            Err(ArgumentError::TtlTooShort { .. })
        ));
        assert!(matches!(
            check_ttl(MAX_TTL * 2, 0.01, t),
            Err(ArgumentError::TtlTooLong { .. })
        ));
        // humantime's "1y" (365.25 days) is the longest TTL; a millisecond more is not.
        let year = Duration::from_secs(365 * 24 * 3600 + 6 * 3600);
        assert_eq!(check_ttl(year, 0.01, t).unwrap(), year);
        assert!(check_ttl(year + Duration::from_millis(1), 0.01, t).is_err());
        assert_eq!(
            check_ttl(Duration::from_micros(1_000_999), 0.01, t).unwrap(),
            Duration::from_millis(1000)
        );
    }

    #[test]
    fn key_checks() {
        assert!(matches!(check_key(""), Err(ArgumentError::EmptyKey)));
        assert!(matches!(
            check_key(&"k".repeat(MAX_KEY_LEN + 1)),
            Err(ArgumentError::KeyTooLong { .. })
        ));
        assert!(check_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
    }
}

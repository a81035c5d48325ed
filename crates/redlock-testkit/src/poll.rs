//! Waiting in tests for a condition that only the mechanism under test can make true.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Polls `check` every 20 ms until it holds, for at most `within`. Returns whether it held.
///
/// The bound is a guard against hanging, not a performance assertion: give it room.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

//! The watch on the host's wall clock: a thread that compares it with the monotonic clock
//! every few milliseconds and keeps each step (see [`HostClockStep`] for why it matters).
//! A thread of its own, not a task: a starved runtime delays its samples, and a sample
//! taken late still measures the step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use crate::checker::HostClockStep;
use crate::history::History;

/// The smallest step kept: well above the noise of reading two clocks (a read pair that took
/// longer than [`MAX_READ`] is dropped) and below any step that matters for a TTL.
const THRESHOLD_NS: i128 = 5_000_000;
/// A pair of clock reads interrupted for longer than this is not used.
const MAX_READ: Duration = Duration::from_micros(500);
/// Time between samples.
const PERIOD: Duration = Duration::from_millis(2);

/// Finds steps in a series of (wall − monotonic) offsets: a change of at least
/// [`THRESHOLD_NS`] from one sample to the next. A slow slew (NTP's at most 0.5 ms/s) never
/// is one.
#[derive(Debug, Default)]
struct Steps {
    last: Option<i128>,
}

impl Steps {
    /// The next offset, in nanoseconds; the step it shows, if any.
    fn sample(&mut self, offset_ns: i128) -> Option<i64> {
        let step = self.last.map(|last| offset_ns - last);
        self.last = Some(offset_ns);
        step.filter(|s| s.abs() >= THRESHOLD_NS)
            .map(|s| i64::try_from(s).unwrap_or(if s > 0 { i64::MAX } else { i64::MIN }))
    }
}

/// The watch of one scenario run.
#[derive(Debug)]
pub(crate) struct HostClockWatch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<HostClockStep>>>,
}

impl HostClockWatch {
    /// Starts watching; steps are timed on `history`'s clock.
    pub(crate) fn start(history: &History) -> HostClockWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, history) = (stop.clone(), history.clone());
        let thread = std::thread::Builder::new()
            .name("lab-host-clock".into())
            .spawn(move || watch(&history, &flag))
            .map_err(|e| tracing::warn!(error = %e, "the host clock watch did not start"))
            .ok();
        HostClockWatch { stop, thread }
    }

    /// Stops watching; every step seen.
    pub(crate) fn stop(mut self) -> Vec<HostClockStep> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for HostClockWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn watch(history: &History, stop: &AtomicBool) -> Vec<HostClockStep> {
    let (wall0, mono0) = (SystemTime::now(), Instant::now());
    let mut steps = Steps::default();
    let mut found = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        if let Some((offset, at)) = offset(wall0, mono0) {
            if let Some(by_ns) = steps.sample(offset) {
                let step = HostClockStep {
                    at: history.at(tokio::time::Instant::from_std(at)),
                    by_ns,
                };
                tracing::warn!(%step, "host clock step");
                found.push(step);
            }
        }
        std::thread::sleep(PERIOD);
    }
    found
}

/// Wall time minus monotonic time since (`wall0`, `mono0`), in nanoseconds, and when it
/// was read; `None` when the two reads were interrupted.
fn offset(wall0: SystemTime, mono0: Instant) -> Option<(i128, Instant)> {
    let before = Instant::now();
    let wall = SystemTime::now();
    let after = Instant::now();
    if after - before > MAX_READ {
        return None;
    }
    let mono = i128::try_from((before - mono0).as_nanos()).ok()?;
    let wall = match wall.duration_since(wall0) {
        Ok(d) => i128::try_from(d.as_nanos()).ok()?,
        Err(back) => -i128::try_from(back.duration().as_nanos()).ok()?,
    };
    Some((wall - mono, before))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i128 = 1_000_000;

    #[test]
    fn a_jump_either_way_is_a_step_and_a_slew_or_jitter_is_not() {
        let mut steps = Steps::default();
        let offsets = [0, MS / 2, MS, 2 * MS, 120 * MS, 121 * MS, 21 * MS, 21 * MS];
        let found: Vec<Option<i64>> = offsets.iter().map(|&o| steps.sample(o)).collect();
        let ms = |n: i64| Some(n * 1_000_000);
        assert_eq!(
            found,
            [None, None, None, None, ms(118), None, ms(-100), None]
        );
    }
}

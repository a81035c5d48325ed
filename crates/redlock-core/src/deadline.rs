//! The end of a lock's validity, on a clock that counts host suspend.
//!
//! Validity is measured on tokio's [`Instant`] (the monotonic clock), which stands still
//! while the host's kernel is suspended (a laptop's sleep, a suspended or hibernated
//! machine or guest), while the Redis servers' clocks, on other hosts, run on: their keys
//! expire during the suspend. A holder that resumed would see its lock as valid for the
//! rest of its validity although the nodes may have expired it and given it to someone
//! else. So each [`Deadline`] also keeps how long the host had been suspended when its
//! round started ([`host_suspended`]), and whatever suspend came since counts as time
//! passed. A virtual machine paused by its hypervisor, without its kernel's knowing, is
//! not seen: that is a process pause like any other (fence the resource for those).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// How long the host has been suspended since it booted, as far as the system tells: on
/// Linux and Android, `CLOCK_BOOTTIME` (which counts suspend) less `CLOCK_MONOTONIC`
/// (which does not, and which [`Instant`] reads), to the whole millisecond; zero on other
/// systems. Only its growth between two readings means anything.
pub fn host_suspended() -> Duration {
    let simulated = Duration::from_nanos(SIMULATED.load(Ordering::Relaxed));
    system_suspended().saturating_add(simulated)
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn system_suspended() -> Duration {
    use nix::time::{clock_gettime, ClockId};
    // Through the C library (its vDSO call): rustix's own reader of the vDSO crashes the
    // process under valgrind (`scripts/instructions.sh`). Clocks that cannot be read
    // (neither can fail on Linux) count no suspend.
    let nanos = |t: nix::sys::time::TimeSpec| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0)
    };
    let (Ok(monotonic), Ok(boot)) = (
        clock_gettime(ClockId::CLOCK_MONOTONIC),
        clock_gettime(ClockId::CLOCK_BOOTTIME),
    ) else {
        return Duration::ZERO;
    };
    let (monotonic, boot) = (nanos(monotonic), nanos(boot));
    // Whole milliseconds: the two readings are a few nanoseconds apart, and that noise
    // must not shorten a validity that no suspend touched.
    Duration::from_millis(boot.saturating_sub(monotonic) / 1_000_000)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn system_suspended() -> Duration {
    Duration::ZERO
}

/// Suspend time added by `simulate_host_suspend` (feature `test-util`), in nanoseconds.
static SIMULATED: AtomicU64 = AtomicU64::new(0);

/// Tests only (feature `test-util`): makes [`host_suspended`] report `by` more, as if the
/// host had just been suspended that long (the monotonic clock does not move). Every
/// deadline of the process counts it.
#[cfg(feature = "test-util")]
pub fn simulate_host_suspend(by: Duration) {
    let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
    let _ = SIMULATED.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |total| {
        Some(total.saturating_add(by))
    });
    announce(host_suspended());
}

/// Tells every [`suspend_watch`] receiver when the host has been suspended since it
/// subscribed: its value is [`host_suspended`] as last read, and it changes only when that
/// grew. Tokio's timers run on the monotonic clock, which stands still while the host is
/// suspended, so a task that sleeps until the end of a validity (which counts the suspend)
/// would wake up to the whole suspend late: it waits on this as well, and reads its
/// deadline again when it changes.
///
/// One thread of the process reads the clocks every quarter of a second while anyone
/// subscribes (on Linux and Android; elsewhere no suspend is counted and no thread runs),
/// and ends when nobody does.
pub fn suspend_watch() -> watch::Receiver<Duration> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        // Subscribed under the lock that the thread checks the count under, so that the
        // thread never ends unseen by a subscriber who counted on it.
        let mut watching = watcher::WATCHING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let receiver = sender().subscribe();
        if !*watching {
            let started = std::thread::Builder::new()
                .name("redlock-suspend".into())
                .stack_size(128 * 1024)
                .spawn(watcher::run);
            match started {
                Ok(_) => *watching = true,
                Err(e) => {
                    tracing::warn!(error = %e, "could not start the thread that watches for host suspend: a loss signal or renewal may come up to a suspend late after the host resumes")
                }
            }
        }
        receiver
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    sender().subscribe()
}

fn sender() -> &'static watch::Sender<Duration> {
    static SENDER: OnceLock<watch::Sender<Duration>> = OnceLock::new();
    SENDER.get_or_init(|| watch::Sender::new(host_suspended()))
}

/// Tells the receivers of [`suspend_watch`] about `suspended`, if it grew.
#[cfg(any(target_os = "linux", target_os = "android", feature = "test-util"))]
fn announce(suspended: Duration) {
    announce_to(sender(), suspended);
}

/// Tells the receivers of `to` about `suspended`, if it grew.
#[cfg(any(
    target_os = "linux",
    target_os = "android",
    feature = "test-util",
    test
))]
fn announce_to(to: &watch::Sender<Duration>, suspended: Duration) {
    to.send_if_modified(|last| {
        let grew = suspended > *last;
        if grew {
            *last = suspended;
        }
        grew
    });
}

/// The thread that watches for host suspend.
#[cfg(any(target_os = "linux", target_os = "android"))]
mod watcher {
    use std::sync::{Mutex, PoisonError};
    use std::time::Duration;

    use super::{announce, host_suspended, sender};

    /// How often the thread reads the clocks.
    const EVERY: Duration = Duration::from_millis(250);

    /// Whether the thread runs.
    pub(super) static WATCHING: Mutex<bool> = Mutex::new(false);

    /// Reads the clocks every [`EVERY`] until nobody subscribes.
    pub(super) fn run() {
        loop {
            std::thread::sleep(EVERY);
            {
                let mut watching = WATCHING.lock().unwrap_or_else(PoisonError::into_inner);
                if sender().receiver_count() == 0 {
                    *watching = false;
                    return;
                }
            }
            announce(host_suspended());
        }
    }
}

/// The end of a validity: an instant on the monotonic clock, and how long the host had
/// been suspended when the validity began (see the module). Suspend after that counts as
/// time passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    at: Instant,
    suspended: Duration,
}

impl Deadline {
    /// A validity that ends at `at` by the monotonic clock and began when
    /// [`host_suspended`] read `suspended`.
    pub fn new(at: Instant, suspended: Duration) -> Deadline {
        Deadline { at, suspended }
    }

    /// The end, brought forward by any suspend since the validity began: the instant on
    /// tokio's clock at which the validity runs out.
    pub fn instant(self) -> Instant {
        self.instant_with(host_suspended())
    }

    /// [`instant`](Self::instant) when [`host_suspended`] reads `suspended_now`.
    fn instant_with(self, suspended_now: Duration) -> Instant {
        let since = suspended_now.saturating_sub(self.suspended);
        // An end before the clock's earliest instant is long past: now will do.
        self.at.checked_sub(since).unwrap_or_else(Instant::now)
    }

    /// The validity left at `now`, or `None` once it has run out (suspend counted).
    pub fn remaining_at(self, now: Instant) -> Option<Duration> {
        self.remaining_with(now, host_suspended())
    }

    /// [`remaining_at`](Self::remaining_at) when [`host_suspended`] reads `suspended_now`.
    fn remaining_with(self, now: Instant, suspended_now: Duration) -> Option<Duration> {
        let since = suspended_now.saturating_sub(self.suspended);
        self.at
            .checked_duration_since(now)
            .and_then(|left| left.checked_sub(since))
            .filter(|left| !left.is_zero())
    }

    /// The validity left now, or `None` once it has run out.
    pub fn remaining(self) -> Option<Duration> {
        self.remaining_at(Instant::now())
    }

    /// Whether the validity has run out by `now`.
    pub fn is_past(self, now: Instant) -> bool {
        self.remaining_at(now).is_none()
    }

    /// Whether this deadline ends later than `other`, suspend counted for both.
    pub fn ends_after(self, other: Deadline) -> bool {
        // On the clock that counts suspend: monotonic end plus the suspend before it.
        self.at + self.suspended > other.at + other.suspended
    }

    /// The later of two deadlines.
    pub fn later(self, other: Deadline) -> Deadline {
        if other.ends_after(self) {
            other
        } else {
            self
        }
    }

    /// This deadline, or now if it ends later: a validity that ends at once.
    pub fn cut_now(self) -> Deadline {
        let now = Deadline::new(Instant::now(), host_suspended());
        if self.ends_after(now) {
            now
        } else {
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suspend_since_the_start_counts_as_time_passed() {
        let now = Instant::now();
        let s = Duration::from_secs(100);
        let deadline = Deadline::new(now + Duration::from_secs(10), s);
        // No suspend since: the whole validity.
        assert_eq!(
            deadline.remaining_with(now, s),
            Some(Duration::from_secs(10))
        );
        assert_eq!(deadline.instant_with(s), now + Duration::from_secs(10));
        // Suspended 4 s since: 6 s left, and the end 4 s earlier.
        let later = s + Duration::from_secs(4);
        assert_eq!(
            deadline.remaining_with(now, later),
            Some(Duration::from_secs(6))
        );
        assert_eq!(deadline.instant_with(later), now + Duration::from_secs(6));
        // Suspended past the end: nothing left.
        assert_eq!(
            deadline.remaining_with(now, s + Duration::from_secs(10)),
            None
        );
        assert_eq!(
            deadline.remaining_with(now, s + Duration::from_secs(60)),
            None
        );
        // A reading below the start's (it cannot go down; saturates) counts nothing.
        assert_eq!(
            deadline.remaining_with(now, Duration::ZERO),
            Some(Duration::from_secs(10))
        );
        // The live clock, on a deadline that began now.
        let fresh = Deadline::new(now + Duration::from_secs(10), host_suspended());
        assert!(fresh.remaining_at(now).is_some());
    }

    #[test]
    fn a_receiver_hears_only_of_suspend_that_grew() {
        let to = watch::Sender::new(Duration::from_secs(7));
        let mut rx = to.subscribe();
        announce_to(&to, Duration::from_secs(7));
        announce_to(&to, Duration::from_secs(6));
        assert!(!rx.has_changed().unwrap(), "no suspend, yet a change");
        announce_to(&to, Duration::from_secs(10));
        assert!(rx.has_changed().unwrap(), "a suspend not announced");
        assert_eq!(*rx.borrow_and_update(), Duration::from_secs(10));
    }

    /// The thread that reads the clocks runs while anyone watches, and again for a watcher
    /// who comes after it ended. (The only test of this binary that watches: the thread is
    /// the process's.)
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn the_watching_thread_runs_while_anyone_watches() {
        let watching = || {
            *watcher::WATCHING
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let until = |want: bool| {
            let end = std::time::Instant::now() + Duration::from_secs(10);
            while watching() != want && std::time::Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
            watching() == want
        };
        let rx = suspend_watch();
        assert!(watching(), "no thread while someone watches");
        drop(rx);
        assert!(until(false), "the thread outlived its last watcher");
        let _rx = suspend_watch();
        assert!(
            watching(),
            "no thread for a watcher after the last one left"
        );
    }

    #[test]
    fn the_later_deadline_counts_suspend() {
        let now = Instant::now();
        let s = Duration::from_secs(100);
        // Ends at +10 s after 100 s of suspend, against +12 s after 97 s: the first ends
        // at 110 s on the clock that counts suspend, the second at 109 s.
        let a = Deadline::new(now + Duration::from_secs(10), s);
        let b = Deadline::new(now + Duration::from_secs(12), s - Duration::from_secs(3));
        assert!(a.ends_after(b));
        assert_eq!(a.later(b), a);
        assert_eq!(b.later(a), a);
    }
}

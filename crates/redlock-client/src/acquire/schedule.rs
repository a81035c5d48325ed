//! When the next attempt starts: the retry policy's backoff, and the rules that adjust it
//! for waiters that are woken, queued or handed the lock. Each rule is a pure function of
//! the call's state, tested here without a runtime; the call only asks how long to wait.
//! The figures behind the constants are in `docs/benchmarks.md` ("The acquisition's delay
//! rules").

use std::time::Duration;

use crate::retry::RetryPolicy;

/// Woken attempts of one call that may lose before a waiter that queues only to be woken
/// (not fair) leaves the queue and polls. A key taken back at once after each release (the
/// releasing holder locks again) sends every woken waiter into a round at a random moment
/// of someone else's hold, at a rate far above its backoff's: it loses, splits the vote
/// with the holder, or wins a hand-off that costs more than the holder's retake. Two keeps
/// the wake-up through one unlucky loss.
pub(super) const WOKEN_LOSSES_BEFORE_POLLING: u32 = 2;

/// A fair waiter's lost rounds in a row that no node refused before it steps back to the
/// end of its keys' queues. A healthy head whose key is free wins its first round; one that
/// loses three without a refusal has answers that keep coming after the node timeout, or
/// reaches fewer nodes than a quorum, and would hold the waiters behind it up for its whole
/// wait. Three rides out a reconnection or a slow moment.
pub(super) const HEAD_LOSSES_BEFORE_STEPPING_BACK: u32 = 3;

/// The state the delay rules read, and the policy they apply.
#[derive(Debug, Clone)]
pub(super) struct Schedule {
    fair: bool,
    max_delay: Duration,
    node_timeout: Duration,
    ttl: Duration,
    /// Whether the last wait ended with a wake-up (not the timer).
    pub(super) woken: bool,
    /// Attempts after a wake-up that lost, in this call: each doubles the window the next
    /// woken attempt's pause is drawn from.
    woken_losses: u32,
    /// A fair waiter's lost rounds in a row that no node refused.
    unrefused_losses: u32,
    /// Whether a waiter that queues only to be woken still does (see
    /// [`lost_after_wake`](Self::lost_after_wake)).
    pub(super) announced: bool,
}

impl Schedule {
    pub(super) fn new(
        fair: bool,
        retry: &RetryPolicy,
        node_timeout: Duration,
        ttl: Duration,
    ) -> Self {
        Schedule {
            fair,
            max_delay: retry.max_delay,
            node_timeout,
            ttl,
            woken: false,
            woken_losses: 0,
            unrefused_losses: 0,
            announced: true,
        }
    }

    /// Counts a lost round that followed a wake-up (a round of `round`'s duration), and says
    /// whether a waiter that queues only to be woken stops being announced: it leaves the
    /// queue and polls at its backoff's rate for the rest of the call.
    ///
    /// That is after [`WOKEN_LOSSES_BEFORE_POLLING`] woken losses, or sooner once the
    /// pause window has grown to `max_delay` (rounds slower than half of it): a wake-up
    /// would then only start a pause as long as the backoff's. A fair waiter always stays:
    /// its turn comes only through the queue.
    pub(super) fn lost_after_wake(&mut self, round: Duration) -> bool {
        if !self.woken {
            return false;
        }
        self.woken_losses = self.woken_losses.saturating_add(1);
        let stop = !self.fair
            && self.announced
            && (self.woken_losses >= WOKEN_LOSSES_BEFORE_POLLING
                || self.wake_window(round) >= self.max_delay);
        if stop {
            self.announced = false;
        }
        stop
    }

    /// Counts a fair waiter's lost round (`unrefused`: one that no node refused, a head's
    /// that found the key free) and says whether it steps back now: after
    /// [`HEAD_LOSSES_BEFORE_STEPPING_BACK`] such losses in a row, unless the deadline is
    /// within three node timeouts (`remaining`): the call's own leave comes then anyway,
    /// and the step-back must not hold its return up.
    pub(super) fn head_lost(&mut self, unrefused: bool, remaining: Option<Duration>) -> bool {
        if unrefused {
            self.unrefused_losses = self.unrefused_losses.saturating_add(1);
        } else {
            self.unrefused_losses = 0;
        }
        let room = remaining.is_none_or(|left| left > self.node_timeout.saturating_mul(3));
        let step_back = room && self.unrefused_losses >= HEAD_LOSSES_BEFORE_STEPPING_BACK;
        if step_back {
            self.unrefused_losses = 0;
        }
        step_back
    }

    /// The pause before the next attempt: `drawn` from the backoff (`None`: it ran out, so
    /// `max_delay`), after attempt number `attempts`, adjusted by the rules below, and cut to
    /// end at the deadline (`remaining` until it).
    ///
    /// - **First queuing** (`queued_to_be_woken`, a waiter that queues only to be woken,
    ///   after its first attempt): the attempt that queues it comes after the backoff's
    ///   first delay, as a polling waiter's would, but no later than a node timeout, so
    ///   that a long backoff does not put off its wake-ups. A release of a plain lock is
    ///   announced only to the queue's next waiter, so a release within that delay is
    ///   found by the attempt itself, and one after it names this waiter when it is next.
    ///   Queuing at once costs a contended call a round and a leave more than polling,
    ///   which short holds taken back at once do not repay.
    /// - **A fair waiter's turn** (fair, not woken, its last loss refused, every subscriber
    ///   up): it is woken when its turn comes, so until then it tries again only at
    ///   `max_delay`, which refreshes its place well within its patience and still finds a
    ///   key whose holder expired or a head that died; at the backoff's early delays every
    ///   waiter in the queue would run a refused round per delay. Within half a TTL all the
    ///   same: a hand-over's validity counts from the attempt that registered it, so a
    ///   waiter whose turn came late in a pause as long as the TTL would be handed a key
    ///   with little validity left. An attempt that lost after a wake-up keeps the backoff
    ///   (nothing may announce the key again), and so does a head whose round no node
    ///   refused (it steps back within a few short delays, not `max_delay`s).
    pub(super) fn delay(
        &self,
        drawn: Option<Duration>,
        attempts: u32,
        queued_to_be_woken: bool,
        all_subscribed: impl FnOnce() -> bool,
        remaining: Option<Duration>,
    ) -> Duration {
        let mut delay = drawn.unwrap_or(self.max_delay);
        if attempts == 1 && queued_to_be_woken && !self.fair {
            delay = delay.min(self.node_timeout);
        }
        if self.fair && !self.woken && self.unrefused_losses == 0 && all_subscribed() {
            delay = delay.max(self.max_delay).min(self.ttl / 2);
        }
        until(delay, remaining)
    }

    /// The window a woken (not fair) waiter's pause is drawn from, after a round of
    /// `round`'s duration (see [`wake_window`]).
    pub(super) fn wake_window(&self, round: Duration) -> Duration {
        wake_window(round, self.woken_losses, self.max_delay)
    }

    /// How long a fair waiter woken by the first nodes that handed it the key waits for the
    /// others (they normally follow within a round trip): a node timeout, not past the
    /// deadline. After it, it tries again at once: its round takes on the keys handed to
    /// it.
    pub(super) fn handover_grace(&self, remaining: Option<Duration>) -> Duration {
        until(self.node_timeout, remaining)
    }
}

/// `delay`, cut to end at the deadline (`remaining` until it; `None`: no deadline).
pub(super) fn until(delay: Duration, remaining: Option<Duration>) -> Duration {
    match remaining {
        Some(left) => delay.min(left),
        None => delay,
    }
}

/// The window a woken waiter's pause is drawn from: its last round's duration, doubled for
/// each of its call's woken attempts that lost, up to the retry policy's `max_delay` (or
/// one round, when that is longer).
///
/// One waiter per client is woken, but the waiters of other clients hear the same release
/// at the same instant; sent all at once, their rounds split the vote and all lose. A
/// random pause spreads them out, so the first one through wins and the rest see the key
/// held. Many clients on one key need a window of about one round per client, which the
/// doubling reaches without knowing their number (binary exponential backoff, as on a
/// shared Ethernet).
pub(super) fn wake_window(round: Duration, woken_losses: u32, max_delay: Duration) -> Duration {
    round
        .saturating_mul(1 << woken_losses.min(31))
        .min(max_delay.max(round))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn schedule(fair: bool) -> Schedule {
        let retry = RetryPolicy {
            max_delay: 400 * MS,
            ..RetryPolicy::default()
        };
        Schedule::new(fair, &retry, 50 * MS, 10_000 * MS)
    }

    #[test]
    fn the_wake_window_doubles_with_each_woken_loss_up_to_the_largest_backoff_delay() {
        let round = Duration::from_micros(250);
        let max = Duration::from_secs(1);
        assert_eq!(wake_window(round, 0, max), round);
        assert_eq!(wake_window(round, 1, max), round * 2);
        assert_eq!(wake_window(round, 5, max), round * 32);
        assert_eq!(wake_window(round, 6, max), round * 64);
        // 250 µs * 2^12 is past 1 s: the window stops there, as the backoff does.
        assert_eq!(wake_window(round, 12, max), max);
        assert_eq!(wake_window(round, u32::MAX, max), max);
        // A round longer than `max_delay` is still one window.
        assert_eq!(wake_window(max * 2, 0, max), max * 2);
        assert_eq!(wake_window(Duration::MAX, 6, max), Duration::MAX);
        assert_eq!(wake_window(Duration::ZERO, 3, max), Duration::ZERO);
    }

    #[test]
    fn a_loss_without_a_wake_up_counts_for_nothing() {
        let mut s = schedule(false);
        assert!(!s.lost_after_wake(MS));
        assert_eq!(s.wake_window(MS), MS);
        assert!(s.announced);
    }

    #[test]
    fn a_waiter_woken_twice_in_vain_stops_being_announced() {
        let mut s = schedule(false);
        s.woken = true;
        assert!(!s.lost_after_wake(MS), "one unlucky loss keeps the wake-up");
        assert_eq!(s.wake_window(MS), 2 * MS);
        assert!(s.lost_after_wake(MS));
        assert!(!s.announced);
        // Said once: it has left the queue already.
        assert!(!s.lost_after_wake(MS));
    }

    #[test]
    fn a_pause_window_grown_to_the_longest_delay_stops_the_announcements_at_once() {
        let mut s = schedule(false);
        s.woken = true;
        // A round of half `max_delay`, doubled once: the window is `max_delay`.
        assert!(s.lost_after_wake(200 * MS));
        assert!(!s.announced);
    }

    #[test]
    fn a_fair_waiter_stays_announced_however_often_it_loses_after_a_wake_up() {
        let mut s = schedule(true);
        s.woken = true;
        for _ in 0..10 {
            assert!(!s.lost_after_wake(400 * MS));
        }
        assert!(s.announced);
    }

    #[test]
    fn a_head_steps_back_after_three_unrefused_losses_in_a_row() {
        let mut s = schedule(true);
        assert!(!s.head_lost(true, None));
        assert!(!s.head_lost(true, None));
        assert!(s.head_lost(true, None));
        // The count starts again after a step-back...
        assert!(!s.head_lost(true, None));
        // ...and after a refused round.
        assert!(!s.head_lost(false, None));
        assert!(!s.head_lost(true, None));
        assert!(!s.head_lost(true, None));
        assert!(s.head_lost(true, None));
    }

    #[test]
    fn a_head_does_not_step_back_within_three_node_timeouts_of_the_deadline() {
        let mut s = schedule(true);
        assert!(!s.head_lost(true, Some(150 * MS)));
        assert!(!s.head_lost(true, Some(150 * MS)));
        assert!(
            !s.head_lost(true, Some(150 * MS)),
            "no room: the call's own leave comes soon"
        );
        // With room again, the losses counted meanwhile are still there.
        assert!(s.head_lost(true, Some(151 * MS)));
    }

    #[test]
    fn the_backoff_delay_is_used_as_drawn_and_max_delay_when_it_runs_out() {
        let s = schedule(false);
        assert_eq!(s.delay(Some(7 * MS), 2, true, || true, None), 7 * MS);
        assert_eq!(s.delay(None, 2, true, || true, None), 400 * MS);
    }

    #[test]
    fn a_waiter_queued_to_be_woken_queues_within_a_node_timeout() {
        let s = schedule(false);
        assert_eq!(s.delay(Some(300 * MS), 1, true, || true, None), 50 * MS);
        assert_eq!(s.delay(Some(30 * MS), 1, true, || true, None), 30 * MS);
        // Only its first pause; and only a waiter that queues.
        assert_eq!(s.delay(Some(300 * MS), 2, true, || true, None), 300 * MS);
        assert_eq!(s.delay(Some(300 * MS), 1, false, || true, None), 300 * MS);
    }

    #[test]
    fn a_fair_waiter_waits_for_its_turn_at_the_longest_delay_within_half_a_ttl() {
        let mut s = schedule(true);
        assert_eq!(s.delay(Some(MS), 1, false, || true, None), 400 * MS);
        // Not when a subscriber is down: no wake-up may come.
        assert_eq!(s.delay(Some(MS), 1, false, || false, None), MS);
        // Within half a TTL.
        s.ttl = 600 * MS;
        assert_eq!(s.delay(Some(MS), 1, false, || true, None), 300 * MS);
        // Not after a wake-up that lost.
        s.woken = true;
        assert_eq!(s.delay(Some(MS), 1, false, || true, None), MS);
        // Nor after a loss no node refused.
        s.woken = false;
        s.head_lost(true, None);
        assert_eq!(s.delay(Some(MS), 1, false, || true, None), MS);
    }

    #[test]
    fn every_pause_ends_at_the_deadline() {
        let s = schedule(true);
        assert_eq!(s.delay(Some(MS), 1, false, || true, Some(20 * MS)), 20 * MS);
        assert_eq!(
            s.delay(Some(MS), 1, false, || true, Some(Duration::ZERO)),
            Duration::ZERO
        );
        assert_eq!(s.handover_grace(None), 50 * MS);
        assert_eq!(s.handover_grace(Some(10 * MS)), 10 * MS);
        assert_eq!(until(5 * MS, None), 5 * MS);
    }
}

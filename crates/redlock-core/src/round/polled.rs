//! Sets of futures polled together on one task's waker: a small one polled whole at each
//! wake-up (a round's commands, one per node, and its rollbacks), and a larger one whose
//! futures are polled when they woke it (a cluster member's commands per hash slot). In a
//! file of its own: it knows nothing of rounds.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::task::{ArcWake, AtomicWaker};

use tokio::time::{Instant, Interval, MissedTickBehavior};

/// How long after one period a [`Polled::waking_every`] set first wakes: longer than it
/// takes to make and first poll a round's commands (microseconds), short beside a period
/// (a node timeout and a margin).
const FIRST_TICK_MARGIN: Duration = Duration::from_millis(2);

/// Futures polled together, all on the waker of the task that polls the set: a round's
/// commands (one per node) and its rollbacks. Every poll polls each pending future, which
/// for a handful costs less than `FuturesUnordered`'s task allocation for each future
/// pushed (and its own for each set made), which a round would pay several times per node.
pub(crate) struct Polled<F: Future + Unpin> {
    pending: Vec<F>,
    /// Finished, not yet taken, in the order they were found finished.
    ready: VecDeque<F::Output>,
    /// With [`waking_every`](Self::waking_every): the timer that wakes the polling task.
    tick: Option<Interval>,
}

impl<F: Future + Unpin> Polled<F> {
    pub(crate) fn new() -> Self {
        Polled::with_capacity(0)
    }

    /// A set for up to `n` futures without growing.
    pub(crate) fn with_capacity(n: usize) -> Self {
        Polled {
            pending: Vec::with_capacity(n),
            ready: VecDeque::with_capacity(n),
            tick: None,
        }
    }

    /// A set for up to `n` futures that wakes the task polling it at least every
    /// `period` while any is pending, so that each is polled that often: for futures that
    /// check a deadline of their own when polled, instead of each setting a timer (a
    /// round's commands, see `connection::Sending::InRound`). One timer for the set.
    ///
    /// The first wake-up comes [`FIRST_TICK_MARGIN`] after one period: the set is made
    /// just before its futures, so their deadlines (one period after each was made) fall
    /// a little after one period from now, and a first wake-up right at it would find
    /// them not yet due and leave them to the next, a whole period later.
    pub(crate) fn waking_every(n: usize, period: Duration) -> Self {
        // `interval_at` takes no zero period.
        let period = period.max(Duration::from_millis(1));
        let first = Instant::now() + period + FIRST_TICK_MARGIN;
        let mut tick = tokio::time::interval_at(first, period);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Polled {
            tick: Some(tick),
            ..Polled::with_capacity(n)
        }
    }

    pub(crate) fn push(&mut self, future: F) {
        self.pending.push(future);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.ready.is_empty()
    }

    /// Polls every pending future (so that each is registered with this task's waker,
    /// also right after the set moved to another task), then yields one finished
    /// output; `None` once none is left.
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        if let Some(tick) = self.tick.as_mut().filter(|_| !self.pending.is_empty()) {
            // Until it is pending again, so that it wakes this task at the next tick.
            while tick.poll_tick(cx).is_ready() {}
        }
        let mut i = 0;
        while i < self.pending.len() {
            match Pin::new(&mut self.pending[i]).poll(cx) {
                Poll::Ready(output) => {
                    self.ready.push_back(output);
                    drop(self.pending.swap_remove(i));
                }
                Poll::Pending => i += 1,
            }
        }
        match self.ready.pop_front() {
            Some(output) => Poll::Ready(Some(output)),
            None if self.pending.is_empty() => Poll::Ready(None),
            None => Poll::Pending,
        }
    }

    pub(crate) async fn next(&mut self) -> Option<F::Output> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }
}

/// Many futures polled together on the task that polls the set, each only once it woke
/// the set, or every one at a wake-up that none of them made (the first poll, a
/// [`waking_every`](Polled::waking_every) tick of the round): a [`Polled`] polls every
/// pending future at each wake-up, which for a `PerSlot` command's parts (up to a round's
/// requests) would cost the square of their number; and futures that check a deadline of
/// their own when polled (see `connection::Sending::InRound`) are still polled at each
/// tick.
pub(crate) struct Swept<F: Future + Unpin> {
    futures: Vec<F>,
    outputs: Vec<Option<F::Output>>,
    /// Each future's waker: it marks the future woken, then wakes the set's task.
    wakers: Vec<Waker>,
    woken: Arc<Woken>,
}

/// Which of a [`Swept`] set's futures woke it since its last poll, and the task to wake.
struct Woken {
    task: AtomicWaker,
    any: AtomicBool,
    each: Vec<AtomicBool>,
}

/// The waker of a [`Swept`] set's future number `index`.
struct Part {
    woken: Arc<Woken>,
    index: usize,
}

impl ArcWake for Part {
    fn wake_by_ref(part: &Arc<Self>) {
        part.woken.each[part.index].store(true, Ordering::Release);
        part.woken.any.store(true, Ordering::Release);
        part.woken.task.wake();
    }
}

impl<F: Future + Unpin> Swept<F> {
    pub(crate) fn new(futures: Vec<F>) -> Self {
        let woken = Arc::new(Woken {
            task: AtomicWaker::new(),
            any: AtomicBool::new(false),
            each: futures.iter().map(|_| AtomicBool::new(false)).collect(),
        });
        let wakers = (0..futures.len())
            .map(|index| {
                futures::task::waker(Arc::new(Part {
                    woken: woken.clone(),
                    index,
                }))
            })
            .collect();
        Swept {
            outputs: futures.iter().map(|_| None).collect(),
            futures,
            wakers,
            woken,
        }
    }

    /// Polls the futures that woke the set (every pending one when none did); every
    /// output, in the futures' order, once all are finished.
    pub(crate) fn poll_all(&mut self, cx: &mut Context<'_>) -> Poll<Vec<F::Output>> {
        self.woken.task.register(cx.waker());
        let sweep = !self.woken.any.swap(false, Ordering::AcqRel);
        let mut pending = false;
        for (i, (future, output)) in self.futures.iter_mut().zip(&mut self.outputs).enumerate() {
            if output.is_some() {
                continue;
            }
            let woken = self.woken.each[i].swap(false, Ordering::AcqRel);
            if !(sweep || woken) {
                pending = true;
                continue;
            }
            match Pin::new(future).poll(&mut Context::from_waker(&self.wakers[i])) {
                Poll::Ready(out) => *output = Some(out),
                Poll::Pending => pending = true,
            }
        }
        if pending {
            return Poll::Pending;
        }
        Poll::Ready(self.outputs.iter_mut().filter_map(Option::take).collect())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A set first polled on one task (a round, with a no-op waker) and then driven by
    /// another (the background task) is woken by whichever future finishes, the last one
    /// pushed too: each poll registers every pending future with the current waker.
    /// A future that only checks a deadline when polled (as a round's command checks its
    /// backstop) and never wakes its task itself is polled again, and finishes, at the
    /// set's first wake-up after its deadline: a round with a command that fred never ends
    /// is still decided (see `connection::Sending::InRound`).
    #[tokio::test(start_paused = true)]
    async fn a_set_waking_every_period_finishes_futures_that_only_check_a_deadline() {
        let start = Instant::now();
        let deadline = start + Duration::from_millis(250);
        let overdue = std::future::poll_fn(move |_: &mut Context<'_>| {
            if Instant::now() >= deadline {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        });
        let mut set = Polled::waking_every(1, Duration::from_millis(100));
        set.push(Box::pin(overdue));
        // Bounded, so that a set that never wakes fails here instead of hanging.
        let finished = tokio::time::timeout(Duration::from_secs(10), set.next()).await;
        assert_eq!(finished, Ok(Some(())));
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(250) && took <= Duration::from_millis(302),
            "finished after {took:?}: expected at the first wake-up after 250 ms (302 ms)"
        );
    }

    /// A future made just after its set, whose deadline is one period from then (a
    /// round's command and its backstop), finishes at the set's first wake-up, not a
    /// period later.
    #[tokio::test(start_paused = true)]
    async fn a_future_due_one_period_after_the_set_was_made_finishes_at_its_first_wake_up() {
        let period = Duration::from_millis(100);
        let start = Instant::now();
        let mut set = Polled::waking_every(1, period);
        let deadline = start + period + Duration::from_micros(50);
        let due = std::future::poll_fn(move |_: &mut Context<'_>| {
            if Instant::now() >= deadline {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        });
        set.push(Box::pin(due));
        let finished = tokio::time::timeout(Duration::from_secs(10), set.next()).await;
        assert_eq!(finished, Ok(Some(())));
        let took = start.elapsed();
        assert!(
            took < 2 * period,
            "finished after {took:?}: at the second wake-up, not the first"
        );
    }

    /// A swept set polls only the futures that woke it, and every pending one at a
    /// wake-up that none of them made (as the round's tick is).
    #[test]
    fn a_swept_set_polls_the_futures_that_woke_it_or_all_at_a_wake_up_of_its_own() {
        use std::sync::atomic::AtomicUsize;
        let polls: Arc<Vec<AtomicUsize>> = Arc::new((0..3).map(|_| AtomicUsize::new(0)).collect());
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..3)
            .map(|_| tokio::sync::oneshot::channel::<usize>())
            .unzip();
        let futures: Vec<_> = receivers
            .into_iter()
            .enumerate()
            .map(|(i, mut receiver)| {
                let polls = polls.clone();
                std::future::poll_fn(move |cx: &mut Context<'_>| {
                    polls[i].fetch_add(1, Ordering::SeqCst);
                    Pin::new(&mut receiver).poll(cx).map(Result::unwrap)
                })
            })
            .map(Box::pin)
            .collect();
        let counts = || -> Vec<usize> { polls.iter().map(|p| p.load(Ordering::SeqCst)).collect() };
        let mut set = Swept::new(futures);
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        assert!(set.poll_all(&mut cx).is_pending());
        assert_eq!(counts(), [1, 1, 1], "the first poll polls every one");
        let mut senders: Vec<_> = senders.into_iter().map(Some).collect();
        senders[1].take().unwrap().send(1).unwrap();
        assert!(set.poll_all(&mut cx).is_pending());
        assert_eq!(counts(), [1, 2, 1], "only the one that woke");
        assert!(set.poll_all(&mut cx).is_pending());
        assert_eq!(counts(), [2, 2, 2], "none woke: every pending one");
        for (i, sender) in senders.into_iter().enumerate() {
            if let Some(sender) = sender {
                sender.send(i).unwrap();
            }
        }
        assert_eq!(set.poll_all(&mut cx), Poll::Ready(vec![0, 1, 2]));
    }

    #[tokio::test]
    async fn a_set_moved_to_another_task_is_woken_by_any_of_its_futures() {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..3)
            .map(|_| tokio::sync::oneshot::channel::<usize>())
            .unzip();
        let mut set = Polled::with_capacity(3);
        for receiver in receivers {
            set.push(receiver);
        }
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        assert!(set.poll_next(&mut cx).is_pending());
        let task = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(value) = set.next().await {
                got.push(value.unwrap());
            }
            got
        });
        // The last first, after the task has waited: the others are still pending then.
        for (i, sender) in senders.into_iter().enumerate().rev() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            sender.send(i).unwrap();
        }
        let got = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("a finished future never woke the set")
            .unwrap();
        assert_eq!(got, vec![2, 1, 0]);
    }
}

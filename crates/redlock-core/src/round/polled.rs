//! Sets of futures polled together on one task: a round's commands (one per node) and its
//! rollbacks ([`Polled`]), and a cluster member's commands per hash slot ([`Swept`]). Each
//! future has a waker of its own, which marks it woken and wakes the task polling the set,
//! so that a wake-up polls the futures that woke it, not every pending one: polling every
//! pending command again at each other node's answer would be about half of a round's
//! polls, each walking the command's layers down to fred's timer and reply channel.
//! In a file of its own: it knows nothing of rounds.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::task::{ArcWake, AtomicWaker};

use tokio::time::{Instant, Interval, MissedTickBehavior};

/// How long after one period a [`Polled::waking_every`] set first wakes: longer than it
/// takes to make and first poll a round's commands (microseconds), short beside a period
/// (a node timeout and a margin).
const FIRST_TICK_MARGIN: Duration = Duration::from_millis(2);

/// Which of a set's futures woke it since its last poll, and the task to wake: a bit per
/// future, by its index modulo 64. Futures that share a bit (a set of more than 64) are
/// polled together: one more poll, never a wake-up lost.
struct Woken {
    task: AtomicWaker,
    bits: AtomicU64,
}

impl Woken {
    fn new() -> Arc<Self> {
        Arc::new(Woken {
            task: AtomicWaker::new(),
            bits: AtomicU64::new(0),
        })
    }

    /// Registers the task of `cx` as the one to wake, then takes the bits of the futures
    /// that woke since the last call (registered first: a wake-up in between is then seen
    /// now or wakes the task again, never lost).
    fn take(&self, cx: &Context<'_>) -> u64 {
        self.task.register(cx.waker());
        self.bits.swap(0, Ordering::AcqRel)
    }
}

/// The bit of a set's future number `index`.
fn bit(index: usize) -> u64 {
    1 << (index % 64)
}

/// The waker of one future of a set: it marks the future's bit, then wakes the set's task.
struct Part {
    woken: Arc<Woken>,
    bit: u64,
}

impl ArcWake for Part {
    fn wake_by_ref(part: &Arc<Self>) {
        part.woken.bits.fetch_or(part.bit, Ordering::AcqRel);
        part.woken.task.wake();
    }
}

fn part(woken: &Arc<Woken>, index: usize) -> Waker {
    futures::task::waker(Arc::new(Part {
        woken: woken.clone(),
        bit: bit(index),
    }))
}

/// A [`Polled`] set's wakers: its [`Woken`], and a waker per future by index, made as
/// futures are pushed. Kept when the set is dropped, for the next set made ([`KEPT`]): a
/// round's commands and its rollbacks each need a waker per future, and making them anew
/// cost six allocations per round (about 4k instructions per uncontended lock and
/// release).
struct Wakers {
    woken: Arc<Woken>,
    parts: Vec<Waker>,
}

impl Wakers {
    fn new() -> Self {
        Wakers {
            woken: Woken::new(),
            parts: Vec::new(),
        }
    }

    /// The waker of future number `index`.
    fn part(&mut self, index: usize) -> &Waker {
        while self.parts.len() <= index {
            let next = part(&self.woken, self.parts.len());
            self.parts.push(next);
        }
        &self.parts[index]
    }
}

/// Dropped sets' [`Wakers`], for the next sets made. One list for the process, not one
/// per thread: a round's set is made on its caller's thread and dropped on the thread of
/// its background work, so lists per thread filled on one side and stayed empty on the
/// other. The lock is held for a push or a pop, twice per round.
struct Kept(Mutex<Vec<Wakers>>);

/// How many sets' [`Wakers`] are kept: more than enough for the rounds that end at any
/// one moment; a set beyond them makes its own.
const KEPT_AT_MOST: usize = 64;

static KEPT: Kept = Kept(Mutex::new(Vec::new()));

impl Kept {
    /// Wakers kept, else new ones.
    fn take(&self) -> Wakers {
        let kept = self.0.lock().ok().and_then(|mut kept| kept.pop());
        kept.unwrap_or_else(Wakers::new)
    }

    /// Keeps `wakers` for the next set, cleared: no task to wake, no future marked. A
    /// waker of theirs still held somewhere (fred keeps a command's waker until its reply
    /// channel is gone) can only wake that next set for nothing: a poll of a future that
    /// is not ready, never a wake-up lost.
    fn keep(&self, wakers: Wakers) {
        drop(wakers.woken.task.take());
        wakers.woken.bits.store(0, Ordering::Release);
        if let Ok(mut kept) = self.0.lock() {
            if kept.len() < KEPT_AT_MOST {
                kept.push(wakers);
            }
        }
    }
}

/// Futures polled together on the task that polls the set, each when it woke the set: a
/// round's commands (one per node) and its rollbacks. A handful each, so they are kept in
/// a vector and walked at each wake-up; `FuturesUnordered` would allocate a task for each
/// future pushed (and its own for each set made), which a round would pay several times
/// per node. Each future is polled first when it is pushed; the set may then move to
/// another task (a round's background work), which its next poll registers.
pub(crate) struct Polled<F: Future + Unpin> {
    /// Pending futures, each with its index (its waker's in `wakers`).
    pending: Vec<(F, usize)>,
    /// Finished, not yet taken, in the order they were found finished.
    ready: VecDeque<F::Output>,
    /// With [`waking_every`](Self::waking_every): the timer that wakes the polling task,
    /// and then every pending future is polled.
    tick: Option<Interval>,
    /// Taken at the first push: a set that stays empty takes none.
    wakers: Option<Wakers>,
    pushed: usize,
}

impl<F: Future + Unpin> Drop for Polled<F> {
    fn drop(&mut self) {
        // The futures first: they hold clones of the wakers.
        self.pending.clear();
        if let Some(wakers) = self.wakers.take() {
            KEPT.keep(wakers);
        }
    }
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
            wakers: None,
            pushed: 0,
        }
    }

    /// A set for up to `n` futures that wakes the task polling it at least every
    /// `period` while any is pending, and then polls every pending one: for futures that
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
        let mut set = Polled::with_capacity(n);
        set.tick = Some(tick);
        set
    }

    /// Polls `future` once now, with its own waker (a round's command is handed to its
    /// node's connection by it, in the order the commands are pushed): its output if it
    /// finished at once, else it is kept, and polled again when it wakes the set.
    pub(crate) fn push(&mut self, mut future: F) -> Option<F::Output> {
        let index = self.pushed;
        self.pushed += 1;
        let waker = self.wakers.get_or_insert_with(|| KEPT.take()).part(index);
        match Pin::new(&mut future).poll(&mut Context::from_waker(waker)) {
            Poll::Ready(output) => Some(output),
            Poll::Pending => {
                self.pending.push((future, index));
                None
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.ready.is_empty()
    }

    /// Yields one finished output; `None` once none is left. An output already found
    /// finished is yielded without polling anything. Otherwise it polls the futures that
    /// woke the set since its last poll (every pending one when the set's tick fired),
    /// after registering this task as the one their wakers wake.
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        if let Some(output) = self.ready.pop_front() {
            return Poll::Ready(Some(output));
        }
        let Some(wakers) = self.wakers.as_ref().filter(|_| !self.pending.is_empty()) else {
            return Poll::Ready(None);
        };
        let mut bits = wakers.woken.take(cx);
        if let Some(tick) = self.tick.as_mut() {
            // Until it is pending again, so that it wakes this task at the next tick.
            while tick.poll_tick(cx).is_ready() {
                bits = u64::MAX;
            }
        }
        let mut i = 0;
        while i < self.pending.len() {
            let (future, index) = &mut self.pending[i];
            if bit(*index) & bits == 0 {
                i += 1;
                continue;
            }
            match Pin::new(future).poll(&mut Context::from_waker(&wakers.parts[*index])) {
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
/// [`waking_every`](Polled::waking_every) tick of the round): a `PerSlot` command's parts
/// (up to a round's requests), all of whose outputs are wanted together; futures that
/// check a deadline of their own when polled (see `connection::Sending::InRound`) are
/// still polled at each tick.
pub(crate) struct Swept<F: Future + Unpin> {
    futures: Vec<F>,
    outputs: Vec<Option<F::Output>>,
    /// Each future's waker.
    wakers: Vec<Waker>,
    woken: Arc<Woken>,
}

impl<F: Future + Unpin> Swept<F> {
    pub(crate) fn new(futures: Vec<F>) -> Self {
        let woken = Woken::new();
        let wakers = (0..futures.len()).map(|i| part(&woken, i)).collect();
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
        let bits = self.woken.take(cx);
        let sweep = bits == 0;
        let mut pending = false;
        for (i, (future, output)) in self.futures.iter_mut().zip(&mut self.outputs).enumerate() {
            if output.is_some() {
                continue;
            }
            if !(sweep || bits & bit(i) != 0) {
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
        assert!(set.push(Box::pin(overdue)).is_none());
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
        assert!(set.push(Box::pin(due)).is_none());
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

    /// A set's wake-up polls only the futures that woke it, every pending one at its
    /// tick, and an output already found finished is taken without polling anything.
    #[tokio::test(start_paused = true)]
    async fn a_set_polls_the_futures_that_woke_it_and_every_one_at_its_tick() {
        use std::sync::atomic::AtomicUsize;
        let polls: Arc<Vec<AtomicUsize>> = Arc::new((0..3).map(|_| AtomicUsize::new(0)).collect());
        let counts = || -> Vec<usize> { polls.iter().map(|p| p.load(Ordering::SeqCst)).collect() };
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..3)
            .map(|_| tokio::sync::oneshot::channel::<usize>())
            .unzip();
        let period = Duration::from_millis(100);
        let mut set = Polled::waking_every(3, period);
        for (i, mut receiver) in receivers.into_iter().enumerate() {
            let polls = polls.clone();
            let future = std::future::poll_fn(move |cx: &mut Context<'_>| {
                polls[i].fetch_add(1, Ordering::SeqCst);
                Pin::new(&mut receiver).poll(cx).map(Result::unwrap)
            });
            assert!(set.push(Box::pin(future)).is_none());
        }
        assert_eq!(counts(), [1, 1, 1], "each polled once when pushed");
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        assert!(set.poll_next(&mut cx).is_pending());
        assert_eq!(counts(), [1, 1, 1], "none woke: none polled");
        let mut senders: Vec<_> = senders.into_iter().map(Some).collect();
        senders[0].take().unwrap().send(0).unwrap();
        senders[2].take().unwrap().send(2).unwrap();
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(Some(0)));
        assert_eq!(counts(), [2, 1, 2], "only the two that woke");
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(Some(2)));
        assert_eq!(counts(), [2, 1, 2], "the second output was found already");
        assert!(set.poll_next(&mut cx).is_pending());
        assert_eq!(counts(), [2, 1, 2]);
        tokio::time::advance(period + FIRST_TICK_MARGIN).await;
        assert!(set.poll_next(&mut cx).is_pending());
        assert_eq!(counts(), [2, 2, 2], "the tick polls every pending one");
        senders[1].take().unwrap().send(1).unwrap();
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(Some(1)));
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(None));
    }

    /// Kept wakers serve the next set, cleared; a waker of the old set still held
    /// somewhere wakes the new one for nothing (a poll of a future that is not ready), and
    /// the new set's own wake-ups still come through.
    #[test]
    fn kept_wakers_serve_the_next_set_and_an_old_waker_only_costs_a_poll() {
        use std::sync::atomic::AtomicUsize;
        // A list of its own: the process's is shared with the tests running beside.
        let kept = Kept(Mutex::new(Vec::new()));
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        let mut old = kept.take();
        let stale = old.part(0).clone();
        stale.wake_by_ref();
        let woken = old.woken.clone();
        kept.keep(old);
        assert_eq!(woken.bits.load(Ordering::SeqCst), 0, "kept cleared");

        let polls = Arc::new(AtomicUsize::new(0));
        let (sender, mut receiver) = tokio::sync::oneshot::channel::<usize>();
        let counted = polls.clone();
        let future = std::future::poll_fn(move |cx: &mut Context<'_>| {
            counted.fetch_add(1, Ordering::SeqCst);
            Pin::new(&mut receiver).poll(cx).map(Result::unwrap)
        });
        let mut set = Polled::with_capacity(1);
        set.wakers = Some(kept.take());
        assert!(
            Arc::ptr_eq(&set.wakers.as_ref().unwrap().woken, &woken),
            "reused"
        );
        assert!(set.push(Box::pin(future)).is_none());
        assert!(set.poll_next(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 1);
        stale.wake();
        assert!(set.poll_next(&mut cx).is_pending());
        assert_eq!(
            polls.load(Ordering::SeqCst),
            2,
            "woken for nothing: one poll"
        );
        sender.send(7).unwrap();
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(Some(7)));
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(None));
    }

    /// A set first polled on one task (a round) and then driven by another (the
    /// background task) is woken by whichever future finishes, the last one pushed too:
    /// each poll registers the polling task as the one its futures' wakers wake.
    #[tokio::test]
    async fn a_set_moved_to_another_task_is_woken_by_any_of_its_futures() {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..3)
            .map(|_| tokio::sync::oneshot::channel::<usize>())
            .unzip();
        let mut set = Polled::with_capacity(3);
        for receiver in receivers {
            assert!(set.push(receiver).is_none());
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

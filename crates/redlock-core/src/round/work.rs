//! A coordinator's background work (commands still in flight after their round's decision,
//! rollbacks, background releases): counted, so that callers can wait for it to drain, and
//! run in the runtime the coordinator was connected in. Apart from the rounds, whose
//! leftovers are one kind of it.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;

/// Counts a coordinator's background work (commands still in flight, rollbacks,
/// background releases), so that callers can wait for it to drain, and runs it in the
/// runtime the coordinator was connected in.
#[derive(Debug, Clone)]
pub(crate) struct BackgroundWork(Arc<watch::Sender<usize>>, tokio::runtime::Handle);

impl BackgroundWork {
    /// Background work run in `runtime`: the coordinator's, whose tasks its connections
    /// are.
    pub(crate) fn new(runtime: tokio::runtime::Handle) -> Self {
        BackgroundWork(Arc::new(watch::Sender::new(0)), runtime)
    }

    /// Runs `task` in the coordinator's runtime, not the caller's: a caller may run in
    /// another runtime, one shutting down (its tasks dropping their guards and rounds),
    /// which would drop the task unrun. Dropped too if the coordinator's runtime has shut
    /// down (its connections are gone with it).
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        drop(self.1.spawn(task));
    }

    /// Counts one piece of work until the returned guard is dropped.
    ///
    /// Only the count's return to zero notifies: [`idle`](Self::idle) is the one waiter,
    /// and each notification of a `watch` takes eight locks (its wake lists), on every
    /// round's hand-off.
    pub(crate) fn enter(&self) -> WorkGuard {
        self.0.send_if_modified(|n| {
            *n += 1;
            false
        });
        WorkGuard(self.0.clone())
    }

    pub(crate) async fn idle(&self) {
        let _ = self.0.subscribe().wait_for(|n| *n == 0).await;
    }
}

/// One piece of background work, counted while it lives.
pub(crate) struct WorkGuard(Arc<watch::Sender<usize>>);

impl Drop for WorkGuard {
    /// Notifies only at the return to zero, and only while somebody waits (a receiver
    /// exists only inside [`BackgroundWork::idle`]): most rounds' work drains with nobody
    /// waiting, and the notification took most of this drop. A waiter that subscribes
    /// after the count's change reads the new count first, so it misses nothing (the
    /// change and its subscription are ordered by the channel's lock).
    fn drop(&mut self) {
        let sender = &self.0;
        sender.send_if_modified(|n| {
            *n -= 1;
            *n == 0 && sender.receiver_count() > 0
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A waiter already in `idle` when the last piece of work ends is woken (the count
    /// notifies a waiter at zero), and one that comes after it returns at once (it reads
    /// the count, which changed without a notification).
    #[tokio::test]
    async fn idle_returns_when_the_work_drains_whether_it_waited_first_or_came_after() {
        let work = BackgroundWork::new(tokio::runtime::Handle::current());
        let (first, second) = (work.enter(), work.enter());
        let waiting = tokio::spawn({
            let work = work.clone();
            async move { work.idle().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "idle returned with work left");
        drop(first);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "idle returned with one piece left");
        drop(second);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("a waiter in idle was not woken when the work drained")
            .unwrap();

        let third = work.enter();
        drop(third);
        tokio::time::timeout(Duration::from_secs(5), work.idle())
            .await
            .expect("idle after the work drained with nobody waiting did not return");
    }
}

//! A round's settling: what its late answers and rollbacks keep filling in after the
//! decision, written by the round and its background work ([`SettlingWriter`]) and
//! waited for by its reports ([`SettlingView`], `RoundReport::settled`).
//!
//! Readers wait for one thing only, the close (every node answered or timed out, every
//! rollback over), or for the writers to be gone (the runtime dropped the work): so one
//! lock and one wake list, woken at the close. A `tokio::sync::watch` would take its eight
//! wake lists' locks at each notification (the close, the sender's drop), twice per round,
//! for readers that are mostly none (see `docs/benchmarks.md`, instructions per cycle).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use super::NodeReport;

/// Each request's node reports, and how many nodes are still open.
#[derive(Debug, Clone)]
pub(crate) struct Settling {
    pub(crate) requests: Vec<Vec<NodeReport>>,
    pub(crate) open: usize,
}

struct Shared {
    state: Mutex<Settling>,
    /// Set when the last writer is gone: the state is final, closed or not.
    ended: AtomicBool,
    /// Woken at the close, and when the last writer is gone.
    closed: Notify,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, Settling> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The writers' handle, shared by the round and its background work (in an `Arc`): when
/// the last one goes, the settling ends for its readers, closed or not.
pub(crate) struct SettlingWriter(Arc<Shared>);

impl SettlingWriter {
    pub(crate) fn new(settling: Settling) -> Self {
        SettlingWriter(Arc::new(Shared {
            state: Mutex::new(settling),
            ended: AtomicBool::new(false),
            closed: Notify::new(),
        }))
    }

    /// Updates the settling, and wakes its readers if it closed.
    pub(crate) fn update(&self, f: impl FnOnce(&mut Settling)) {
        let closed = {
            let mut state = self.0.state();
            f(&mut state);
            state.open == 0
        };
        if closed {
            self.0.closed.notify_waiters();
        }
    }

    /// Request `j`'s node reports so far.
    pub(crate) fn nodes(&self, j: usize) -> Vec<NodeReport> {
        self.0.state().requests[j].clone()
    }

    /// Request `j`'s view, for its report.
    pub(crate) fn view(&self, j: usize) -> SettlingView {
        SettlingView {
            shared: self.0.clone(),
            index: j,
        }
    }
}

impl Drop for SettlingWriter {
    fn drop(&mut self) {
        self.0.ended.store(true, Ordering::SeqCst);
        self.0.closed.notify_waiters();
    }
}

/// One request's view of its round's [`Settling`].
#[derive(Clone)]
pub(crate) struct SettlingView {
    shared: Arc<Shared>,
    index: usize,
}

impl SettlingView {
    /// The request's node reports once the settling closed, or once its writers are gone.
    pub(crate) async fn settled(&self) -> Vec<NodeReport> {
        loop {
            // Registered before the state is read, so that a close in between still wakes.
            let mut notified = std::pin::pin!(self.shared.closed.notified());
            notified.as_mut().enable();
            {
                let state = self.shared.state();
                if state.open == 0 || self.shared.ended.load(Ordering::SeqCst) {
                    return state.requests[self.index].clone();
                }
            }
            notified.await;
        }
    }
}

/// Only what a reader of a report's `{:?}` can use (how many nodes are still to answer or
/// roll back), not the state's internals, which would fill a screen in every error.
impl fmt::Debug for SettlingView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let open = self.shared.state().open;
        f.debug_struct("Settling").field("open", &open).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::NodeName;

    fn two_open() -> SettlingWriter {
        SettlingWriter::new(Settling {
            requests: vec![vec![NodeReport::pending(NodeName::redacted(
                "redis://127.0.0.1:7001",
            ))]],
            open: 2,
        })
    }

    /// A reader waits for the close, and sees what was written before it.
    #[tokio::test]
    async fn a_view_settles_when_the_last_node_closes() {
        let writer = Arc::new(two_open());
        let view = writer.view(0);
        let waiting = tokio::spawn(async move { view.settled().await });
        writer.update(|s| s.open -= 1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "settled with a node still open");
        writer.update(|s| {
            s.requests[0][0].outcome = crate::NodeOutcome::HeldByOther;
            s.open -= 1;
        });
        let nodes = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the close woke no reader")
            .unwrap();
        assert_eq!(nodes[0].outcome, crate::NodeOutcome::HeldByOther);
        // Closed already: at once.
        assert_eq!(writer.view(0).settled().await.len(), 1);
    }

    /// Work that ends without closing (its runtime dropped it) still ends the wait.
    #[tokio::test]
    async fn a_view_settles_when_its_writers_are_gone() {
        let writer = two_open();
        let view = writer.view(0);
        let waiting = tokio::spawn(async move { view.settled().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(writer);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the writers' end woke no reader")
            .unwrap();
    }
}

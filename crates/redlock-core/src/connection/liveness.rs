//! Whether a client can still send: one flag shared by every node's connection, closed by
//! `shutdown` or when the tokio runtime the client was connected in shuts down. Apart from
//! the connection, since one value serves all of a client's connections.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crate::report::ClosedReason;

/// Whether a client (all of its connections) can still send: open until it is closed or
/// the tokio runtime it was connected in shuts down. A closed client's commands fail at
/// once with [`NodeOutcome::Closed`], never sent, instead of with fred's words for a
/// client whose tasks are gone ("Failed to send command to router", a server error to
/// look at) or for a connection that was quit.
///
/// [`NodeOutcome::Closed`]: crate::NodeOutcome::Closed
#[derive(Debug, Default)]
pub(crate) struct Liveness(AtomicU8);

impl Liveness {
    const OPEN: u8 = 0;
    const SHUTDOWN: u8 = 1;
    const RUNTIME_STOPPED: u8 = 2;

    /// Why the client is closed, or `None` while it is open.
    pub(crate) fn closed(&self) -> Option<ClosedReason> {
        match self.0.load(Ordering::Acquire) {
            Liveness::OPEN => None,
            Liveness::SHUTDOWN => Some(ClosedReason::Shutdown),
            _ => Some(ClosedReason::RuntimeStopped),
        }
    }

    /// Closes the client for `reason`; returns whether it was open (the first reason
    /// stays).
    pub(crate) fn close(&self, reason: ClosedReason) -> bool {
        let code = match reason {
            ClosedReason::Shutdown => Liveness::SHUTDOWN,
            ClosedReason::RuntimeStopped => Liveness::RUNTIME_STOPPED,
        };
        self.0
            .compare_exchange(Liveness::OPEN, code, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Closes `liveness` when the runtime this runs in shuts down: a task holds a guard
    /// that closes it when dropped (a runtime drops its tasks as it shuts down), until the
    /// returned sender is dropped (with the coordinator), when the task ends quietly.
    pub(crate) fn watch_runtime(liveness: &Arc<Liveness>) -> tokio::sync::oneshot::Sender<()> {
        struct CloseOnDrop(Option<std::sync::Weak<Liveness>>);
        impl CloseOnDrop {
            fn disarm(&mut self) {
                self.0 = None;
            }
        }
        impl Drop for CloseOnDrop {
            fn drop(&mut self) {
                if let Some(liveness) = self.0.take().and_then(|weak| weak.upgrade()) {
                    liveness.close(ClosedReason::RuntimeStopped);
                }
            }
        }
        let (owner, gone) = tokio::sync::oneshot::channel::<()>();
        let guard = CloseOnDrop(Some(Arc::downgrade(liveness)));
        tokio::spawn(async move {
            let mut guard = guard;
            // Only a dropped sender ends this: the coordinator is gone, nothing to close.
            let _ = gone.await;
            guard.disarm();
        });
        owner
    }
}

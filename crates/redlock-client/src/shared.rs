//! What every handle of one client shares: the coordinator, the configuration, the renewal
//! scheduler and the wake-up subscribers. The facade (`client.rs`), the acquisition
//! (`acquire/`) and the guards (which keep it alive) read it.

use redlock_core::Coordinator;

use crate::config::LockConfig;
use crate::notify::Notifier;
use crate::renew::Renewer;

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) core: Coordinator,
    pub(crate) config: LockConfig,
    pub(crate) renewer: Renewer,
    pub(crate) notifier: Option<Notifier>,
    /// The runtime it was connected in, whose tasks run its connections.
    runtime: tokio::runtime::Handle,
}

impl Inner {
    /// The shared state of a client connected in the current runtime.
    pub(crate) fn new(
        core: Coordinator,
        config: LockConfig,
        renewer: Renewer,
        notifier: Option<Notifier>,
    ) -> Self {
        Inner {
            core,
            config,
            renewer,
            notifier,
            runtime: tokio::runtime::Handle::current(),
        }
    }
}

impl Drop for Inner {
    /// The last client handle and the last guard are gone (guards hold the client): close
    /// the wake-up subscriptions, in the runtime the client was connected in, wherever the
    /// drop happens (on a plain thread, or in another runtime that is shutting down and
    /// would drop the task unrun); if that one has shut down, they are gone with it. The
    /// coordinator closes its own connections, once background work is done, when its
    /// last copy is gone: a copy the caller kept ([`Redlock::coordinator`](crate::Redlock::coordinator)) goes on
    /// working.
    fn drop(&mut self) {
        if let Some(notifier) = self.notifier.take() {
            self.runtime.spawn(async move { notifier.close().await });
        }
    }
}

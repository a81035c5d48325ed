//! What a scenario records: acquisitions, releases, extensions, writes to the protected value
//! and injected faults, each stamped with the lab's monotonic clock.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// A point on the lab's monotonic clock: the time since the scenario started.
pub type At = Duration;

/// One recorded event.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A client won a lock.
    Acquired {
        /// Which client (e.g. `"client-1"`).
        client: String,
        /// The lock's token.
        token: String,
        /// The locked key.
        key: String,
        /// When the acquisition round that won began (its `t0`, before its first command
        /// was sent), from the validity the library reported. Never later than that, so
        /// that ordering acquisitions by it never puts one after an acquisition that in
        /// fact overlapped it.
        started: At,
        /// When `lock()` returned (and a fenced lock's token had been handed out): never
        /// earlier than that.
        acquired: At,
        /// The end of the validity the library reported.
        valid_until: At,
        /// The fencing token, for a fenced acquisition.
        fencing: Option<u64>,
        /// The owner, for a hold of a reentrant lock: holds of one owner share the key.
        owner: Option<String>,
    },
    /// A holder started releasing: from here on it no longer claims the lock.
    ReleaseStarted {
        /// Which client.
        client: String,
        /// The token released.
        token: String,
        /// When the release call started.
        at: At,
    },
    /// An extension call by `client` with `token`, and whether it succeeded.
    Extend {
        /// Which client.
        client: String,
        /// The token it extended.
        token: String,
        /// When the call started.
        started: At,
        /// When it returned.
        ended: At,
        /// The new end of validity, if it succeeded.
        valid_until: Option<At>,
    },
    /// A read-modify-write of the protected value by the holder of `token`.
    Write {
        /// Which client.
        client: String,
        /// The token it believed it held.
        token: String,
        /// When it read the value.
        read_at: At,
        /// When it wrote the new value.
        wrote_at: At,
        /// The value it read.
        read: u64,
        /// The value it wrote (`read + 1`).
        wrote: u64,
    },
    /// A write to a fenced resource that the resource rejected: a write with a higher
    /// fencing token came first. The value is unchanged.
    WriteRejected {
        /// Which client.
        client: String,
        /// Its lock's token.
        token: String,
        /// Its fencing token.
        fencing: u64,
        /// When it read the value.
        read_at: At,
        /// When the resource rejected the write.
        rejected_at: At,
        /// The value it read (and would have written plus one).
        read: u64,
    },
    /// One operation of the workload mix and how it ended (`ok`, `failed: ...`,
    /// `cancelled`, `dropped`, ...), for the summary and for the checker: an operation of a
    /// reentrant lock's owner may move the expiry of the owner's key.
    Op {
        /// Which client.
        client: String,
        /// The operation (see [`crate::Op`]).
        op: &'static str,
        /// The owner, for the operations on a reentrant lock.
        owner: Option<String>,
        /// When it started.
        started: At,
        /// When it ended.
        ended: At,
        /// How it ended.
        outcome: String,
    },
    /// What the nodes held for a guard, read straight from each node (not through the
    /// fault proxies) right after the guard reported `valid_until`: an extension must never
    /// leave a guard reporting validity that a quorum of nodes no longer hold.
    NodesRead {
        /// Which client.
        client: String,
        /// The guard's token.
        token: String,
        /// When the guard was asked (before the first read was sent).
        at: At,
        /// The end of validity the guard reported then.
        valid_until: At,
        /// How many nodes must hold the lock.
        quorum: usize,
        /// One read per node of the set, in node order.
        nodes: Vec<NodeHold>,
    },
    /// A semaphore whose holders the checker counts: every holder whose key starts with
    /// `keys` holds one of its `permits` permits, and more than `permits` of them may never
    /// claim at once.
    Semaphore {
        /// Its name, for reports.
        name: String,
        /// The prefix of its holders' keys (for the library's semaphore, of its permits'
        /// keys: `<key_prefix>semaphore-{name}:`).
        keys: String,
        /// How many holders it admits at once.
        permits: u32,
    },
    /// A read-write lock whose holders the checker judges: a holder on `writers` is a
    /// writer and claims alone, a holder on `readers` a reader, which shares with readers.
    RwLock {
        /// Its name, for reports.
        name: String,
        /// Its writers' key (for the library's, `<key_prefix>rwlock-{name}:write`).
        writers: String,
        /// Its readers' key (for the library's, `<key_prefix>rwlock-{name}:read`).
        readers: String,
    },
    /// A fault the harness injected.
    Fault {
        /// When.
        at: At,
        /// Which node (index), or `None` for a fault on client links only.
        node: Option<usize>,
        /// What was done.
        kind: FaultKind,
        /// A human-readable description, e.g. `"pause node-2"`.
        what: String,
    },
}

/// What one node held for a guard ([`Event::NodesRead`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeHold {
    /// The node's index.
    pub node: usize,
    /// When the read was sent.
    pub sent: At,
    /// When its reply arrived.
    pub received: At,
    /// `None`: no answer (down, paused, cut off: unknown). `Some(-2)`: the node does not
    /// hold the lock (a key missing, or another token). `Some(-1)`: held with no expiry.
    /// Otherwise the least `PTTL` of the lock's keys, in the node's milliseconds.
    pub pttl: Option<i64>,
}

/// How the checker treats an injected fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Keys on the node may vanish here (restart without data, eviction, DEL, FLUSHALL): a
    /// token disappearing around this time is explained by the fault.
    KeyLoss,
    /// The node's wall clock stepped forward this much (its own, or the host's): its keys
    /// expire that much early, and no earlier, so a token gone around this time up to this
    /// much before its `PTTL` ran out is explained, and one gone earlier still is not.
    ClockForward(Duration),
    /// The end of a [`ClockForward`](Self::ClockForward) that takes time (the clock shim
    /// applied the step).
    ClockForwardEnd,
    /// The node's wall clock stepped back: its keys live longer than their `PTTL` said, so
    /// an expiry moving later around this time is explained. Nothing vanishes: a token
    /// removed early on that node is still a violation.
    ClockBack,
    /// Anything else (pause, partition, latency, kill, ...).
    Other,
    /// The end of a [`KeyLoss`](Self::KeyLoss) that takes time (a node back after a
    /// restart without its data): the loss runs from the node's last `KeyLoss` to here.
    KeyLossEnd,
    /// The end of a [`ClockBack`](Self::ClockBack) that takes time (the clock shim applied
    /// the step).
    ClockBackEnd,
}

impl FaultKind {
    /// The kind that ends a fault of this kind that takes time (itself for the others).
    pub fn end(self) -> FaultKind {
        match self {
            FaultKind::KeyLoss => FaultKind::KeyLossEnd,
            FaultKind::ClockBack => FaultKind::ClockBackEnd,
            FaultKind::ClockForward(_) => FaultKind::ClockForwardEnd,
            other => other,
        }
    }
}

/// The shared, append-only history of one scenario run. Cheap to clone.
#[derive(Clone, Debug)]
pub struct History {
    origin: Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl History {
    /// A new, empty history whose clock starts now.
    pub fn new() -> History {
        History {
            origin: Instant::now(),
            events: Arc::default(),
        }
    }

    /// The lab time now.
    pub fn now(&self) -> At {
        self.at(Instant::now())
    }

    /// The lab time of `instant` (zero for instants before the origin).
    pub fn at(&self, instant: Instant) -> At {
        instant.saturating_duration_since(self.origin)
    }

    /// Appends an event.
    pub fn record(&self, event: Event) {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event);
    }

    /// Records an injected fault at the current time.
    pub fn fault(&self, node: Option<usize>, kind: FaultKind, what: impl Into<String>) {
        let what = what.into();
        tracing::info!(at = ?self.now(), %what, "fault");
        self.record(Event::Fault {
            at: self.now(),
            node,
            kind,
            what,
        });
    }

    /// A copy of every event so far, in recording order.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many acquisitions were recorded.
    pub fn acquisitions(&self) -> usize {
        self.events()
            .iter()
            .filter(|e| matches!(e, Event::Acquired { .. }))
            .count()
    }

    /// How many acquisitions were recorded with a fencing token.
    pub fn fenced_acquisitions(&self) -> usize {
        self.events()
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    Event::Acquired {
                        fencing: Some(_),
                        ..
                    }
                )
            })
            .count()
    }
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

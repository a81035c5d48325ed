//! A read-write lock over the quorum: readers share it, each with its own expiry, and a
//! writer holds it alone.
//!
//! Each node keeps the lock's writer key, its readers' set and a waiting writer's intent
//! (see `layout::rwlock_keys`). A node admits a reader only where no writer's key is and no
//! writer waits, and a writer only where no writer's key is and no reader's entry is live
//! (`scripts::RW_READ`, `RW_WRITE`). A read quorum and a write quorum share a node, and on
//! it whichever came first refuses the other for as long as its hold lasts there: so no
//! reader and writer, and no two writers, hold the lock at once inside their validities,
//! by the same argument as a lock's exclusion. A reader's entry ends by its own score on
//! each node (a crashed reader frees its share after its TTL), and a reader's extension
//! checks the entry is live before it lengthens it, so an expired reader is never brought
//! back (`kind::READER`).
//!
//! Writers are not starved by a stream of readers: a writer refused on a node leaves its
//! intent there (its id, for as long as it keeps trying, `RwAcquisition::writer`), which
//! new readers respect; the readers already in finish, and the writer's next round finds
//! the node free. The intent goes with the writer's win, or its leave
//! ([`Coordinator::leave_write_intent`]), or expires. There is no upgrade from reading to
//! writing: two readers that both wanted to write would each wait for the other to stop
//! reading. A writer gets a fencing token when asked, as a lock does; readers get none
//! (they do not write).
//!
//! A fair acquisition ([`RwAcquisition::fair`]) waits in the lock's one fair queue, the
//! fair-queue companions of its writer's key (`layout::queue_keys`), which both sides share:
//! a writer may try when it heads the queue, a reader when no writer is ahead of it
//! (`scripts::RW_READ_QUEUED`, `RW_WRITE_QUEUED`). So writers go one at a time in the order
//! they came, and the readers that came between two writers share the lock. The queue only
//! decides who tries, as a lock's does (see `fair`): exclusion rests on the sides' own
//! checks above, and a queue lost or different between nodes costs order, never safety.
//! Nothing is handed over: a writer's release passes the turn on to the queue's next waiter
//! by a message (see `scripts::release`), and a waiter that wins or leaves does the same
//! with its leave ([`Waiters::leave`](crate::support::Waiters::leave) on the writer's key).

use std::time::Duration;

use fred::types::{Key, Value};
use tokio::time::Instant;

use crate::config::check_key;
use crate::coordinator::Coordinator;
use crate::error::Error;
use crate::fair::FairPlace;
use crate::kind;
use crate::layout::{queue_keys, rwlock_keys};
use crate::lock::Lock;
use crate::lock_spec::{ttl_ms, LockSpec};
use crate::report::{RoundKind, RoundReport};
use crate::round::command::Command;
use crate::round::plan::Round;
use crate::scripts::{
    RW_LEAVE, RW_READ, RW_READ_QUEUED, RW_WRITE, RW_WRITE_FENCED, RW_WRITE_QUEUED,
    RW_WRITE_QUEUED_FENCED,
};
use crate::token::Token;

/// One acquisition of a read-write lock's read or write side
/// ([`Coordinator::acquire_rw`]).
///
/// ```
/// use std::time::Duration;
/// use redlock_core::RwAcquisition;
///
/// let writer = RwAcquisition {
///     fenced: true,
///     writer: Some(("writer-1", Duration::from_secs(2))),
///     ..RwAcquisition::write("config", Duration::from_secs(10))
/// };
/// assert!(writer.write);
/// ```
#[derive(Debug, Clone)]
pub struct RwAcquisition<'a> {
    /// The read-write lock's name: its keys are `<rwlock_prefix>{name}:...`.
    pub name: &'a str,
    /// The write side (alone) rather than the read side (shared).
    pub write: bool,
    /// The token of the hold. Defaults to a fresh random one.
    pub token: Token,
    /// The hold's TTL.
    pub ttl: Duration,
    /// For a writer: whether it gets a fencing token, as a fenced lock does. Readers get
    /// none. Defaults to `false`.
    pub fenced: bool,
    /// For a fenced writer: when its fencing step must be over (see
    /// [`Acquisition::deadline`](crate::Acquisition::deadline)).
    pub deadline: Option<Instant>,
    /// For a writer that keeps trying: its id (the same for each of its attempts), and
    /// how long its intent stays on a node that refused it, from each attempt: new readers
    /// wait while it is there. `None`: the writer leaves no intent, and a steady stream
    /// of readers can keep it out.
    pub writer: Option<(&'a str, Duration)>,
    /// For a fair acquisition: the waiter's place in the lock's one fair queue, for every
    /// attempt of its wait (see the module docs). Its hand-over number is ignored: nothing
    /// is handed over in a read-write lock's queue. Defaults to `None`.
    pub fair: Option<FairPlace<'a>>,
}

impl<'a> RwAcquisition<'a> {
    /// The read side of `name`, for `ttl`, with a fresh random token.
    pub fn read(name: &'a str, ttl: Duration) -> Self {
        RwAcquisition {
            name,
            write: false,
            token: Token::random(),
            ttl,
            fenced: false,
            deadline: None,
            writer: None,
            fair: None,
        }
    }

    /// The write side of `name`, for `ttl`, with a fresh random token and no intent.
    pub fn write(name: &'a str, ttl: Duration) -> Self {
        RwAcquisition {
            write: true,
            ..RwAcquisition::read(name, ttl)
        }
    }
}

impl Coordinator {
    /// One acquisition round of a read-write lock's read or write side, as `what`
    /// describes (see the module docs): the hold, a lock of one key (the readers' set for
    /// a reader, the writer's key for a writer) that extends, renews and releases as any
    /// lock, or the error of a lost round. No retries: that is the client's policy.
    ///
    /// Fails with [`Error::Argument`] for an empty or too long name, an unusable token or
    /// TTL, before anything is sent.
    pub async fn acquire_rw(&self, what: RwAcquisition<'_>) -> Result<Lock, Error> {
        let config = &self.inner.config;
        check_key(what.name)?;
        what.token.check()?;
        what.token.check_not_handover()?;
        let ttl = config.check_ttl(what.ttl)?;
        let keys = rwlock_keys(&config.rwlock_prefix, what.name);
        for key in &keys {
            check_key(key)?;
        }
        if let Some(place) = &what.fair {
            place.check()?;
        }
        let fenced = what.write && what.fenced;
        let (kind, held): (&'static dyn crate::kind::Kind, &str) = if what.write {
            (&kind::WRITER, &keys[0])
        } else {
            (&kind::READER, &keys[1])
        };
        let spec = LockSpec::of_kind(kind, &[held], what.token.clone(), None)?;
        let bounds = fenced.then(|| self.fencing_bounds()).transpose()?;
        let round = Round {
            kind: RoundKind::Acquire,
            alternatives: false,
            command: rw_command(
                &what,
                &keys,
                ttl,
                fenced.then_some(&config.fence_key),
                &config.fair_prefix,
            ),
            requests: vec![spec.acquire_request(ttl)],
            drift_factor: config.drift_factor,
        };
        let decided = self.run_one(round).await;
        match bounds {
            None => decided.into_lock(spec, ttl, None),
            Some(bounds) => {
                self.fenced_lock(decided, spec, ttl, bounds, what.deadline)
                    .await
            }
        }
    }

    /// A writer that stops trying (it won, gave up, or its call was dropped) takes its
    /// intent back from every node, where the intent is its own: new readers need not wait
    /// for it until the intent expires. Idempotent; sent again to a node that did not
    /// answer.
    pub async fn leave_write_intent(&self, name: &str, writer: &str) -> Result<RoundReport, Error> {
        check_key(name)?;
        let keys = rwlock_keys(&self.inner.config.rwlock_prefix, name);
        let command = Command::Script {
            script: &RW_LEAVE,
            keys: keys.iter().map(|k| Key::from(k.as_str())).collect(),
            args: vec![Value::from(writer)],
        };
        let round = self.untimed_round(RoundKind::Leave, command, keys[2].as_str().into());
        self.run_to_quorum(round).await
    }
}

impl Coordinator {
    /// [`leave_write_intent`](Self::leave_write_intent) in the background (counted as
    /// background work, which `quiesce` and `shutdown` wait for): for a writer's call that
    /// ends, however it ends. `false` when nothing could be spawned (the runtime is gone);
    /// the intent then expires by itself.
    pub fn leave_write_intent_in_background(&self, name: String, writer: String) -> bool {
        self.spawn_background(|this| async move {
            if let Err(e) = this.leave_write_intent(&name, &writer).await {
                tracing::debug!(error = %e, "taking a writer's intent back failed; it expires by itself");
            }
        })
    }
}

/// The acquisition's command: the reader's or the writer's script over the lock's `keys`
/// (queued in the lock's fair queue under `fair_prefix` for a fair one), the writer's
/// fenced with the counter at `fence_key`.
fn rw_command(
    what: &RwAcquisition<'_>,
    keys: &[String; 3],
    ttl: Duration,
    fence_key: Option<&String>,
    fair_prefix: &str,
) -> Command {
    let mut fred_keys: Vec<Key> = keys.iter().map(|k| Key::from(k.as_str())).collect();
    let mut args = vec![
        Value::String(what.token.as_fred().clone()),
        Value::from(ttl_ms(ttl)),
    ];
    if what.write || what.fair.is_some() {
        let (id, patience) = what.writer.unwrap_or(("", Duration::ZERO));
        args.push(Value::from(id));
        args.push(Value::from(ttl_ms(patience.max(Duration::from_millis(1)))));
    }
    if let Some(place) = &what.fair {
        fred_keys.extend(queue_keys(fair_prefix, &keys[0]));
        args.extend(place.args());
    }
    let fenced = what.write && fence_key.is_some();
    let script = match (what.write, what.fair.is_some(), fenced) {
        (false, false, _) => &RW_READ,
        (false, true, _) => &RW_READ_QUEUED,
        (true, false, false) => &RW_WRITE,
        (true, false, true) => &RW_WRITE_FENCED,
        (true, true, false) => &RW_WRITE_QUEUED,
        (true, true, true) => &RW_WRITE_QUEUED_FENCED,
    };
    if let (true, Some(fence_key)) = (fenced, fence_key) {
        fred_keys.push(Key::from(fence_key.as_str()));
    }
    Command::Script {
        script,
        keys: fred_keys,
        args,
    }
}

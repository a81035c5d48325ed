//! What a round is asked to do: the command every node gets, and one request per lock with
//! its TTL and its undo.

use std::sync::Arc;
use std::time::Duration;

use fred::types::{Key, Value};

use super::command::Command;
use crate::layout::{by_slot, queued_by_slot};
use crate::report::{NodeOutcome, RoundKind};
use crate::scripts::Script;

/// One lock's part in a round.
#[derive(Debug)]
pub(crate) struct Request {
    /// The key as reported (one key, or several joined).
    pub(crate) name: Arc<str>,
    /// The TTL the request asks for; its validity is computed from it.
    pub(crate) ttl: Option<Duration>,
    /// What undoes the command on a node, for requests that must roll back when not won.
    pub(crate) undo: Option<Undo>,
    /// Whether the round's command is sent again, in the background, on each node that did
    /// not answer (timed out, or its connection failed), up to the rollback's number of
    /// tries: for commands that only remove what is ours and can run twice (a release, a
    /// fair waiter leaving its queue). A node that was slow or cut off for a moment would
    /// otherwise keep the key until its TTL.
    pub(crate) redo: bool,
}

impl Request {
    /// The request of a round of `kind` that asks for no TTL and needs no undo (a release,
    /// a leave, an inspection, a fencing write-back): sent again where unanswered when
    /// `kind` is a release or a leave (see [`redo`](Self::redo)).
    pub(crate) fn untimed(name: Arc<str>, kind: RoundKind) -> Request {
        Request {
            name,
            ttl: None,
            undo: None,
            redo: matches!(kind, RoundKind::Release | RoundKind::Leave),
        }
    }
}

/// A compare-and-delete that undoes what a request may have set on a node.
#[derive(Debug)]
pub(crate) struct Undo {
    pub(crate) script: &'static Script,
    pub(crate) keys: Vec<Key>,
    pub(crate) args: Vec<Value>,
    /// For the rollback of a queued acquisition, which puts its waiter back in the queues
    /// where it frees the keys: the index in `args` of the waiter's id. A round abandoned
    /// before its decision (its caller dropped the call) sends "" there instead: the waiter
    /// has stopped waiting, and its leave may reach a node before the rollback.
    pub(crate) waiter_arg: Option<usize>,
}

impl Undo {
    /// The undo's keys as a cluster member runs them: one list per hash slot of the lock's
    /// keys, as the lock was taken there (see `LockSpec::by_slot`), each in the layout of
    /// the undo's script: a lock's keys alone, or for a queued acquisition's
    /// (`waiter_arg`) its keys then each one's queue keys (`queued_by_slot`).
    pub(crate) fn keys_by_slot(&self) -> Vec<Vec<Key>> {
        match self.waiter_arg {
            None => by_slot(&self.keys, |key| key.as_bytes()),
            Some(_) => queued_by_slot(&self.keys),
        }
    }
}

/// Everything one round sends and decides.
#[derive(Debug)]
pub(crate) struct Round {
    pub(crate) kind: RoundKind,
    /// The requests are alternatives, of which at most one can win (a semaphore's
    /// permits): the round counts as won when one did. Otherwise the requests are a batch
    /// of locks, and the round counts as won only when every one did.
    pub(crate) alternatives: bool,
    pub(crate) command: Command,
    pub(crate) requests: Vec<Request>,
    pub(crate) drift_factor: f64,
}

impl Round {
    /// Whether an answer counts towards a request's quorum (see [`RoundKind::counts`]).
    pub(crate) fn counts(&self, outcome: &NodeOutcome) -> bool {
        self.kind.counts(outcome)
    }

    /// An inspection reads every node (up to its timeout) instead of stopping at a quorum:
    /// how long the key is held depends on every node's TTL.
    pub(crate) fn waits_for_all(&self) -> bool {
        self.kind == RoundKind::Inspect
    }
}

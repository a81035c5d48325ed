//! What one node did in one round: its answer, why a closed client sent nothing, and the
//! cleanup (rollback, or a release sent again) that followed. The round as a whole is in
//! the module above.

use std::fmt;
use std::time::Duration;

use super::RoundKind;
use crate::node_name::NodeName;
use crate::server_error::{ServerError, ServerErrorKind};

/// What one node answered in one round.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeOutcome {
    /// The node set our key.
    Acquired,
    /// The key is held by another owner (acquire).
    HeldByOther,
    /// A cluster member, for a lock over keys of several hash slots (one script per slot
    /// there): another owner holds keys of some slots, and the member took the keys of the
    /// others. It counts as a refusal. What it took is rolled back with the round when the
    /// round fails, and is the lock's when the round wins (its release frees it).
    PartlyHeldByOther,
    /// The node extended our key.
    Extended,
    /// The node deleted our key.
    Released,
    /// The node holds the key (inspect).
    Held,
    /// The node recorded the fencing token (its counter is now the token).
    Recorded,
    /// The node's fencing counter was already at or above the token: another fenced
    /// acquisition recorded it (or a higher one) after this one read the counters. The
    /// acquisition tries again above it while its lock is valid.
    CounterAhead,
    /// The key is not ours on this node: absent, expired or held by another owner
    /// (extend, release). A release counts it as done; an extension as failed.
    NotHeld,
    /// No answer within the per-node timeout. The command may still run on the node later,
    /// which is why failed acquisitions are rolled back on every node.
    TimedOut,
    /// The connection failed or is down; the node is reconnected in the background.
    ConnectionError(String),
    /// The node answered with an error (for example `NOAUTH`, `NOPERM`, `OOM`,
    /// `READONLY`): its kind, the command it refused, and what to do.
    ServerError(ServerError),
    /// The round was decided before this node answered; see
    /// [`RoundReport::settled`] for what it answered later.
    ///
    /// [`RoundReport::settled`]: super::RoundReport::settled
    Pending,
    /// Nothing was sent: this client is closed (see [`ClosedReason`]).
    Closed(ClosedReason),
}

/// Why a client can send nothing any more ([`NodeOutcome::Closed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ClosedReason {
    /// It was closed ([`Coordinator::close`](crate::Coordinator::close), the client's
    /// `shutdown`).
    Shutdown,
    /// The tokio runtime it was connected in has shut down, and its connections' tasks
    /// with it: a client works only in the runtime that connected it (a client kept in a
    /// `static` across `#[tokio::test]`s, each with its own runtime, meets this).
    RuntimeStopped,
}

impl fmt::Display for ClosedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClosedReason::Shutdown => "the client was shut down",
            ClosedReason::RuntimeStopped => {
                "the tokio runtime this client was connected in has shut down, and its \
                 connections with it (a client works only in the runtime that connected it)"
            }
        })
    }
}

impl NodeOutcome {
    /// Whether the node reached the server and got a definite answer about the key.
    pub fn is_answer(&self) -> bool {
        matches!(
            self,
            NodeOutcome::Acquired
                | NodeOutcome::HeldByOther
                | NodeOutcome::PartlyHeldByOther
                | NodeOutcome::Extended
                | NodeOutcome::Released
                | NodeOutcome::Held
                | NodeOutcome::Recorded
                | NodeOutcome::CounterAhead
                | NodeOutcome::NotHeld
        )
    }

    /// Whether this answer leaves our key possibly set on the node: everything but a whole
    /// refusal (a member that refused in part took the rest), a script the node did not
    /// know (see `OnNoScript::Refuse`), a node not ready for the command (`LOADING`,
    /// `BUSY`) and a client that sent nothing (closed): nothing ran. Where it may, a round
    /// that fails rolls the node back.
    pub(crate) fn may_have_set(&self) -> bool {
        match self {
            NodeOutcome::HeldByOther | NodeOutcome::Closed(_) => false,
            // Nothing was sent to a node that casts no vote.
            NodeOutcome::ServerError(e)
                if matches!(
                    e.kind,
                    ServerErrorKind::ScriptNotLoaded | ServerErrorKind::SameServer
                ) =>
            {
                false
            }
            other => !other.not_ready(),
        }
    }

    /// Whether the node refused the command as not ready for it (`LOADING`, `BUSY`): it did
    /// not run, and may run if sent again a little later.
    pub(crate) fn not_ready(&self) -> bool {
        // A node being identified was sent nothing (see `connection::identity`).
        matches!(self, NodeOutcome::ServerError(e)
            if matches!(e.kind, ServerErrorKind::NotReady | ServerErrorKind::NotIdentified))
    }

    pub(super) fn is_unreachable(&self) -> bool {
        matches!(
            self,
            NodeOutcome::TimedOut | NodeOutcome::ConnectionError(_)
        )
    }
}

impl fmt::Display for NodeOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeOutcome::Acquired => f.write_str("acquired"),
            NodeOutcome::HeldByOther => f.write_str("held by another owner"),
            NodeOutcome::PartlyHeldByOther => {
                f.write_str("held by another owner in some of its hash slots")
            }
            NodeOutcome::Extended => f.write_str("extended"),
            NodeOutcome::Released => f.write_str("released"),
            NodeOutcome::Held => f.write_str("holds the key"),
            NodeOutcome::Recorded => f.write_str("recorded the fencing token"),
            NodeOutcome::CounterAhead => {
                f.write_str("its fencing counter was already at or above the token")
            }
            NodeOutcome::NotHeld => f.write_str("not held by us"),
            NodeOutcome::TimedOut => f.write_str("timed out"),
            NodeOutcome::ConnectionError(e) => write!(f, "connection error: {e}"),
            NodeOutcome::ServerError(e) => write!(f, "server error: {e}"),
            NodeOutcome::Pending => f.write_str("no answer yet when the round was decided"),
            NodeOutcome::Closed(reason) => write!(f, "not sent: {reason}"),
        }
    }
}

/// What the rollback of a failed acquisition did on one node; for a release (or a fair
/// waiter leaving its queue) that a node did not answer, what sending it again did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CleanupOutcome {
    /// Our key was there and was deleted.
    Removed,
    /// Our key was not there (never set, or already gone); nothing to do.
    NotPresent,
    /// The delete could not be confirmed before the key's own TTL ran out; the key (if it
    /// was set) expires by itself by then.
    Failed(String),
}

impl fmt::Display for CleanupOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_in(f, RoundKind::Acquire)
    }
}

impl CleanupOutcome {
    /// What several cleanups on one node did together (a batch sent again as one script
    /// per hash slot): the first failure if one failed, else removed if one removed
    /// something; nothing to do for none.
    pub(crate) fn together(cleanups: Vec<CleanupOutcome>) -> CleanupOutcome {
        let mut together = CleanupOutcome::NotPresent;
        for cleanup in cleanups {
            match cleanup {
                CleanupOutcome::Failed(_) => return cleanup,
                CleanupOutcome::Removed => together = CleanupOutcome::Removed,
                CleanupOutcome::NotPresent => {}
            }
        }
        together
    }

    /// Worded for a round of `kind`: a release or a leave is not rolled back but sent
    /// again where the node did not answer it.
    fn fmt_in(&self, f: &mut fmt::Formatter<'_>, kind: RoundKind) -> fmt::Result {
        let sent_again = matches!(kind, RoundKind::Release | RoundKind::Leave);
        match (self, sent_again) {
            (CleanupOutcome::Removed, false) => f.write_str("rolled back"),
            (CleanupOutcome::NotPresent, false) => f.write_str("nothing to roll back"),
            (CleanupOutcome::Failed(e), false) => {
                write!(f, "rollback failed ({e}); the key expires with its TTL")
            }
            (CleanupOutcome::Removed, true) if kind == RoundKind::Leave => {
                f.write_str("sent again: left the queue")
            }
            (CleanupOutcome::Removed, true) => f.write_str("sent again: released"),
            (CleanupOutcome::NotPresent, true) => {
                f.write_str("sent again: nothing of ours was left there")
            }
            (CleanupOutcome::Failed(e), true) => write!(
                f,
                "sent again, and that failed too ({e}); the key expires with its TTL"
            ),
        }
    }
}

/// One node's part in a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReport {
    /// The node.
    pub node: NodeName,
    /// What it answered.
    pub outcome: NodeOutcome,
    /// Time from the start of the round to the answer (`None` while pending).
    pub latency: Option<Duration>,
    /// The answer arrived after the round had been decided.
    pub late: bool,
    /// What the rollback did, for a rolled-back acquisition; for a release (or a leave) the
    /// node did not answer, what sending it again did.
    pub cleanup: Option<CleanupOutcome>,
}

impl NodeReport {
    /// A node that has not answered yet.
    pub(crate) fn pending(node: NodeName) -> Self {
        NodeReport {
            node,
            outcome: NodeOutcome::Pending,
            latency: None,
            late: false,
            cleanup: None,
        }
    }
}

impl fmt::Display for NodeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_in(f, RoundKind::Acquire)
    }
}

impl NodeReport {
    /// Worded for a round of `kind` (see [`CleanupOutcome::fmt_in`]).
    pub(super) fn fmt_in(&self, f: &mut fmt::Formatter<'_>, kind: RoundKind) -> fmt::Result {
        write!(f, "{}: {}", self.node, self.outcome)?;
        if let Some(latency) = self.latency {
            write!(f, " after {latency:.1?}")?;
        }
        if self.late {
            f.write_str(" (late)")?;
        }
        if let Some(cleanup) = &self.cleanup {
            f.write_str(", ")?;
            cleanup.fmt_in(f, kind)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node a closed client sent nothing to needs no rollback: it must not get three
    /// tries, each waiting for a connection that has quit. A cluster member that refused in
    /// part took its other slots' keys: it needs one.
    #[test]
    fn nothing_sent_needs_no_undo() {
        assert!(!NodeOutcome::Closed(ClosedReason::Shutdown).may_have_set());
        assert!(!NodeOutcome::Closed(ClosedReason::RuntimeStopped).may_have_set());
        assert!(!NodeOutcome::HeldByOther.may_have_set());
        assert!(NodeOutcome::PartlyHeldByOther.may_have_set());
        assert!(NodeOutcome::TimedOut.may_have_set());
        assert!(NodeOutcome::Acquired.may_have_set());
    }

    /// Cleanups on one node together: a failure is kept, else a removal.
    #[test]
    fn cleanups_together_keep_a_failure_then_a_removal() {
        use CleanupOutcome::{Failed, NotPresent, Removed};
        assert_eq!(CleanupOutcome::together(vec![]), NotPresent);
        assert_eq!(CleanupOutcome::together(vec![NotPresent, Removed]), Removed);
        let failed = Failed("timed out".into());
        assert_eq!(
            CleanupOutcome::together(vec![Removed, failed.clone(), NotPresent]),
            failed
        );
    }
}

//! How a command is sent: under fred's own timeout (the node timeout, or a longer one for
//! cleanup commands) with this library's backstop a moment later, and how a fred error
//! becomes what a report says about the node. Kept together because the two timeouts only
//! work as a pair (see `Connection::bounded`).

use std::sync::PoisonError;
use std::time::Duration;

use fred::error::{Error as FredError, ErrorKind};
use fred::types::config::Options;

use super::failure::{self, ConnectFailure};
use super::Connection;
use crate::report::{ClosedReason, NodeOutcome};
use crate::server_error::{ServerError, ServerErrorKind};

impl Connection {
    /// A command under fred's own timeout (the node timeout, from the per-command
    /// options), with a backstop a moment later.
    ///
    /// fred's timeout must be the one that ends the command: it marks the command as timed
    /// out, and fred then never writes it. A command that is abandoned unmarked (its future
    /// dropped) stays in fred's queue when it was sent just as the connection dropped (fred
    /// still reads it as up for a moment), and fred writes it once the connection is back,
    /// however long after: an acquisition written then sets a key that no rollback deletes,
    /// since every rollback of its round was over by then. This library's own timeout, the
    /// backstop, starts first, so it must end a moment after fred's: with the same
    /// timeout, it would fire first and leave such commands unmarked.
    pub(super) async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, FredError>>,
        command: &'static str,
    ) -> Result<T, NodeOutcome> {
        self.bounded_as(fut, command, Sending::Round).await
    }

    /// [`bounded`](Self::bounded) for a command sent as `sending`: a cleanup command is
    /// waited for a node timeout, but fred's own (longer) timeout is left to run, so that
    /// it is still written if it was not yet (see [`Sending::Cleanup`]).
    pub(super) async fn bounded_as<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, FredError>>,
        command: &'static str,
        sending: Sending,
    ) -> Result<T, NodeOutcome> {
        if let Some(reason) = self.liveness.closed() {
            return Err(NodeOutcome::Closed(reason));
        }
        let wait = match sending {
            Sending::Round => self.timeout + BACKSTOP_MARGIN,
            Sending::Cleanup => self.timeout,
        };
        match tokio::time::timeout(wait, fut).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.failure(&e, command)),
            Err(_) => Err(NodeOutcome::TimedOut),
        }
    }

    /// Sorts a fred error into what a report can say about the node. A command that fred
    /// refused for want of a connection reports why the connection failed, when known.
    fn failure(&self, e: &FredError, command: &'static str) -> NodeOutcome {
        if failure::is_stopped(e) {
            // fred's tasks for this client are gone: it was quit, or its runtime stopped
            // (a runtime that shuts down drops them before the watch on it runs).
            self.liveness.close(ClosedReason::RuntimeStopped);
            return NodeOutcome::Closed(
                self.liveness
                    .closed()
                    .unwrap_or(ClosedReason::RuntimeStopped),
            );
        }
        if failure::is_redirected(e) && self.is_cluster() {
            return NodeOutcome::ServerError(ServerError::of_kind(
                ServerErrorKind::Redirected,
                command,
                "the cluster sent the command to another master (MOVED or ASK)",
            ));
        }
        if *e.kind() == ErrorKind::Canceled || failure::is_unrouted(e) {
            if let Some(failure) = self.connect_failure() {
                return failure.outcome();
            }
        }
        failure::failure(e, command)
    }

    pub(super) fn connect_failure(&self) -> Option<ConnectFailure> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// How long after fred's timeout of a command [`Connection::bounded`]'s backstop ends it:
/// enough to let fred's timer (which starts a moment later) fire first, whatever the
/// timer wheel's millisecond rounding.
const BACKSTOP_MARGIN: Duration = Duration::from_millis(20);

/// The per-command options of every command a round sends: no replay (one attempt: an
/// unanswered command is ambiguous, and cleaned up by compare-and-delete), fred's timeout,
/// and failing at once while the connection is down.
pub(super) fn command_options(timeout: Duration) -> Options {
    Options {
        max_attempts: Some(1),
        timeout: Some(timeout),
        fail_fast: true,
        ..Default::default()
    }
}

/// How a command is sent: as part of a round, or to clean up after one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sending {
    /// Under fred's timeout (the node timeout), which marks the command so that fred never
    /// writes it late (see [`Connection::bounded`]).
    Round,
    /// A command that only removes what is ours (compare-and-delete of a round's token: a
    /// rollback, a release sent again), waited for a node timeout, under fred's much
    /// longer [`CLEANUP_WRITE_LIMIT`]. Marked timed out after a node timeout, a rollback
    /// still waiting in fred's queue behind the command it undoes (a lock over many keys is
    /// megabytes to write) would never be written, and that command would then set its keys
    /// for their TTL; every later try would meet the same fate. Written late, it removes
    /// only this round's keys, in order after the command it undoes.
    Cleanup,
}

/// fred's timeout of a cleanup command ([`Sending::Cleanup`]): it is written however long
/// the commands before it on the connection take to write, up to this.
const CLEANUP_WRITE_LIMIT: Duration = Duration::from_secs(30);

/// The per-command options of a cleanup command: as a round's ([`command_options`]) but
/// with fred's timeout at [`CLEANUP_WRITE_LIMIT`].
pub(super) fn cleanup_options() -> Options {
    command_options(CLEANUP_WRITE_LIMIT)
}

//! How a command is sent: under fred's own timeout (the node timeout, or a longer one for
//! cleanup commands) with this library's backstop a moment later, and how a fred error
//! becomes what a report says about the node. Kept together because the two timeouts only
//! work as a pair (see `Connection::bounded`).

use std::future::Future;
use std::pin::Pin;
use std::sync::PoisonError;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

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
    ///
    /// How the backstop runs depends on `sending`: a round's command checks it when polled,
    /// and the round wakes it (see [`Sending::InRound`]); a cleanup command is waited for
    /// a node timeout, but fred's own (longer) timeout is left to run, so that it is still
    /// written if it was not yet (see [`Sending::Cleanup`]).
    pub(super) async fn bounded<T>(
        &self,
        fut: impl Future<Output = Result<T, FredError>>,
        command: &'static str,
        sending: Sending,
    ) -> Result<T, NodeOutcome> {
        if let Some(reason) = self.liveness.closed() {
            return Err(NodeOutcome::Closed(reason));
        }
        // Pinned here, and only borrowed below: one move of the command's future (an
        // async block around fred's boxed one can be large), whatever bounds it.
        let fut = std::pin::pin!(fut);
        let outcome = match sending {
            Sending::InRound => unless_overdue(self.backstop(), fut).await,
            Sending::Alone => tokio::time::timeout(self.backstop(), fut).await.ok(),
            Sending::Cleanup => tokio::time::timeout(self.timeout, fut).await.ok(),
        };
        match outcome {
            Some(Ok(value)) => Ok(value),
            Some(Err(e)) => Err(self.failure(&e, command)),
            None => Err(NodeOutcome::TimedOut),
        }
    }

    /// How long after its start a command of a round or alone is ended by this library's
    /// backstop: a moment after fred's own timeout (see [`bounded`](Self::bounded)). A
    /// round's set of calls wakes its commands at least this often (see
    /// [`Sending::InRound`]).
    pub(crate) fn backstop(&self) -> Duration {
        self.timeout + BACKSTOP_MARGIN
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

/// The per-command options of every command but a cleanup command: no replay (one attempt: an
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

/// `fut`'s output, or `None` when it is still pending at a poll `limit` or more after its
/// first: a backstop without a timer of its own, which ends `fut` only when something else
/// wakes the task (see [`Sending::InRound`]).
async fn unless_overdue<F: Future>(limit: Duration, mut fut: Pin<&mut F>) -> Option<F::Output> {
    let deadline = Instant::now() + limit;
    std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(output) => Poll::Ready(Some(output)),
        Poll::Pending if Instant::now() >= deadline => Poll::Ready(None),
        Poll::Pending => Poll::Pending,
    })
    .await
}

/// How a command is sent: as part of a round, alone, or to clean up after a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sending {
    /// One of a round's commands (everything `Command::send` sends), under fred's timeout
    /// (the node timeout), which marks the command so that fred never writes it late (see
    /// [`Connection::bounded`]). The backstop is checked whenever the command is polled,
    /// and the round's set of calls wakes its task at least every
    /// [`backstop`](Connection::backstop) (`Polled::waking_every`): one timer for the
    /// round, where a timer per command took about 4 % of the instructions of an
    /// uncontended lock and release (ten timers, two per node; see
    /// `docs/benchmarks.md`). A command that fred's timeout did not end is ended by the
    /// first wake-up after its backstop: the first comes a moment after one backstop,
    /// past the backstops of commands sent right after the set was made, so that is
    /// usually the first; a command sent later is at most one backstop late. The parts
    /// of a `Command::PerSlot` are polled at each wake-up too (`Swept`).
    InRound,
    /// Any other command (a node's identity and health, a fencing repair's steps): fred's
    /// timeout, and the backstop as a timer of its own.
    Alone,
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

#[cfg(test)]
mod tests {
    use std::future::pending;

    use super::*;

    /// A round's backstop: a command still pending when polled at its limit ends (`None`,
    /// read as `TimedOut`), one that answers in time gives its answer; nothing ends it
    /// between polls (the round's set wakes it, see `Polled::waking_every`).
    #[tokio::test(start_paused = true)]
    async fn a_command_in_a_round_ends_when_polled_past_its_backstop() {
        let limit = Duration::from_millis(100);
        let mut never = std::pin::pin!(pending::<()>());
        let mut hung = std::pin::pin!(unless_overdue(limit, never.as_mut()));
        assert!(futures::poll!(hung.as_mut()).is_pending());
        tokio::time::advance(limit - Duration::from_millis(1)).await;
        assert!(futures::poll!(hung.as_mut()).is_pending());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(futures::poll!(hung.as_mut()), Poll::Ready(None));

        let answered = unless_overdue(limit, std::pin::pin!(async { 7 })).await;
        assert_eq!(answered, Some(7));
    }
}

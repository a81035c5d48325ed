//! `redlock run`: acquire, run the command while the lock is renewed, stop the command if
//! the lock is lost, release.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitStatus;
use std::time::Duration;

use redlock_client::{HoldHealth, LockGuard, LostReason, Redlock};
use tokio::time::Instant;

use crate::child::{exit_of, Child, Signals};
use crate::cli::RunArgs;
use crate::console::Console;
use crate::error::CliError;
use crate::exit::Exit;
use crate::settings;

/// Runs `args.command` under the lock `args.key` with `client`, whose configuration
/// already has the run's TTL, wait, fencing and minimum validity (see
/// `settings::for_run`).
pub async fn run(client: &Redlock, args: &RunArgs, console: Console) -> Result<Exit, CliError> {
    let grace = settings::grace(client.config(), args.grace)?;
    // Before the wait, so that a Ctrl-C during it ends the wait (rolling back the attempt
    // in flight) instead of the process, and none is missed between wait and command.
    let mut signals = Signals::listen().map_err(CliError::Setup)?;
    let (guard, permit) = match acquire(client, args, console, &mut signals).await? {
        Ok(held) => held,
        Err(signal) => return Ok(Exit::signalled(signal as i32)),
    };
    let mut child = match Child::spawn(&args.command, &command_env(&guard, permit)) {
        Ok(child) => child,
        Err(e) => {
            release_or_warn(guard, console).await;
            return Err(e);
        }
    };
    let lost = guard.lost();
    tokio::pin!(lost);
    // The end of the validity as it last stood while the lock was held: a lock that a
    // majority refused reads as ended at once, and its command still gets its grace within
    // that end (SIGTERM at once, SIGKILL after the grace or then).
    let mut valid_until = guard.valid_until();
    let outcome = loop {
        // The command must be gone by the end of the lock's validity: unless a renewal
        // has moved that end by the time only `grace` is left of it (renewal is failing,
        // or capped by `max_hold`), the command is stopped then, with SIGKILL at the end.
        let now_until = guard.valid_until();
        if guard.is_valid() {
            valid_until = now_until;
        }
        let stop_at = valid_until.checked_sub(grace).unwrap_or(valid_until);
        // Biased, in this order: a command that has ended is reported as it ended, and
        // after a stall (the process stopped or starved past the validity), the timer's
        // "nothing left" wins over the loss signal, which would grant a whole grace.
        tokio::select! {
            biased;
            status = child.wait() => break status.map_or_else(Outcome::WaitFailed, Outcome::Ended),
            _ = tokio::time::sleep_until(stop_at) => {
                if guard.valid_until() <= valid_until {
                    // Why renewal did not extend it: the guard's last renewal error (or the
                    // loss that came between two turns of this loop).
                    let renewal = match guard.health() {
                        HoldHealth::Lost(reason) if reason != LostReason::Expired => {
                            break Outcome::Lost(reason, None, valid_until)
                        }
                        HoldHealth::RenewalFailing { last_error, .. } => last_error,
                        _ => "no renewal got through in time".to_string(),
                    };
                    break Outcome::Lost(LostReason::Expired, Some(renewal), valid_until);
                }
            }
            reason = &mut lost => break Outcome::Lost(reason, None, valid_until),
            signal = signals.recv() => child.forward(signal),
        }
    };
    let (reason, renewal, valid_until) = match outcome {
        Outcome::Ended(status) => {
            let exit = exit_of(status);
            if exit.code() != 0 {
                release_or_warn(guard, console).await;
                return Ok(exit);
            }
            // The command succeeded but its lock was not released on a quorum: the key
            // stays until its TTL (the release was refused, by an ACL without the scripts,
            // or not answered). Not a success: the caller must not take the lock for free.
            release(guard).await?;
            return Ok(exit);
        }
        Outcome::Lost(reason, renewal, valid_until) => (reason, renewal, valid_until),
        Outcome::WaitFailed(e) => {
            // The command's state is unknown: it is stopped as for a lost lock (before the
            // lock goes), and the error is what is reported.
            console.warn(format_args!(
                "could not wait for the command: {e}; stopping it"
            ));
            stop(&mut child, guard.valid_until(), grace, console).await;
            release_or_warn(guard, console).await;
            return Err(CliError::Setup(e));
        }
    };
    let key = guard.key();
    tracing::info!(%key, %reason, "lock lost or about to be");
    // Signals that arrive meanwhile wait in their queue: the command is being stopped
    // already, and redlock still releases before it exits.
    stop(&mut child, valid_until, grace, console).await;
    // The key is not ours any more on a majority (or soon will not be); releasing cleans up
    // the nodes where it still is, without touching another holder's key
    // (compare-and-delete).
    release_or_warn(guard, console).await;
    Err(CliError::LockLost {
        key,
        reason,
        renewal,
    })
}

/// What the command finds in its environment: the key, the lock's token, its fencing
/// token when the lock is fenced, and the permit's number for a semaphore's permit.
fn command_env(guard: &LockGuard, permit: Option<u32>) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("REDLOCK_KEY", guard.key()),
        ("REDLOCK_TOKEN", guard.lock().token().as_str().to_string()),
    ];
    if let Some(token) = guard.fencing_token() {
        env.push(("REDLOCK_FENCING_TOKEN", token.get().to_string()));
    }
    if let Some(permit) = permit {
        env.push(("REDLOCK_PERMIT", permit.to_string()));
    }
    env
}

/// How the command's run ended, as far as `redlock` is concerned.
enum Outcome {
    /// The command ended by itself.
    Ended(ExitStatus),
    /// The lock was lost, or is about to be with no renewal in sight (then with why
    /// renewal did not extend it); and the end of its validity as it stood before.
    Lost(LostReason, Option<String>, Instant),
    /// Waiting for the command failed (its state is unknown).
    WaitFailed(std::io::Error),
}

/// Stops the command: SIGTERM, then SIGKILL after `grace` or at the end of the lock's
/// validity, whichever comes first (at once when nothing is left of it), so that the
/// command never runs past the validity on `redlock`'s account, whatever the reason.
async fn stop(child: &mut Child, valid_until: Instant, grace: Duration, console: Console) {
    let left = valid_until.saturating_duration_since(Instant::now());
    let grace = grace.min(left);
    tracing::info!(
        ?grace,
        "stopping the command: SIGTERM, then SIGKILL after the grace period"
    );
    if let Err(e) = child.stop(grace).await {
        console.warn(format_args!("could not wait for the command to end: {e}"));
    }
}

/// Waits for the lock, showing progress on a terminal. `Ok(Err(signal))` when a signal
/// ended the wait; the attempt in flight is rolled back when its future is dropped.
async fn acquire(
    client: &Redlock,
    args: &RunArgs,
    console: Console,
    signals: &mut Signals,
) -> Result<Result<(LockGuard, Option<u32>), nix::sys::signal::Signal>, CliError> {
    let semaphore = match args.permits {
        Some(permits) => Some(
            client
                .semaphore(&args.key, permits)
                .map_err(|e| CliError::from_lock("naming the semaphore", e))?,
        ),
        None => None,
    };
    let rwlock = if args.read || args.write {
        Some(
            client
                .rwlock(&args.key)
                .map_err(|e| CliError::from_lock("naming the read-write lock", e))?,
        )
    } else {
        None
    };
    let full_key = match (&semaphore, &rwlock) {
        (Some(semaphore), _) => semaphore.base_key().to_string(),
        (_, Some(rwlock)) => rwlock.base_key().to_string(),
        _ => client.full_key(&args.key),
    };
    let mut waiting = console.waiting(&full_key, client.config().retry.max_wait);
    let lock: Pin<Box<dyn Future<Output = Result<LockGuard, redlock_client::Error>> + Send>> =
        match (&semaphore, &rwlock) {
            (Some(semaphore), _) => Box::pin(semaphore.acquire()),
            (_, Some(rwlock)) if args.write => Box::pin(rwlock.write()),
            (_, Some(rwlock)) => Box::pin(rwlock.read()),
            _ => Box::pin(client.lock(&args.key)),
        };
    tokio::pin!(lock);
    loop {
        tokio::select! {
            result = &mut lock => {
                return match result {
                    Ok(guard) => {
                        waiting.finish("acquired");
                        let permit = semaphore.as_ref().and_then(|s| s.permit(&guard));
                        Ok(Ok((guard, permit)))
                    }
                    Err(e) => {
                        waiting.finish("not acquired");
                        Err(CliError::from_lock(&format!("acquiring lock \"{full_key}\""), e))
                    }
                };
            }
            signal = signals.recv() => {
                waiting.finish(&format!("given up on {signal}"));
                return Ok(Err(signal));
            }
            _ = waiting.tick() => waiting.draw(),
        }
    }
}

/// Releases the lock: `Err` when it failed on a quorum (see `CliError::ReleaseFailed`),
/// which a command that succeeded exits with.
async fn release(guard: LockGuard) -> Result<(), CliError> {
    let key = guard.key();
    match guard.release().await {
        Ok(_) => Ok(()),
        Err(error) => Err(CliError::ReleaseFailed { key, error }),
    }
}

/// Releases the lock where something else is reported: a failed release is a warning (the
/// key expires with its TTL).
async fn release_or_warn(guard: LockGuard, console: Console) {
    if let Err(e) = release(guard).await {
        console.warn(format_args!("{e}"));
    }
}

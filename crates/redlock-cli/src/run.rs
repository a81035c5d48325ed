//! `redlock run`: acquire, run the command while the lock is renewed, stop the command if
//! the lock is lost, release.

use redlock_client::{LockGuard, LostReason, Redlock};
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
    let guard = match acquire(client, args, console, &mut signals).await? {
        Ok(guard) => guard,
        Err(signal) => return Ok(Exit::signalled(signal as i32)),
    };
    let mut env = vec![
        ("REDLOCK_KEY", guard.key()),
        ("REDLOCK_TOKEN", guard.lock().token().as_str().to_string()),
    ];
    if let Some(token) = guard.fencing_token() {
        env.push(("REDLOCK_FENCING_TOKEN", token.get().to_string()));
    }
    let mut child = match Child::spawn(&args.command, &env) {
        Ok(child) => child,
        Err(e) => {
            release(guard, console).await;
            return Err(e);
        }
    };
    let lost = guard.lost();
    tokio::pin!(lost);
    let outcome = loop {
        // The command must be gone by the end of the lock's validity: unless a renewal
        // has moved that end by the time only `grace` is left of it (renewal is failing,
        // or capped by `max_hold`), the command is stopped then, with SIGKILL at the end.
        let valid_until = guard.valid_until();
        let stop_at = valid_until.checked_sub(grace).unwrap_or(valid_until);
        tokio::select! {
            status = child.wait() => break Ok(status.map_err(CliError::Setup)?),
            reason = &mut lost => break Err((reason, grace)),
            _ = tokio::time::sleep_until(stop_at) => {
                if guard.valid_until() <= valid_until {
                    let left = valid_until.saturating_duration_since(Instant::now());
                    break Err((LostReason::Expired, left));
                }
            }
            signal = signals.recv() => child.forward(signal),
        }
    };
    match outcome {
        Ok(status) => {
            release(guard, console).await;
            Ok(exit_of(status))
        }
        Err((reason, grace)) => {
            let key = guard.key();
            tracing::info!(%key, %reason, ?grace, "lock lost or about to be; stopping the command");
            // Signals that arrive meanwhile wait in their queue: the command is being
            // stopped already, and redlock still releases before it exits.
            if let Err(e) = child.stop(grace).await {
                console.warn(format_args!("could not wait for the command to end: {e}"));
            }
            // The key is not ours any more on a majority (or soon will not be); releasing
            // cleans up the nodes where it still is, without touching another holder's key
            // (compare-and-delete).
            release(guard, console).await;
            Err(CliError::LockLost { key, reason })
        }
    }
}

/// Waits for the lock, showing progress on a terminal. `Ok(Err(signal))` when a signal
/// ended the wait; the attempt in flight is rolled back when its future is dropped.
async fn acquire(
    client: &Redlock,
    args: &RunArgs,
    console: Console,
    signals: &mut Signals,
) -> Result<Result<LockGuard, nix::sys::signal::Signal>, CliError> {
    let full_key = client.full_key(&args.key);
    let mut waiting = console.waiting(&full_key, client.config().retry.max_wait);
    let lock = client.lock(&args.key);
    tokio::pin!(lock);
    loop {
        tokio::select! {
            result = &mut lock => {
                return match result {
                    Ok(guard) => {
                        waiting.finish("acquired");
                        Ok(Ok(guard))
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

/// Releases the lock; a failed release changes nothing for the caller (the key expires with
/// its TTL), so it is a warning.
async fn release(guard: LockGuard, console: Console) {
    let key = guard.key();
    if let Err(e) = guard.release().await {
        console.warn(format_args!(
            "could not confirm the release of \"{key}\": {e}; it expires by itself at the end of its TTL"
        ));
    }
}

//! The commands a round sends to a node: `SET NX PX`, a script by its SHA-1 (with its
//! `EVAL` fallback, or a refusal, when the node does not know it), and any other command,
//! each through the node's identity gate. How each is bounded in time is in `sending`.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::{ClusterHash, CustomCommand, Expiration, Key, SetOptions, Value};
use tokio::time::Instant;

use super::script_cache::reload_scripts;
use super::sending::{cleanup_options, command_options, Sending};
use super::Connection;
use crate::report::NodeOutcome;
use crate::scripts::{Script, Unfenced};
use crate::server_error::{ServerError, ServerErrorKind};

/// What [`Connection::eval`] does when the node does not know the script (`NOSCRIPT`: the
/// node restarted, or someone ran `SCRIPT FLUSH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnNoScript {
    /// Sends it again with its source (`EVAL`): for commands whose order against the
    /// caller's later commands does not matter (releases, extensions, records, reads).
    Resend,
    /// Answers [`ServerErrorKind::ScriptNotLoaded`] (nothing ran) and loads the scripts
    /// again in the background: for acquisitions. Their `EVAL` would be a second command,
    /// written after whatever the caller sent the node meanwhile: a release of the lock,
    /// once the other nodes made a quorum, would then find nothing to delete there, and
    /// the acquisition, run after it, would leave the key for its TTL. Until the scripts
    /// are loaded, later acquisitions on the node are sent as `EVAL` with the source from
    /// the start (one command).
    ///
    /// [`ServerErrorKind::ScriptNotLoaded`]: crate::ServerErrorKind::ScriptNotLoaded
    Refuse,
}

impl Connection {
    /// `SET key token NX PX ttl`, a round's: the raw reply (`OK` when set, nil when the key
    /// exists).
    pub(crate) async fn set_nx_px(
        &self,
        key: Key,
        token: Value,
        ttl: Duration,
    ) -> Result<Value, NodeOutcome> {
        // TTLs are checked to be at most a year before any round, so this never saturates.
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        self.gate()?;
        // fred's own `SET`, not a custom command: fred builds a custom command's frame by
        // splitting its name and copying each part, two allocations more per command.
        // Its `NX` and `PX` are static arguments: no copy per command.
        // The slot first, so that fred's future is made in it (see `boxed`).
        let set = boxed(
            Box::new_uninit(),
            self.cmd.set::<Value, _, _>(
                key,
                token,
                Some(Expiration::PX(ttl_ms)),
                Some(SetOptions::NX),
                false,
            ),
        );
        self.bounded(set, "SET", Sending::InRound).await
    }

    /// Runs a script by its SHA-1. When the node does not know it (`NOSCRIPT`: a
    /// restarted node, or `SCRIPT FLUSH`), `on_no_script` says whether it is sent again with
    /// its source (`EVAL`; both steps share one timeout) or refused (see [`OnNoScript`]).
    pub(crate) async fn eval(
        &self,
        script: &Script,
        keys: &[Key],
        args: &[Value],
        on_no_script: OnNoScript,
    ) -> Result<Value, NodeOutcome> {
        self.eval_as(script, keys, args, on_no_script, Sending::Alone)
            .await
    }

    /// [`eval`](Self::eval) for a command that removes what is ours (a rollback, a release
    /// sent again), sent as [`Sending::Cleanup`], with the `EVAL` fallback.
    pub(crate) async fn eval_cleanup(
        &self,
        script: &Script,
        keys: &[Key],
        args: &[Value],
    ) -> Result<Value, NodeOutcome> {
        self.eval_as(script, keys, args, OnNoScript::Resend, Sending::Cleanup)
            .await
    }

    /// A script of a round that may run twice (a release, an extension, a read), sent
    /// again after a cluster member's master sent it on to another
    /// ([`ServerErrorKind::Redirected`]: nothing ran): fred has learnt the cluster's slots
    /// again, so it goes to the slot's master now. A `WAIT` sent behind the first (see
    /// `Command::send`) reached the old master: with `replica_acks`, the new one is asked
    /// too. Never an acquisition (see [`OnNoScript::Refuse`]); a cleanup command that was
    /// redirected is sent again by the round's background work.
    ///
    /// [`ServerErrorKind::Redirected`]: crate::ServerErrorKind::Redirected
    pub(crate) async fn eval_redirected(
        &self,
        script: &Script,
        keys: &[Key],
        args: &[Value],
    ) -> Result<Value, NodeOutcome> {
        let reply = self
            .eval_as(script, keys, args, OnNoScript::Resend, Sending::InRound)
            .await?;
        if let Some(key) = keys.first().filter(|_| self.replica_acks > 0) {
            self.wait_for_replicas(key).await?;
        }
        Ok(reply)
    }

    /// `WAIT <replica_acks> <half the node timeout>` on the master of `key`'s slot, on a
    /// cluster member: sent right behind a write to that master (on the same connection,
    /// so it counts the write), it answers how many replicas have everything written to
    /// the master so far. `Err` with [`ServerErrorKind::NotReplicated`] when fewer than
    /// `Config::replica_acks` did within the time: the member's vote must not count.
    /// Half the node timeout, so that the server answers before fred's timeout ends the
    /// wait (a node that does not answer at all is `TimedOut` as for any command).
    ///
    /// [`ServerErrorKind::NotReplicated`]: crate::ServerErrorKind::NotReplicated
    pub(crate) async fn wait_for_replicas(&self, key: &Key) -> Result<(), NodeOutcome> {
        let wanted = self.replica_acks;
        let slot = fred::util::redis_keyslot(key.as_bytes());
        let within = i64::try_from((self.timeout / 2).as_millis())
            .unwrap_or(i64::MAX)
            .max(1);
        let command = CustomCommand::new_static("WAIT", ClusterHash::Custom(slot), false);
        let args = vec![Value::from(i64::from(wanted)), Value::from(within)];
        let fut = boxed(
            Box::new_uninit(),
            self.cmd.custom::<Value, Value>(command, args),
        );
        let acked = self
            .bounded(fut, "WAIT", Sending::InRound)
            .await?
            .as_u64()
            .unwrap_or(0);
        if acked >= u64::from(wanted) {
            return Ok(());
        }
        Err(NodeOutcome::ServerError(ServerError::of_kind(
            ServerErrorKind::NotReplicated,
            "WAIT",
            format!(
                "{acked} of the {wanted} replicas wanted acknowledged the write within {within} ms"
            ),
        )))
    }

    /// [`eval`](Self::eval) sent as `sending`.
    pub(crate) async fn eval_as(
        &self,
        script: &Script,
        keys: &[Key],
        args: &[Value],
        on_no_script: OnNoScript,
        sending: Sending,
    ) -> Result<Value, NodeOutcome> {
        self.gate()?;
        let cmd = match sending {
            Sending::InRound | Sending::Alone => &*self.cmd,
            Sending::Cleanup => &self.cleanup,
        };
        let whole = on_no_script == OnNoScript::Refuse || sending == Sending::Cleanup;
        if whole && self.scripts.missing.load(Ordering::SeqCst) {
            // The node may not know the script: one command with its source, in order. An
            // acquisition may not be sent twice (`OnNoScript::Refuse`); a cleanup command's
            // `NOSCRIPT` comes after what it undoes has run, often after its wait, when the
            // `EVAL` that would follow it is never sent.
            let args = script_args(Value::from(script.source()), keys, args);
            let eval = script_command(self, "EVAL", keys);
            let fut = boxed(Box::new_uninit(), cmd.custom::<Value, Value>(eval, args));
            return self.bounded(fut, "EVAL", sending).await;
        }
        let mut sent = "EVALSHA";
        let outcome = {
            // Made where it stays (pinned here), and lent to `bounded`: the future is large
            // (fred's is boxed, but its fallback and the arguments are not), and every move
            // copies it.
            let evalsha = std::pin::pin!(async {
                let evalsha = script_command(self, "EVALSHA", keys);
                let start = Instant::now();
                // Boxed where made, as in `custom_as`.
                match boxed(
                    Box::new_uninit(),
                    cmd.custom::<Value, Value>(evalsha, script_args(script.sha_arg(), keys, args)),
                )
                .await
                {
                    Err(e)
                        if e.details().starts_with("NOSCRIPT")
                            && on_no_script == OnNoScript::Refuse =>
                    {
                        self.scripts.missing.store(true, Ordering::SeqCst);
                        reload_scripts(&self.cmd, &self.scripts);
                        Err(e)
                    }
                    Err(e) if e.details().starts_with("NOSCRIPT") => {
                        sent = "EVAL";
                        let eval = script_command(self, "EVAL", keys);
                        // fred's own timeout for the second step ends with the first's
                        // (see `bounded`): the time left, at least a millisecond.
                        let left = self
                            .timeout
                            .saturating_sub(start.elapsed())
                            .max(Duration::from_millis(1));
                        let options = match sending {
                            Sending::InRound | Sending::Alone => command_options(left),
                            Sending::Cleanup => cleanup_options(),
                        };
                        let client = self.client.with_options(&options);
                        Box::pin(client.custom::<Value, Value>(
                            eval,
                            script_args(Value::from(script.source()), keys, args),
                        ))
                        .await
                    }
                    other => other,
                }
            });
            self.bounded(evalsha, "EVALSHA", sending).await
        };
        // Name the command that failed: the retry with the source when it was sent.
        outcome.map_err(|failure| match failure {
            NodeOutcome::ServerError(mut e) => {
                e.command = sent.into();
                NodeOutcome::ServerError(e)
            }
            other => other,
        })
    }

    /// A fenced acquisition on a cluster member, taken apart (see `scripts::Unfenced`):
    /// the acquisition alone on `keys` but the last, the fencing counter's, and a `GET` of
    /// the counter in the same flight; their answers make the fenced script's. An
    /// acquisition, so never sent twice ([`OnNoScript::Refuse`]).
    pub(crate) async fn fenced_apart(
        &self,
        unfenced: &Unfenced,
        keys: &[Key],
        args: &[Value],
    ) -> Result<Value, NodeOutcome> {
        let Some((counter, lock_keys)) = keys.split_last() else {
            return Err(unexpected_reply("EVALSHA"));
        };
        // Polled in this order, so the acquisition is handed to fred first.
        let (reply, counter) = futures::join!(
            self.eval_as(
                &unfenced.script,
                lock_keys,
                args,
                OnNoScript::Refuse,
                Sending::InRound
            ),
            self.custom_as("GET", vec![Value::from(counter.clone())], Sending::InRound)
        );
        unfenced
            .reply
            .compose(reply?, &counter?)
            .ok_or_else(|| unexpected_reply("EVALSHA"))
    }

    /// One command with the per-command options, under the node timeout.
    ///
    /// fred's future for a command is about 7 KB: it is boxed where it is made, so that the
    /// futures around it (this one, a round's call to one node) stay small. Unboxed, every
    /// move of each of them would copy it whole (into `bounded`, into the timeout, into the
    /// boxed call of each node), and those copies would be a large share of the
    /// instructions of an uncontended lock and release (see `docs/benchmarks.md`,
    /// "Instructions per cycle").
    pub(super) async fn custom_as(
        &self,
        name: &'static str,
        args: Vec<Value>,
        sending: Sending,
    ) -> Result<Value, NodeOutcome> {
        self.gate()?;
        self.send_custom_as(name, args, sending).await
    }

    /// Whether the node's commands may be sent: `Err` with why not, for a node not yet
    /// identified or found to be another node's server (see [`identity`](super::identity)).
    pub(super) fn gate(&self) -> Result<(), NodeOutcome> {
        self.identity
            .gate(|| self.connect_failure().map(|failure| failure.outcome()))
    }

    /// [`custom_as`](Self::custom_as) whatever the node's identity, sent alone.
    pub(super) async fn send_custom(
        &self,
        name: &'static str,
        args: Vec<Value>,
    ) -> Result<Value, NodeOutcome> {
        self.send_custom_as(name, args, Sending::Alone).await
    }

    /// [`send_custom`](Self::send_custom) sent as `sending`.
    pub(super) async fn send_custom_as(
        &self,
        name: &'static str,
        args: Vec<Value>,
        sending: Sending,
    ) -> Result<Value, NodeOutcome> {
        let command = CustomCommand::new_static(name, None, false);
        let fut = boxed(
            Box::new_uninit(),
            self.cmd.custom::<Value, Value>(command, args),
        );
        self.bounded(fut, name, sending).await
    }
}

/// A reply of a shape the command never answers.
fn unexpected_reply(command: &'static str) -> NodeOutcome {
    NodeOutcome::ServerError(ServerError::of_kind(
        ServerErrorKind::Unknown,
        command,
        "unexpected reply: the node may not be a Redis master",
    ))
}

/// `future`, pinned in `slot`. The slot is allocated before the future is made, so that
/// the future (fred's is about 7 KB) can be written there directly; `Box::pin(future)` makes
/// it on the stack first and then copies it whole.
#[inline(always)]
pub(super) fn boxed<F>(slot: Box<std::mem::MaybeUninit<F>>, future: F) -> Pin<Box<F>> {
    Box::into_pin(Box::write(slot, future))
}

/// `EVAL` or `EVALSHA` (`name`) of a script over `keys`, sent by `connection`. A cluster
/// member sends it to the master of the first key's slot (every key of one script shares
/// that slot, see `layout`), and a script without keys to any master. fred would hash the
/// first argument, the script, and it honours only a slot given outright for a custom
/// command; a single server needs none.
fn script_command(connection: &Connection, name: &'static str, keys: &[Key]) -> CustomCommand {
    let hash = match keys.first() {
        _ if !connection.is_cluster() => ClusterHash::FirstKey,
        Some(key) => ClusterHash::Custom(fred::util::redis_keyslot(key.as_bytes())),
        None => ClusterHash::Random,
    };
    CustomCommand::new_static(name, hash, false)
}

fn script_args(head: Value, keys: &[Key], args: &[Value]) -> Vec<Value> {
    let mut all = Vec::with_capacity(2 + keys.len() + args.len());
    all.push(head);
    all.push((keys.len() as i64).into());
    all.extend(keys.iter().cloned().map(Value::from));
    all.extend(args.iter().cloned());
    all
}

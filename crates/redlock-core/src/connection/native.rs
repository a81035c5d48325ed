//! A node's native compare-and-delete: whether it has `DELIFEQ key value` (Valkey 9.0 and
//! later), and the release that sends it there instead of the kind's script.
//!
//! `DELIFEQ` deletes the key only when it holds the value, in one command, as the release
//! script does for a plain lock: it never deletes another holder's key, and it answers as
//! the script does (1 deleted, 0 not held). It costs the node far less than a script call,
//! and the client less than `EVALSHA` (see `docs/servers.md`).
//!
//! The node is asked (`COMMAND INFO DELIFEQ`) when it connects and again after each
//! reconnection, since its name may reach another server after a failover or a change of
//! address; until it answers, and where it lacks the command, the release is the script.
//! A stale answer costs a round trip, never a guarantee: a server without `DELIFEQ`, or
//! whose ACL refuses it while it allows the scripts, answers with an error and runs
//! nothing; the release is then sent as the script, and the node is not sent `DELIFEQ`
//! again until it reconnects.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use fred::clients::{Client, WithOptions};
use fred::interfaces::ClientLike;
use fred::types::{CustomCommand, Key, Value};

use super::commands::{boxed, OnNoScript};
use super::health::{first_offered, is_refusal};
use super::sending::Sending;
use super::Connection;
use crate::report::{NodeName, NodeOutcome};
use crate::scripts::Script;

/// Whether a node takes `DELIFEQ`, as last read or learnt.
#[derive(Debug)]
pub(super) struct NativeDelete {
    /// The node, for the log line when it refuses the command.
    node: NodeName,
    state: AtomicU8,
}

impl NativeDelete {
    /// Not asked yet, or it did not answer: the script.
    const UNKNOWN: u8 = 0;
    /// `COMMAND INFO` describes it.
    const OFFERED: u8 = 1;
    /// The server does not know it.
    const ABSENT: u8 = 2;
    /// Offered, but it answered `DELIFEQ` with a refusal (an ACL, or a server changed
    /// under the node's name): the script until the node is asked again.
    const REFUSED: u8 = 3;

    pub(super) fn new(node: NodeName) -> NativeDelete {
        NativeDelete {
            node,
            state: AtomicU8::new(Self::UNKNOWN),
        }
    }

    fn offered(&self) -> bool {
        self.state.load(Ordering::Relaxed) == Self::OFFERED
    }

    /// Asks the node whether it has the command, and records the answer unless a refusal
    /// was recorded while the question was on its way (the answer would undo it). No
    /// answer leaves what was known.
    pub(super) async fn ask(&self, cmd: &WithOptions<Client>) {
        let before = self.state.load(Ordering::SeqCst);
        let command = CustomCommand::new_static("COMMAND", None, false);
        let args = vec![Value::from("INFO"), Value::from("DELIFEQ")];
        let reply = boxed(Box::new_uninit(), cmd.custom::<Value, Value>(command, args)).await;
        let Some(offered) = reply.ok().as_ref().and_then(first_offered) else {
            return;
        };
        let now = if offered { Self::OFFERED } else { Self::ABSENT };
        let _ = self
            .state
            .compare_exchange(before, now, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Records a refusal; logs it the first time.
    fn refuse(&self, why: &dyn std::fmt::Display) {
        if self.state.swap(Self::REFUSED, Ordering::SeqCst) == Self::OFFERED {
            tracing::info!(node = %self.node, %why, "the node refuses DELIFEQ: its releases run the release script until it reconnects");
        }
    }
}

/// Asks the node again in the background, after a reconnection (see [`NativeDelete::ask`]).
/// Outside a tokio runtime (a connection being dropped) it does nothing.
pub(super) fn ask_again(cmd: &Arc<WithOptions<Client>>, native: &Arc<NativeDelete>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let (cmd, native) = (cmd.clone(), native.clone());
    runtime.spawn(async move { native.ask(&cmd).await });
}

impl Connection {
    /// Releases `key` if it holds `token`, as a round's command: `DELIFEQ` where the node has it, else `script`
    /// (the kind's release, on `key` with `args`). An error reply to `DELIFEQ` (nothing ran)
    /// sends the script, under a node timeout of its own; a refusal (`NOPERM`, an unknown
    /// command) also keeps the node on the script until it reconnects. Any other failure
    /// (no answer) is the outcome, as a script's would be: the release may have run.
    pub(crate) async fn compare_and_delete(
        &self,
        key: &Key,
        token: &Value,
        script: &Script,
        args: &[Value],
    ) -> Result<Value, NodeOutcome> {
        let keys = std::slice::from_ref(key);
        let round = Sending::InRound;
        if !self.native.offered() {
            return self
                .eval_as(script, keys, args, OnNoScript::Resend, round)
                .await;
        }
        let delifeq = vec![Value::from(key.clone()), token.clone()];
        match self.custom_as("DELIFEQ", delifeq, round).await {
            Err(NodeOutcome::ServerError(e)) => {
                if is_refusal(&e) {
                    self.native.refuse(&e);
                }
                self.eval_as(script, keys, args, OnNoScript::Resend, round)
                    .await
            }
            answer => answer,
        }
    }
}

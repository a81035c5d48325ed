//! Whether a node knows the lock's scripts, and loading them there: once when it connects,
//! and again in the background after a reconnection or a `NOSCRIPT`. Apart from the
//! commands, which only read whether the scripts may be missing and ask for a load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fred::clients::{Client, WithOptions};
use fred::interfaces::{ClientLike, LuaInterface};
use fred::types::{CustomCommand, Value};

use super::commands::boxed;
use crate::report::NodeName;

/// Whether a node knows the lock's scripts, and the background load that teaches it them.
#[derive(Debug)]
pub(super) struct ScriptCache {
    /// The node, for the warning when a load fails.
    pub(super) node: NodeName,
    /// The node may not know them: from a reconnection (a restarted node has forgotten
    /// them), a `NOSCRIPT`, or a load that failed, until a load succeeds. Meanwhile an
    /// acquisition is sent with its script's source (`EVAL`): one command, in order.
    pub(super) missing: AtomicBool,
    /// A load runs in the background.
    pub(super) running: AtomicBool,
    /// A load was asked for since the running one started: it runs again.
    pub(super) wanted: AtomicBool,
}

/// Loads every script of the lock on the node (`SCRIPT LOAD`), each under the node
/// timeout; `Err` says why one was not loaded (an ACL without `script|load`, a proxy that
/// refuses `SCRIPT`, the node down).
///
/// On a cluster member every master needs them (a script runs on the master of its keys'
/// slot): fred's `SCRIPT LOAD` for clusters sends each to every master it knows.
pub(super) async fn load_scripts(cmd: &WithOptions<Client>) -> Result<(), String> {
    if cmd.is_clustered() {
        let loads = crate::kind::every_script()
            .into_iter()
            .map(|script| Box::pin(cmd.script_load_cluster::<Value, _>(script.source())));
        return match futures::future::join_all(loads)
            .await
            .into_iter()
            .find_map(Result::err)
        {
            None => Ok(()),
            Some(e) => Err(format!(
                "SCRIPT LOAD on every master: {:?}: {}",
                e.kind(),
                e.details()
            )),
        };
    }
    let command = || CustomCommand::new_static("SCRIPT", None, false);
    // Each of fred's futures (about 7 KB) boxed where it is made, never an array of them
    // on the stack.
    let loads = crate::kind::every_script().into_iter().map(|script| {
        boxed(
            Box::new_uninit(),
            cmd.custom::<Value, Value>(
                command(),
                vec![Value::from("LOAD"), Value::from(script.source())],
            ),
        )
    });
    // Sent together: one round trip, not one per script.
    match futures::future::join_all(loads)
        .await
        .into_iter()
        .find_map(Result::err)
    {
        None => Ok(()),
        Some(e) => Err(format!("SCRIPT LOAD: {:?}: {}", e.kind(), e.details())),
    }
}

impl ScriptCache {
    /// Records how a load went: the node knows the scripts once one succeeded with no
    /// request for another since (the node may have restarted meanwhile); a failure is
    /// logged, and acquisitions there keep sending the source.
    pub(super) fn loaded(&self, load: Result<(), String>) {
        match load {
            Ok(()) if !self.wanted.load(Ordering::SeqCst) => {
                self.missing.store(false, Ordering::SeqCst);
            }
            Ok(()) => {}
            Err(why) => {
                tracing::warn!(node = %self.node, %why, "the lock's scripts could not be loaded; acquisitions there send their scripts' source (EVAL) until they are")
            }
        }
    }
}

/// Loads the scripts again in the background (see [`load_scripts`]); a request that comes
/// while a load runs makes it run once more when it ends. Outside a tokio runtime (a
/// connection being dropped) it does nothing.
pub(super) fn reload_scripts(cmd: &Arc<WithOptions<Client>>, scripts: &Arc<ScriptCache>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    scripts.wanted.store(true, Ordering::SeqCst);
    if scripts.running.swap(true, Ordering::SeqCst) {
        return;
    }
    let (cmd, scripts) = (cmd.clone(), scripts.clone());
    runtime.spawn(async move {
        loop {
            scripts.wanted.store(false, Ordering::SeqCst);
            scripts.loaded(load_scripts(&cmd).await);
            scripts.running.store(false, Ordering::SeqCst);
            // A request that came during the load found it running and left it to us,
            // unless another task has taken over since.
            if !scripts.wanted.load(Ordering::SeqCst)
                || scripts.running.swap(true, Ordering::SeqCst)
            {
                break;
            }
        }
    });
}

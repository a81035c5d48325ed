//! Test support for the redlock workspace: real `redis-server` processes on free loopback
//! ports, with process-level fault injection.
//!
//! Every integration test, example and benchmark of the workspace starts its Redis masters
//! through this crate:
//!
//! ```no_run
//! use redlock_testkit::{HarnessError, NodeSet};
//!
//! async fn example() -> Result<(), HarnessError> {
//!     let nodes = NodeSet::start(3).await?;
//!     let urls = nodes.urls(); // "redis://127.0.0.1:PORT", one per node
//!     # let _ = urls;
//!     nodes.node(0).set("k", "v", Some(10_000)).await?;
//!     nodes.node(1).pause()?; // SIGSTOP: requests to it now time out
//!     assert_eq!(nodes.nodes_holding("k").await, vec![0]);
//!     nodes.node(1).resume()?;
//!     nodes.node(2).kill()?; // SIGKILL
//!     nodes.node(2).restart().await?; // same port, data gone (no persistence by default)
//!     Ok(())
//! } // dropping `nodes` kills and reaps every process and removes the data directories
//! # fn main() {}
//! ```
//!
//! # Finding redis-server
//! `$REDIS_SERVER` (a path, or a name looked up on `PATH`), else `redis-server` on `PATH`.
//! On Debian: `apt-get install -y redis-server`.
//!
//! # Process hygiene
//! Each node runs `redis-server --port P --bind 127.0.0.1 --daemonize no --save "" ...` with its
//! own temporary `--dir` and a `--logfile` inside it (start-up errors quote its tail). Nodes are
//! killed and reaped when dropped, also when a test panics (unwinding drops them). If the test
//! process itself is killed, `PR_SET_PDEATHSIG(SIGKILL)` takes the servers down with it. That
//! signal fires when the *thread* that spawned the server exits: servers are spawned from the
//! thread calling [`NodeSet::start`] / [`Node::restart`] (a test thread, a `block_on` thread or
//! a tokio worker, all living as long as the test). Do not keep nodes started from a
//! short-lived thread such as a `spawn_blocking` one.
//!
//! Linux only (prctl, `/proc`). No timing guarantees are made beyond the documented timeouts:
//! start-up waits up to [`READY_TIMEOUT`], inspection calls up to about [`INSPECT_TIMEOUT`].
#![deny(missing_docs, missing_debug_implementations)]
#![deny(unsafe_code)]

mod error;
mod faults;
mod inspect;
mod node;
mod port;
mod process;
mod ready;
mod set;

pub use error::HarnessError;
pub use inspect::INSPECT_TIMEOUT;
pub use node::{Node, READY_TIMEOUT};
pub use process::REDIS_SERVER_ENV;
pub use set::NodeSet;

/// How each node is configured.
#[derive(Clone, Debug, Default)]
pub struct NodeOptions {
    /// `--appendonly yes --appendfsync always`, so data survives [`Node::restart`] and even
    /// [`Node::kill`]. Default `false`: `--save "" --appendonly no`, no persistence at all.
    pub appendonly_always: bool,
    /// Extra `redis-server` arguments, appended last (so they override the defaults),
    /// e.g. `["--hz", "100"]`.
    pub extra_args: Vec<String>,
}

//! The docker-compose node set: the five Redis masters of `docker-compose.yml`, each in its own
//! container, with container-level faults (kill, start, pause, network disconnect) and
//! optional fake clocks.
//!
//! Heavier than [`NodeSet`](crate::NodeSet) and opt-in: it needs Docker Engine and
//! docker-compose v1 (`docker-compose`, not the `docker compose` plugin). Every Docker call is a
//! plain `docker` / `docker-compose` command line, run on tokio's blocking pool with a deadline
//! after which the command (and its process group) is killed (see `crate::command`).
//!
//! Container names (`redlock-redis1`..`5`), the network name (`redlock`) and the host ports
//! (`127.0.0.1:7101`..`7105`) are fixed by `docker-compose.yml`, so only one set can run per
//! Docker daemon; within one process, [`DockerSet::up`] refuses a second set while one is alive.
//!
//! The modules, in the order [`DockerSet::up`] uses them: `available` (are Docker and
//! docker-compose there), `image` (build the image), `clock` (the per-run clock directory),
//! `compose` (the `docker-compose` command lines), `set` (the set and its life cycle),
//! `container` (one container: names, address, `docker` commands, readiness) and `faults`
//! (the faults, and the set as [`Nodes`](crate::Nodes)).

mod available;
mod clock;
mod cluster;
mod compose;
mod container;
mod faults;
mod image;
mod set;

pub use cluster::DockerCluster;
pub use set::{DockerOptions, DockerSet};

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{command, HarnessError};

/// This process's claim on one of the fixed sets (their container names, network and ports
/// are fixed, so one of each runs per Docker daemon); released when dropped.
#[derive(Debug)]
struct Claim(&'static AtomicBool);

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// What `up` of both sets checks first: that Docker and docker-compose are there, that no
/// other set of the kind `what` is up in this process (`slot`), and that the compose file
/// `file` is in the repository. Returns the claim and the file's path.
async fn claim(
    slot: &'static AtomicBool,
    what: &str,
    file: &str,
) -> Result<(Claim, PathBuf), HarnessError> {
    command::blocking(DockerSet::available)
        .await
        .map_err(|e| HarnessError::io("check that Docker is available", e))??;
    if slot.swap(true, Ordering::SeqCst) {
        return Err(HarnessError::DockerUnavailable {
            reason: format!("another {what} of this process is still up"),
            advice: format!(
                "drop it before calling {what}::up again (container names and ports are fixed, \
                 so one per Docker daemon)"
            ),
        });
    }
    let claim = Claim(slot);
    let path = image::repo_root().join(file);
    if !path.is_file() {
        return Err(compose::set_error(
            "find the compose file",
            path.display().to_string(),
            "does not exist".to_owned(),
            "run the tests from a full checkout of the repository",
            String::new(),
        ));
    }
    Ok((claim, path))
}

/// Services `redis1`..`redis5` in `docker-compose.yml`.
const NODES: usize = 5;

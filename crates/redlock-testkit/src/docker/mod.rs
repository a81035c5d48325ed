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

/// Services `redis1`..`redis5` in `docker-compose.yml`.
const NODES: usize = 5;

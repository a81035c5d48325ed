//! [`DockerSet`] and its life cycle: `up` (image, clean slate, `docker-compose up`, readiness)
//! and `down -v` when dropped.

use std::sync::atomic::AtomicBool;

use futures::future::try_join_all;
use tempfile::TempDir;

use super::compose::{set_error, Compose, COMPOSE_TIMEOUT};
use super::container::Container;
use super::{clock, image, NODES};
use crate::{ClockControl, HarnessError, Nodes};

/// Set while a [`DockerSet`] of this process is alive.
static UP: AtomicBool = AtomicBool::new(false);

/// How [`DockerSet::up`] configures the containers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DockerOptions {
    /// `--appendonly yes --appendfsync always`: data survives a kill and restart. Default
    /// `false`: `--appendonly no --save ""`, a restarted container comes back empty.
    pub appendonly_always: bool,
    /// A [`ClockControl`] per node ([`Nodes::clock`]) steering the clock shim preloaded into
    /// each container. Default `false`: real clocks.
    pub fake_clock: bool,
}

/// The five containers of `docker-compose.yml` (`redis1`..`redis5` on `127.0.0.1:7101`..`7105`),
/// as independent Redlock masters with container-level faults.
///
/// Its nodes, inspection and faults by index are those of the [`Nodes`] interface (bring it
/// into scope with `use redlock_testkit::Nodes`), so a test written against `&dyn Nodes` runs
/// on this set and on a local [`NodeSet`](crate::NodeSet) alike. Its own methods are the
/// Docker-only ones: [`DockerSet::start`], [`DockerSet::disconnect`],
/// [`DockerSet::connect`], [`DockerSet::container`].
///
/// Dropping the set runs `docker-compose down -v` (containers, network and data volumes go;
/// a failure is logged through `tracing`) and removes the per-run clock directory.
#[derive(Debug)]
pub struct DockerSet {
    pub(super) compose: Compose,
    pub(super) nodes: Vec<Container>,
    pub(super) clocks: Vec<ClockControl>,
    options: DockerOptions,
    // Fields drop after `Drop::drop` took the containers down, so the mounts are gone by then.
    _clock_dir: TempDir,
    _slot: super::Claim,
}

impl DockerSet {
    /// Builds the image (`docker/build-image.sh`, a no-op when up to date), takes down any
    /// leftover of an earlier run (`down -v`, so every set starts empty), then runs
    /// `docker-compose -p redlock-lab -f <repo>/docker-compose.yml up -d --force-recreate` and
    /// waits (up to 20 s) until all five nodes answer PING on `127.0.0.1:7101..7105`.
    ///
    /// Fails with [`HarnessError::DockerUnavailable`] when Docker is missing or another set of
    /// this process is still alive, and with [`HarnessError::Docker`] when a step fails (on
    /// failure the containers are taken down again).
    pub async fn up(opts: DockerOptions) -> Result<DockerSet, HarnessError> {
        let (slot, file) = super::claim(&UP, "DockerSet", "docker-compose.yml").await?;
        let root = image::repo_root();
        image::build(&root).await?;
        let clock_dir = clock::dir(&root)?;
        let compose = Compose::new(file, &opts, clock_dir.path());
        let nodes: Vec<Container> = (1..=NODES).map(Container::new).collect();
        let clocks = if opts.fake_clock {
            clock::controls(&nodes, clock_dir.path())?
        } else {
            Vec::new()
        };
        // Leftovers of a run that could not clean up would keep their data (volumes) or block
        // the fixed names; a failure here shows up again, with its cause, in `up` below.
        let _ = compose.run(&["down", "-v", "--timeout", "2"]).await;
        // Built before `up`, so that whatever fails from here on, dropping it takes the
        // containers down again.
        let set = DockerSet {
            compose,
            nodes,
            clocks,
            options: opts,
            _clock_dir: clock_dir,
            _slot: slot,
        };
        let args = ["up", "-d", "--force-recreate"];
        let ran = set
            .compose
            .run(&args)
            .await
            .map_err(|e| set.compose.error(&args, e))?;
        if !ran.ok() {
            return Err(set_error(
                "start the containers",
                set.compose.shown(&args),
                ran.outcome(COMPOSE_TIMEOUT),
                "if another copy of the set holds the names redlock-redis1..5 or the ports \
                 7101..7105 (`docker ps -a --filter name=redlock-redis`), take it down with \
                 `docker-compose down -v` in its directory",
                ran.output(),
            ));
        }
        try_join_all((0..NODES).map(|i| set.wait_ready(i, "start"))).await?;
        tracing::debug!(urls = ?set.urls(), "docker node set ready");
        Ok(set)
    }

    /// The options the set was started with.
    pub fn options(&self) -> &DockerOptions {
        &self.options
    }

    /// Container name of node `i` (`redlock-redis1`..), for `docker` commands of your own.
    /// Panics if `i >= len()`.
    pub fn container(&self, i: usize) -> &str {
        &self.at(i).container
    }

    /// Node `i`, panicking with a clear message for an index out of range (like slice
    /// indexing; the fallible methods return [`HarnessError::NoSuchNode`] instead).
    pub(super) fn at(&self, i: usize) -> &Container {
        self.nodes.get(i).unwrap_or_else(|| {
            panic!(
                "docker node set: there is no node {i} (the set has {} nodes)",
                self.nodes.len()
            )
        })
    }

    /// Node `i`, or [`HarnessError::NoSuchNode`] for `action`.
    pub(super) fn node(&self, i: usize, action: &str) -> Result<&Container, HarnessError> {
        self.nodes.get(i).ok_or_else(|| HarnessError::NoSuchNode {
            set: "docker node set".to_owned(),
            action: action.to_owned(),
            index: i,
            len: self.nodes.len(),
        })
    }
}

impl Drop for DockerSet {
    fn drop(&mut self) {
        self.compose.take_down();
    }
}

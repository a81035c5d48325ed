//! The per-run clock directory of the docker set: one subdirectory per container, mounted on
//! `/clock` inside it, where the clock shim preloaded into redis-server reads its control file.
//! A [`ClockControl`] on the host writes that file.

use std::fs::{self, Permissions};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tempfile::TempDir;

use super::container::Container;
use super::NODES;
use crate::{ClockControl, HarnessError};

/// A fresh directory `<repo>/target/redlock-lab-clock-XXXXXX` with one world-readable
/// subdirectory per node, mounted on `/clock` in its container. Under `target/` rather than
/// the system temp dir because Docker setups that run the daemon in a VM share the project
/// tree more often than `/tmp`.
pub(super) fn dir(root: &Path) -> Result<TempDir, HarnessError> {
    let parent = root.join("target");
    fs::create_dir_all(&parent)
        .map_err(|e| HarnessError::io(format!("create {}", parent.display()), e))?;
    let dir = tempfile::Builder::new()
        .prefix("redlock-lab-clock-")
        .permissions(Permissions::from_mode(0o755))
        .tempdir_in(&parent)
        .map_err(|e| {
            HarnessError::io(
                format!("create a clock directory in {}", parent.display()),
                e,
            )
        })?;
    for n in 1..=NODES {
        let sub = dir.path().join(format!("redis{n}"));
        fs::create_dir(&sub)
            .and_then(|()| fs::set_permissions(&sub, Permissions::from_mode(0o755)))
            .map_err(|e| HarnessError::io(format!("create {}", sub.display()), e))?;
    }
    Ok(dir)
}

/// One [`ClockControl`] per container, writing `<dir>/<service>/control`.
pub(super) fn controls(nodes: &[Container], dir: &Path) -> Result<Vec<ClockControl>, HarnessError> {
    nodes
        .iter()
        .map(|n| ClockControl::for_node(&n.service, dir.join(&n.service).join("control")))
        .collect()
}

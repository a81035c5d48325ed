//! The image the containers run: `docker/build-image.sh` builds it locally (there is no
//! registry to pull from) and returns at once when it is up to date.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::compose::set_error;
use crate::command;
use crate::HarnessError;

/// Deadline of the image build (an up-to-date image returns at once).
const BUILD_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs `docker/build-image.sh` (idempotent).
pub(super) async fn build(root: &Path) -> Result<(), HarnessError> {
    let script = root.join("docker").join("build-image.sh");
    let shown = format!("bash {}", script.display());
    let mut cmd = Command::new("bash");
    cmd.arg(&script);
    let advice = "run the script by hand to see its whole output";
    match command::run(cmd, BUILD_TIMEOUT).await {
        Ok(ran) if ran.ok() => Ok(()),
        Ok(ran) => Err(set_error(
            "build the image",
            shown,
            ran.outcome(BUILD_TIMEOUT),
            advice,
            ran.output(),
        )),
        Err(e) => Err(set_error(
            "build the image",
            shown,
            format!("could not be run ({e})"),
            "install bash",
            String::new(),
        )),
    }
}

/// The repository root (where `docker-compose.yml` and `docker/` live), two levels above this
/// crate.
pub(super) fn repo_root() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .ancestors()
        .nth(2)
        .unwrap_or(crate_dir)
        .to_path_buf()
}

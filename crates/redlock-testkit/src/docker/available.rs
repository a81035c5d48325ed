//! [`DockerSet::available`]: whether the `docker` and `docker-compose` command lines are
//! installed and the Docker daemon answers, with advice on what to install or start.

use std::process::Command;

use super::container::DOCKER_TIMEOUT;
use super::DockerSet;
use crate::command::run_blocking;
use crate::HarnessError;

impl DockerSet {
    /// Checks that `docker` and `docker-compose` are installed and that the Docker daemon
    /// answers; the error says what to install or start.
    pub fn available() -> Result<(), HarnessError> {
        let unavailable = |reason: String, advice: &str| HarnessError::DockerUnavailable {
            reason,
            advice: advice.to_owned(),
        };
        let mut docker = Command::new("docker");
        docker.args(["version", "--format", "{{.Server.Version}}"]);
        match run_blocking(docker, DOCKER_TIMEOUT) {
            Err(e) => {
                return Err(unavailable(
                    format!("the docker CLI could not be run ({e})"),
                    "install Docker Engine (Debian: `apt-get install -y docker.io`)",
                ))
            }
            Ok(ran) if !ran.ok() => {
                return Err(unavailable(
                    format!(
                        "the Docker daemon did not answer `docker version`: {}",
                        ran.output().trim()
                    ),
                    "start it (`systemctl start docker`, or `dockerd &` without systemd) and \
                     make sure this user may use /var/run/docker.sock (root or group docker)",
                ))
            }
            Ok(_) => {}
        }
        let mut compose = Command::new("docker-compose");
        compose.args(["version", "--short"]);
        match run_blocking(compose, DOCKER_TIMEOUT) {
            Ok(ran) if ran.ok() => Ok(()),
            Ok(ran) => Err(unavailable(
                format!("`docker-compose version` failed: {}", ran.output().trim()),
                "reinstall docker-compose v1 (Debian: `apt-get install -y docker-compose`)",
            )),
            Err(e) => Err(unavailable(
                format!("docker-compose could not be run ({e})"),
                "install docker-compose v1 (Debian: `apt-get install -y docker-compose`)",
            )),
        }
    }
}

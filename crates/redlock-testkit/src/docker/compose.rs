//! The `docker-compose` command lines of the set: the compose file, the project name and the
//! variables `docker-compose.yml` interpolates (persistence, clock directory, ports).

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::container::port;
use super::{DockerOptions, NODES};
use crate::command::{self, Ran};
use crate::HarnessError;

/// Compose project name; the data volumes are `redlock-lab_redisN-data`.
const PROJECT: &str = "redlock-lab";
/// Compose project name of the cluster of `docker-compose.cluster.yml`.
const CLUSTER_PROJECT: &str = "redlock-cluster";
/// Deadline of `docker-compose up` / `down`: a network and five containers.
pub(super) const COMPOSE_TIMEOUT: Duration = Duration::from_secs(180);

/// How to call `docker-compose` for this set: the file and the variables it interpolates.
#[derive(Debug)]
pub(super) struct Compose {
    project: &'static str,
    file: PathBuf,
    env: Vec<(String, OsString)>,
}

impl Compose {
    pub(super) fn new(file: PathBuf, opts: &DockerOptions, clock_dir: &Path) -> Compose {
        let appendonly = if opts.appendonly_always { "yes" } else { "no" };
        let mut env = vec![
            ("REDLOCK_APPENDONLY".to_owned(), OsString::from(appendonly)),
            ("REDLOCK_CLOCK_DIR".to_owned(), clock_dir.as_os_str().into()),
        ];
        // The ports are fixed here; a REDLOCK_PORT_N of the caller's environment must not
        // move a node away from the address this set reports.
        for n in 1..=NODES {
            env.push((format!("REDLOCK_PORT_{n}"), port(n).to_string().into()));
        }
        Compose {
            project: PROJECT,
            file,
            env,
        }
    }

    /// The cluster of `docker-compose.cluster.yml` (`file`), which interpolates nothing.
    pub(super) fn cluster(file: PathBuf) -> Compose {
        Compose {
            project: CLUSTER_PROJECT,
            file,
            env: Vec::new(),
        }
    }

    /// `docker-compose -p <project> -f <file> <args>` with the set's variables.
    pub(super) fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("docker-compose");
        cmd.arg("-p")
            .arg(self.project)
            .arg("-f")
            .arg(&self.file)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Runs [`Compose::command`] under [`COMPOSE_TIMEOUT`].
    pub(super) async fn run(&self, args: &[&str]) -> io::Result<Ran> {
        command::run(self.command(args), COMPOSE_TIMEOUT).await
    }

    /// The command line as a user would type it, for messages.
    pub(super) fn shown(&self, args: &[&str]) -> String {
        format!(
            "docker-compose -p {} -f {} {}",
            self.project,
            self.file.display(),
            args.join(" ")
        )
    }

    /// `docker-compose ... down -v` (containers, network and volumes go), logging through
    /// `tracing` when it cannot: what dropping a set does.
    pub(super) fn take_down(&self) {
        let args = ["down", "-v", "--timeout", "2"];
        match command::run_blocking(self.command(&args), COMPOSE_TIMEOUT) {
            Ok(ran) if ran.ok() => tracing::debug!(project = self.project, "taken down"),
            Ok(ran) => tracing::warn!(
                command = %self.shown(&args),
                outcome = %ran.outcome(COMPOSE_TIMEOUT),
                output = %ran.output(),
                "could not take the containers down; run the command by hand"
            ),
            Err(error) => tracing::warn!(
                command = %self.shown(&args),
                %error,
                "could not take the containers down; run the command by hand"
            ),
        }
    }

    /// The error for a `docker-compose` that could not be run at all.
    pub(super) fn error(&self, args: &[&str], e: io::Error) -> HarnessError {
        set_error(
            "run docker-compose",
            self.shown(args),
            format!("could not be run ({e})"),
            "install docker-compose v1 (Debian: `apt-get install -y docker-compose`)",
            String::new(),
        )
    }
}

/// A [`HarnessError::Docker`] about the whole set (not one node): `command` ended with
/// `outcome` while trying to `action`.
pub(super) fn set_error(
    action: &str,
    command: String,
    outcome: String,
    advice: &str,
    output: String,
) -> HarnessError {
    HarnessError::Docker {
        name: "docker node set".to_owned(),
        action: action.to_owned(),
        failure: format!("`{command}` {outcome}"),
        advice: advice.to_owned(),
        output,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compose_pins_persistence_and_ports() {
        let opts = DockerOptions::default();
        let compose = Compose::new("c.yml".into(), &opts, Path::new("clk"));
        let env: Vec<(String, String)> = compose
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string_lossy().into_owned()))
            .collect();
        assert!(env.contains(&("REDLOCK_APPENDONLY".into(), "no".into())));
        assert!(env.contains(&("REDLOCK_CLOCK_DIR".into(), "clk".into())));
        assert!(env.contains(&("REDLOCK_PORT_5".into(), "7105".into())));
        assert_eq!(
            compose.shown(&["up", "-d"]),
            "docker-compose -p redlock-lab -f c.yml up -d"
        );
    }
}

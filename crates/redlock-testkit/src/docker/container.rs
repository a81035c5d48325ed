//! One container of the set: its service and container names and host address, the `docker`
//! commands run on it, and the wait until it answers PING.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use super::DockerSet;
use crate::command::{self, Ran, OUTPUT_LINES};
use crate::{HarnessError, Nodes};

/// Host port of `redis1`; `redisN` is published on `FIRST_PORT + N - 1`.
const FIRST_PORT: u16 = 7101;
/// Deadline of one `docker` CLI call (kill, start, pause, network, logs).
pub(super) const DOCKER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `up`, `start` and `connect` wait for PONG. A container starts in about a second;
/// the rest is margin for a small, shared machine.
const READY_WAIT: Duration = Duration::from_secs(20);
/// Pause between two PINGs while waiting.
const READY_POLL: Duration = Duration::from_millis(100);

/// One service of the compose file.
#[derive(Debug)]
pub(super) struct Container {
    /// `redis{n}`, the node's name.
    pub(super) service: String,
    /// `redlock-redis{n}`, for `docker` commands.
    pub(super) container: String,
    /// `127.0.0.1:{port}` on the host.
    pub(super) addr: SocketAddr,
}

impl Container {
    /// Service `redis{n}` (1-based).
    pub(super) fn new(n: usize) -> Container {
        Container {
            service: format!("redis{n}"),
            container: format!("redlock-redis{n}"),
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port(n))),
        }
    }

    fn error(&self, action: &str, args: &[&str], outcome: String, output: String) -> HarnessError {
        HarnessError::Docker {
            name: self.service.clone(),
            action: action.to_owned(),
            failure: format!("`docker {}` {outcome}", args.join(" ")),
            advice: format!(
                "check the container with `docker ps -a --filter name={c}` and `docker logs {c}` \
                 (was the set taken down by someone else?)",
                c = self.container
            ),
            output,
        }
    }
}

/// Host port of `redis{n}` (1-based; `n` is at most [`NODES`](super::NODES)).
pub(super) fn port(n: usize) -> u16 {
    FIRST_PORT + (n as u16 - 1)
}

impl DockerSet {
    /// `docker <args> <container>`; an error whose output contains one of `no_op` is a
    /// success (the node already is in the requested state).
    pub(super) async fn docker(
        &self,
        i: usize,
        action: &str,
        args: &[&str],
        no_op: &[&str],
    ) -> Result<(), HarnessError> {
        let node = self.node(i, action)?;
        let mut all: Vec<&str> = args.to_vec();
        all.push(&node.container);
        match run_docker(&all).await {
            Ok(ran) if ran.ok() => Ok(()),
            Ok(ran) if no_op.iter().any(|s| ran.stderr.contains(s)) => Ok(()),
            Ok(ran) => Err(node.error(action, &all, ran.outcome(DOCKER_TIMEOUT), ran.output())),
            Err(e) => Err(node.error(
                action,
                &all,
                format!("could not be run ({e})"),
                String::new(),
            )),
        }
    }

    /// `docker <args> <container>`, returning its stdout.
    pub(super) async fn docker_output(
        &self,
        i: usize,
        action: &str,
        args: &[&str],
    ) -> Result<String, HarnessError> {
        let node = self.node(i, action)?;
        let mut all: Vec<&str> = args.to_vec();
        all.push(&node.container);
        match run_docker(&all).await {
            Ok(ran) if ran.ok() => Ok(ran.stdout),
            Ok(ran) => Err(node.error(action, &all, ran.outcome(DOCKER_TIMEOUT), ran.output())),
            Err(e) => Err(node.error(
                action,
                &all,
                format!("could not be run ({e})"),
                String::new(),
            )),
        }
    }

    /// PING node `i` until PONG or [`READY_WAIT`]; the error quotes the container log.
    pub(super) async fn wait_ready(&self, i: usize, action: &str) -> Result<(), HarnessError> {
        let node = self.node(i, action)?;
        let redis = self.redis(i);
        let started = tokio::time::Instant::now();
        loop {
            let last = match redis.ping().await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if started.elapsed() >= READY_WAIT {
                let tail = OUTPUT_LINES.to_string();
                let log = match run_docker(&["logs", "--tail", &tail, &node.container]).await {
                    Ok(ran) => ran.output(),
                    Err(e) => format!("(docker logs failed: {e})"),
                };
                return Err(HarnessError::Docker {
                    name: node.service.clone(),
                    action: format!("{action} it: it never answered PING"),
                    failure: format!(
                        "`PING {}` got no PONG within {READY_WAIT:?} (last error: {last})",
                        node.addr
                    ),
                    advice: format!(
                        "check `docker ps -a --filter name={}` and the container log below",
                        node.container
                    ),
                    output: log,
                });
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }
}

/// `docker <args>` under [`DOCKER_TIMEOUT`].
pub(super) async fn run_docker(args: &[&str]) -> io::Result<Ran> {
    let mut cmd = Command::new("docker");
    cmd.args(args);
    command::run(cmd, DOCKER_TIMEOUT).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_numbered_from_one_on_fixed_ports() {
        let third = Container::new(3);
        assert_eq!(third.service, "redis3");
        assert_eq!(third.container, "redlock-redis3");
        assert_eq!(third.addr.to_string(), "127.0.0.1:7103");
    }
}

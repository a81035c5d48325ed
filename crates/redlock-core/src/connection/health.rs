//! Reading a node's settings for the health check (`INFO`, `CONFIG GET appendfsync`) and
//! what it offers and lets its user run (`COMMAND INFO`, the script commands tried) over its
//! connection; what they mean is judged in the crate's `health` module.

use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::config::Options;
use fred::types::{CustomCommand, Value};
use futures::future::join_all;

use super::sending::command_options;
use super::Connection;
use crate::health::{Capabilities, ClusterState, NodeHealth};
use crate::report::NodeOutcome;
use crate::server_error::{ServerError, ServerErrorKind};

/// A SHA1 no script has: `EVALSHA` with it runs nothing, and a user that may run `EVALSHA`
/// gets `NOSCRIPT`.
const NO_SCRIPT: &str = "0000000000000000000000000000000000000000";

impl Connection {
    /// Reads the node's settings for the health check: `INFO` (timed, for the latency),
    /// then together `CONFIG GET appendfsync` and `COMMAND INFO`, which managed services may
    /// refuse (then unknown), and the script commands (see [`scripts_refused`]).
    pub(crate) async fn health(&self) -> NodeHealth {
        let started = tokio::time::Instant::now();
        // Not gated: a node that casts no vote is still reachable, and its settings count.
        let info = match self.send_custom("INFO", Vec::new()).await {
            Ok(reply) => reply
                .as_str()
                .map(|text| text.to_string())
                .unwrap_or_default(),
            Err(why) => return NodeHealth::unreachable(self.name.clone(), why),
        };
        let latency = started.elapsed();
        let config = async {
            match self
                .send_custom(
                    "CONFIG",
                    vec![Value::from("GET"), Value::from("appendfsync")],
                )
                .await
            {
                Ok(reply) => config_value(reply, "appendfsync"),
                Err(why) => {
                    tracing::debug!(node = %self.name, %why, "CONFIG GET appendfsync not answered; reported as unknown");
                    None
                }
            }
        };
        let offered = async {
            match self
                .send_custom("COMMAND", vec![Value::from("INFO"), Value::from("DELIFEQ")])
                .await
            {
                Ok(reply) => first_offered(&reply),
                Err(why) => {
                    tracing::debug!(node = %self.name, %why, "COMMAND INFO not answered; the server's commands are unknown");
                    None
                }
            }
        };
        // Sent so that they run nothing: `EVALSHA` of a script no server has, `EVAL` with a
        // negative key count (refused before the script is even compiled).
        let evalsha = self.send_custom("EVALSHA", vec![Value::from(NO_SCRIPT), Value::from(0_i64)]);
        let eval = self.send_custom("EVAL", vec![Value::from("return 0"), Value::from(-1_i64)]);
        let cluster = self.cluster_masters();
        let (appendfsync, offered, evalsha, eval, cluster) =
            tokio::join!(config, offered, evalsha, eval, cluster);
        let (refused, refusal) = scripts_refused([("EVALSHA", evalsha), ("EVAL", eval)]);
        let capabilities = Capabilities {
            compare_and_delete: offered,
            refused,
            refusal,
        };
        let (cluster, masters) = cluster.map_or((None, Vec::new()), |(state, masters)| {
            (Some(state), masters)
        });
        let judge = |info: &str, appendfsync: Option<String>| {
            NodeHealth::from_info(
                self.name.clone(),
                latency,
                info,
                appendfsync,
                capabilities.clone(),
                cluster.clone(),
            )
        };
        let mut health = judge(&info, appendfsync);
        // A cluster member's settings are those of its master with the most problems: a
        // lock key can live on any of them, and each must keep it (H2).
        for settings in masters {
            let master = judge(&settings.info, settings.appendfsync);
            if master.problems.len() > health.problems.len() {
                health = master;
            }
        }
        health
    }
}

/// What one master of a cluster member says of its own settings: `INFO` and its
/// `appendfsync` (unknown where `CONFIG GET` is refused).
struct MasterSettings {
    info: String,
    appendfsync: Option<String>,
}

impl Connection {
    /// For a cluster member, what its masters say of it: `CLUSTER INFO` (the first that
    /// finds the cluster degraded, else the first answer; empty when none answered:
    /// unknown), and each master's own settings from its `INFO` (those that answered),
    /// with the fewest replicas connected to one of them (known when every master
    /// answered). Every master is asked, since a master's view of the others' slots
    /// can lag (a master that gave its slots up still counts them served for the others),
    /// and each keeps its own settings. `None` for a single server.
    async fn cluster_masters(&self) -> Option<(ClusterState, Vec<MasterSettings>)> {
        if !self.is_cluster() {
            return None;
        }
        let masters = self
            .client
            .cached_cluster_state()
            .map(|state| state.unique_primary_nodes())
            .unwrap_or_default();
        let asks = masters.into_iter().map(|master| {
            let options = Options {
                cluster_node: Some(master),
                ..command_options(self.timeout)
            };
            let client = self.client.with_options(&options);
            async move {
                let reply = |words: &[&'static str]| {
                    let command = CustomCommand::new_static(words[0], None, false);
                    let args = words[1..].iter().map(|w| Value::from(*w)).collect();
                    let reply = client.custom::<Value, Value>(command, args);
                    async move { Box::pin(reply).await.ok() }
                };
                let text = |words| {
                    let reply = reply(words);
                    async move { reply.await.and_then(|r| r.as_string()) }
                };
                // `INFO` (every section) gives both the replicas and the settings.
                let (cluster, info, fsync) = futures::join!(
                    text(&["CLUSTER", "INFO"]),
                    text(&["INFO"]),
                    reply(&["CONFIG", "GET", "appendfsync"])
                );
                let settings = info.map(|info| MasterSettings {
                    info,
                    appendfsync: fsync.and_then(|r| config_value(r, "appendfsync")),
                });
                (cluster, settings)
            }
        });
        let answers = join_all(asks).await;
        let infos: Vec<&String> = answers
            .iter()
            .filter_map(|(info, _)| info.as_ref())
            .collect();
        if infos.len() < answers.len() {
            tracing::debug!(node = %self.name, "a master did not answer CLUSTER INFO");
        }
        let worst = infos
            .iter()
            .find(|text| ClusterState::of(text).is_degraded())
            .or(infos.first());
        let mut state = ClusterState::of(worst.map_or("", |text| text.as_str()));
        state.fewest_replicas = answers
            .iter()
            .map(|(_, settings)| {
                settings
                    .as_ref()
                    .and_then(|s| ClusterState::replicas_of(&s.info))
            })
            .collect::<Option<Vec<u32>>>()
            .and_then(|counts| counts.into_iter().min());
        state.replica_acks = self.replica_acks;
        let settings = answers.into_iter().filter_map(|(_, s)| s).collect();
        Some((state, settings))
    }
}

/// Whether a `COMMAND INFO` reply describes the (first) command asked about: an unknown
/// command's entry is nil. `None` for a reply that is not a list.
pub(super) fn first_offered(reply: &Value) -> Option<bool> {
    match reply {
        Value::Array(entries) => Some(entries.first().is_some_and(|e| !matches!(e, Value::Null))),
        _ => None,
    }
}

/// Which of the script commands tried the node refused, and its words for the first
/// refusal (see [`is_refusal`]). Any other answer, `NOSCRIPT` and the key-count error among
/// them (the command was allowed to run), or none (timed out), is not a refusal.
fn scripts_refused(answers: [(&str, Result<Value, NodeOutcome>); 2]) -> (Vec<String>, String) {
    let mut refused = Vec::new();
    let mut first = String::new();
    for (command, answer) in answers {
        let Err(NodeOutcome::ServerError(e)) = answer else {
            continue;
        };
        if is_refusal(&e) {
            if first.is_empty() {
                first = e.message.to_string();
            }
            refused.push(command.to_string());
        }
    }
    (refused, first)
}

/// Whether an error reply refuses the command itself: the ACL says no (`NOPERM`), or the
/// server does not know the command (renamed away, or older than it).
pub(super) fn is_refusal(e: &ServerError) -> bool {
    let unknown = e
        .message
        .trim_start()
        .to_ascii_lowercase()
        .starts_with("err unknown command");
    e.kind == ServerErrorKind::Permission || unknown
}

/// The value of `name` in a `CONFIG GET` reply (an array of name, value pairs, or a map).
fn config_value(reply: Value, name: &str) -> Option<String> {
    match reply {
        Value::Array(items) => items
            .chunks(2)
            .find(|pair| pair[0].as_str().as_deref() == Some(name))
            .and_then(|pair| pair.get(1)?.as_string()),
        Value::Map(map) => map
            .inner()
            .into_iter()
            .find(|(k, _)| k.as_str() == Some(name))
            .and_then(|(_, v)| v.as_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::NodeOutcome;

    fn reply(command: &'static str, message: &str) -> Result<Value, NodeOutcome> {
        Err(NodeOutcome::ServerError(ServerError::new(command, message)))
    }

    /// The answers each server gives to the two probes, allowed and refused (as a user
    /// granted `+@all -@scripting` gets them).
    #[test]
    fn only_a_refusal_or_an_unknown_command_counts_as_refused() {
        for allowed in [
            // Valkey 9.1.2, then Redis 7.0.
            [
                reply("EVALSHA", "NOSCRIPT No matching script."),
                reply("EVAL", "ERR Number of keys can't be negative"),
            ],
            [
                reply("EVALSHA", "NOSCRIPT No matching script. Please use EVAL."),
                Err(NodeOutcome::TimedOut),
            ],
        ] {
            let [evalsha, eval] = allowed;
            let (refused, _) = scripts_refused([("EVALSHA", evalsha), ("EVAL", eval)]);
            assert!(refused.is_empty(), "{refused:?}");
        }
        let (refused, first) = scripts_refused([
            (
                "EVALSHA",
                reply(
                    "EVALSHA",
                    "NOPERM User locker has no permissions to run the 'evalsha' command",
                ),
            ),
            (
                "EVAL",
                reply(
                    "EVAL",
                    "NOPERM this user has no permissions to run the 'eval' command",
                ),
            ),
        ]);
        assert_eq!(refused, ["EVALSHA", "EVAL"]);
        assert!(first.contains("'evalsha'"), "{first}");
        let (refused, first) = scripts_refused([
            ("EVALSHA", reply("EVALSHA", "NOSCRIPT No matching script.")),
            (
                "EVAL",
                reply(
                    "EVAL",
                    "ERR unknown command 'EVAL', with args beginning with: 'return 0' '-1' ",
                ),
            ),
        ]);
        assert_eq!(refused, ["EVAL"]);
        assert!(first.starts_with("ERR unknown command"), "{first}");
    }

    #[test]
    fn command_info_says_whether_the_command_is_offered() {
        let described = Value::Array(vec![Value::Array(vec![Value::from("delifeq")])]);
        assert_eq!(first_offered(&described), Some(true));
        assert_eq!(first_offered(&Value::Array(vec![Value::Null])), Some(false));
        assert_eq!(first_offered(&Value::from("OK")), None);
    }
}

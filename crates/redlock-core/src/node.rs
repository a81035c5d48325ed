//! One Redis master: its fred client, configured so that nothing is ever replayed, and the
//! commands a round sends to it.

use std::time::Duration;

use fred::clients::{Client, WithOptions};
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::ClientLike;
use fred::types::config::{Options, ReconnectPolicy};
use fred::types::{Builder, CustomCommand, Key, Value};

use crate::config::{Config, Endpoint};
use crate::error::ConfigError;
use crate::report::{NodeName, NodeOutcome};
use crate::scripts::Script;

/// A connection to one master, opened once and shared by every round.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) name: NodeName,
    client: Client,
    /// The same client with per-command options. Every command goes through `custom`,
    /// because fred applies per-command options to `custom` but silently not to its
    /// `evalsha`/`eval` helpers.
    cmd: WithOptions<Client>,
    timeout: Duration,
}

impl Node {
    pub(crate) fn new(endpoint: Endpoint, config: &Config) -> Result<Node, ConfigError> {
        let timeout = config.node_timeout;
        let mut fred_config = endpoint.fred;
        // `false` makes fred apply the reconnect policy to the first connection as well: a
        // node that is down at start-up is retried in the background instead of being dead
        // for good. (Commands still fail fast, through the per-command options below.)
        fred_config.fail_fast = false;
        let max_delay = u32::try_from(config.reconnect_max_delay.as_millis()).unwrap_or(u32::MAX);
        let mut builder = Builder::from_config(fred_config);
        builder
            .with_connection_config(|c| {
                c.connection_timeout = timeout;
                c.internal_command_timeout = timeout;
                // fred replays a command in flight when its connection drops, by default up
                // to three times: a replayed SET NX can answer "not set" for a key that the
                // first attempt set. One attempt, and an unanswered command is ambiguous.
                c.max_command_attempts = 1;
                c.tcp.nodelay = Some(true);
            })
            .with_performance_config(|p| p.default_command_timeout = timeout)
            // Without a policy a fred client whose server went away is dead for good. fred
            // also sleeps one policy delay (plus jitter, 100 ms by default) before the
            // *first* connection, and cancels commands sent meanwhile: start at 1 ms with
            // little jitter so a fresh coordinator is usable at once.
            .set_policy({
                let mut policy = ReconnectPolicy::new_exponential(0, 1, max_delay.max(1), 2);
                policy.set_jitter(5);
                policy
            });
        let client = builder.build().map_err(|e| ConfigError::Client {
            node: endpoint.name.to_string(),
            reason: e.details().to_string(),
        })?;
        let options = Options {
            max_attempts: Some(1),
            timeout: Some(timeout),
            fail_fast: true,
            ..Default::default()
        };
        let cmd = client.with_options(&options);
        Ok(Node {
            name: endpoint.name,
            client,
            cmd,
            timeout,
        })
    }

    /// Starts the connection task (it reconnects by itself) and waits up to `within` for the
    /// first connection. A node that is down does not fail this: it counts as failing in
    /// rounds until it comes back.
    pub(crate) async fn connect(&self, within: Duration) -> bool {
        let _task = self.client.connect();
        let up = matches!(
            tokio::time::timeout(within, self.client.wait_for_connect()).await,
            Ok(Ok(()))
        );
        if up {
            // Loading the scripts now spares the first round on this node an EVALSHA,
            // NOSCRIPT, EVAL sequence (one more round trip, during which later commands can
            // overtake it). Best effort: a node that restarts later, empty, falls back to
            // EVAL by itself.
            for script in crate::scripts::all() {
                let load = CustomCommand::new_static("SCRIPT", None, false);
                let args = vec![Value::from("LOAD"), Value::from(script.source())];
                let _ = self
                    .bounded(self.cmd.custom::<Value, Value>(load, args))
                    .await;
            }
        }
        up
    }

    pub(crate) async fn quit(&self) {
        let _ = tokio::time::timeout(self.timeout, self.client.quit()).await;
    }

    /// `SET key token NX PX ttl`: `Ok(true)` when set, `Ok(false)` when the key exists.
    pub(crate) async fn set_nx_px(
        &self,
        key: Key,
        token: Value,
        ttl_ms: u64,
    ) -> Result<bool, NodeOutcome> {
        let args: Vec<Value> = vec![
            key.into(),
            token,
            "NX".into(),
            "PX".into(),
            (ttl_ms as i64).into(),
        ];
        let cmd = CustomCommand::new_static("SET", None, false);
        match self
            .bounded(self.cmd.custom::<Value, Value>(cmd, args))
            .await?
        {
            Value::Null => Ok(false),
            Value::String(s) if &*s == "OK" => Ok(true),
            other => Err(NodeOutcome::ServerError(format!(
                "unexpected reply to SET: {other:?}"
            ))),
        }
    }

    /// `PTTL key`: `Some(ms)` when the key exists (`u64::MAX` when it has no expiry), `None`
    /// when it does not.
    pub(crate) async fn pttl(&self, key: Key) -> Result<Option<u64>, NodeOutcome> {
        let cmd = CustomCommand::new_static("PTTL", None, false);
        match self
            .bounded(self.cmd.custom::<Value, Value>(cmd, vec![Value::from(key)]))
            .await?
        {
            Value::Integer(-2) => Ok(None),
            Value::Integer(-1) => Ok(Some(u64::MAX)),
            Value::Integer(ms) if ms >= 0 => Ok(Some(ms as u64)),
            other => Err(NodeOutcome::ServerError(format!(
                "unexpected reply to PTTL: {other:?}"
            ))),
        }
    }

    /// Runs a script by its SHA-1, loading it with `EVAL` when the node does not know it
    /// (`NOSCRIPT`: first use, or a restarted node). Both steps share one timeout.
    pub(crate) async fn eval(
        &self,
        script: &Script,
        keys: &[Key],
        args: &[Value],
    ) -> Result<Value, NodeOutcome> {
        self.bounded(async {
            let evalsha = CustomCommand::new_static("EVALSHA", None, false);
            match self
                .cmd
                .custom::<Value, Value>(evalsha, script_args(script.sha(), keys, args))
                .await
            {
                Err(e) if e.details().starts_with("NOSCRIPT") => {
                    let eval = CustomCommand::new_static("EVAL", None, false);
                    self.cmd
                        .custom::<Value, Value>(eval, script_args(script.source(), keys, args))
                        .await
                }
                other => other,
            }
        })
        .await
    }

    /// Runs a script that answers 1 (done) or 0 (not ours).
    pub(crate) async fn eval_flag(
        &self,
        script: &Script,
        keys: &[Key],
        args: &[Value],
    ) -> Result<bool, NodeOutcome> {
        match self.eval(script, keys, args).await? {
            Value::Integer(n) => Ok(n > 0),
            other => Err(NodeOutcome::ServerError(format!(
                "unexpected script reply: {other:?}"
            ))),
        }
    }

    /// fred's own timeout covers commands it has written; this one also covers time spent
    /// before that (a connection being re-established), and uses tokio's clock.
    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, FredError>>,
    ) -> Result<T, NodeOutcome> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(failure(&e)),
            Err(_) => Err(NodeOutcome::TimedOut),
        }
    }
}

fn script_args(head: &str, keys: &[Key], args: &[Value]) -> Vec<Value> {
    let mut all = Vec::with_capacity(2 + keys.len() + args.len());
    all.push(head.into());
    all.push((keys.len() as i64).into());
    all.extend(keys.iter().cloned().map(Value::from));
    all.extend(args.iter().cloned());
    all
}

/// Sorts a fred error into what a report can say about the node.
fn failure(e: &FredError) -> NodeOutcome {
    match e.kind() {
        ErrorKind::Timeout => NodeOutcome::TimedOut,
        // Redis error replies (NOAUTH, OOM, READONLY, script errors) arrive as `Unknown`.
        ErrorKind::Unknown
        | ErrorKind::Auth
        | ErrorKind::InvalidArgument
        | ErrorKind::InvalidCommand => NodeOutcome::ServerError(e.details().to_string()),
        _ => NodeOutcome::ConnectionError(format!("{:?}: {}", e.kind(), e.details())),
    }
}

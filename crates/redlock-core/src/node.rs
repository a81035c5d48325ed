//! One Redis master: its fred client, configured so that nothing is ever replayed, and the
//! commands a round sends to it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fred::clients::{Client, WithOptions};
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::{ClientLike, EventInterface};
use fred::types::config::{Options, ReconnectPolicy};
use fred::types::{Builder, CustomCommand, Key, Value};
use tokio::sync::broadcast::error::RecvError;

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
    /// Why the connection last failed, from fred's error events; cleared when it comes
    /// back. A command refused for want of a connection reports this instead of fred's
    /// generic "connection closed", so that a wrong password or database says so.
    last_error: Arc<Mutex<Option<ConnectFailure>>>,
}

impl Node {
    /// Builds the client (it connects in [`connect`](Self::connect)). Must run inside a
    /// Tokio runtime: it starts the task that records the connection's errors.
    pub(crate) fn new(endpoint: Endpoint, config: &Config) -> Result<Node, ConfigError> {
        let timeout = config.node_timeout;
        let mut fred_config = endpoint.fred;
        let password = fred_config.password.clone();
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
        let last_error = Arc::new(Mutex::new(None));
        // Subscribed before the first connection attempt, so that none of its errors is
        // missed. The password only lives in the task, to be masked should an error echo it.
        watch_connection(&client, last_error.clone(), password);
        Ok(Node {
            name: endpoint.name,
            client,
            cmd,
            timeout,
            last_error,
        })
    }

    /// Starts the connection task (it reconnects by itself) and waits up to `within` for the
    /// first connection. A node that is down, or that refuses the connection (wrong
    /// password, database out of range), does not fail this: it counts as failing in rounds
    /// until it comes back. `Err` says why it is not connected, without any password.
    pub(crate) async fn connect(&self, within: Duration) -> Result<(), String> {
        let _task = self.client.connect();
        let up = matches!(
            tokio::time::timeout(within, self.client.wait_for_connect()).await,
            Ok(Ok(()))
        );
        if !up {
            return Err(match self.connect_failure() {
                Some(failure) => failure.to_string(),
                None => format!("no connection within {within:?}"),
            });
        }
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
        Ok(())
    }

    /// The server's identity: the `run_id` field of `INFO server`, under the node timeout.
    /// Random per server process, and the same for every database of one server and under
    /// every name or address that reaches it; two nodes reporting the same `run_id` are one
    /// server, one failure domain.
    pub(crate) async fn server_id(&self) -> Result<String, NodeOutcome> {
        let info = CustomCommand::new_static("INFO", None, false);
        let reply = self
            .bounded(
                self.cmd
                    .custom::<Value, Value>(info, vec![Value::from("server")]),
            )
            .await?;
        reply
            .as_str()
            .and_then(|text| run_id(&text))
            .ok_or_else(|| NodeOutcome::ServerError("INFO server reported no run_id".to_string()))
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
            Ok(Err(e)) => Err(self.failure(&e)),
            Err(_) => Err(NodeOutcome::TimedOut),
        }
    }

    /// Sorts a fred error into what a report can say about the node. A command that fred
    /// refused for want of a connection reports why the connection failed, when known.
    fn failure(&self, e: &FredError) -> NodeOutcome {
        if *e.kind() == ErrorKind::Canceled {
            if let Some(failure) = self.connect_failure() {
                return failure.outcome();
            }
        }
        failure(e)
    }

    fn connect_failure(&self) -> Option<ConnectFailure> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Why a node's connection failed (or was closed), as fred reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ConnectFailure {
    /// The server refused the credentials: `NOAUTH` (it needs a password and none was
    /// given), `WRONGPASS`, or a password given to a server that has none.
    Auth(String),
    /// The server refused the database of the URL (`SELECT`: index out of range).
    Database(String),
    /// Anything else: refused, reset, unreachable, protocol errors.
    Other(String),
}

impl ConnectFailure {
    /// `password` is masked should fred's text ever contain it.
    fn from_fred(e: &FredError, password: Option<&str>) -> ConnectFailure {
        let mut details = e.details().trim().to_string();
        if let Some(password) = password.filter(|p| !p.is_empty()) {
            details = details.replace(password, "***");
        }
        let upper = details.to_ascii_uppercase();
        if *e.kind() == ErrorKind::Auth
            || upper.starts_with("NOAUTH")
            || upper.starts_with("WRONGPASS")
            || (upper.starts_with("ERR") && upper.contains("AUTH"))
        {
            ConnectFailure::Auth(details)
        } else if upper.contains("DB INDEX") || upper.contains("SELECT IS NOT ALLOWED") {
            ConnectFailure::Database(details)
        } else {
            ConnectFailure::Other(format!("{:?}: {details}", e.kind()))
        }
    }

    /// What a round reports for a command refused because of this failure. A server that
    /// refused the password or database answered: that is a server error, and no retry
    /// fixes it; anything else is a connection error.
    fn outcome(&self) -> NodeOutcome {
        match self {
            ConnectFailure::Auth(_) | ConnectFailure::Database(_) => {
                NodeOutcome::ServerError(self.to_string())
            }
            ConnectFailure::Other(_) => NodeOutcome::ConnectionError(self.to_string()),
        }
    }
}

impl std::fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectFailure::Auth(reason) => write!(
                f,
                "authentication failed ({reason}): check the password (and user name) in the \
                 node URL"
            ),
            ConnectFailure::Database(reason) => write!(
                f,
                "the server refused the database ({reason}): check the database number in the \
                 node URL against the server's `databases` setting"
            ),
            ConnectFailure::Other(reason) => {
                write!(f, "not connected (last connection error: {reason})")
            }
        }
    }
}

/// Records every connection error fred reports for `client` in `last`, and clears it when
/// the connection is (re-)established. Ends when the client is closed or dropped.
fn watch_connection(
    client: &Client,
    last: Arc<Mutex<Option<ConnectFailure>>>,
    password: Option<String>,
) {
    let mut errors = client.error_rx();
    let mut reconnects = client.reconnect_rx();
    tokio::spawn(async move {
        let set = |value: Option<ConnectFailure>| {
            *last.lock().unwrap_or_else(PoisonError::into_inner) = value;
        };
        loop {
            tokio::select! {
                // fred sends an attempt's error before the next attempt's success: read
                // errors first so that a success is never overwritten by an older error.
                biased;
                error = errors.recv() => match error {
                    Ok((error, _)) => {
                        set(Some(ConnectFailure::from_fred(&error, password.as_deref())));
                    }
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => break,
                },
                up = reconnects.recv() => match up {
                    Ok(_) => set(None),
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => break,
                },
            }
        }
    });
}

/// The `run_id` field of an `INFO` reply.
fn run_id(info: &str) -> Option<String> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("run_id:"))
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .map(str::to_string)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(kind: ErrorKind, details: &str, password: Option<&str>) -> ConnectFailure {
        ConnectFailure::from_fred(&FredError::new(kind, details.to_string()), password)
    }

    #[test]
    fn refused_credentials_and_databases_are_server_errors_that_say_what_to_fix() {
        for (kind, details) in [
            (ErrorKind::Auth, "WRONGPASS invalid username-password pair"),
            (ErrorKind::Auth, "NOAUTH Authentication required."),
            (
                ErrorKind::Unknown,
                "ERR AUTH <password> called without any password configured",
            ),
        ] {
            let failure = classify(kind, details, Some("pw"));
            assert_eq!(failure, ConnectFailure::Auth(details.to_string()));
            let NodeOutcome::ServerError(text) = failure.outcome() else {
                panic!("{failure:?}");
            };
            assert!(text.contains(details) && text.contains("check the password"));
        }
        let failure = classify(ErrorKind::Unknown, "ERR DB index is out of range", None);
        assert!(
            matches!(failure, ConnectFailure::Database(_)),
            "{failure:?}"
        );
        assert!(failure.to_string().contains("database number"), "{failure}");
    }

    #[test]
    fn other_connection_errors_stay_connection_errors() {
        let failure = classify(ErrorKind::IO, "Connection refused", None);
        let NodeOutcome::ConnectionError(text) = failure.outcome() else {
            panic!("{failure:?}");
        };
        assert!(text.contains("Connection refused"), "{text}");
    }

    #[test]
    fn a_password_echoed_in_an_error_is_masked() {
        let failure = classify(ErrorKind::Auth, "WRONGPASS for hunter2", Some("hunter2"));
        assert!(!failure.to_string().contains("hunter2"), "{failure}");
        assert!(!format!("{failure:?}").contains("hunter2"), "{failure:?}");
    }

    #[test]
    fn run_id_is_read_from_info_server() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:3f1c0a\r\ntcp_port:6379\r\n";
        assert_eq!(run_id(info).as_deref(), Some("3f1c0a"));
        assert_eq!(run_id("# Server\r\nrun_id:\r\n"), None);
        assert_eq!(run_id(""), None);
    }
}

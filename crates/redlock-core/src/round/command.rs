//! What a round sends to each node, and how a node's reply reads for each of the round's
//! requests. Every kind of round (acquire, extend, release, inspect; one lock or a batch)
//! is one [`Command`] per node; the engine in the parent module never looks inside.

use std::time::Duration;

use fred::types::{Key, Value};

use crate::connection::{Connection, OnNoScript, Sending};
use crate::report::{NodeOutcome, RoundKind};
use crate::scripts::Script;
use crate::server_error::{ServerError, ServerErrorKind};

/// The command a round sends to every node.
#[derive(Debug)]
pub(crate) enum Command {
    /// `SET key token NX PX ttl`, for a round of one request; the TTL is the request's.
    SetNx { key: Key, token: Value },
    /// A script. For a round of one request it answers 1 (done), 0 (refused) or
    /// `{1/0, value}`; for a batch, an array with one such element per request. The value
    /// (a counter, a TTL, an owner) is carried to the caller as the node returned it.
    Script {
        script: &'static Script,
        keys: Vec<Key>,
        args: Vec<Value>,
    },
    /// The release of a lock of one key with nothing else to do (no notification, no
    /// queue; see `LockSpec::release`): `DELIFEQ key token` on a node that has it, else
    /// `script` (the kind's release) on `key` with `args`. Either answers 1 (released) or 0
    /// (not held).
    CompareAndDelete {
        key: Key,
        token: Value,
        script: &'static Script,
        args: Vec<Value>,
    },
}

/// What one node answered for one request.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) outcome: NodeOutcome,
    /// What the node returned beyond yes or no, when it did.
    pub(crate) value: Option<Value>,
}

impl Command {
    /// Sends the command of a round of `kind` to one node; `ttl` is the TTL of the round's
    /// first request. An acquisition is one command, never sent again with its script's
    /// source: the caller's later commands (a release) must not overtake it.
    ///
    /// On a cluster member with `Config::replica_acks`, an acquisition or an extension has
    /// a `WAIT` sent right behind it, in the same flight (see
    /// `Connection::wait_for_replicas`): its answer counts only if enough replicas
    /// acknowledged it. That path is boxed, so that the future of every other command
    /// stays [`send_once`](Self::send_once)'s size.
    pub(crate) async fn send(
        &self,
        connection: &Connection,
        kind: RoundKind,
        ttl: Option<Duration>,
    ) -> Result<Value, NodeOutcome> {
        let acked =
            connection.replica_acks() > 0 && matches!(kind, RoundKind::Acquire | RoundKind::Extend);
        let key = match self {
            Command::SetNx { key, .. } | Command::CompareAndDelete { key, .. } => Some(key),
            Command::Script { keys, .. } => keys.first(),
        };
        match key.filter(|_| acked) {
            None => self.send_once(connection, kind, ttl).await,
            Some(key) => Box::pin(self.send_acked(connection, kind, ttl, key)).await,
        }
    }

    /// [`send_once`](Self::send_once) with a `WAIT` for the replicas right behind it.
    async fn send_acked(
        &self,
        connection: &Connection,
        kind: RoundKind,
        ttl: Option<Duration>,
        key: &Key,
    ) -> Result<Value, NodeOutcome> {
        // Polled first, so the command is handed to fred before the `WAIT`.
        let (reply, replicated) = futures::join!(
            self.send_once(connection, kind, ttl),
            connection.wait_for_replicas(key)
        );
        let reply = reply?;
        replicated?;
        Ok(reply)
    }

    async fn send_once(
        &self,
        connection: &Connection,
        kind: RoundKind,
        ttl: Option<Duration>,
    ) -> Result<Value, NodeOutcome> {
        match self {
            Command::SetNx { key, token } => {
                let ttl = ttl.unwrap_or_default();
                connection.set_nx_px(key.clone(), token.clone(), ttl).await
            }
            Command::Script { script, keys, args } => {
                if let Some(unfenced) = script.unfenced().filter(|_| connection.is_cluster()) {
                    return Box::pin(connection.fenced_apart(unfenced, keys, args)).await;
                }
                let on_no_script = match kind {
                    RoundKind::Acquire => OnNoScript::Refuse,
                    _ => OnNoScript::Resend,
                };
                let reply = connection
                    .eval_as(script, keys, args, on_no_script, Sending::InRound)
                    .await;
                if on_no_script == OnNoScript::Resend && redirected(&reply) {
                    return Box::pin(connection.eval_redirected(script, keys, args)).await;
                }
                reply
            }
            Command::CompareAndDelete {
                key,
                token,
                script,
                args,
            } => {
                let reply = connection
                    .compare_and_delete(key, token, script, args)
                    .await;
                if redirected(&reply) {
                    let keys = std::slice::from_ref(key);
                    return Box::pin(connection.eval_redirected(script, keys, args)).await;
                }
                reply
            }
        }
    }

    /// The command as a script (its keys and arguments), for sending it again as a
    /// cleanup: a compare-and-delete is sent again as its script, which every node runs.
    pub(crate) fn as_script(&self) -> Option<(&'static Script, &[Key], &[Value])> {
        match self {
            Command::SetNx { .. } => None,
            Command::Script { script, keys, args } => Some((script, keys, args)),
            Command::CompareAndDelete {
                key, script, args, ..
            } => Some((script, std::slice::from_ref(key), args)),
        }
    }

    /// Reads one node's reply as one answer per request.
    pub(crate) fn read(
        &self,
        kind: RoundKind,
        reply: Result<Value, NodeOutcome>,
        requests: usize,
    ) -> Vec<Answer> {
        let failed = |outcome: NodeOutcome| {
            vec![
                Answer {
                    outcome,
                    value: None,
                };
                requests
            ]
        };
        let reply = match reply {
            Ok(reply) => reply,
            Err(failure) => return failed(failure),
        };
        let answer = |(done, value)| Answer {
            outcome: outcome(kind, done),
            value,
        };
        match (self, reply) {
            (Command::SetNx { .. }, Value::Null) => vec![answer((false, None))],
            (Command::SetNx { .. }, Value::String(s)) if &*s == "OK" => {
                vec![answer((true, None))]
            }
            // One request: the reply is its element (1/0, or `{1/0, value}`), or a batch of
            // one.
            (
                Command::Script { .. } | Command::CompareAndDelete { .. },
                Value::Array(mut items),
            ) if requests == 1 && items.len() == 1 => match items.pop().and_then(element) {
                Some(flags) => vec![answer(flags)],
                None => failed(unexpected(self)),
            },
            (Command::Script { .. } | Command::CompareAndDelete { .. }, reply) if requests == 1 => {
                match element(reply) {
                    Some(flags) => vec![answer(flags)],
                    None => failed(unexpected(self)),
                }
            }
            (Command::Script { .. }, Value::Array(items)) if items.len() == requests => {
                let answers = items.into_iter().map(|item| element(item).map(answer));
                answers
                    .collect::<Option<Vec<_>>>()
                    .unwrap_or_else(|| failed(unexpected(self)))
            }
            _ => failed(unexpected(self)),
        }
    }
}

/// Whether a cluster member's master sent the command on to another
/// ([`ServerErrorKind::Redirected`]): nothing ran, and one that may run twice is sent again
/// (see `Connection::eval_redirected`).
fn redirected(reply: &Result<Value, NodeOutcome>) -> bool {
    matches!(reply, Err(NodeOutcome::ServerError(e)) if e.kind == ServerErrorKind::Redirected)
}

/// One element of a script's array reply: 1/0, or `{1/0, value}`.
fn element(item: Value) -> Option<(bool, Option<Value>)> {
    match item {
        Value::Integer(n) => Some((n > 0, None)),
        Value::Array(mut pair) if pair.len() == 2 => {
            let value = pair.pop();
            match pair.pop() {
                Some(Value::Integer(n)) => Some((n > 0, value)),
                _ => None,
            }
        }
        _ => None,
    }
}

fn unexpected(command: &Command) -> NodeOutcome {
    let what = match command {
        Command::SetNx { .. } => "SET",
        Command::Script { .. } => "EVALSHA",
        Command::CompareAndDelete { .. } => "DELIFEQ or EVALSHA",
    };
    NodeOutcome::ServerError(ServerError::of_kind(
        ServerErrorKind::Unknown,
        what,
        "unexpected reply: the node may not be a Redis master",
    ))
}

/// What a node's yes or no means in a round of `kind`.
fn outcome(kind: RoundKind, done: bool) -> NodeOutcome {
    match (kind, done) {
        (RoundKind::Acquire, true) => NodeOutcome::Acquired,
        (RoundKind::Acquire, false) => NodeOutcome::HeldByOther,
        (RoundKind::Extend, true) => NodeOutcome::Extended,
        (RoundKind::Release, true) => NodeOutcome::Released,
        (RoundKind::Inspect, true) => NodeOutcome::Held,
        (RoundKind::Fence, true) => NodeOutcome::Recorded,
        (RoundKind::Fence, false) => NodeOutcome::CounterAhead,
        (RoundKind::Leave, true) => NodeOutcome::Released,
        (RoundKind::Extend | RoundKind::Release | RoundKind::Inspect | RoundKind::Leave, false) => {
            NodeOutcome::NotHeld
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script() -> Command {
        Command::Script {
            script: &crate::kind::EXTEND_BATCH,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    fn outcomes(answers: &[Answer]) -> Vec<NodeOutcome> {
        answers.iter().map(|a| a.outcome.clone()).collect()
    }

    #[test]
    fn a_batch_reply_answers_each_request_and_carries_values() {
        let reply = Value::Array(vec![
            Value::Integer(1),
            Value::Integer(0),
            Value::Array(vec![Value::Integer(1), Value::Integer(42)]),
        ]);
        let answers = script().read(RoundKind::Extend, Ok(reply), 3);
        assert_eq!(
            outcomes(&answers),
            [
                NodeOutcome::Extended,
                NodeOutcome::NotHeld,
                NodeOutcome::Extended
            ]
        );
        assert_eq!(answers[2].value, Some(Value::Integer(42)));
        assert_eq!(answers[0].value, None);
    }

    #[test]
    fn a_failure_or_a_malformed_reply_fails_every_request() {
        let answers = script().read(RoundKind::Extend, Err(NodeOutcome::TimedOut), 2);
        assert_eq!(
            outcomes(&answers),
            [NodeOutcome::TimedOut, NodeOutcome::TimedOut]
        );
        let short = Value::Array(vec![Value::Integer(1)]);
        let answers = script().read(RoundKind::Extend, Ok(short), 2);
        assert!(answers
            .iter()
            .all(|a| matches!(a.outcome, NodeOutcome::ServerError(_))));
    }

    #[test]
    fn a_single_request_reads_a_flag_a_pair_or_a_batch_of_one() {
        for (reply, done, value) in [
            (Value::Integer(1), true, None),
            (Value::Array(vec![Value::Integer(0)]), false, None),
            (
                Value::Array(vec![Value::Integer(1), Value::Integer(7)]),
                true,
                Some(Value::Integer(7)),
            ),
        ] {
            let answers = script().read(RoundKind::Acquire, Ok(reply), 1);
            let expected = if done {
                NodeOutcome::Acquired
            } else {
                NodeOutcome::HeldByOther
            };
            assert_eq!(outcomes(&answers), [expected]);
            assert_eq!(answers[0].value, value);
        }
    }

    #[test]
    fn a_compare_and_delete_reads_as_its_script_does() {
        let release = Command::CompareAndDelete {
            key: Key::from("k"),
            token: Value::from("t"),
            script: &crate::kind::EXTEND_BATCH,
            args: Vec::new(),
        };
        let done = release.read(RoundKind::Release, Ok(Value::Integer(1)), 1);
        assert_eq!(outcomes(&done), [NodeOutcome::Released]);
        let not_held = release.read(RoundKind::Release, Ok(Value::Integer(0)), 1);
        assert_eq!(outcomes(&not_held), [NodeOutcome::NotHeld]);
        let odd = release.read(RoundKind::Release, Ok(Value::from("OK")), 1);
        assert!(matches!(odd[0].outcome, NodeOutcome::ServerError(_)));
    }

    #[test]
    fn set_replies() {
        let set = Command::SetNx {
            key: Key::from("k"),
            token: Value::from("t"),
        };
        let ok = set.read(RoundKind::Acquire, Ok(Value::from("OK")), 1);
        assert_eq!(outcomes(&ok), [NodeOutcome::Acquired]);
        let taken = set.read(RoundKind::Acquire, Ok(Value::Null), 1);
        assert_eq!(outcomes(&taken), [NodeOutcome::HeldByOther]);
    }
}

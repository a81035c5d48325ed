//! What a round sends to each node, and how a node's reply reads for each of the round's
//! requests. Every kind of round (acquire, extend, release, inspect; one lock or a batch)
//! is one [`Command`] per node; the engine in the parent module never looks inside.

use std::collections::BTreeMap;
use std::time::Duration;

use fred::types::{Key, Value};

use crate::connection::{Connection, OnNoScript, Sending};
use crate::report::{NodeOutcome, RoundKind};
use crate::round::polled::Swept;
use crate::round::Request;
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
    /// A batch of requests over keys of several hash slots (group commit, see `group`):
    /// `whole` for a single server; a cluster member, which runs a script only on keys of
    /// one slot, runs `parts` instead, one command per slot, sent together.
    PerSlot {
        whole: Box<Command>,
        parts: Vec<SlotPart>,
    },
}

/// One hash slot's share of a [`Command::PerSlot`].
#[derive(Debug)]
pub(crate) struct SlotPart {
    /// The round's requests it carries (their places in the round), in its reply's order.
    pub(crate) requests: Vec<usize>,
    /// The TTL of its first request, as [`Command::send`] takes it.
    pub(crate) ttl: Option<Duration>,
    pub(crate) command: Command,
}

/// What one node answered for one request.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) outcome: NodeOutcome,
    /// What the node returned beyond yes or no, when it did.
    pub(crate) value: Option<Value>,
}

impl Command {
    /// The command of a round of several requests, as `build` makes it for some of them
    /// (their places in `requests`); request `j` names keys of the hash slot of
    /// `first_keys[j]`. With `by_slot` (a cluster member in the node set) and requests of
    /// several slots, a [`Command::PerSlot`]: `build`'s command for every request, which
    /// single servers run, and for each slot's requests, which a cluster member runs
    /// instead: it runs a script only on keys of one slot, and every key of one request
    /// shares its slot (its companions are hash-tagged to it, see `layout`).
    pub(crate) fn per_slot<'k>(
        by_slot: bool,
        first_keys: impl Iterator<Item = &'k str>,
        requests: &[Request],
        build: impl Fn(&[usize]) -> Command,
    ) -> Command {
        let whole = build(&(0..requests.len()).collect::<Vec<_>>());
        if !by_slot {
            return whole;
        }
        let mut slots: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (j, key) in first_keys.enumerate() {
            let slot = fred::util::redis_keyslot(key.as_bytes());
            slots.entry(slot).or_default().push(j);
        }
        if slots.len() < 2 {
            return whole;
        }
        let parts = slots
            .into_values()
            .map(|carried| SlotPart {
                command: build(&carried),
                ttl: requests[carried[0]].ttl,
                requests: carried,
            })
            .collect();
        Command::PerSlot {
            whole: Box::new(whole),
            parts,
        }
    }

    /// Sends the command of a round of `kind` with `requests` requests to one node and
    /// reads its answer to each ([`send`](Self::send), [`read`](Self::read)); a cluster
    /// member runs a [`Command::PerSlot`]'s parts (see [`per_slot`]).
    pub(crate) async fn answers(
        &self,
        connection: &Connection,
        kind: RoundKind,
        ttl: Option<Duration>,
        requests: usize,
    ) -> Vec<Answer> {
        let command = match self {
            Command::PerSlot { parts, .. } if connection.is_cluster() => {
                return Box::pin(per_slot(parts, connection, kind, requests)).await;
            }
            Command::PerSlot { whole, .. } => whole,
            command => command,
        };
        let reply = command.send(connection, kind, ttl).await;
        command.read(kind, reply, requests)
    }

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
        match self.first_key().filter(|_| acked) {
            None => self.send_once(connection, kind, ttl).await,
            Some(key) => Box::pin(self.send_acked(connection, kind, ttl, key)).await,
        }
    }

    /// The key whose slot's master runs the command on a cluster member.
    fn first_key(&self) -> Option<&Key> {
        match self {
            Command::SetNx { key, .. } | Command::CompareAndDelete { key, .. } => Some(key),
            Command::Script { keys, .. } => keys.first(),
            Command::PerSlot { whole, .. } => whole.first_key(),
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
            // Sent as one command: on a single server (see `answers`).
            Command::PerSlot { whole, .. } => {
                Box::pin(whole.send_once(connection, kind, ttl)).await
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
            Command::PerSlot { whole, .. } => whole.as_script(),
        }
    }

    /// The command as the scripts to send again as a cleanup on `connection` (see
    /// [`as_script`](Self::as_script)): a [`Command::PerSlot`]'s parts on a cluster member.
    pub(crate) fn cleanups_on(
        &self,
        connection: &Connection,
    ) -> Vec<(&'static Script, &[Key], &[Value])> {
        match self {
            Command::PerSlot { parts, .. } if connection.is_cluster() => parts
                .iter()
                .filter_map(|part| part.command.as_script())
                .collect(),
            command => command.as_script().into_iter().collect(),
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
        if let Command::PerSlot { whole, .. } = self {
            return whole.read(kind, reply, requests);
        }
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

/// A [`Command::PerSlot`]'s answers on a cluster member: every part sent at once (each to
/// its slot's master), each part's answers put at its requests' places. The parts are a
/// [`Swept`] set: each polled when it woke, every one at the round's tick, so that each
/// checks its backstop (see `Sending::InRound`).
async fn per_slot(
    parts: &[SlotPart],
    connection: &Connection,
    kind: RoundKind,
    requests: usize,
) -> Vec<Answer> {
    let calls: Vec<_> = parts
        .iter()
        .map(|part| {
            Box::pin(async move {
                let reply = part.command.send(connection, kind, part.ttl).await;
                part.command.read(kind, reply, part.requests.len())
            })
        })
        .collect();
    let mut calls = Swept::new(calls);
    let answered = std::future::poll_fn(|cx| calls.poll_all(cx)).await;
    scatter(kind, parts, answered.into_iter(), requests)
}

/// The round's `requests` answers from each part's (in `parts`' order). A request carried
/// by several parts (a lock over keys of several slots, in shares: see
/// `LockSpec::by_slot`) gets their answers [together](together).
fn scatter(
    kind: RoundKind,
    parts: &[SlotPart],
    answered: impl Iterator<Item = Vec<Answer>>,
    requests: usize,
) -> Vec<Answer> {
    let mut carried: Vec<Vec<Answer>> = vec![Vec::new(); requests];
    for (part, part_answers) in parts.iter().zip(answered) {
        for (&j, answer) in part.requests.iter().zip(part_answers) {
            if let Some(place) = carried.get_mut(j) {
                place.push(answer);
            }
        }
    }
    let answers = carried.into_iter().map(|answers| together(kind, answers));
    // A request no part carried (never built so, see `Command::per_slot`): read as a
    // server error, never as done, and rolled back as if sent.
    let none = || Answer {
        outcome: NodeOutcome::ServerError(ServerError::of_kind(
            ServerErrorKind::Unknown,
            "EVALSHA",
            "no command of the round carried this request: a bug of redlock-core, please report it",
        )),
        value: None,
    };
    answers.map(|answer| answer.unwrap_or_else(none)).collect()
}

/// A cluster member's answer for one lock from its shares' answers, one per hash slot
/// (`None` for none). The member votes yes only if every share did: a lock is all its
/// keys. Otherwise its answer is a share's that did not answer, for the member's state is
/// not known then (the round rolls such a member back when it fails); else, where some
/// shares took their keys and others found them held, [`NodeOutcome::PartlyHeldByOther`],
/// a refusal that a failed round still rolls back; else a share's no.
///
/// A share that ran nothing (a master not ready, a script it did not have) beside shares
/// that took their keys reads as an unknown server error, which is rolled back, not as the
/// share's own error, which would leave the other shares' keys behind.
fn together(kind: RoundKind, mut answers: Vec<Answer>) -> Option<Answer> {
    if answers.len() < 2 {
        return answers.pop();
    }
    if answers.iter().all(|a| kind.counts(&a.outcome)) {
        // A release that deleted anywhere reads as released.
        let at = answers
            .iter()
            .position(|a| a.outcome == NodeOutcome::Released)
            .unwrap_or(0);
        return Some(answers.swap_remove(at));
    }
    let took = answers.iter().any(|a| a.outcome == NodeOutcome::Acquired);
    let unanswered = |a: &&Answer| !a.outcome.is_answer();
    if let Some(unknown) = answers
        .iter()
        .filter(unanswered)
        .find(|a| a.outcome.may_have_set())
    {
        return Some(unknown.clone());
    }
    if let Some(ran_nothing) = answers.iter().find(unanswered) {
        if !took {
            return Some(ran_nothing.clone());
        }
        return Some(Answer {
            outcome: NodeOutcome::ServerError(ServerError::of_kind(
                ServerErrorKind::Unknown,
                "EVALSHA",
                format!(
                    "one hash slot's master ran nothing ({}) while the others took the lock's \
                     keys there, which the round rolls back if it fails",
                    ran_nothing.outcome
                ),
            )),
            value: None,
        });
    }
    let no = answers
        .iter()
        .position(|a| !kind.counts(&a.outcome))
        .unwrap_or(0);
    let mut no = answers.swap_remove(no);
    if took {
        no.outcome = NodeOutcome::PartlyHeldByOther;
    }
    Some(no)
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
        Command::PerSlot { whole, .. } => return unexpected(whole),
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

    fn request() -> Request {
        Request {
            name: "k".into(),
            ttl: Some(Duration::from_secs(1)),
            undo: None,
            redo: false,
        }
    }

    /// The command `per_slot`'s tests build for some requests: a script whose keys are the
    /// requests' places.
    fn of(carried: &[usize]) -> Command {
        Command::Script {
            script: &crate::kind::EXTEND_BATCH,
            keys: carried.iter().map(|j| Key::from(j.to_string())).collect(),
            args: Vec::new(),
        }
    }

    fn places(command: &Command) -> Vec<String> {
        match command {
            Command::Script { keys, .. } => keys
                .iter()
                .map(|k| k.as_str().unwrap_or_default().to_string())
                .collect(),
            other => panic!("not a script: {other:?}"),
        }
    }

    /// Requests of three slots (`{t}:a` and `{t}:b` share one) go to a cluster member as
    /// one command per slot, each with its requests in order, and to single servers as one.
    #[test]
    fn a_batch_over_several_slots_is_one_command_per_slot_on_a_cluster_member() {
        let keys = ["{t}:a", "a", "{t}:b", "b"];
        let requests: Vec<Request> = keys.iter().map(|_| request()).collect();
        let command = Command::per_slot(true, keys.into_iter(), &requests, of);
        let Command::PerSlot { whole, parts } = &command else {
            panic!("one command: {command:?}");
        };
        assert_eq!(places(whole), ["0", "1", "2", "3"]);
        let mut carried: Vec<Vec<usize>> = parts.iter().map(|p| p.requests.clone()).collect();
        carried.sort();
        assert_eq!(carried, [vec![0, 2], vec![1], vec![3]]);
        for part in parts {
            let expected: Vec<String> = part.requests.iter().map(|j| j.to_string()).collect();
            assert_eq!(places(&part.command), expected);
            assert_eq!(part.ttl, Some(Duration::from_secs(1)));
        }
        // No cluster member, or one slot: one command.
        let plain = Command::per_slot(false, keys.into_iter(), &requests, of);
        assert_eq!(places(&plain), ["0", "1", "2", "3"]);
        let tagged = ["{t}:a", "{t}:b"];
        let one_slot = Command::per_slot(true, tagged.into_iter(), &requests[..2], of);
        assert_eq!(places(&one_slot), ["0", "1"]);
    }

    /// Each part's answers go to its requests' places; a place no part carried reads as a
    /// server error (never taken as done).
    #[test]
    fn answers_per_slot_go_to_their_requests() {
        let part = |requests: Vec<usize>| SlotPart {
            command: of(&requests),
            ttl: None,
            requests,
        };
        let parts = [part(vec![0, 2]), part(vec![1])];
        let answer = |outcome| Answer {
            outcome,
            value: None,
        };
        let answered = vec![
            vec![
                answer(NodeOutcome::Acquired),
                answer(NodeOutcome::HeldByOther),
            ],
            vec![answer(NodeOutcome::TimedOut)],
        ];
        let answers = scatter(RoundKind::Acquire, &parts, answered.into_iter(), 4);
        assert_eq!(
            outcomes(&answers[..3]),
            [
                NodeOutcome::Acquired,
                NodeOutcome::TimedOut,
                NodeOutcome::HeldByOther
            ]
        );
        assert!(matches!(answers[3].outcome, NodeOutcome::ServerError(_)));
        let said = answers[3].outcome.to_string();
        assert!(said.contains("please report it"), "{said}");
    }

    /// A cluster member's answer for a lock in shares: yes only if every share said yes; a
    /// share that did not answer decides it (the member's state is unknown); shares that
    /// took their keys beside one that found them held make a refusal that is rolled back;
    /// a share that ran nothing beside ones that took keys reads as an error that is rolled
    /// back too.
    #[test]
    fn a_lock_in_shares_is_answered_by_all_of_them() {
        let answer = |outcome| Answer {
            outcome,
            value: None,
        };
        let of = |outcomes: Vec<NodeOutcome>| outcomes.into_iter().map(answer).collect();
        let acquire = |outcomes| together(RoundKind::Acquire, of(outcomes)).map(|a| a.outcome);
        use NodeOutcome::*;
        assert_eq!(acquire(vec![Acquired, Acquired]), Some(Acquired));
        assert_eq!(acquire(vec![HeldByOther, HeldByOther]), Some(HeldByOther));
        assert_eq!(
            acquire(vec![Acquired, HeldByOther]),
            Some(PartlyHeldByOther)
        );
        assert_eq!(
            acquire(vec![Acquired, TimedOut, HeldByOther]),
            Some(TimedOut)
        );
        assert_eq!(acquire(vec![]), None);
        let not_ready = ServerError(crate::server_error::ServerError::of_kind(
            ServerErrorKind::NotReady,
            "EVALSHA",
            "LOADING",
        ));
        assert_eq!(
            acquire(vec![HeldByOther, not_ready.clone()]),
            Some(not_ready.clone())
        );
        let beside_taken = acquire(vec![Acquired, not_ready]).expect("an answer");
        assert!(
            beside_taken.may_have_set() && !beside_taken.is_answer(),
            "{beside_taken}"
        );
        let release = |outcomes| together(RoundKind::Release, of(outcomes)).map(|a| a.outcome);
        assert_eq!(release(vec![NotHeld, Released]), Some(Released));
        assert_eq!(release(vec![NotHeld, NotHeld]), Some(NotHeld));
        assert_eq!(release(vec![Released, TimedOut]), Some(TimedOut));
        let extend = |outcomes| together(RoundKind::Extend, of(outcomes)).map(|a| a.outcome);
        assert_eq!(extend(vec![Extended, NotHeld]), Some(NotHeld));
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

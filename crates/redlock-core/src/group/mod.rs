//! Group commit for plain acquisitions.
//!
//! While an acquisition round of a plain lock (one key, not fenced, not reentrant, not
//! fair) is in flight, the plain acquisitions started meanwhile on the same coordinator
//! wait, and go out together as soon as it is decided: one script call per node (the
//! kind's grouped acquisition) for up to [`GROUP_MAX`](queue::GROUP_MAX) locks instead of
//! one `SET NX PX` per lock (a larger burst in several such rounds, in flight together),
//! each lock still decided on its own quorum, with its own validity and rollback, by the
//! round engine, and answered as soon as it is won (one lock that needs a slow node's
//! answer holds up no other). A cluster member gets the round as one command per hash
//! slot (see `Command::per_slot`). A lone acquisition
//! (nothing in flight) is sent at once as `SET NX PX`, exactly as without grouping, so an
//! uncontended caller pays nothing; under load the commands, and the system calls that the
//! client's CPU goes to, fall to a fraction per lock.
//!
//! A waiting acquisition's validity is measured from the start of the round that carries
//! it (its `t0`, read before that round's commands leave), never from when it began
//! waiting, so waiting costs time, not safety. A caller whose future is dropped while it
//! waits is left out of the next round; one dropped while its round is in flight gets its
//! lock released in the background if it was won, as a round dropped mid-flight rolls
//! back.
//!
//! The lead round is decided in its caller's future: a leader whose future is kept but not
//! polled (pinned in a `select!` loop busy elsewhere) holds the waiting calls back. So a
//! call waits for the group at most [`GROUP_WAIT_MARGIN`] past one node timeout (the lead
//! round's bound); still not sent by then, it leaves the group and sends a round of its
//! own.

pub(crate) mod queue;

use std::sync::Arc;
use std::time::Duration;

use fred::types::{Key, Value};
use futures::future::join_all;
use tokio::sync::oneshot;

use crate::coordinator::Coordinator;
use crate::error::Error;
use crate::group::queue::{chunks, Answer, Group, Released, Turn, Waiting};
use crate::layout::queue_keys;
use crate::lock::Lock;
use crate::lock_spec::LockSpec;
use crate::report::{ClosedReason, RoundKind, RoundReport};
use crate::round::{self, Command, Request, Round};
use crate::scripts::{channel_arg, Script};

/// How long past one node timeout (the bound of the lead round) a call waits for the group
/// before it sends a round of its own (see the module's documentation).
const GROUP_WAIT_MARGIN: Duration = Duration::from_millis(50);

/// What is grouped: acquisitions (answered with [`Answer`]) or releases (answered with
/// [`Released`]). Each kind has its group and sends a batch its own way.
trait Grouped: Sized + Send + 'static {
    /// Whether a waiting call whose caller gave up is left out of its round. A release is
    /// sent all the same: the key is ours to free.
    const LEAVES_OUT_GONE: bool;

    fn group(coordinator: &Coordinator) -> &Group<Self>;

    /// One round for `batch`, each caller answered.
    fn send(
        coordinator: &Coordinator,
        batch: Vec<Waiting<Self>>,
    ) -> impl std::future::Future<Output = ()> + Send + '_;
}

impl Grouped for Answer {
    const LEAVES_OUT_GONE: bool = true;

    fn group(coordinator: &Coordinator) -> &Group<Self> {
        &coordinator.inner.group
    }

    fn send(
        coordinator: &Coordinator,
        batch: Vec<Waiting<Self>>,
    ) -> impl std::future::Future<Output = ()> + Send + '_ {
        coordinator.acquire_batch(batch)
    }
}

impl Grouped for Released {
    const LEAVES_OUT_GONE: bool = false;

    fn group(coordinator: &Coordinator) -> &Group<Self> {
        &coordinator.inner.release_group
    }

    fn send(
        coordinator: &Coordinator,
        batch: Vec<Waiting<Self>>,
    ) -> impl std::future::Future<Output = ()> + Send + '_ {
        coordinator.release_batch(batch)
    }
}

/// The leader's turn: when its round is decided (or its future dropped), the calls that
/// waited meanwhile go out in rounds of their own.
struct Lead<'a, A: Grouped> {
    coordinator: &'a Coordinator,
    kind: std::marker::PhantomData<A>,
}

impl<'a, A: Grouped> Lead<'a, A> {
    fn new(coordinator: &'a Coordinator) -> Self {
        Lead {
            coordinator,
            kind: std::marker::PhantomData,
        }
    }
}

impl<A: Grouped> Drop for Lead<'_, A> {
    fn drop(&mut self) {
        self.coordinator.hand_on::<A>();
    }
}

/// The wave task's end, however it ends. One that ends before the group ran dry (its
/// runtime shut down and cancelled it, or a round panicked) lets every call that waits go
/// (each sends a round of its own, or finds its client closed) and frees the group for the
/// next leader: otherwise the group stayed busy with nobody to hand on to, and every later
/// call of its kind waited for ever.
struct Unfinished<A: Grouped> {
    coordinator: Coordinator,
    kind: std::marker::PhantomData<A>,
    armed: bool,
}

impl<A: Grouped> Drop for Unfinished<A> {
    fn drop(&mut self) {
        if self.armed {
            while A::group(&self.coordinator).next().is_some() {}
        }
    }
}

impl Coordinator {
    /// A plain acquisition of one key: its own `SET NX PX` round when nothing is in flight,
    /// else a place in the next grouped round.
    pub(crate) async fn acquire_grouped(
        &self,
        spec: LockSpec,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let answer = match self.inner.group.join(&spec, ttl) {
            Turn::Lead => {
                let lead = Lead::<Answer>::new(self);
                let decided = self.run_one(self.plain_round(&spec, ttl)).await;
                drop(lead);
                return decided.into_lock(spec, ttl, None);
            }
            Turn::Wait(answer, id) => match self.wait_in_group(&self.inner.group, answer, id).await
            {
                Some(answer) => answer,
                // Never sent: a round of its own.
                None => {
                    let decided = self.run_one(self.plain_round(&spec, ttl)).await;
                    return decided.into_lock(spec, ttl, None);
                }
            },
        };
        match answer {
            Ok(answer) => answer.take(),
            // The group's task ended without answering: its runtime is shutting down (and
            // the connections' tasks with it), or it panicked. Its batch may have been
            // sent with this token, and that batch's rollback (compare-and-delete of this
            // token) may still be on its way: a round of our own with the same token could
            // win a node whose key that rollback then deletes, leaving us a quorum in name
            // only. So nothing more is sent under this token; the caller's next attempt
            // (a new token) is a round like any other.
            Err(_) => Err(Error::NoQuorum {
                report: Box::new(self.unsent(RoundKind::Acquire, &spec.name)),
            }),
        }
    }

    /// Waits for the group's answer to call `id`, at most [`GROUP_WAIT_MARGIN`] past one
    /// node timeout while no round took it: `None` when it left the group unsent then.
    async fn wait_in_group<A>(
        &self,
        group: &Group<A>,
        mut answer: oneshot::Receiver<A>,
        id: u64,
    ) -> Option<Result<A, oneshot::error::RecvError>> {
        let patience = self.inner.config.node_timeout + GROUP_WAIT_MARGIN;
        match tokio::time::timeout(patience, &mut answer).await {
            Ok(answer) => Some(answer),
            Err(_) if group.withdraw(id) => {
                tracing::debug!(
                    "a grouped call waited past a node timeout for the round in flight (its caller's future is not being polled?) and sends a round of its own"
                );
                None
            }
            // A round carries it now (bounded by the node timeout).
            Err(_) => Some(answer.await),
        }
    }

    /// The report of a round that sent nothing because the task that was to send it is
    /// gone, with the client's own reason if it was closed, else "the runtime stopped".
    fn unsent(&self, kind: RoundKind, key: &Arc<str>) -> RoundReport {
        let reason = self.closed().unwrap_or(ClosedReason::RuntimeStopped);
        round::unsent(kind, key.clone(), self.nodes(), reason)
    }

    /// Sends the calls that waited for the round just decided, if any, from a task of
    /// their own (counted as background work): all of them at once, in rounds of up to
    /// [`GROUP_MAX`](queue::GROUP_MAX), and again until none waits.
    fn hand_on<A: Grouped>(&self) {
        let Some(first) = A::group(self).next() else {
            return;
        };
        // Made before the task, so that a task dropped before it first runs (its runtime
        // shutting down), or never spawned (no runtime to run it on), frees the group too:
        // the waiting calls' answers are dropped, and each (if any can still run) sends a
        // round of its own.
        let unfinished = Unfinished::<A> {
            coordinator: self.clone(),
            kind: std::marker::PhantomData,
            armed: true,
        };
        self.spawn_background(move |this| async move {
            let mut unfinished = unfinished;
            let mut wave = first;
            loop {
                if A::LEAVES_OUT_GONE {
                    wave.retain(|w| !w.answer.is_closed());
                }
                join_all(chunks(wave).into_iter().map(|batch| A::send(&this, batch))).await;
                match A::group(&this).next() {
                    Some(next) => wave = next,
                    None => {
                        unfinished.armed = false;
                        return;
                    }
                }
            }
        });
    }

    /// One round for `batch`: `SET NX PX` for one, the kind's grouped acquisition for several; each
    /// caller gets its own lock or error.
    async fn acquire_batch(&self, batch: Vec<Waiting<Answer>>) {
        let requests: Vec<Request> = batch
            .iter()
            .map(|waiting| waiting.spec.acquire_request(waiting.ttl))
            .collect();
        let round = Round {
            kind: RoundKind::Acquire,
            alternatives: false,
            command: self.per_slot(&batch, &requests, acquire_command),
            requests,
            drift_factor: self.inner.config.drift_factor,
        };
        // Each lock goes to its caller as soon as it is decided won (its quorum in), the
        // others when the round is decided: one contended key that needs a slow node's
        // answer does not hold up the rest of its batch.
        let mut waiting: Vec<Option<Waiting<Answer>>> = batch.into_iter().map(Some).collect();
        let send = |waiting: Waiting<Answer>, decided: round::Decided| {
            let result = decided.into_lock(waiting.spec, waiting.ttl, None);
            // A caller gone meanwhile drops the answer, which releases a won lock.
            let _ = waiting.answer.send(Answer {
                result: Some(result),
                unclaimed: self.inner.clone(),
            });
        };
        let mut early = |j: usize, decided: round::Decided| {
            if let Some(waiting) = waiting.get_mut(j).and_then(Option::take) {
                send(waiting, decided);
            }
        };
        let rest = round::run_early(
            &self.inner.connections,
            round,
            &self.inner.work,
            Some(&mut early),
        )
        .await;
        // The rest come in order: those of the calls not answered yet.
        for (waiting, decided) in waiting.into_iter().flatten().zip(rest) {
            send(waiting, decided);
        }
    }

    /// A plain lock's release (one key, not fair): its own round when no release is in
    /// flight, else a place in the next grouped release round.
    pub(crate) async fn release_grouped(&self, spec: LockSpec) -> Released {
        let answer = match self.inner.release_group.join(&spec, Duration::ZERO) {
            Turn::Lead => {
                let _lead = Lead::<Released>::new(self);
                return self.run_to_quorum(self.release_round(&spec)).await;
            }
            Turn::Wait(answer, id) => {
                match self
                    .wait_in_group(&self.inner.release_group, answer, id)
                    .await
                {
                    Some(answer) => answer,
                    // Never sent: a round of its own.
                    None => return self.run_to_quorum(self.release_round(&spec)).await,
                }
            }
        };
        match answer {
            Ok(released) => released,
            Err(_) => self.run_to_quorum(self.release_round(&spec)).await,
        }
    }

    /// One release round for `batch`: the release script for one, the kind's grouped release for
    /// several; each caller gets its own report.
    async fn release_batch(&self, batch: Vec<Waiting<Released>>) {
        let requests: Vec<Request> = batch
            .iter()
            .map(|waiting| Request::untimed(waiting.spec.name.clone(), RoundKind::Release))
            .collect();
        let round = Round {
            kind: RoundKind::Release,
            alternatives: false,
            command: self.per_slot(&batch, &requests, |calls| self.release_command(calls)),
            requests,
            drift_factor: self.inner.config.drift_factor,
        };
        let decided = round::run(&self.inner.connections, round, &self.inner.work).await;
        for (waiting, decided) in batch.into_iter().zip(decided) {
            let released = if decided.won {
                Ok(decided.report)
            } else {
                Err(Error::NoQuorum {
                    report: Box::new(decided.report),
                })
            };
            let _ = waiting.answer.send(released);
        }
    }

    /// The release of `calls`: the lock's release for one, the kind's grouped release for
    /// several.
    fn release_command(&self, calls: &[&Waiting<Released>]) -> Command {
        let channel = self.inner.release_channel.as_ref();
        let prefix = &self.inner.config.fair_prefix;
        let many = match calls {
            [one] => return one.spec.release(channel, prefix),
            many => many,
        };
        // The lock keys, then each one's queue, expiry and hand-overs.
        let mut keys = Vec::with_capacity(many.len() * 4);
        let mut queues = Vec::with_capacity(many.len() * 3);
        let mut args = Vec::with_capacity(many.len() + 1);
        args.push(channel_arg(channel));
        for waiting in many {
            let key = &*waiting.spec.keys[0];
            keys.push(Key::from(key));
            queues.extend(queue_keys(prefix, key));
            args.push(Value::String(waiting.spec.token.as_fred().clone()));
        }
        keys.append(&mut queues);
        Command::Script {
            script: &grouped(&many[0].spec).1,
            keys,
            args,
        }
    }

    /// The command of a grouped round for `batch` (whose `requests` are the round's), as
    /// `build` makes it for some of its calls: one command per hash slot on a cluster
    /// member (see [`Command::per_slot`]), so concurrent locks of distinct keys share
    /// rounds over cluster members too.
    fn per_slot<A>(
        &self,
        batch: &[Waiting<A>],
        requests: &[Request],
        build: impl Fn(&[&Waiting<A>]) -> Command,
    ) -> Command {
        let first_keys = batch.iter().map(|waiting| &*waiting.spec.keys[0]);
        Command::per_slot(
            self.inner.cluster.is_some(),
            first_keys,
            requests,
            |carried| build(&carried.iter().map(|&j| &batch[j]).collect::<Vec<_>>()),
        )
    }

    /// The round of one lock's release: its compare-and-delete script.
    fn release_round(&self, spec: &LockSpec) -> Round {
        let command = spec.release(
            self.inner.release_channel.as_ref(),
            &self.inner.config.fair_prefix,
        );
        self.untimed_round(RoundKind::Release, command, spec.name.clone())
    }

    /// The round of one plain acquisition: `SET key token NX PX ttl`.
    fn plain_round(&self, spec: &LockSpec, ttl: Duration) -> Round {
        Round {
            kind: RoundKind::Acquire,
            alternatives: false,
            command: spec.acquire(ttl, None),
            requests: vec![spec.acquire_request(ttl)],
            drift_factor: self.inner.config.drift_factor,
        }
    }
}

/// The acquisition of `calls`: `SET NX PX` for one, the kind's grouped acquisition for
/// several.
fn acquire_command(calls: &[&Waiting<Answer>]) -> Command {
    let many = match calls {
        [one] => return one.spec.acquire(one.ttl, None),
        many => many,
    };
    let mut keys = Vec::with_capacity(many.len());
    let mut args = Vec::with_capacity(2 * many.len());
    for waiting in many {
        keys.push(Key::from(&*waiting.spec.keys[0]));
        waiting.spec.batch_args(waiting.ttl, &mut args);
    }
    Command::Script {
        script: &grouped(&many[0].spec).0,
        keys,
        args,
    }
}

/// The grouped acquisition and release of `spec`'s kind: every lock of a group is of a kind
/// that has them ([`LockSpec::groups`]).
fn grouped(spec: &LockSpec) -> &'static (Script, Script) {
    spec.kind
        .scripts()
        .grouped
        .as_ref()
        .expect("only a kind with grouped scripts joins a group")
}

//! A lock's identity (keys, token, owner) and the commands built from it: what a round
//! sends to take, extend, release or undo it.

use std::sync::Arc;
use std::time::Duration;

use fred::bytes_utils::Str;
use fred::types::{Key, Value};

use crate::config::check_key;
use crate::error::ArgumentError;
use crate::fair::place::FairPlace;
use crate::kind::{self, Kind};
use crate::layout::{by_slot, queue_keys};
use crate::lock::Lock;
use crate::round::command::{Command, SlotPart};
use crate::round::plan::{Request, Undo};
use crate::scripts::{channel_arg, Script};
use crate::token::Token;

/// What a lock's scripts are built from: its keys and token, its kind (whose scripts it
/// runs, see [`crate::kind`]) and the kind's argument.
#[derive(Clone)]
pub(crate) struct LockSpec {
    pub(crate) keys: Arc<[Arc<str>]>,
    pub(crate) name: Arc<str>,
    pub(crate) token: Token,
    pub(crate) kind: &'static dyn Kind,
    /// The kind's argument: a reentrant lock's owner.
    pub(crate) arg: Option<Arc<str>>,
    /// Won through a fair queue: its release names the queue's next waiter.
    pub(crate) fair: bool,
}

impl LockSpec {
    /// Checks the keys (not empty, none repeated) and the token; the kind follows from the
    /// keys and the owner of a reentrant lock ([`kind::of`]).
    pub(crate) fn new(
        keys: &[&str],
        token: Token,
        owner: Option<Arc<str>>,
    ) -> Result<LockSpec, ArgumentError> {
        let kind = kind::of(owner.is_some(), keys.len());
        LockSpec::of_kind(kind, keys, token, owner)
    }

    /// [`new`](Self::new) for a lock of `kind` with its argument `arg`.
    pub(crate) fn of_kind(
        kind: &'static dyn Kind,
        keys: &[&str],
        token: Token,
        arg: Option<Arc<str>>,
    ) -> Result<LockSpec, ArgumentError> {
        if keys.is_empty() {
            return Err(ArgumentError::NoKeys);
        }
        token.check()?;
        // Only multi-key locks can repeat a key; the common single-key round skips the set.
        let mut seen =
            std::collections::HashSet::with_capacity(if keys.len() > 1 { keys.len() } else { 0 });
        for key in keys {
            check_key(key)?;
            if keys.len() > 1 && !seen.insert(*key) {
                return Err(ArgumentError::DuplicateKey {
                    key: (*key).to_string(),
                });
            }
        }
        Ok(LockSpec {
            keys: keys.iter().map(|k| Arc::from(*k)).collect(),
            name: lock_name(keys).into(),
            token,
            kind,
            arg,
            fair: false,
        })
    }

    /// The identity of a plain lock of one key that a release handed over to a fair
    /// waiter, under the hand-over `token` (see `fair::handed_over`).
    pub(crate) fn handed_over(key: Arc<str>, token: Token) -> LockSpec {
        LockSpec {
            keys: Arc::from([key.clone()]),
            name: key,
            token,
            kind: &kind::ONE,
            arg: None,
            fair: true,
        }
    }

    /// The identity of a lock that was already won.
    pub(crate) fn of(lock: &Lock) -> LockSpec {
        LockSpec {
            keys: lock.keys.clone(),
            name: lock.name.clone(),
            token: lock.token.clone(),
            kind: lock.kind,
            arg: lock.owner.clone(),
            fair: lock.fair,
        }
    }

    /// For a lock over keys of several hash slots, the lock's share in each slot, in the
    /// order of each slot's first key: the same token and kind over that slot's keys, as a
    /// cluster member runs it (a script there names keys of one slot only). `None` when
    /// every key shares one slot. Every script of a lock of several keys treats each key
    /// (with its queues) alone, so its shares taken, extended and released one by one are
    /// the lock:
    /// - a fenced lock's shares each read the fencing counter beside their keys (see
    ///   `scripts::Unfenced`), so whichever share's answer decides the member's carries
    ///   the member's counter;
    /// - a fair lock's shares each queue the waiter in their keys' queues and take their
    ///   keys only where it heads all of them. One ticket orders every queue, so the oldest
    ///   waiter heads its queues in every slot; one that heads some slots' queues only takes
    ///   their keys, where nobody was ahead of it, and the member's answer is a refusal
    ///   (`NodeOutcome::PartlyHeldByOther`) that a failed round rolls back, putting the
    ///   waiter back in those queues (`queued_by_slot`).
    pub(crate) fn slot_shares(&self) -> Option<Vec<LockSpec>> {
        if self.keys.len() < 2 {
            return None;
        }
        let shares = by_slot(&self.keys, |key| key.as_bytes());
        if shares.len() < 2 {
            return None;
        }
        let share = |keys: Vec<Arc<str>>| LockSpec {
            keys: keys.into(),
            name: self.name.clone(),
            token: self.token.clone(),
            kind: self.kind,
            arg: self.arg.clone(),
            fair: self.fair,
        };
        Some(shares.into_iter().map(share).collect())
    }

    /// The command of a round of this lock alone, as `build` makes it for a lock: with
    /// `by_slot` (a cluster member in the node set) and keys of several hash slots, a
    /// [`Command::PerSlot`] whose parts are the lock's [shares](Self::slot_shares), each
    /// carrying the round's one request with `ttl`. Single servers run `build`'s command
    /// for the whole lock; a cluster member runs the shares, and its answer is theirs
    /// together (see `round::command::together`).
    pub(crate) fn by_slot(
        &self,
        by_slot: bool,
        ttl: Option<Duration>,
        build: impl Fn(&LockSpec) -> Command,
    ) -> Command {
        let whole = build(self);
        let Some(shares) = by_slot.then(|| self.slot_shares()).flatten() else {
            return whole;
        };
        let parts = shares
            .iter()
            .map(|share| SlotPart {
                requests: vec![0],
                ttl,
                command: build(share),
            })
            .collect();
        Command::PerSlot {
            whole: Box::new(whole),
            parts,
        }
    }

    pub(crate) fn fred_keys(&self) -> Vec<Key> {
        self.keys.iter().map(|k| Key::from(&**k)).collect()
    }

    fn token_value(&self) -> Value {
        Value::String(self.token.as_fred().clone())
    }

    /// The kind's argument, for a kind that has one.
    fn push_arg(&self, args: &mut Vec<Value>) {
        if self.kind.has_arg() {
            args.push(Value::from(self.arg.as_deref().unwrap_or("")));
        }
    }

    /// The command that takes the lock with `ttl`: the kind's acquisition, or `SET NX PX`
    /// for a kind that [`is_set_nx`](Kind::is_set_nx). With `fence_key`, the fenced form,
    /// which also reads the node's fencing counter (its key goes last).
    pub(crate) fn acquire(&self, ttl: Duration, fence_key: Option<&str>) -> Command {
        let scripts = self.kind.scripts();
        let mut args = vec![self.token_value(), Value::from(ttl_ms(ttl))];
        self.push_arg(&mut args);
        match fence_key {
            Some(fence_key) => {
                let mut keys = self.fred_keys();
                keys.push(Key::from(fence_key));
                Command::Script {
                    script: &scripts.fenced,
                    keys,
                    args,
                }
            }
            None if self.kind.is_set_nx() => Command::SetNx {
                key: Key::from(&*self.keys[0]),
                token: self.token_value(),
            },
            None => self.script(&scripts.acquire, args),
        }
    }

    /// The acquisition of this lock (fenced with `fence_key`) by a waiter with a place in
    /// its keys' queues: the kind's queued script, which lets only the head of every one
    /// of them take the keys when `gated` (a fair acquisition, see [`FairPlace`]), and
    /// otherwise only enqueues the waiter to be woken. Only the gated attempt of a kind
    /// whose waiters queue registers the place's hand-over.
    pub(crate) fn acquire_queued(
        &self,
        ttl: Duration,
        place: &FairPlace<'_>,
        gated: bool,
        prefix: &str,
        fence_key: Option<&str>,
    ) -> Command {
        let mut args = vec![self.token_value(), Value::from(ttl_ms(ttl))];
        args.extend(place.args());
        args.push(Value::from(if gated { "1" } else { "0" }));
        args.push(
            self.handover(place, gated, fence_key.is_some())
                .map_or(Value::from(""), Value::from),
        );
        self.push_arg(&mut args);
        let mut keys = self.queued_keys(prefix);
        let scripts = self.kind.scripts();
        let script = match fence_key {
            Some(fence_key) => {
                keys.push(Key::from(fence_key));
                &scripts.fenced_queued
            }
            None => &scripts.queued,
        };
        Command::Script { script, keys, args }
    }

    /// The hand-over number that a queued attempt registers: a hand-over sets the key to a
    /// string under a token no round chose, so only a gated attempt of a kind whose waiters
    /// queue (a plain lock of one key) has one, and no fenced one (its fencing token needs
    /// the waiter's own round).
    fn handover(&self, place: &FairPlace<'_>, gated: bool, fenced: bool) -> Option<i64> {
        place
            .handover
            .filter(|_| gated && !fenced && self.kind.waiters_queue())
            .map(|number| i64::try_from(number).unwrap_or(i64::MAX))
    }

    /// The lock's keys, then each key's queue, expiry and hand-overs (the kind's queue for
    /// the key, [`Kind::queue_of`]).
    fn queued_keys(&self, prefix: &str) -> Vec<Key> {
        let mut keys = Vec::with_capacity(4 * self.keys.len());
        keys.extend(self.keys.iter().map(|k| Key::from(&**k)));
        for key in self.keys.iter() {
            keys.extend(queue_keys(prefix, self.kind.queue_of(key)));
        }
        keys
    }

    /// The request of a queued acquisition ([`acquire_queued`](Self::acquire_queued)): it
    /// asks for `ttl`, and its rollback also puts the waiter back in the queues where it
    /// frees the keys (see `scripts::queued_rollback`), as they were before the round took
    /// it out; an abandoned round's rollback passes the keys it frees on, on `channel`.
    pub(crate) fn acquire_queued_request(
        &self,
        ttl: Duration,
        place: &FairPlace<'_>,
        (gated, fenced): (bool, bool),
        prefix: &str,
        channel: Option<&Value>,
    ) -> Request {
        let ttl_ms = ttl_ms(ttl);
        let [waiter, ticket, patience] = place.args();
        let handover = self
            .handover(place, gated, fenced)
            .map_or(String::new(), |number| format!("{number} {ttl_ms}"));
        let mut args = vec![
            self.token_value(),
            waiter,
            ticket,
            patience,
            handover.into(),
            channel_arg(channel),
        ];
        self.push_arg(&mut args);
        Request {
            name: self.name.clone(),
            ttl: Some(ttl),
            undo: Some(Undo {
                script: &self.kind.scripts().queued_rollback,
                keys: self.queued_keys(prefix),
                args,
                waiter_arg: Some(1),
            }),
            redo: false,
        }
    }

    /// The acquisition's request: it asks for `ttl`, and is undone by the kind's release
    /// without a channel, which publishes nothing (nobody held the lock, so nobody waits
    /// for its release).
    pub(crate) fn acquire_request(&self, ttl: Duration) -> Request {
        Request {
            name: self.name.clone(),
            ttl: Some(ttl),
            undo: Some(Undo {
                script: &self.kind.scripts().release,
                keys: self.fred_keys(),
                args: self.release_args(None),
                waiter_arg: None,
            }),
            redo: false,
        }
    }

    /// The kind's release of this lock, publishing on `channel` when given. The release
    /// also passes each key it frees on to the next live waiter of the key's queue (named
    /// after `fair_prefix`; its keys follow the lock's) when it has one: a fair waiter of a
    /// plain lock of one key is handed the key, any other waiter is told, on its client's
    /// channel alone.
    ///
    /// Without a channel, the release of a plain lock of one key outside the fair queue has
    /// nothing to do but compare and delete: a node with `DELIFEQ` runs that instead of the
    /// script ([`Command::CompareAndDelete`]). A fair lock (won through its queue, or handed over)
    /// keeps the script, so that nothing the fair queue does depends on the server's
    /// commands.
    pub(crate) fn release(&self, channel: Option<&Value>, fair_prefix: &str) -> Command {
        let script = &self.kind.scripts().release;
        let mut args = self.release_args(channel);
        if channel.is_none() && self.kind.native_release() && !self.fair {
            return Command::CompareAndDelete {
                key: Key::from(&*self.keys[0]),
                token: self.token_value(),
                script,
                args,
            };
        }
        if channel.is_none() {
            return self.script(script, args);
        }
        // The queue flag: "1" when every waiter queues, so that a release with nobody
        // queued is announced to nobody.
        let quiet = if self.kind.waiters_queue() { "1" } else { "0" };
        args.push(Value::String(Str::from_static(quiet)));
        Command::Script {
            script,
            keys: self.queued_keys(fair_prefix),
            args,
        }
    }

    /// Whether concurrent acquisitions and releases of this lock may share rounds with
    /// other locks' (group commit): a kind that is `SET NX PX`, outside the fair queue.
    pub(crate) fn groups(&self) -> bool {
        self.kind.is_set_nx() && !self.fair
    }

    /// One lock's two arguments to the grouped acquisition script: token, TTL.
    pub(crate) fn batch_args(&self, ttl: Duration, args: &mut Vec<Value>) {
        args.push(self.token_value());
        args.push(Value::from(ttl_ms(ttl)));
    }

    /// One lock's five arguments to the batch extension script.
    pub(crate) fn extend_args(&self, ttl: Duration, args: &mut Vec<Value>) {
        args.push(Value::from(self.kind.tag()));
        args.push(Value::from(self.keys.len() as i64));
        args.push(self.token_value());
        args.push(Value::from(self.arg.as_deref().unwrap_or("")));
        args.push(Value::from(ttl_ms(ttl)));
    }

    /// The release's first arguments: token, channel (or ""), the kind's argument.
    fn release_args(&self, channel: Option<&Value>) -> Vec<Value> {
        // Room for the queue flag that a release with a channel adds.
        let mut args = Vec::with_capacity(4);
        args.extend([self.token_value(), channel_arg(channel)]);
        self.push_arg(&mut args);
        args
    }

    fn script(&self, script: &'static Script, args: Vec<Value>) -> Command {
        Command::Script {
            script,
            keys: self.fred_keys(),
            args,
        }
    }
}

/// A TTL in whole milliseconds, as `PX` and the scripts take it. TTLs are checked to be at
/// most a year before any round, so this never saturates.
pub(crate) fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// How reports, errors and logs name a lock over `keys`: the keys, comma-separated, up to
/// [`NAMED_KEYS`] of them, and how many more (a lock over 20,000 keys would otherwise put
/// every one of them in each message about it).
///
/// ```
/// assert_eq!(redlock_core::support::lock_name(&["a", "b"]), "a, b");
/// let many: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
/// assert_eq!(redlock_core::support::lock_name(&many), "k0, k1, k2, k3, k4 and 3 more keys");
/// ```
pub fn lock_name<S: AsRef<str>>(keys: &[S]) -> String {
    if let [key] = keys {
        return key.as_ref().to_string();
    }
    let shown: Vec<&str> = keys.iter().take(NAMED_KEYS).map(AsRef::as_ref).collect();
    let mut name = shown.join(", ");
    if keys.len() > NAMED_KEYS {
        name.push_str(&format!(" and {} more keys", keys.len() - NAMED_KEYS));
    }
    name
}

/// How many keys [`lock_name`] names.
pub const NAMED_KEYS: usize = 5;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::queued_by_slot;

    /// The undo of a queued acquisition over keys of several slots splits as its shares
    /// were built: each share's keys, then their queue keys, as the share's own undo lays
    /// them out. Keys of one slot, and a layout that is not a lock's keys and their queues,
    /// stay whole.
    #[test]
    fn a_queued_undo_splits_into_each_shares_keys_and_queues() {
        let spec =
            LockSpec::new(&["{a}:1", "b", "{a}:2"], Token::from_string("t"), None).expect("valid");
        let names = |lists: Vec<Vec<Key>>| -> Vec<Vec<String>> {
            lists
                .iter()
                .map(|keys| {
                    keys.iter()
                        .map(|k| k.as_str().unwrap().to_owned())
                        .collect()
                })
                .collect()
        };
        let split = names(queued_by_slot(&spec.queued_keys("q-")));
        let shares = spec.slot_shares().expect("several slots");
        let expected = names(shares.iter().map(|s| s.queued_keys("q-")).collect());
        assert_eq!(split, expected);
        assert_eq!(split.len(), 2);
        let one_slot = LockSpec::new(&["{a}:1", "{a}:2"], Token::from_string("t"), None)
            .expect("valid")
            .queued_keys("q-");
        assert_eq!(queued_by_slot(&one_slot), vec![one_slot.clone()]);
        let other_layout: Vec<Key> = ["a", "b", "c"].map(Key::from).to_vec();
        assert_eq!(queued_by_slot(&other_layout), vec![other_layout.clone()]);
    }

    /// A lock over keys of several hash slots splits into one share per slot, keys in the
    /// lock's order, each with the lock's token and kind; keys of one slot do not split, and
    /// without a cluster member (`by_slot` false) nothing does.
    #[test]
    fn a_lock_over_several_slots_splits_into_one_share_per_slot() {
        let token = Token::from_string("t");
        let keys = ["{a}:1", "b", "{a}:2", "c"];
        let spec = LockSpec::new(&keys, token.clone(), None).expect("valid");
        let shares = spec.slot_shares().expect("several slots");
        let names: Vec<Vec<&str>> = shares
            .iter()
            .map(|share| share.keys.iter().map(|k| &**k).collect())
            .collect();
        assert_eq!(names, [vec!["{a}:1", "{a}:2"], vec!["b"], vec!["c"]]);
        assert!(shares
            .iter()
            .all(|share| share.token == token && share.kind.name() == spec.kind.name()));
        let tagged = LockSpec::new(&["{a}:1", "{a}:2"], token, None).expect("valid");
        assert!(tagged.slot_shares().is_none());
        let build = |s: &LockSpec| s.acquire(Duration::from_secs(1), None);
        let parts = |command: Command| match command {
            Command::PerSlot { parts, .. } => parts.len(),
            _ => 1,
        };
        assert_eq!(parts(spec.by_slot(true, None, build)), 3);
        assert_eq!(parts(spec.by_slot(false, None, build)), 1);
        assert_eq!(parts(tagged.by_slot(true, None, build)), 1);
    }

    /// Only a plain lock of one key, released without a channel and outside the fair queue,
    /// is a bare compare-and-delete; its script form is the kind's release on its key.
    #[test]
    fn only_a_release_with_nothing_else_to_do_is_a_compare_and_delete() {
        let token = Token::from_string("t");
        let native = |spec: &LockSpec, channel: Option<&Value>| {
            matches!(
                spec.release(channel, "p:"),
                Command::CompareAndDelete { .. }
            )
        };
        let one = LockSpec::new(&["k"], token.clone(), None).unwrap();
        assert!(native(&one, None));
        let release = one.release(None, "p:");
        let (script, keys, args) = release.as_script().unwrap();
        assert!(std::ptr::eq(script, &kind::ONE.scripts().release));
        assert_eq!(keys, [Key::from("k")]);
        assert_eq!(args, one.release_args(None));

        let channel = Value::from("redlock:released");
        assert!(!native(&one, Some(&channel)));
        let fair = LockSpec {
            fair: true,
            ..one.clone()
        };
        assert!(!native(&fair, None));
        let many = LockSpec::new(&["a", "b"], token.clone(), None).unwrap();
        assert!(!native(&many, None));
        let reentrant = LockSpec::new(&["k"], token, Some("owner".into())).unwrap();
        assert!(!native(&reentrant, None));
    }
}

//! A lock's identity (keys, token, owner) and the commands built from it: what a round
//! sends to take, extend, release or undo it.

use std::sync::Arc;
use std::time::Duration;

use fred::bytes_utils::Str;
use fred::types::{Key, Value};

use crate::config::check_key;
use crate::error::ConfigError;
use crate::fair::place::FairPlace;
use crate::layout::queue_keys;
use crate::lock::Lock;
use crate::round::{Command, Request, Undo};
use crate::scripts::{
    channel_arg, Script, ACQUIRE_MANY, FAIR_ACQUIRE, FAIR_ACQUIRE_MANY, FAIR_REENTRANT_ACQUIRE,
    FAIR_REENTRANT_ROLLBACK, FAIR_ROLLBACK, FENCED_ACQUIRE_MANY, FENCED_ACQUIRE_ONE,
    FENCED_FAIR_ACQUIRE, FENCED_FAIR_ACQUIRE_MANY, FENCED_FAIR_REENTRANT_ACQUIRE,
    FENCED_REENTRANT_ACQUIRE, REENTRANT_ACQUIRE, REENTRANT_RELEASE, RELEASE,
};
use crate::token::Token;

/// What a lock's scripts are built from.
#[derive(Clone)]
pub(crate) struct LockSpec {
    pub(crate) keys: Arc<[Arc<str>]>,
    pub(crate) name: Arc<str>,
    pub(crate) token: Token,
    pub(crate) owner: Option<Arc<str>>,
    /// Won through a fair queue: its release names the queue's next waiter.
    pub(crate) fair: bool,
}

impl LockSpec {
    /// Checks the keys (not empty, none repeated) and the token.
    pub(crate) fn new(
        keys: &[&str],
        token: Token,
        owner: Option<Arc<str>>,
    ) -> Result<LockSpec, ConfigError> {
        if keys.is_empty() {
            return Err(ConfigError::NoKeys);
        }
        token.check()?;
        // Only multi-key locks can repeat a key; the common single-key round skips the set.
        let mut seen =
            std::collections::HashSet::with_capacity(if keys.len() > 1 { keys.len() } else { 0 });
        for key in keys {
            check_key(key)?;
            if keys.len() > 1 && !seen.insert(*key) {
                return Err(ConfigError::DuplicateKey {
                    key: (*key).to_string(),
                });
            }
        }
        Ok(LockSpec {
            keys: keys.iter().map(|k| Arc::from(*k)).collect(),
            name: lock_name(keys).into(),
            token,
            owner,
            fair: false,
        })
    }

    /// The identity of a lock that was already won.
    pub(crate) fn of(lock: &Lock) -> LockSpec {
        LockSpec {
            keys: lock.keys.clone(),
            name: lock.name.clone(),
            token: lock.token.clone(),
            owner: lock.owner.clone(),
            fair: lock.fair,
        }
    }

    pub(crate) fn fred_keys(&self) -> Vec<Key> {
        self.keys.iter().map(|k| Key::from(&**k)).collect()
    }

    fn token_value(&self) -> Value {
        Value::String(self.token.as_fred().clone())
    }

    /// The command that takes the lock with `ttl`: `SET NX PX` for one key, a script for
    /// several keys or a reentrant hold. With `fence_key`, the fenced form of the script,
    /// which also reads the node's fencing counter (its key goes last).
    pub(crate) fn acquire(&self, ttl: Duration, fence_key: Option<&str>) -> Command {
        let ttl_ms = Value::from(ttl_ms(ttl));
        let (plain, fenced, args) = match (&self.owner, self.keys.len()) {
            (Some(owner), _) => (
                Some(&*REENTRANT_ACQUIRE),
                &*FENCED_REENTRANT_ACQUIRE,
                vec![Value::from(&**owner), self.token_value(), ttl_ms],
            ),
            (None, 1) => (None, &*FENCED_ACQUIRE_ONE, vec![self.token_value(), ttl_ms]),
            (None, _) => (
                Some(&*ACQUIRE_MANY),
                &*FENCED_ACQUIRE_MANY,
                vec![self.token_value(), ttl_ms],
            ),
        };
        match (fence_key, plain) {
            (Some(fence_key), _) => {
                let mut keys = self.fred_keys();
                keys.push(Key::from(fence_key));
                Command::Script {
                    script: fenced,
                    keys,
                    args,
                }
            }
            (None, Some(script)) => self.script(script, args),
            (None, None) => Command::SetNx {
                key: Key::from(&*self.keys[0]),
                token: self.token_value(),
            },
        }
    }

    /// The acquisition of this lock (plain, reentrant or over several keys, fenced with
    /// `fence_key`) by a waiter with a place in its keys' queues: the queue script, which
    /// lets only the head of every one of them take the keys when `gated` (a fair
    /// acquisition, see [`FairPlace`]), and otherwise only enqueues the waiter to be woken.
    /// Only a plain lock of one key's gated attempt registers the place's hand-over.
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
        if let Some(owner) = &self.owner {
            args.push(Value::from(&**owner));
        }
        let mut keys = self.queued_keys(prefix);
        let script = match (&self.owner, self.keys.len() > 1, fence_key) {
            (Some(_), _, None) => &*FAIR_REENTRANT_ACQUIRE,
            (Some(_), _, Some(_)) => &*FENCED_FAIR_REENTRANT_ACQUIRE,
            (None, false, None) => &*FAIR_ACQUIRE,
            (None, false, Some(_)) => &*FENCED_FAIR_ACQUIRE,
            (None, true, None) => &*FAIR_ACQUIRE_MANY,
            (None, true, Some(_)) => &*FENCED_FAIR_ACQUIRE_MANY,
        };
        if let Some(fence_key) = fence_key {
            keys.push(Key::from(fence_key));
        }
        Command::Script { script, keys, args }
    }

    /// The hand-over number that a queued attempt registers: a hand-over sets the key to a
    /// string under a token no round chose, so only a gated attempt of a plain lock of one
    /// key has one: no fencing token (that needs the waiter's own round), no reentrant
    /// hold.
    fn handover(&self, place: &FairPlace<'_>, gated: bool, fenced: bool) -> Option<i64> {
        place
            .handover
            .filter(|_| gated && !fenced && self.waiters_queue())
            .map(|number| i64::try_from(number).unwrap_or(i64::MAX))
    }

    /// The lock's keys, then each key's queue, expiry and hand-overs.
    fn queued_keys(&self, prefix: &str) -> Vec<Key> {
        let mut keys = self.fred_keys();
        for key in self.keys.iter() {
            keys.extend(queue_keys(prefix, key));
        }
        keys
    }

    /// The request of a queued acquisition ([`acquire_queued`](Self::acquire_queued)): it
    /// asks for `ttl`, and its rollback also puts the waiter back in the queues where it
    /// frees the keys (see `FAIR_ROLLBACK`), as they were before the round took it out; an
    /// abandoned round's rollback passes the keys it frees on, on `channel`.
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
        let script = match &self.owner {
            Some(owner) => {
                args.push(Value::from(&**owner));
                &*FAIR_REENTRANT_ROLLBACK
            }
            None => &*FAIR_ROLLBACK,
        };
        Request {
            name: self.name.clone(),
            ttl: Some(ttl),
            undo: Some(Undo {
                script,
                keys: self.queued_keys(prefix),
                args,
                waiter_arg: Some(1),
            }),
            redo: false,
        }
    }

    /// The acquisition's request: it asks for `ttl`, and is undone by a compare-and-delete
    /// that publishes nothing (nobody held the lock, so nobody waits for its release).
    pub(crate) fn acquire_request(&self, ttl: Duration) -> Request {
        let (script, args) = self.release_script(None);
        Request {
            name: self.name.clone(),
            ttl: Some(ttl),
            undo: Some(Undo {
                script,
                keys: self.fred_keys(),
                args,
                waiter_arg: None,
            }),
            redo: false,
        }
    }

    /// The compare-and-delete for this lock, publishing on `channel` when given. The
    /// release also passes each key it frees on to the next live waiter of the key's queue
    /// (named after `fair_prefix`; its keys follow the lock's) when it has one: a fair
    /// waiter of a plain lock is handed the key, any other waiter is told, on its client's
    /// channel alone.
    pub(crate) fn release(&self, channel: Option<&Value>, fair_prefix: &str) -> Command {
        let (script, mut args) = self.release_script(channel);
        if channel.is_none() {
            return self.script(script, args);
        }
        args.push(Value::String(Str::from_static("1")));
        if self.owner.is_none() {
            let queues = if self.waiters_queue() { "1" } else { "0" };
            args.push(Value::String(Str::from_static(queues)));
        }
        Command::Script {
            script,
            keys: self.queued_keys(fair_prefix),
            args,
        }
    }

    /// Whether every waiter for this lock's key that wants a wake-up queues for it: a lock
    /// of one key, not reentrant, fenced or not (whose waiters queue from their second
    /// attempt, which follows the first after at most a node timeout). Its release with
    /// nobody queued is announced to nobody.
    pub(crate) fn waiters_queue(&self) -> bool {
        self.keys.len() == 1 && self.owner.is_none()
    }

    /// One plain lock's two arguments to the grouped acquisition script: token, TTL.
    pub(crate) fn batch_args(&self, ttl: Duration, args: &mut Vec<Value>) {
        args.push(self.token_value());
        args.push(Value::from(ttl_ms(ttl)));
    }

    /// One lock's five arguments to the batch extension script.
    pub(crate) fn extend_args(&self, ttl: Duration, args: &mut Vec<Value>) {
        args.push(Value::from(if self.owner.is_some() { "r" } else { "e" }));
        args.push(Value::from(self.keys.len() as i64));
        args.push(self.token_value());
        args.push(Value::from(self.owner.as_deref().unwrap_or("")));
        args.push(Value::from(ttl_ms(ttl)));
    }

    fn release_script(&self, channel: Option<&Value>) -> (&'static Script, Vec<Value>) {
        let channel = channel_arg(channel);
        match &self.owner {
            Some(owner) => (
                &REENTRANT_RELEASE,
                vec![Value::from(&**owner), self.token_value(), channel],
            ),
            None => (&RELEASE, vec![self.token_value(), channel]),
        }
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
fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// How reports, errors and logs name a lock over `keys`: the keys, comma-separated, up to
/// [`NAMED_KEYS`] of them, and how many more (a lock over 20,000 keys would otherwise put
/// every one of them in each message about it).
///
/// ```
/// assert_eq!(redlock_core::lock_name(&["a", "b"]), "a, b");
/// let many: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
/// assert_eq!(redlock_core::lock_name(&many), "k0, k1, k2, k3, k4 and 3 more keys");
/// ```
pub fn lock_name<S: AsRef<str>>(keys: &[S]) -> String {
    let shown: Vec<&str> = keys.iter().take(NAMED_KEYS).map(AsRef::as_ref).collect();
    let mut name = shown.join(", ");
    if keys.len() > NAMED_KEYS {
        name.push_str(&format!(" and {} more keys", keys.len() - NAMED_KEYS));
    }
    name
}

/// How many keys [`lock_name`] names.
pub const NAMED_KEYS: usize = 5;

//! Plain locks: each key holds the holder's token as a string. One key ([`ONE`]: `SET NX
//! PX`, the one kind a release hands to a fair waiter) or several taken all or none
//! ([`MANY`]).

use std::sync::LazyLock;

use super::{Kind, KindScripts};

/// A plain lock of one key.
pub(crate) struct One;

/// A plain lock of several keys, taken all or none on each node.
pub(crate) struct Many;

/// A semaphore's permit: one key, taken by the semaphore's own round (see
/// `acquire::permit`), then released and extended as a plain key. Nobody waits for one
/// permit: a semaphore's waiters try again after their backoff's delay (announcing each
/// release to every client cost more under contention than it gained, see
/// `docs/benchmarks.md`), or wait in the semaphore's one fair queue; its release, like a
/// plain lock's, announces itself only to the next waiter of that queue, when there is one.
pub(crate) struct Permit;

pub(crate) static ONE: One = One;
pub(crate) static MANY: Many = Many;
pub(crate) static PERMIT: Permit = Permit;

/// A read-write lock's write side: one key taken by the read-write lock's own round (see
/// `acquire::rwlock`), then released and extended as a plain key, as a permit is; its
/// release is announced to every client too.
pub(crate) struct Writer;

pub(crate) static WRITER: Writer = Writer;

/// What both plain kinds free and extend: a key that holds the token.
const FREE_AND_HOLDS: &str = r#"local function free(key, token, arg)
  if redis.pcall("GET", key) == token then
    redis.call("DEL", key)
    return true, true
  end
  return false, false
end
local function holds(key, token, arg)
  return redis.pcall("GET", key) == token
end"#;

/// One key: `take` is `SET NX PX`; `held` takes on a key that a release handed over to
/// `waiter` (`"<waiter>~<number>"`, see `crate::message`) under the round's token and TTL,
/// as if the round had set it.
static ONE_LUA: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"local function take(first, last, token, ttl, arg)
  if redis.call("SET", KEYS[first], token, "NX", "PX", ttl) then return true end
  return false
end
local function held(first, last, token, ttl, waiter, arg)
  if not waiter then return false end
  if not handed_to(redis.pcall("GET", KEYS[first]), waiter) then return false end
  redis.call("SET", KEYS[first], token, "PX", ttl)
  return true
end
{FREE_AND_HOLDS}"#
    )
});

/// Several keys: `take` sets every key or none; nothing is held without a round.
static MANY_LUA: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"local function take(first, last, token, ttl, arg)
  for i = first, last do
    if redis.call("EXISTS", KEYS[i]) == 1 then return false end
  end
  for i = first, last do redis.call("SET", KEYS[i], token, "PX", ttl) end
  return true
end
local function held(first, last, token, ttl, waiter, arg) return false end
{FREE_AND_HOLDS}"#
    )
});

/// A permit: `take` is `SET NX PX` (the semaphore's round proposes every permit in a
/// script of its own, `scripts::PERMIT_TAKE`); nothing is held without a round.
static PERMIT_LUA: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"local function take(first, last, token, ttl, arg)
  if redis.call("SET", KEYS[first], token, "NX", "PX", ttl) then return true end
  return false
end
local function held(first, last, token, ttl, waiter, arg) return false end
{FREE_AND_HOLDS}"#
    )
});

static ONE_SCRIPTS: LazyLock<KindScripts> = LazyLock::new(|| KindScripts::of(&ONE));
static MANY_SCRIPTS: LazyLock<KindScripts> = LazyLock::new(|| KindScripts::of(&MANY));
static PERMIT_SCRIPTS: LazyLock<KindScripts> = LazyLock::new(|| KindScripts::of(&PERMIT));

/// A write side: a permit's Lua, marked so that its scripts are its own (a script is known
/// by its source's SHA-1).
static WRITER_LUA: LazyLock<String> =
    LazyLock::new(|| format!("-- a read-write lock's write side\n{}", &*PERMIT_LUA));
static WRITER_SCRIPTS: LazyLock<KindScripts> = LazyLock::new(|| KindScripts::of(&WRITER));

impl Kind for One {
    fn name(&self) -> &'static str {
        "one key"
    }
    fn tag(&self) -> &'static str {
        "e"
    }
    fn lua(&self) -> &'static str {
        &ONE_LUA
    }
    fn waiters_queue(&self) -> bool {
        true
    }
    fn is_set_nx(&self) -> bool {
        true
    }
    fn native_release(&self) -> bool {
        true
    }
    fn scripts(&self) -> &'static KindScripts {
        &ONE_SCRIPTS
    }
}

impl Kind for Many {
    fn name(&self) -> &'static str {
        "several keys"
    }
    fn tag(&self) -> &'static str {
        "m"
    }
    fn lua(&self) -> &'static str {
        &MANY_LUA
    }
    fn scripts(&self) -> &'static KindScripts {
        &MANY_SCRIPTS
    }
}

impl Kind for Permit {
    fn name(&self) -> &'static str {
        "a permit"
    }
    fn tag(&self) -> &'static str {
        "p"
    }
    fn lua(&self) -> &'static str {
        &PERMIT_LUA
    }
    fn waiters_queue(&self) -> bool {
        true
    }
    fn queue_of<'k>(&self, key: &'k str) -> &'k str {
        crate::layout::permit_base(key)
    }
    fn native_release(&self) -> bool {
        true
    }
    fn scripts(&self) -> &'static KindScripts {
        &PERMIT_SCRIPTS
    }
}

impl Kind for Writer {
    fn name(&self) -> &'static str {
        "a write lock"
    }
    fn tag(&self) -> &'static str {
        "w"
    }
    fn lua(&self) -> &'static str {
        &WRITER_LUA
    }
    fn native_release(&self) -> bool {
        true
    }
    fn scripts(&self) -> &'static KindScripts {
        &WRITER_SCRIPTS
    }
}

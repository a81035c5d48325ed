//! A read-write lock's read side: the readers' set (a sorted set, see
//! `layout::rwlock_keys`) holds one entry per reader, its token, scored by the node time
//! (ms) its hold ends; the set's own expiry is at least its longest entry's. A reader is
//! taken by the read-write lock's own round (`acquire::rwlock`), so `take` and `held`
//! never take anything here; this kind frees, checks and lengthens one reader's entry.
//!
//! An entry counts only while its score is ahead of the node's clock: a reader whose hold
//! expired is not held, even while the set lives on for other readers, and an extension
//! never brings it back (it checks before it lengthens, in the same call). Reads go through
//! `redis.pcall`, so a key of another type counts as "not ours".

use std::sync::LazyLock;

use super::{Kind, KindScripts};
use crate::scripts::NODE_TIME_MS;

/// A reader of a read-write lock.
pub(crate) struct Reader;

pub(crate) static READER: Reader = Reader;

static LUA: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"{NODE_TIME_MS}
local function take(first, last, token, ttl, arg) return false end
local function held(first, last, token, ttl, waiter, arg) return false end
local function free(key, token, arg)
  local removed = redis.pcall("ZREM", key, token)
  if type(removed) ~= "number" or removed == 0 then return false, false end
  redis.call("ZREMRANGEBYSCORE", key, "-inf", node_time_ms())
  if redis.call("ZCARD", key) == 0 then
    redis.call("DEL", key)
    return true, true
  end
  return true, false
end
local function holds(key, token, arg)
  local until_ms = redis.pcall("ZSCORE", key, token)
  if type(until_ms) ~= "string" then return false end
  return tonumber(until_ms) > node_time_ms()
end
local function lengthen(key, token, ttl, arg)
  local until_ms = node_time_ms() + tonumber(ttl)
  if tonumber(redis.call("ZSCORE", key, token)) < until_ms then
    redis.call("ZADD", key, until_ms, token)
  end
  if redis.call("PTTL", key) < tonumber(ttl) then redis.call("PEXPIRE", key, ttl) end
end"#
    )
});

static SCRIPTS: LazyLock<KindScripts> = LazyLock::new(|| KindScripts::of(&READER));

impl Kind for Reader {
    fn name(&self) -> &'static str {
        "a read lock"
    }
    fn tag(&self) -> &'static str {
        "s"
    }
    fn lua(&self) -> &'static str {
        &LUA
    }
    fn own_lengthen(&self) -> bool {
        true
    }
    fn scripts(&self) -> &'static KindScripts {
        &SCRIPTS
    }
}

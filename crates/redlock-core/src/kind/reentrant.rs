//! Reentrant locks: the key is a hash with its owner (field `owner`) and one field
//! `hold:<token>` per hold. Holds are idempotent by token, so a retried or rolled-back
//! attempt never adds or removes another hold's count. A key that exists but is not a
//! reentrant lock (a plain lock's string, a list, a hash without an `owner` field) is
//! refused and left as it was: the Lua looks at the key's type before it reads or writes a
//! field.

use std::sync::LazyLock;

use super::{Kind, KindScripts};

/// A reentrant lock of one key; its argument is the owner.
pub(crate) struct Reentrant;

pub(crate) static REENTRANT: Reentrant = Reentrant;

/// `take` takes the free key; `held` adds a hold when the owner (`arg`) already has the
/// key, never shortening its TTL, which the owner's other holds count on; `free` deletes
/// the key with its last hold.
const LUA: &str = r#"local function take(first, last, token, ttl, owner)
  if redis.call("EXISTS", KEYS[first]) == 1 then return false end
  redis.call("HSET", KEYS[first], "owner", owner, "hold:" .. token, 1)
  redis.call("PEXPIRE", KEYS[first], ttl)
  return true
end
local function held(first, last, token, ttl, waiter, owner)
  if redis.call("TYPE", KEYS[first]).ok ~= "hash" then return false end
  if redis.call("HGET", KEYS[first], "owner") ~= owner then return false end
  redis.call("HSET", KEYS[first], "hold:" .. token, 1)
  if redis.call("PTTL", KEYS[first]) < tonumber(ttl) then
    redis.call("PEXPIRE", KEYS[first], ttl)
  end
  return true
end
local function free(key, token, owner)
  if redis.pcall("HGET", key, "owner") ~= owner then return false, false end
  if redis.call("HDEL", key, "hold:" .. token) == 0 then return false, false end
  if redis.call("HLEN", key) <= 1 then
    redis.call("DEL", key)
    return true, true
  end
  return true, false
end
local function holds(key, token, owner)
  return redis.pcall("HGET", key, "owner") == owner and redis.call("HEXISTS", key, "hold:" .. token) == 1
end"#;

static SCRIPTS: LazyLock<KindScripts> = LazyLock::new(|| KindScripts::of(&REENTRANT));

impl Kind for Reentrant {
    fn name(&self) -> &'static str {
        "reentrant"
    }
    fn tag(&self) -> &'static str {
        "r"
    }
    fn lua(&self) -> &'static str {
        LUA
    }
    fn has_arg(&self) -> bool {
        true
    }
    fn scripts(&self) -> &'static KindScripts {
        &SCRIPTS
    }
}

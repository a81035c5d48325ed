//! The read-only read of a key's holder.

use std::sync::LazyLock;

use super::{Script, NODE_TIME_MS};

/// Reads a key's holder and TTL in one call, read-only: `KEYS[1]` = key. Returns 0 when the
/// key is absent, otherwise `{1, {pttl, kind, ...}}` with `pttl` -1 for no expiry and
/// `kind` one of: `"s"` and the value (a plain lock: its token), `"r"`, the owner and the
/// tokens of its holds (a reentrant lock's hash), `"z"` and the tokens of the live readers
/// (a read-write lock's readers' set; a set without a live reader reads as absent), `"o"`
/// (any other value, not a lock of this library). One script rather than GET and PTTL so
/// that the holder and the TTL are read at one instant, and so that a reentrant hash is
/// read as a hash.
pub(crate) static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(format!("{NODE_TIME_MS}{BODY}")));

const BODY: &str = r#"local kind = redis.call("TYPE", KEYS[1]).ok
if kind == "none" then return 0 end
local ttl = redis.call("PTTL", KEYS[1])
if kind == "string" then return {1, {ttl, "s", redis.call("GET", KEYS[1])}} end
if kind == "hash" then
  local owner = redis.call("HGET", KEYS[1], "owner")
  if owner then
    local holds = {}
    for _, field in ipairs(redis.call("HKEYS", KEYS[1])) do
      if string.sub(field, 1, 5) == "hold:" then holds[#holds + 1] = string.sub(field, 6) end
    end
    return {1, {ttl, "r", owner, holds}}
  end
end
if kind == "zset" then
  local readers = redis.call("ZRANGEBYSCORE", KEYS[1], "(" .. node_time_ms(), "+inf")
  if #readers == 0 then return 0 end
  return {1, {ttl, "z", readers}}
end
return {1, {ttl, "o"}}"#;

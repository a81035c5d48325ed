//! Plain locks: several keys taken all or none, and the batches of group commit
//! (acquisitions and extensions of many locks in one call per node).

use std::sync::LazyLock;

use super::Script;

/// `KEYS` = the lock's keys, `ARGV[1]` = token, `ARGV[2]` = TTL in ms: set every key, or none
/// if any exists (all-or-nothing on this node). Returns 1 when set, 0 otherwise.
pub(crate) static ACQUIRE_MANY: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_MANY_BODY));

pub(super) const ACQUIRE_MANY_BODY: &str = r#"for _, key in ipairs(KEYS) do
  if redis.call("EXISTS", key) == 1 then return 0 end
end
for _, key in ipairs(KEYS) do
  redis.call("SET", key, ARGV[1], "PX", ARGV[2])
end
return 1"#;

/// Extends several locks in one call. `ARGV[1]` is ignored (reserved); then five arguments
/// per lock: kind (`e` exclusive, `r` reentrant), number of keys, token, owner (or ""), TTL
/// in ms. `KEYS` holds each lock's keys in the same order. A lock is extended (all its keys)
/// only if every key still holds its token; `PEXPIRE` never recreates a missing key.
/// Returns one 1 or 0 per lock.
///
/// An extension only ever lengthens: a key whose TTL is already at least the one asked for
/// keeps it (the rule of `PEXPIRE ... GT`, written out so that servers older than Redis 7
/// apply it too). So no extension, whether it won, lost its quorum, or arrived late, can
/// move a node's expiry before a validity that a guard reports: not another holder's of a
/// shared reentrant hold, not a longer manual extension's that renewal follows, and not
/// the validity a failed extension leaves in place.
pub(crate) static EXTEND_BATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"local function lengthen(key, ttl)
  if redis.call("PTTL", key) < tonumber(ttl) then redis.call("PEXPIRE", key, ttl) end
end
local results = {}
local k = 1
local a = 2
while a + 4 <= #ARGV do
  local kind, n, token, owner, ttl = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  a = a + 5
  local ok = 1
  if kind == "r" then
    local key = KEYS[k]
    if redis.pcall("HGET", key, "owner") == owner and redis.call("HEXISTS", key, "hold:" .. token) == 1 then
      lengthen(key, ttl)
    else
      ok = 0
    end
  else
    for i = k, k + n - 1 do
      if redis.pcall("GET", KEYS[i]) ~= token then ok = 0 end
    end
    if ok == 1 then
      for i = k, k + n - 1 do lengthen(KEYS[i], ttl) end
    end
  end
  k = k + n
  results[#results + 1] = ok
end
return results"#,
    )
});

/// Plain acquisitions of distinct locks, coalesced into one call per node (group commit,
/// see `group`): `SET KEYS[i] ARGV[2i-1] NX PX ARGV[2i]` for each key, each on its own (not
/// all or nothing). Returns one 1 (set) or 0 (held) per key, in order.
pub(crate) static ACQUIRE_BATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"local results = {}
for i, key in ipairs(KEYS) do
  if redis.call("SET", key, ARGV[2 * i - 1], "NX", "PX", ARGV[2 * i]) then
    results[i] = 1
  else
    results[i] = 0
  end
end
return results"#,
    )
});

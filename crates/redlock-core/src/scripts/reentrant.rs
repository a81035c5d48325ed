//! Reentrant locks: a hash with its owner and one field per hold.

use std::sync::LazyLock;

use super::Script;

/// A reentrant lock is a hash: field `owner` names the owner, and each hold adds a field
/// `hold:<token>`. Holds are idempotent by token, so a retried or rolled-back attempt can
/// never add or remove another hold's count.
///
/// `KEYS[1]` = key, `ARGV[1]` = owner, `ARGV[2]` = hold token, `ARGV[3]` = TTL in ms. Takes
/// the key when free, adds a hold when the owner already has it. Returns 1 or 0.
///
/// A key that exists but is not a reentrant lock (a plain lock's string, a list, or a hash
/// without an `owner` field) is refused and left as it was: the script looks at the key's
/// type before it reads or writes a field. Adding a hold never shortens the key's TTL, which
/// the other holds of the same owner count on.
pub(crate) static REENTRANT_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(REENTRANT_ACQUIRE_BODY.as_str()));

pub(super) static REENTRANT_ACQUIRE_BODY: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"local owner, token, ttl = ARGV[1], ARGV[2], ARGV[3]
{REENTRANT_STEPS}
if held() or take() then return 1 end
return 0"#
    )
});

/// The two steps of a reentrant acquisition of `KEYS[1]` by `owner`, hold `token`, for
/// `ttl` ms (Lua locals the script sets first): `held()` adds a hold when the owner
/// already has the key (never shortening its TTL), `take()` takes the key when it is free.
/// Each returns whether it did.
pub(super) const REENTRANT_STEPS: &str = r#"local function held()
  if redis.call("TYPE", KEYS[1]).ok ~= "hash" then return false end
  if redis.call("HGET", KEYS[1], "owner") ~= owner then return false end
  redis.call("HSET", KEYS[1], "hold:" .. token, 1)
  if redis.call("PTTL", KEYS[1]) < tonumber(ttl) then
    redis.call("PEXPIRE", KEYS[1], ttl)
  end
  return true
end
local function take()
  if redis.call("EXISTS", KEYS[1]) == 1 then return false end
  redis.call("HSET", KEYS[1], "owner", owner, "hold:" .. token, 1)
  redis.call("PEXPIRE", KEYS[1], ttl)
  return true
end"#;

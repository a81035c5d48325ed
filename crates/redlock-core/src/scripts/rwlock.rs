//! A read-write lock's acquisitions and a writer's leave (see `crate::acquire::rwlock`).
//! `KEYS` is always the lock's writer key, readers' set and intent, in that order (see
//! `layout::rwlock_keys`).

use std::sync::LazyLock;

use super::fence::fenced;
use super::{Script, NODE_TIME_MS};

/// A reader: taken where no writer holds the lock (`EXISTS` of the writer's key, whose
/// expiry is the writer's) and no writer waits (its intent); its entry in the readers' set
/// ends `ttl` after the node's time, and the set lives at least that long. Expired entries
/// are trimmed first. `ARGV`: token, TTL in ms. Answers 1 or 0.
pub(crate) static RW_READ: LazyLock<Script> = LazyLock::new(|| {
    Script::new(format!(
        r#"{NODE_TIME_MS}
if redis.call("EXISTS", KEYS[1]) == 1 or redis.call("EXISTS", KEYS[3]) == 1 then return 0 end
local now = node_time_ms()
local ttl = tonumber(ARGV[2])
redis.call("ZREMRANGEBYSCORE", KEYS[2], "-inf", now)
redis.call("ZADD", KEYS[2], now + ttl, ARGV[1])
if redis.call("PTTL", KEYS[2]) < ttl then redis.call("PEXPIRE", KEYS[2], ttl) end
return 1"#
    ))
});

/// The writer's acquisition, the body of [`RW_WRITE`] and [`RW_WRITE_FENCED`]: taken where
/// no writer holds the lock and no reader's entry is live; refused otherwise, and then the
/// writer's intent (`ARGV[3]`, its id; "" for none) is set for `ARGV[4]` ms unless another
/// writer's is there, so that new readers wait for it. Taking the lock clears the writer's
/// own intent. `ARGV`: token, TTL in ms, writer id, intent's TTL in ms. Answers 1 or 0.
const WRITE: &str = r#"local function intend()
  local id = ARGV[3]
  if id == "" then return end
  local other = redis.call("GET", KEYS[3])
  if not other or other == id then redis.call("SET", KEYS[3], id, "PX", ARGV[4]) end
end
if redis.call("EXISTS", KEYS[1]) == 1 then
  intend()
  return 0
end
redis.call("ZREMRANGEBYSCORE", KEYS[2], "-inf", node_time_ms())
if redis.call("ZCARD", KEYS[2]) > 0 then
  intend()
  return 0
end
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
if ARGV[3] ~= "" and redis.call("GET", KEYS[3]) == ARGV[3] then redis.call("DEL", KEYS[3]) end
return 1"#;

/// A writer (see [`WRITE`]).
pub(crate) static RW_WRITE: LazyLock<Script> =
    LazyLock::new(|| Script::new(format!("{NODE_TIME_MS}\n{WRITE}")));

/// A fenced writer: [`WRITE`] with the node's fencing counter read in the same call.
pub(crate) static RW_WRITE_FENCED: LazyLock<Script> =
    LazyLock::new(|| fenced(&format!("{NODE_TIME_MS}\n{WRITE}")));

/// A writer that stops waiting takes its intent back, where it is its own: `ARGV[1]` is
/// the writer's id. Answers 1 when it removed it.
pub(crate) static RW_LEAVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"if redis.call("GET", KEYS[3]) == ARGV[1] then
  redis.call("DEL", KEYS[3])
  return 1
end
return 0"#,
    )
});

//! A read-write lock's acquisitions and a writer's leave (see `crate::acquire::rwlock`).
//! `KEYS` is always the lock's writer key, readers' set and intent, in that order (see
//! `layout::rwlock_keys`).

use std::sync::LazyLock;

use super::fair::DROP_EXPIRED;
use super::fence::fenced;
use super::{Script, NODE_TIME_MS};

/// A reader's acquisition, the body of [`RW_READ`]: taken where no writer holds the lock
/// (`EXISTS` of the writer's key, whose expiry is the writer's) and no writer waits (its
/// intent); its entry in the readers' set ends `ttl` after the node's time, and the set
/// lives at least that long. Expired entries are trimmed first. `ARGV`: token, TTL in ms.
/// Answers 1 or 0.
const READ: &str = r#"if redis.call("EXISTS", KEYS[1]) == 1 or redis.call("EXISTS", KEYS[3]) == 1 then return 0 end
local now = node_time_ms()
local ttl = tonumber(ARGV[2])
redis.call("ZREMRANGEBYSCORE", KEYS[2], "-inf", now)
redis.call("ZADD", KEYS[2], now + ttl, ARGV[1])
if redis.call("PTTL", KEYS[2]) < ttl then redis.call("PEXPIRE", KEYS[2], ttl) end
return 1"#;

/// A reader (see [`READ`]).
pub(crate) static RW_READ: LazyLock<Script> =
    LazyLock::new(|| Script::new(format!("{NODE_TIME_MS}\n{READ}")));

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

/// A reader in the read-write lock's fair queue (see [`queued`]).
pub(crate) static RW_READ_QUEUED: LazyLock<Script> =
    LazyLock::new(|| Script::new(queued(READ, false)));

/// A writer in the read-write lock's fair queue (see [`queued`]).
pub(crate) static RW_WRITE_QUEUED: LazyLock<Script> =
    LazyLock::new(|| Script::new(queued(WRITE, true)));

/// A fenced writer in the read-write lock's fair queue: [`RW_WRITE_QUEUED`] with the
/// node's fencing counter read in the same call (a turn not come answers 0).
pub(crate) static RW_WRITE_QUEUED_FENCED: LazyLock<Script> =
    LazyLock::new(|| fenced(&queued(WRITE, true)));

/// The fair queue of a read-write lock: one queue per lock, the fair-queue companions of
/// its writer's key (`layout::queue_keys`: waiters by ticket, their expiry, and a hash
/// that marks the writers with `"w"`), so `KEYS` = writer's key, readers' set, intent,
/// queue, expiry, marks; `ARGV` = token, TTL in ms, writer id ("" for a reader), intent's
/// TTL in ms, waiter, ticket, patience in ms.
///
/// The waiter enters the queue (or refreshes its entry) as a fair waiter of a lock does
/// (see `scripts::queued`: expired entries dropped, a ticket that only moves later), and
/// may try only when its turn has come: a writer at the head of the queue, a reader when no
/// writer is ahead of it. So writers go one at a time in the order they came, readers that
/// came between two writers share the lock, and a reader that came after a waiting writer
/// waits for it. Its turn come, the side's own acquisition (`body`) decides, and a win takes
/// the waiter out of the queue. A writer whose turn has not come takes its intent back:
/// the reader ahead of it must not wait for it.
///
/// The marks are the hash where a lock's fair waiter registers its hand-over; a release
/// finds `"w"` there, which is no hand-over (see `pass_on` in `scripts::release`): it only
/// tells the waiter. Nothing is ever handed over in a read-write lock's queue: a writer
/// must see the readers' set. As in every fair queue, mutual exclusion rests on the sides'
/// own acquisitions alone; the queue only decides who tries.
///
/// Answers as `body` does, or `{0, 1}` when the turn has not come.
fn queued(body: &str, writer: bool) -> String {
    format!(
        r#"if redis.replicate_commands then redis.replicate_commands() end
{NODE_TIME_MS}
{DROP_EXPIRED}
local function take()
{body}
end
local queue, expiry, marks = KEYS[4], KEYS[5], KEYS[6]
local waiter, ticket, patience = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local writer = {writer}
local now = node_time_ms()
drop_expired(queue, expiry, marks, now)
local current = redis.call("ZSCORE", queue, waiter)
if not current or tonumber(current) < ticket then redis.call("ZADD", queue, ticket, waiter) end
redis.call("ZADD", expiry, now + patience, waiter)
if writer then redis.call("HSET", marks, waiter, "w") end
local function turn()
  local rank = redis.call("ZRANK", queue, waiter)
  if rank == 0 then return true end
  if writer then return false end
  for _, ahead in ipairs(redis.call("ZRANGE", queue, 0, rank - 1)) do
    if redis.call("HGET", marks, ahead) == "w" then return false end
  end
  return true
end
local result = {{0, 1}}
if turn() then
  result = take()
  if result == 1 then
    redis.call("ZREM", queue, waiter)
    redis.call("ZREM", expiry, waiter)
    redis.call("HDEL", marks, waiter)
  end
elseif writer and ARGV[3] ~= "" and redis.call("GET", KEYS[3]) == ARGV[3] then
  redis.call("DEL", KEYS[3])
end
for _, key in ipairs({{queue, expiry, marks}}) do
  if redis.call("PTTL", key) < patience and redis.call("EXISTS", key) == 1 then
    redis.call("PEXPIRE", key, patience)
  end
end
return result"#
    )
}

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

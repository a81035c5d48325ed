//! The semaphore's acquisition (see `crate::acquire::permit`).

use std::sync::LazyLock;

use super::fair::DROP_EXPIRED;
use super::fence::{FencedReply, Unfenced, IN_RANGE};
use super::{Script, NODE_TIME_MS};

/// Lua: takes the first free permit of those proposed. `KEYS`: the permits' keys in the
/// order the caller proposes; `ARGV`: the token and the TTL in milliseconds. `taken` holds
/// one flag per key, in `KEYS`' order: 1 for the permit taken (at most one), 0 for every
/// other. A node where every proposed permit is held takes none.
const TAKE: &str = r#"local taken = {}
local free = true
for i = 1, #KEYS do
  if free and redis.call("SET", KEYS[i], ARGV[1], "NX", "PX", ARGV[2]) then
    taken[i] = 1
    free = false
  else
    taken[i] = 0
  end
end"#;

/// The acquisition in the semaphore's fair queue: [`TAKE`] behind a turn. The queue is the
/// fair-queue companions of the semaphore's base key (`layout::queue_keys`: waiters by
/// ticket, their expiry, and a hand-over hash that stays empty), which follow the permits
/// in `KEYS` and are taken off first; `ARGV` goes on after the token and the TTL with the
/// waiter, its ticket and its patience in ms.
///
/// The waiter enters the queue (or refreshes its entry) as a fair waiter of a lock does
/// (see `scripts::queued`: expired entries dropped, a ticket that only moves later), and
/// its turn has come when fewer waiters are ahead of it than the node has free permits: the
/// oldest waiters try, as many as could win, and those behind them do not split the votes.
/// A win takes the waiter out of the queue. A turn not come takes nothing (`taken` all
/// 0). The queue only decides who tries: at most `permits` holders rests on the permits'
/// keys alone, and a queue lost on a node, or different between nodes, costs order, never
/// safety.
const QUEUED: &str = r#"local handovers = table.remove(KEYS)
local expiry = table.remove(KEYS)
local queue = table.remove(KEYS)
local function take()
  TAKE_HERE
  return taken
end
local waiter, ticket, patience = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local now = node_time_ms()
drop_expired(queue, expiry, handovers, now)
local current = redis.call("ZSCORE", queue, waiter)
if not current or tonumber(current) < ticket then redis.call("ZADD", queue, ticket, waiter) end
redis.call("ZADD", expiry, now + patience, waiter)
local free = 0
for i = 1, #KEYS do
  if redis.call("EXISTS", KEYS[i]) == 0 then free = free + 1 end
end
local taken = {}
if redis.call("ZRANK", queue, waiter) < free then
  taken = take()
  for i = 1, #taken do
    if taken[i] == 1 then
      redis.call("ZREM", queue, waiter)
      redis.call("ZREM", expiry, waiter)
    end
  end
else
  for i = 1, #KEYS do taken[i] = 0 end
end
for _, key in ipairs({queue, expiry}) do
  if redis.call("PTTL", key) < patience and redis.call("EXISTS", key) == 1 then
    redis.call("PEXPIRE", key, patience)
  end
end"#;

/// [`QUEUED`] with the permits' take in place, and the helpers it calls.
fn queued() -> String {
    format!(
        "if redis.replicate_commands then redis.replicate_commands() end\n{NODE_TIME_MS}\n{DROP_EXPIRED}\n{}",
        QUEUED.replace("TAKE_HERE", TAKE)
    )
}

/// The acquisition: answers `taken`.
pub(crate) static PERMIT_TAKE: LazyLock<Script> =
    LazyLock::new(|| Script::new(format!("{TAKE}\nreturn taken")));

/// The acquisition in the semaphore's fair queue (see [`QUEUED`]): answers `taken`.
pub(crate) static PERMIT_TAKE_QUEUED: LazyLock<Script> =
    LazyLock::new(|| Script::new(format!("{}\nreturn taken", queued())));

/// The fenced acquisition: the node's fencing counter is read in the same call, as a
/// lock's fenced acquisition reads it (see `fence::fenced`); its key comes last in `KEYS`
/// and is taken off first. Answers `{flag, counter}` per permit, the counter -1 when the
/// node has none.
pub(crate) static PERMIT_TAKE_FENCED: LazyLock<Script> = LazyLock::new(|| fenced_answers(TAKE));

/// The fenced acquisition in the semaphore's fair queue (see [`QUEUED`]).
pub(crate) static PERMIT_TAKE_QUEUED_FENCED: LazyLock<Script> =
    LazyLock::new(|| fenced_answers(&queued()));

/// A fenced acquisition whose `take` sets `taken`: `{flag, counter}` per permit. Its
/// acquisition alone (for a cluster member, see `fence::Unfenced`) answers `taken`.
fn fenced_answers(take: &str) -> Script {
    Script::new(format!(
        r#"{IN_RANGE}
local fence_key = table.remove(KEYS)
{take}
local counter = redis.pcall("GET", fence_key)
if type(counter) ~= "string" or not tonumber(counter) then
  counter = -1
else
  counter = in_range(tonumber(counter))
end
local answers = {{}}
for i = 1, #taken do answers[i] = {{taken[i], counter}} end
return answers"#
    ))
    .with_unfenced(Unfenced {
        script: Script::new(format!("{take}\nreturn taken")),
        reply: FencedReply::Permits,
    })
}

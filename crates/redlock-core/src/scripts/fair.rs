//! The fair queue: gated and queued acquisitions, a waiter's leave and the rollback of a
//! queued acquisition.

use std::sync::LazyLock;

use super::plain::arg_at;
use super::release::ANNOUNCE;
use super::{Script, MESSAGE, NODE_TIME_MS};

/// The fair acquisition: a waiter queue per key on every node gates who may try.
///
/// `KEYS` = the lock's `n` keys, then for each of them its queue (sorted set: waiter ->
/// ticket), the queue's expiry (sorted set: waiter -> node time in ms after which the entry
/// is dropped) and its hand-overs (hash: waiter -> `"<number> <ttl ms>"`), so `4n` keys.
/// `ARGV[1]` = token, `ARGV[2]` = TTL in ms, `ARGV[3]` = waiter, `ARGV[4]` = ticket,
/// `ARGV[5]` = patience in ms, `ARGV[6]` = "1" for a gated (fair) attempt, "0" for a waiter
/// that only queues to be woken, `ARGV[7]` = the attempt's hand-over number or "" (a plain
/// lock of one key's only), and for a kind with an argument of its own `ARGV[8]` = that
/// argument (a reentrant lock's owner). The kind's `held` and `take` (see the `kind` module)
/// decide whether the waiter holds the lock already and take it.
///
/// Drops the entries whose waiters stopped refreshing them. When no key has a queue (nobody
/// waits) and the keys are free, takes them at once without queuing. Otherwise enqueues
/// the waiter in every key's queue with its ticket (a ticket only moves later: every
/// attempt of one wait gives the same one, and one given after stepping back moves the
/// waiter behind those queued meanwhile, also where its leave did not get through),
/// refreshes its expiry, and registers its hand-over when given
/// (a release that finds the waiter at the head then hands it the key, see [`ANNOUNCE`]).
/// Gated, only a waiter that heads every one of its keys' queues (lowest ticket, then
/// waiter id: the same order on every node and in every queue, so the oldest waiter heads
/// all of its queues and waiters of overlapping keys cannot wait for each other) may take
/// the keys; not gated, the waiter tries wherever it stands, and its entry only tells the
/// release whose client to wake. A key the waiter already holds needs no turn: for a plain lock, one that an
/// earlier release handed to this waiter (`"<waiter>~<number>"`) is taken on under this
/// round's token, with this round's TTL, as if this round had set it; for a reentrant
/// lock, a key its owner holds gets one more hold. A waiter that won leaves the queues.
/// Mutual exclusion still rests on `SET NX PX` (and the release's compare-and-set) alone:
/// the queue only decides who tries. The queues' keys live at most `patience` past their
/// last use. Returns 1 (taken), 0 (a key is held), or `{0, 1}` (gated, and not the head).
pub(crate) fn queued(lua: &str, has_arg: bool) -> String {
    fair(lua, &arg_at(has_arg, 8))
}

/// `drop_expired(queue, expiry, handovers, now)`: takes the waiters whose entries expired by
/// `now` (node time in ms) out of a key's queue and hand-overs.
pub(super) const DROP_EXPIRED: &str = r#"local function drop_expired(waiters, expiry, handovers, now)
  local gone = redis.call("ZRANGEBYSCORE", expiry, "-inf", now)
  for _, waiter in ipairs(gone) do
    redis.call("ZREM", waiters, waiter)
    redis.call("HDEL", handovers, waiter)
  end
  if #gone > 0 then redis.call("ZREMRANGEBYSCORE", expiry, "-inf", now) end
end"#;

/// The queues of a script whose `KEYS` are a lock's `n` keys and then each key's queue,
/// expiry and hand-overs: `queue(i)` names key `i`'s three, and `keep_queues(patience)`
/// makes each of them that exists live at least `patience` ms more.
pub(super) const QUEUES: &str = r#"local n = #KEYS / 4
local function queue(i)
  return KEYS[n + 3 * i - 2], KEYS[n + 3 * i - 1], KEYS[n + 3 * i]
end
local function keep_queues(patience)
  for i = n + 1, #KEYS do
    if redis.call("PTTL", KEYS[i]) < patience and redis.call("EXISTS", KEYS[i]) == 1 then
      redis.call("PEXPIRE", KEYS[i], patience)
    end
  end
end"#;

/// The body of [`queued`] for a kind's `lua` (which defines `held` and `take`, see
/// the `kind` module), with `arg` binding the kind's argument.
fn fair(lua: &str, arg: &str) -> String {
    format!(
        r#"if redis.replicate_commands then redis.replicate_commands() end
{NODE_TIME_MS}
{MESSAGE}
local now = node_time_ms()
local patience = tonumber(ARGV[5])
{QUEUES}
{DROP_EXPIRED}
for i = 1, n do
  local waiters, expiry, handovers = queue(i)
  drop_expired(waiters, expiry, handovers, now)
end
local function leave()
  for i = 1, n do
    local waiters, expiry, handovers = queue(i)
    redis.call("ZREM", waiters, ARGV[3])
    redis.call("ZREM", expiry, ARGV[3])
    redis.call("HDEL", handovers, ARGV[3])
  end
end
{lua}
{arg}
local function held_here() return held(1, n, ARGV[1], ARGV[2], ARGV[3], arg) end
local function take_here() return take(1, n, ARGV[1], ARGV[2], arg) end
if held_here() then
  leave()
  return 1
end
local queued = false
for i = 1, n do
  if redis.call("EXISTS", (queue(i))) == 1 then queued = true end
end
-- Nobody queues for any of the keys: no turn to wait for, so a free lock is taken
-- without entering (and leaving) the queues.
if not queued and take_here() then return 1 end
local result = 0
do
  local head = true
  for i = 1, n do
    local waiters, expiry, handovers = queue(i)
    -- A ticket only ever moves later: every attempt of one wait gives the same one, and a
    -- waiter that stepped back (see `redlock-client`) gives a newer one, which must also
    -- take effect where its leave did not get through.
    local ticket = redis.call("ZSCORE", waiters, ARGV[3])
    if not ticket or tonumber(ticket) < tonumber(ARGV[4]) then
      redis.call("ZADD", waiters, ARGV[4], ARGV[3])
    end
    redis.call("ZADD", expiry, now + patience, ARGV[3])
    if ARGV[7] ~= "" then redis.call("HSET", handovers, ARGV[3], ARGV[7] .. " " .. ARGV[2]) end
    if redis.call("ZRANGE", waiters, 0, 0)[1] ~= ARGV[3] then head = false end
  end
  if ARGV[6] == "1" and not head then
    result = {{0, 1}}
  elseif queued and take_here() then
    leave()
    result = 1
  end
end
keep_queues(patience)
return result"#
    )
}

/// Takes a waiter out of a key's queue: `KEYS[1]` = the queue, `KEYS[2]` = its expiry,
/// `KEYS[3]` = the lock's key, `KEYS[4]` = the queue's hand-overs, `ARGV[1]` = the waiter,
/// `ARGV[2]` = the release channel or "", `ARGV[3]` = the token of the lock the waiter won
/// (or ""), `ARGV[4]` = the highest hand-over number to delete, or "" for any, `ARGV[5]` =
/// the token of the message that passes the key on (fresh for each leave; the waiter's id
/// when absent). Drops the
/// entries that expired first, as an acquisition does: a leave after which only expired
/// entries are left deletes the queue's keys instead of leaving them to their expiry. A key
/// handed over to the waiter (`"<waiter>~<number>"`) that is not that lock's is deleted
/// (when its number is at most `ARGV[4]`): a waiter that won by its own round, or gave up,
/// leaves no hand-over behind. A waiter that steps back and goes on waiting gives its last
/// attempt's number: its leave, sent again when a node did not answer, may land after the
/// waiter's next attempt, and must not delete a hand-over made for that one (which the
/// waiter may already hold).
/// When the key is then free and the queue has a live waiter left, it is passed on to that
/// waiter as a release would (`pass_on`, see [`ANNOUNCE`], under `ARGV[5]` as the message's
/// token: a client counts a release's messages per token and wakes its waiter once a quorum
/// of nodes sent them, so two leaves of one waiter that each pass the key on to the same
/// next waiter must not share one), whether or not the leaving waiter was still queued: a
/// head that
/// leaves while the key is free (its call was cancelled, or gave up, right after a release
/// woke it; or its winning round was abandoned, its script having taken it out of the
/// queue and its rollback having freed the key without telling anyone) would otherwise
/// leave the next waiter to find out by polling. Returns 1.
pub(crate) static FAIR_LEAVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(format!(
        r#"if redis.replicate_commands then redis.replicate_commands() end
{ANNOUNCE}
{DROP_EXPIRED}
now = node_time_ms()
drop_expired(KEYS[1], KEYS[2], KEYS[4], now)
local removed = dequeue(KEYS[1], KEYS[2], KEYS[4], ARGV[1])
local value = redis.pcall("GET", KEYS[3])
if handed_to(value, ARGV[1]) and value ~= ARGV[3] then
  local number = tonumber(string.sub(value, #ARGV[1] + 2))
  if ARGV[4] == "" or (number and number <= tonumber(ARGV[4])) then
    redis.call("DEL", KEYS[3])
    removed = 1
  end
end
if ARGV[2] ~= "" and redis.call("EXISTS", KEYS[3]) == 0 then
  pass_on(ARGV[2], ARGV[5] or ARGV[1], KEYS[3], KEYS[1], KEYS[2], KEYS[4])
end
return 1"#
    ))
});

/// The rollback of a queued acquisition ([`queued`], fenced or not) that was not won:
/// deletes what the round set and, where that freed the lock's keys, puts the waiter back
/// in their queues as it was before the round (its ticket, its expiry refreshed, and its
/// hand-over when the attempt registered one and no later attempt did), since the winning
/// script took it out of the queue where it set the keys. Without it a round that took the
/// keys on some nodes and lost on others left the waiter queued only where it lost: the
/// next waiter headed the other queues, and each could block the other's quorum until
/// the first waiter tried again. Where the keys were not freed (the round set nothing
/// there, or a reentrant owner still has other holds), nothing is restored, so a rollback
/// that reaches a node after the waiter's next round there changes nothing of that round's.
///
/// `KEYS` = the lock's `n` keys, then each key's queue, expiry and hand-overs (as
/// [`queued`]'s), `ARGV[1]` = the round's token, `ARGV[2]` = waiter (or "" to restore
/// nothing: the round was abandoned, and its waiter's leave may come first), `ARGV[3]` =
/// ticket, `ARGV[4]` = patience in ms, `ARGV[5]` = the hand-over registration
/// (`"<number> <ttl ms>"`) or "", `ARGV[6]` = the release channel or "", and for a kind
/// with an argument of its own `ARGV[7]` = that argument. The kind's `free` (see
/// the `kind` module) drops the round's hold: a reentrant owner's other holds keep the key.
/// Returns 1 when it deleted something, 0 otherwise.
///
/// An abandoned round's rollback that frees a key passes it on to the queue's next live
/// waiter, as a release would (`pass_on`, see [`ANNOUNCE`], with the round's token as the
/// message's token): the round's script took its waiter out of the queue, and the waiter's
/// leave, sent when its call was dropped, may have reached the node before this rollback,
/// found the key held and passed nothing on; nobody else would tell the next waiter.
pub(crate) fn queued_rollback(lua: &str, has_arg: bool) -> String {
    let arg = arg_at(has_arg, 7);
    fair_rollback(&format!(
        r#"{lua}
{arg}
local function undo()
  local removed, freed = 0, false
  for i = 1, n do
    local held, free_now = free(KEYS[i], ARGV[1], arg)
    if held then removed = 1 end
    if free_now then freed = true end
  end
  return removed, freed
end"#
    ))
}

/// The body of a queued acquisition's rollback whose `undo` step returns what the script
/// returns and whether it freed the keys (see [`queued_rollback`]).
fn fair_rollback(undo: &str) -> String {
    format!(
        r#"if redis.replicate_commands then redis.replicate_commands() end
{ANNOUNCE}
{QUEUES}
{undo}
local removed, freed = undo()
if not freed then return removed end
if ARGV[2] == "" then
  if ARGV[6] ~= "" then
    for i = 1, n do
      if redis.call("EXISTS", KEYS[i]) == 0 then
        local waiters, expiry, handovers = queue(i)
        pass_on(ARGV[6], ARGV[1], KEYS[i], waiters, expiry, handovers)
      end
    end
  end
  return removed
end
now = node_time_ms()
local patience = tonumber(ARGV[4])
for i = 1, n do
  local waiters, expiry, handovers = queue(i)
  redis.call("ZADD", waiters, "NX", ARGV[3], ARGV[2])
  redis.call("ZADD", expiry, now + patience, ARGV[2])
  if ARGV[5] ~= "" then redis.call("HSETNX", handovers, ARGV[2], ARGV[5]) end
end
keep_queues(patience)
return removed"#
    )
}

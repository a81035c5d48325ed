//! Releases: compare-and-delete of a lock's keys (one lock, a reentrant hold, or a
//! batch), passing each freed key on to the next live waiter of its queue, and the Lua
//! helpers they share with a fair waiter's leave.

use std::sync::LazyLock;

use super::Script;
use crate::message::message_lua;

/// The Lua helpers of the scripts that free a key while waiters queue for it (releases, and
/// a fair waiter leaving): `next_waiter(queue, expiry, handovers)` is the first waiter of
/// the queue whose entry has not expired by the node's clock (or nil). When the head's
/// entry has expired (a waiter that died, or left while this node was cut off), it first
/// drops every expired entry, as an acquisition does, so that a live waiter behind any
/// number of dead ones is found;
/// `pass_on(channel, token, key, queue, expiry, handovers)` passes the freed key on to
/// that waiter and tells its client, returning whether there was one (the key's queue, its
/// expiry and its hand-overs come from the script's `KEYS`, see [`crate::layout`]).
/// `leave_handed_over(token, queue, expiry, handovers)` takes the waiter of a hand-over
/// token out of the key's queue, for the release of a lock handed over to it on a node where
/// the key is not the waiter's: there the release came before the releasing holder's (the
/// key is still the old holder's), and the waiter would otherwise still head the queue when
/// the holder's release came, and be handed the key again after it had released it, leaving
/// the key there for a TTL. (Where the key is the waiter's, the hand-over that set it took
/// the waiter out of the queue, and a later attempt of the waiter that reached the node
/// would have taken the key on under its own token.)
///
/// `dequeue(queue, expiry, handovers, waiter)` takes a waiter out of a key's queue, its
/// expiry and its hand-overs, returning 1 when it was queued.
///
/// A fair waiter registers a hand-over with each attempt (`"<number> <ttl ms>"` under its
/// id in the `handovers` hash, see [`FAIR_ACQUIRE`](super::FAIR_ACQUIRE)): `pass_on` then sets the key to
/// `"<waiter>~<number>"` with that TTL, takes the waiter out of the queue, and publishes
/// `"<token>\t<waiter>\t<waiter>~<number> <key>"` (the wire format is [`crate::message`]'s).
/// The waiter holds the lock once a quorum
/// of nodes has told it so, with the validity its attempt `<number>` would have had: that
/// attempt registered the hand-over before any node set the key, so `t0 + ttl - drift` of
/// the attempt is a lower bound of every such node's expiry. A waiter that only queues to
/// be woken is told `"<token>\t<waiter> <key>"` and runs its own round. The message goes to
/// `"<channel>:<tag>"` for a waiter id `"<tag>:<rest>"`, which only the waiter's own client
/// listens to. The node's time is read once per script call.
///
/// The hand-over token is never a round's token, so no rollback of the waiter's rounds (which
/// deletes only the round's own token) can delete a key handed over meanwhile; a later
/// attempt of the waiter takes such a key on under its round's token instead.
pub(super) const ANNOUNCE: &str = concat!(
    node_time_ms!(),
    message_lua!(),
    r#"local now = nil
local function dequeue(queue, expiry, handovers, waiter)
  local removed = redis.call("ZREM", queue, waiter)
  redis.call("ZREM", expiry, waiter)
  redis.call("HDEL", handovers, waiter)
  return removed
end
local function next_waiter(queue, expiry, handovers)
  local waiters = redis.call("ZRANGE", queue, 0, 15)
  if #waiters == 0 then return nil end
  if not now then now = node_time_ms() end
  local head = tonumber(redis.call("ZSCORE", expiry, waiters[1]) or "0")
  if head <= now then
    local gone = redis.call("ZRANGEBYSCORE", expiry, "-inf", now)
    for _, waiter in ipairs(gone) do
      redis.call("ZREM", queue, waiter)
      redis.call("HDEL", handovers, waiter)
    end
    redis.call("ZREMRANGEBYSCORE", expiry, "-inf", now)
    waiters = redis.call("ZRANGE", queue, 0, 15)
  end
  for _, waiter in ipairs(waiters) do
    local until_ms = tonumber(redis.call("ZSCORE", expiry, waiter) or "0")
    if until_ms > now then return waiter end
  end
  return nil
end
local function pass_on(channel, token, key, queue, expiry, handovers)
  local waiter = next_waiter(queue, expiry, handovers)
  if not waiter then return false end
  local registered = redis.call("HGET", handovers, waiter)
  local number, ttl = nil, nil
  if registered then number, ttl = string.match(registered, "^(%S+) (%d+)$") end
  local handed = nil
  if number then
    handed = handover_token(waiter, number)
    redis.call("SET", key, handed, "PX", ttl)
    dequeue(queue, expiry, handovers, waiter)
  end
  redis.call("PUBLISH", waiter_channel(channel, waiter), release_message(token, waiter, handed, key))
  return true
end
local function leave_handed_over(token, queue, expiry, handovers)
  local waiter = handover_waiter(token)
  if waiter then dequeue(queue, expiry, handovers, waiter) end
end"#
);

/// `KEYS` = the lock's keys, `ARGV[1]` = token, `ARGV[2]` = channel or "": delete every key
/// that holds the token, publishing `"<token> <key>"` on the channel when one is given (the
/// token lets subscribers of several nodes recognise one release). Returns 1 when something
/// was deleted, 0 otherwise.
///
/// With `ARGV[3]` given ("1"), each lock key's queue, expiry and hand-overs follow the lock
/// keys in `KEYS` (three per key, in the keys' order; see [`crate::layout`]): when a freed
/// key's queue has a live waiter (fair, or queued only to be woken), the release passes the
/// key on to it (see `pass_on` in [`ANNOUNCE`]): a fair waiter is handed the key there and
/// then, and either kind is told on its client's channel alone. When the queue has none,
/// `ARGV[4]` = "1" publishes nothing: every waiter of a plain lock of one key queues.
/// Tokens and waiter ids hold no white space, so every form of the message parses. The
/// release of a key handed over to a fair waiter (a token `"<waiter>~<number>"`) that finds
/// the key not its own takes that waiter out of the key's queue (`leave_handed_over` in
/// [`ANNOUNCE`]); where the key is its own, the hand-over took it out already.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(format!(
        r#"if ARGV[3] and redis.replicate_commands then redis.replicate_commands() end
{ANNOUNCE}
local n = #KEYS
if ARGV[3] then n = #KEYS / 4 end
local deleted = 0
for i = 1, n do
  local key = KEYS[i]
  local queue, expiry, handovers = KEYS[n + 3 * i - 2], KEYS[n + 3 * i - 1], KEYS[n + 3 * i]
  local value = redis.pcall("GET", key)
  if value ~= ARGV[1] and ARGV[3] then leave_handed_over(ARGV[1], queue, expiry, handovers) end
  if value == ARGV[1] then
    redis.call("DEL", key)
    deleted = deleted + 1
    if ARGV[2] ~= "" then
      local passed = false
      if ARGV[3] then passed = pass_on(ARGV[2], ARGV[1], key, queue, expiry, handovers) end
      if not passed and ARGV[4] ~= "1" then
        redis.call("PUBLISH", ARGV[2], release_message(ARGV[1], nil, nil, key))
      end
    end
  end
end
if deleted > 0 then return 1 end
return 0"#
    ))
});

/// `KEYS[1]` = key, `ARGV[1]` = owner, `ARGV[2]` = hold token, `ARGV[3]` = channel or "":
/// drops one hold; deletes the key when it was the last. Returns 1 when the hold was
/// there, 0 otherwise.
///
/// A key it deletes is passed on, when `ARGV[4]` is given ("1": `KEYS[2..4]` are the key's
/// queue, expiry and hand-overs) and the key's queue has a live waiter, as [`RELEASE`] does (a fair waiter of a plain lock is handed the
/// key, any other is told on its client's channel); otherwise the release is published on
/// the channel for every client (reentrant waiters that are not fair do not queue).
pub(crate) static REENTRANT_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(format!(
        r#"if ARGV[4] and redis.replicate_commands then redis.replicate_commands() end
{ANNOUNCE}
local owner = redis.pcall("HGET", KEYS[1], "owner")
if owner ~= ARGV[1] then return 0 end
if redis.call("HDEL", KEYS[1], "hold:" .. ARGV[2]) == 0 then return 0 end
if redis.call("HLEN", KEYS[1]) <= 1 then
  redis.call("DEL", KEYS[1])
  if ARGV[3] ~= "" then
    local passed = false
    if ARGV[4] then passed = pass_on(ARGV[3], ARGV[2], KEYS[1], KEYS[2], KEYS[3], KEYS[4]) end
    if not passed then redis.call("PUBLISH", ARGV[3], release_message(ARGV[2], nil, nil, KEYS[1])) end
  end
end
return 1"#
    ))
});

/// Releases of distinct plain locks of one key (fenced or not), coalesced into one call per
/// node: `KEYS` = the lock keys, then each one's queue, expiry and hand-overs (three per
/// key, in the keys' order); `ARGV[1]` = channel or "", then one token per key. Each
/// key that holds its token is deleted and, when its queue has a live waiter, passed on to
/// it as [`RELEASE`] does for a plain lock of one key; where a hand-over token does not
/// hold its key, its waiter leaves the key's queue, as there. Returns one 1 (deleted) or 0
/// (not held) per key, in order.
pub(crate) static RELEASE_BATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(format!(
        r#"if redis.replicate_commands then redis.replicate_commands() end
{ANNOUNCE}
local results = {{}}
local n = #KEYS / 4
for i = 1, n do
  local key, token = KEYS[i], ARGV[i + 1]
  local queue, expiry, handovers = KEYS[n + 3 * i - 2], KEYS[n + 3 * i - 1], KEYS[n + 3 * i]
  if redis.pcall("GET", key) == token then
    redis.call("DEL", key)
    if ARGV[1] ~= "" then
      pass_on(ARGV[1], token, key, queue, expiry, handovers)
    end
    results[i] = 1
  else
    leave_handed_over(token, queue, expiry, handovers)
    results[i] = 0
  end
end
return results"#
    ))
});

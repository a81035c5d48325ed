//! Releases: a kind's release of a lock's keys (one lock, or a batch), passing each freed
//! key on to the next live waiter of its queue, and the Lua helpers they share with a fair
//! waiter's leave.

use super::plain::arg_at;
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
/// id in the `handovers` hash, see [`queued`](super::queued)): `pass_on` then sets the key to
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

/// A kind's release (see the `kind` module): `KEYS` = the lock's keys, `ARGV[1]` = token,
/// `ARGV[2]` = channel or "", then the kind's argument when it has one (a reentrant lock's
/// owner). Drops the token's hold of every key (the kind's `free`), publishing
/// `"<token> <key>"` on the channel, when one is given, for each key that is free then (the
/// token lets subscribers of several nodes recognise one release). Returns 1 when a hold
/// was there, 0 otherwise. Without a channel, it is also the rollback of an acquisition
/// outside the fair queues: nobody held the lock, so nobody waits for its release.
///
/// With the queue flag after those (`ARGV[3]`, or `ARGV[4]` after an argument), each lock
/// key's queue, expiry and hand-overs follow the lock keys in `KEYS` (three per key, in the
/// keys' order; see [`crate::layout`]): when a freed key's queue has a live waiter (fair,
/// or queued only to be woken), the release passes the key on to it (see `pass_on` in
/// [`ANNOUNCE`]): a fair waiter is handed the key there and then, and either kind is told
/// on its client's channel alone. When the queue has none, the flag "1" publishes nothing
/// (every waiter of the kind queues, see `Kind::waiters_queue`), and "0" publishes on the
/// channel for every client. One flag, not two, since every argument is sent to every node
/// of every release. Tokens and waiter ids hold no white space, so every form of the
/// message parses. The release of a key handed over to a fair waiter (a token
/// `"<waiter>~<number>"`) that finds the key not its own takes that waiter out of the
/// key's queue (`leave_handed_over` in [`ANNOUNCE`]); where the key is its own, the
/// hand-over took it out already.
pub(crate) fn release(lua: &str, has_arg: bool) -> String {
    let (arg, flags) = (arg_at(has_arg, 3), if has_arg { 4 } else { 3 });
    format!(
        r#"local queued = ARGV[{flags}] ~= nil
local quiet = ARGV[{flags}] == "1"
if queued and redis.replicate_commands then redis.replicate_commands() end
{ANNOUNCE}
{lua}
local token, channel = ARGV[1], ARGV[2]
{arg}
local n = #KEYS
if queued then n = #KEYS / 4 end
local deleted = 0
for i = 1, n do
  local key = KEYS[i]
  local queue, expiry, handovers = KEYS[n + 3 * i - 2], KEYS[n + 3 * i - 1], KEYS[n + 3 * i]
  local removed, freed = free(key, token, arg)
  if removed then
    deleted = deleted + 1
  elseif queued then
    leave_handed_over(token, queue, expiry, handovers)
  end
  if freed and channel ~= "" then
    local passed = false
    if queued then passed = pass_on(channel, token, key, queue, expiry, handovers) end
    if not passed and not quiet then
      redis.call("PUBLISH", channel, release_message(token, nil, nil, key))
    end
  end
end
if deleted > 0 then return 1 end
return 0"#
    )
}

/// Releases of distinct locks of one key each, of a kind without an argument, coalesced
/// into one call per node (group commit): `KEYS` = the lock keys, then each one's queue,
/// expiry and hand-overs (three per key, in the keys' order); `ARGV[1]` = channel or "",
/// then one token per key. Each key that holds its token is freed and, when its queue has
/// a live waiter, passed on to it as [`release`] does; where a token does not hold its key
/// (a hand-over token whose key is not the waiter's), its waiter leaves the key's queue,
/// as there. Returns one 1 (freed) or 0 (not held) per key, in order.
pub(crate) fn grouped_release(lua: &str) -> String {
    format!(
        r#"if redis.replicate_commands then redis.replicate_commands() end
{ANNOUNCE}
{lua}
local results = {{}}
local n = #KEYS / 4
for i = 1, n do
  local key, token = KEYS[i], ARGV[i + 1]
  local queue, expiry, handovers = KEYS[n + 3 * i - 2], KEYS[n + 3 * i - 1], KEYS[n + 3 * i]
  local removed, freed = free(key, token, nil)
  if removed then
    if freed and ARGV[1] ~= "" then
      pass_on(ARGV[1], token, key, queue, expiry, handovers)
    end
    results[i] = 1
  else
    leave_handed_over(token, queue, expiry, handovers)
    results[i] = 0
  end
end
return results"#
    )
}

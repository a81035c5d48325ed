//! The Lua scripts. Every script that deletes or extends checks that the key still holds our
//! token first, so a holder whose lock expired can never delete or extend a newer holder's
//! key (guarantee G3). Reads that might meet a key of the other kind (a reentrant hash where
//! a string is expected, or the reverse) go through `redis.pcall`, so they count as "not
//! ours" instead of failing the whole script.

use std::borrow::Cow;
use std::sync::LazyLock;

use fred::bytes_utils::Str;
use fred::types::Value;

use crate::message::message_lua;

/// A Lua script with its SHA-1, computed once.
#[derive(Debug)]
pub struct Script {
    source: Cow<'static, str>,
    /// Shared by every call's arguments: no copy per command.
    sha: Str,
}

impl Script {
    /// A script from its source.
    pub fn new(source: impl Into<Cow<'static, str>>) -> Self {
        let source = source.into();
        let sha = Str::from(fred::util::sha1_hash(&source));
        Script { source, sha }
    }

    /// The Lua source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The SHA-1 that `EVALSHA` names it by.
    #[cfg(test)]
    pub fn sha(&self) -> &str {
        &self.sha
    }

    /// The SHA-1 that `EVALSHA` names it by, as the command's argument.
    pub(crate) fn sha_arg(&self) -> Value {
        Value::String(self.sha.clone())
    }
}

/// The release channel as the scripts take it: the channel, or "" for none.
pub(crate) fn channel_arg(channel: Option<&Value>) -> Value {
    channel.map_or(Value::String(Str::from_static("")), Value::clone)
}

/// `KEYS` = the lock's keys, `ARGV[1]` = token, `ARGV[2]` = TTL in ms: set every key, or none
/// if any exists (all-or-nothing on this node). Returns 1 when set, 0 otherwise.
pub(crate) static ACQUIRE_MANY: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_MANY_BODY));

const ACQUIRE_MANY_BODY: &str = r#"for _, key in ipairs(KEYS) do
  if redis.call("EXISTS", key) == 1 then return 0 end
end
for _, key in ipairs(KEYS) do
  redis.call("SET", key, ARGV[1], "PX", ARGV[2])
end
return 1"#;

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

/// Lua: `node_time_ms()`, the node's clock (`TIME`) in whole milliseconds: the one clock
/// the fair queues' expiries are read by. A macro, so that [`ANNOUNCE`] can include it in
/// its literal; [`NODE_TIME_MS`] for the scripts built with `format!`.
macro_rules! node_time_ms {
    () => {
        r#"local function node_time_ms()
  local time = redis.call("TIME")
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
"#
    };
}

/// See [`node_time_ms!`].
const NODE_TIME_MS: &str = node_time_ms!();

/// The release message's Lua (see [`crate::message`]), for scripts that do not include
/// [`ANNOUNCE`].
const MESSAGE: &str = message_lua!();

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
/// id in the `handovers` hash, see [`FAIR_ACQUIRE`]): `pass_on` then sets the key to
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
const ANNOUNCE: &str = concat!(
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

static REENTRANT_ACQUIRE_BODY: LazyLock<String> = LazyLock::new(|| {
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
const REENTRANT_STEPS: &str = r#"local function held()
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

/// `SET KEYS[1] ARGV[1] NX PX ARGV[2]` as a script body, for the fenced acquisition of one
/// key (a plain one sends the command itself).
const ACQUIRE_ONE_BODY: &str = r#"if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then return 1 end
return 0"#;

/// Lua: `in_range(counter)`, a counter read from a node as the scripts answer it: as is
/// from 0 to 2^62, else (set by hand: negative, 2^63 or more, not a number) 2^62, which the
/// client counts as out of range like anything above 2^53 (see `fence::usable`). Redis
/// would turn a reply of 2^63 or more (`"1e19"`, `"inf"`) into a negative integer, which
/// reads as "no counter".
const IN_RANGE: &str = r#"local function in_range(counter)
  if counter ~= counter or counter < 0 or counter > 4611686018427387904 then return 4611686018427387904 end
  return counter
end"#;

/// A fenced acquisition: `body` (an acquisition script answering 1 or 0) with the node's
/// fencing counter read in the same call, so fencing costs the acquisition no round trip.
/// The counter's key comes last in `KEYS` and is taken off before `body` runs. Returns
/// `{done, counter}` (`done` 0 also for a fair waiter that is not the head), `counter`
/// being -1 when the node has no counter (never fenced, or it lost its data): such a node
/// is not counted, and no acquisition's write-back gives it one (see [`FENCE_RECORD`]).
fn fenced(body: &str) -> Script {
    Script::new(format!(
        r#"{IN_RANGE}
local fence_key = table.remove(KEYS)
local function acquire()
{body}
end
local done = acquire()
if type(done) == "table" then done = 0 end
local counter = redis.pcall("GET", fence_key)
if type(counter) ~= "string" or not tonumber(counter) then return {{done, -1}} end
return {{done, in_range(tonumber(counter))}}"#
    ))
}

pub(crate) static FENCED_ACQUIRE_ONE: LazyLock<Script> = LazyLock::new(|| fenced(ACQUIRE_ONE_BODY));
pub(crate) static FENCED_ACQUIRE_MANY: LazyLock<Script> =
    LazyLock::new(|| fenced(ACQUIRE_MANY_BODY));
pub(crate) static FENCED_REENTRANT_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| fenced(&REENTRANT_ACQUIRE_BODY));

/// Lua: `server_run_id()`, the `run_id` of the server the script runs on (it changes
/// with every start of the server process), and `intact_counter(counter_key, stamp_key,
/// run, check)`: the node's fencing counter when it belongs to this run of the server,
/// else `nil` and why (-1: no counter; -2: a counter stamped by another run, which the
/// server brought back from older data: an RDB snapshot, an append-only file that lost its
/// tail, a promoted replica), with that stale value. A counter without a stamp (written
/// before stamps existed, or set by hand) is adopted by this run. `check` "0" skips the
/// stamp's comparison (a test's switch, see `fence::Safeguard::Incarnation`).
const INCARNATION: &str = r#"local function server_run_id()
  return string.match(redis.call("INFO", "server"), "run_id:(%x+)") or "?"
end
local function intact_counter(counter_key, stamp_key, run, check)
  local found = redis.pcall("GET", counter_key)
  if type(found) ~= "string" or not tonumber(found) then return nil, -1, -1 end
  local value = in_range(tonumber(found))
  local stamp = redis.pcall("GET", stamp_key)
  if type(stamp) ~= "string" then
    redis.call("SET", stamp_key, run)
  elseif stamp ~= run and check ~= "0" then
    return nil, -2, value
  end
  return value, 0, value
end"#;

/// The write-back of a fencing token: `KEYS` = the node's fencing counter and its stamp,
/// `ARGV[1]` = the token, `ARGV[2]` = "1" to seed a node without a counter (an operator's
/// raise, or a new node set's first token: every node answered without one), `ARGV[3]` =
/// "0" to skip the stamp's check (tests only). Raise-only: the counter is set (and stamped
/// with this run of the server) only when it is lower, or missing with `ARGV[2]` "1"; a
/// late write-back never lowers it. Returns `{1, token}` when it set the counter,
/// `{0, counter}` when the counter was already at or above the token (another fenced
/// acquisition recorded that token, or a higher one, here, so it is not this one's),
/// `{0, -1}` when the node has no counter and `{0, -2}` when its counter is from another
/// run of the server (see [`INCARNATION`]): this write-back may not give it one. A counter
/// goes through each value at most once, so no two write-backs of one token both reach a
/// quorum: no two acquisitions get the same token.
///
/// Why an acquisition's write-back never seeds a node that lost its counter (REDLOCK.md:
/// "never writing to a node without it"): the node may have held a token whose write-back
/// had not yet reached the rest of its quorum when the acquisition read the counters, so
/// that the acquisition computed that same token (or a lower one). Seeded and counted, the
/// node made a second quorum for it; seeded and not counted, it hid its loss from a later
/// read that needs it. Only a repair gives it a counter again (`fence::repair`).
pub(crate) static FENCE_RECORD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(format!(
        r#"{IN_RANGE}
{INCARNATION}
local run = server_run_id()
local counter, missing = intact_counter(KEYS[1], KEYS[2], run, ARGV[3])
local token = tonumber(ARGV[1])
if counter then
  if counter >= token then return {{0, counter}} end
  redis.call("SET", KEYS[1], ARGV[1])
  return {{1, token}}
elseif ARGV[2] ~= "1" then
  return {{0, missing}}
end
redis.call("SET", KEYS[1], ARGV[1])
redis.call("SET", KEYS[2], run)
return {{1, token}}"#
    ))
});

/// Reads a node's fencing state: `KEYS` = the counter, its stamp and its repair marker.
/// Returns `{1, {counter, stale, repair}}`: `counter` as [`FENCE_RECORD`] reads it (-1:
/// none, -2: from another run of the server), `stale` the value of such a stale counter
/// (else -1), `repair` the milliseconds left on a repair's marker (else -1).
pub(crate) static FENCE_READ: LazyLock<Script> = LazyLock::new(|| {
    Script::new(format!(
        r#"{IN_RANGE}
{INCARNATION}
local counter, missing, value = intact_counter(KEYS[1], KEYS[2], server_run_id(), "1")
local stale = -1
if missing == -2 then stale = value end
return {{1, {{counter or missing, stale, redis.call("PTTL", KEYS[3])}}}}"#
    ))
});

/// A repair's first step on the node that lost its counter: `KEYS` = the counter, its
/// stamp and the repair marker, `ARGV[1]` = the repairer's id, `ARGV[2]` = the marker's
/// lease in milliseconds. Returns `{0, counter}` when the node has its counter for this
/// run of the server (nothing to repair), `{0, -3 - pttl}` when another repairer's marker
/// of this run holds (`pttl` ms left), and `{1, 1}` once this repairer's marker, which
/// names it and this run of the server, is set (taking over one left by an earlier run).
pub(crate) static FENCE_MARK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(format!(
        r#"{IN_RANGE}
{INCARNATION}
local run = server_run_id()
local counter = intact_counter(KEYS[1], KEYS[2], run, "1")
if counter then return {{0, counter}} end
local mark = ARGV[1] .. "|" .. run
local held = redis.pcall("GET", KEYS[3])
if type(held) == "string" and held ~= mark and string.sub(held, -#run - 1) == "|" .. run then
  return {{0, -3 - math.max(redis.call("PTTL", KEYS[3]), 0)}}
end
redis.call("SET", KEYS[3], mark, "PX", ARGV[2])
return {{1, 1}}"#
    ))
});

/// A repair's last step: `KEYS` = the counter, its stamp and the repair marker, `ARGV[1]`
/// = the repairer's id, `ARGV[2]` = the value, `ARGV[3]` = "0" to skip the marker's check
/// (tests only). Sets the counter to the higher of the value and what it holds, stamps it
/// with this run of the server and removes the marker, only while the marker is this
/// repairer's of this run: a node that lost its data again since the marker was set (or
/// restarted, even from a snapshot that holds the marker) refuses. Returns `{1, counter}`
/// when seeded, `{0, 0}` when refused.
pub(crate) static FENCE_SEED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(format!(
        r#"{IN_RANGE}
local run = string.match(redis.call("INFO", "server"), "run_id:(%x+)") or "?"
if ARGV[3] ~= "0" and redis.pcall("GET", KEYS[3]) ~= ARGV[1] .. "|" .. run then
  return {{0, 0}}
end
local value = tonumber(ARGV[2])
local found = redis.pcall("GET", KEYS[1])
if type(found) == "string" and tonumber(found) then value = math.max(value, in_range(tonumber(found))) end
redis.call("SET", KEYS[1], string.format("%d", value))
redis.call("SET", KEYS[2], run)
redis.call("DEL", KEYS[3])
return {{1, value}}"#
    ))
});

/// Reads a key's holder and TTL in one call, read-only: `KEYS[1]` = key. Returns 0 when the
/// key is absent, otherwise `{1, {pttl, kind, ...}}` with `pttl` -1 for no expiry and
/// `kind` one of: `"s"` and the value (a plain lock: its token), `"r"`, the owner and the
/// tokens of its holds (a reentrant lock's hash), `"o"` (any other value, not a lock of
/// this library). One script rather than GET and PTTL so that the holder and the TTL are
/// read at one instant, and so that a reentrant hash is read as a hash.
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"local kind = redis.call("TYPE", KEYS[1]).ok
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
return {1, {ttl, "o"}}"#,
    )
});

/// The fair acquisition: a waiter queue per key on every node gates who may try.
///
/// `KEYS` = the lock's `n` keys, then for each of them its queue (sorted set: waiter ->
/// ticket), the queue's expiry (sorted set: waiter -> node time in ms after which the entry
/// is dropped) and its hand-overs (hash: waiter -> `"<number> <ttl ms>"`), so `4n` keys.
/// `ARGV[1]` = token, `ARGV[2]` = TTL in ms, `ARGV[3]` = waiter, `ARGV[4]` = ticket,
/// `ARGV[5]` = patience in ms, `ARGV[6]` = "1" for a gated (fair) attempt, "0" for a waiter
/// that only queues to be woken, `ARGV[7]` = the attempt's hand-over number or "" (a plain
/// lock of one key's only), and for a reentrant lock ([`FAIR_REENTRANT_ACQUIRE`])
/// `ARGV[8]` = its owner.
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
pub(crate) static FAIR_ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(fair(PLAIN_STEPS)));
/// [`FAIR_ACQUIRE`] for a reentrant lock (the steps of [`REENTRANT_ACQUIRE`]).
pub(crate) static FAIR_REENTRANT_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(fair(FAIR_REENTRANT_STEPS.as_str())));
/// [`FAIR_ACQUIRE`] for a lock over several keys: all of them or none (as [`ACQUIRE_MANY`]).
pub(crate) static FAIR_ACQUIRE_MANY: LazyLock<Script> =
    LazyLock::new(|| Script::new(fair(MANY_STEPS)));
/// [`FAIR_ACQUIRE`], fenced: the node's fencing counter is read in the same call.
pub(crate) static FENCED_FAIR_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| fenced(&fair(PLAIN_STEPS)));
/// [`FAIR_REENTRANT_ACQUIRE`], fenced.
pub(crate) static FENCED_FAIR_REENTRANT_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| fenced(&fair(FAIR_REENTRANT_STEPS.as_str())));
/// [`FAIR_ACQUIRE_MANY`], fenced.
pub(crate) static FENCED_FAIR_ACQUIRE_MANY: LazyLock<Script> =
    LazyLock::new(|| fenced(&fair(MANY_STEPS)));

/// A plain lock's steps in a fair acquisition: `held()` takes on a key handed over to the
/// waiter, `take()` is `SET NX`.
const PLAIN_STEPS: &str = r#"local function held()
  local value = redis.pcall("GET", KEYS[1])
  if not handed_to(value, ARGV[3]) then return false end
  redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
  return true
end
local function take()
  if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then return true end
  return false
end"#;

/// A lock over several keys' steps in a fair acquisition: nothing is held without a turn,
/// and `take()` sets every key or none.
const MANY_STEPS: &str = r#"local function held() return false end
local function take()
  for i = 1, n do
    if redis.call("EXISTS", KEYS[i]) == 1 then return false end
  end
  for i = 1, n do redis.call("SET", KEYS[i], ARGV[1], "PX", ARGV[2]) end
  return true
end"#;

static FAIR_REENTRANT_STEPS: LazyLock<String> = LazyLock::new(|| {
    format!("local owner, token, ttl = ARGV[8], ARGV[1], ARGV[2]\n{REENTRANT_STEPS}")
});

/// `drop_expired(queue, expiry, handovers, now)`: takes the waiters whose entries expired by
/// `now` (node time in ms) out of a key's queue and hand-overs.
const DROP_EXPIRED: &str = r#"local function drop_expired(waiters, expiry, handovers, now)
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
const QUEUES: &str = r#"local n = #KEYS / 4
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

/// The body of a fair acquisition whose `steps` define `held()` (the waiter holds the key
/// already: no turn needed) and `take()` (take the free keys), each returning whether it
/// did, over the lock's `n` keys (see [`FAIR_ACQUIRE`]).
fn fair(steps: &str) -> String {
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
{steps}
if held() then
  leave()
  return 1
end
local queued = false
for i = 1, n do
  if redis.call("EXISTS", (queue(i))) == 1 then queued = true end
end
-- Nobody queues for any of the keys: no turn to wait for, so a free lock is taken
-- without entering (and leaving) the queues.
if not queued and take() then return 1 end
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
  elseif queued and take() then
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

/// The rollback of a queued acquisition ([`FAIR_ACQUIRE`] and its forms) that was not won:
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
/// [`FAIR_ACQUIRE`]'s), `ARGV[1]` = the round's token, `ARGV[2]` = waiter (or "" to restore
/// nothing: the round was abandoned, and its waiter's leave may come first), `ARGV[3]` =
/// ticket, `ARGV[4]` = patience in ms, `ARGV[5]` = the hand-over registration
/// (`"<number> <ttl ms>"`) or "", `ARGV[6]` = the release channel or "". Returns 1 when it
/// deleted something, 0 otherwise.
///
/// An abandoned round's rollback that frees a key passes it on to the queue's next live
/// waiter, as a release would (`pass_on`, see [`ANNOUNCE`], with the round's token as the
/// message's token): the round's script took its waiter out of the queue, and the waiter's
/// leave, sent when its call was dropped, may have reached the node before this rollback,
/// found the key held and passed nothing on; nobody else would tell the next waiter.
pub(crate) static FAIR_ROLLBACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(fair_rollback(
        r#"local function undo()
  local freed = false
  for i = 1, n do
    if redis.pcall("GET", KEYS[i]) == ARGV[1] then
      redis.call("DEL", KEYS[i])
      freed = true
    end
  end
  if freed then return 1, true end
  return 0, false
end"#,
    ))
});

/// [`FAIR_ROLLBACK`] for a reentrant lock: drops the round's hold (`ARGV[7]` = the owner),
/// and restores the waiter's place only where that was the key's last hold.
pub(crate) static FAIR_REENTRANT_ROLLBACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(fair_rollback(
        r#"local function undo()
  if redis.pcall("HGET", KEYS[1], "owner") ~= ARGV[7] then return 0, false end
  if redis.call("HDEL", KEYS[1], "hold:" .. ARGV[1]) == 0 then return 0, false end
  if redis.call("HLEN", KEYS[1]) <= 1 then
    redis.call("DEL", KEYS[1])
    return 1, true
  end
  return 1, false
end"#,
    ))
});

/// The body of a queued acquisition's rollback whose `undo` step returns what the script
/// returns and whether it freed the keys (see [`FAIR_ROLLBACK`]).
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

/// Every script, for preloading.
pub(crate) fn all() -> [&'static Script; 24] {
    [
        &ACQUIRE_MANY,
        &ACQUIRE_BATCH,
        &RELEASE_BATCH,
        &RELEASE,
        &REENTRANT_ACQUIRE,
        &REENTRANT_RELEASE,
        &EXTEND_BATCH,
        &FENCED_ACQUIRE_ONE,
        &FENCED_ACQUIRE_MANY,
        &FENCED_REENTRANT_ACQUIRE,
        &FENCE_RECORD,
        &FENCE_READ,
        &FENCE_MARK,
        &FENCE_SEED,
        &INSPECT,
        &FAIR_ACQUIRE,
        &FAIR_REENTRANT_ACQUIRE,
        &FAIR_ACQUIRE_MANY,
        &FENCED_FAIR_ACQUIRE,
        &FENCED_FAIR_REENTRANT_ACQUIRE,
        &FENCED_FAIR_ACQUIRE_MANY,
        &FAIR_LEAVE,
        &FAIR_ROLLBACK,
        &FAIR_REENTRANT_ROLLBACK,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha_matches_the_source() {
        // SHA-1 of the empty string, as Redis would compute it for SCRIPT LOAD "".
        assert_eq!(
            Script::new("").sha(),
            "da39a3ee5e6b4b0d3255bfef95601890afd80709"
        );
        let all = all();
        for (i, a) in all.iter().enumerate() {
            assert_eq!(a.sha().len(), 40);
            for b in &all[i + 1..] {
                assert_ne!(a.sha(), b.sha());
            }
        }
    }
}

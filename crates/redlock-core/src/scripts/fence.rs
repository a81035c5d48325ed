//! Fencing: the fenced form of an acquisition, and the reads and writes of a node's
//! fencing counter (see `crate::fence`).

use std::sync::LazyLock;

use fred::types::Value;

use super::Script;

/// Lua: `in_range(counter)`, a counter read from a node as the scripts answer it: as is
/// from 0 to 2^62, else (set by hand: negative, 2^63 or more, not a number) 2^62, which the
/// client counts as out of range like anything above 2^53 (see `fence::usable`). Redis
/// would turn a reply of 2^63 or more (`"1e19"`, `"inf"`) into a negative integer, which
/// reads as "no counter".
pub(super) const IN_RANGE: &str = r#"local function in_range(counter)
  if counter ~= counter or counter < 0 or counter > 4611686018427387904 then return 4611686018427387904 end
  return counter
end"#;

/// A fenced acquisition: `body` (an acquisition script answering 1 or 0) with the node's
/// fencing counter read in the same call, so fencing costs the acquisition no round trip.
/// The counter's key comes last in `KEYS` and is taken off before `body` runs. Returns
/// `{done, counter}` (`done` 0 also for a fair waiter that is not the head), `counter`
/// being -1 when the node has no counter (never fenced, or it lost its data): such a node
/// is not counted, and no acquisition's write-back gives it one (see [`FENCE_RECORD`]).
pub(crate) fn fenced(body: &str) -> Script {
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
    .with_unfenced(Unfenced {
        script: Script::new(body.to_string()),
        reply: FencedReply::Lock,
    })
}

/// A fenced acquisition taken apart, for a cluster member: there the fencing counter is
/// in another hash slot than the lock's keys, most often on another master, and one
/// script may only touch keys of one slot. So the acquisition runs alone (`script`, the
/// fenced script's body), a `GET` of the counter goes in the same flight, and the two
/// answers make the fenced script's ([`FencedReply::compose`]).
///
/// Why reading the counter apart keeps tokens increasing (see `crate::fence`): what the
/// argument needs of the read is only that it happens after the acquisition began, so
/// after every token handed out before it was recorded by its write-back quorum; a `GET`
/// sent with the acquisition does. That the read rides in the acquisition's own script on
/// a single server saves a command, nothing more.
#[derive(Debug)]
pub(crate) struct Unfenced {
    /// The acquisition alone: what the fenced script runs before it reads the counter.
    pub(crate) script: Script,
    /// How its answer reads.
    pub(crate) reply: FencedReply,
}

/// How a fenced acquisition answers, so that its parts' answers can be put together as
/// it would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FencedReply {
    /// `{done, counter}` ([`fenced`]): the acquisition answers 1 or 0, or a table (a fair
    /// waiter that is not the head), which reads as 0.
    Lock,
    /// `{{taken, counter}, ...}`, one per permit (`scripts::PERMIT_TAKE_FENCED`): the
    /// acquisition answers `taken`, a flag per permit.
    Permits,
}

impl FencedReply {
    /// The fenced script's answer from the acquisition's `reply` and the counter's `GET`
    /// answer, read as the script reads it ([`counter_of`]); `None` for a reply of another
    /// shape.
    pub(crate) fn compose(self, reply: Value, counter: &Value) -> Option<Value> {
        let counter = Value::Integer(counter_of(counter));
        match (self, reply) {
            (FencedReply::Lock, Value::Integer(done)) => {
                Some(Value::Array(vec![Value::Integer(done), counter]))
            }
            (FencedReply::Lock, Value::Array(_)) => {
                Some(Value::Array(vec![Value::Integer(0), counter]))
            }
            (FencedReply::Permits, Value::Array(taken)) => Some(Value::Array(
                taken
                    .into_iter()
                    .map(|flag| Value::Array(vec![flag, counter.clone()]))
                    .collect(),
            )),
            _ => None,
        }
    }
}

/// A counter as the fenced scripts read it (`tonumber`, then `in_range`): -1 when there
/// is none or it is not a number, 2^62 when it is out of range. (Lua also reads hex,
/// `0x10`, which no write-back writes: read here as no counter, which is not counted.)
fn counter_of(reply: &Value) -> i64 {
    const OUT_OF_RANGE: i64 = 1 << 62;
    let text = match reply {
        Value::String(text) => text.to_string(),
        Value::Bytes(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::Integer(n) => n.to_string(),
        _ => return -1,
    };
    match text.trim().parse::<f64>() {
        Err(_) => -1,
        Ok(n) if n.is_nan() || n < 0.0 || n > OUT_OF_RANGE as f64 => OUT_OF_RANGE,
        // A whole number in range: exact below 2^53, as in Lua.
        Ok(n) => n as i64,
    }
}

/// Lua: `server_run_id()`, the `run_id` of the server the script runs on (it changes
/// with every start of the server process), and `intact_counter(counter_key, stamp_key,
/// run, check)`: the node's fencing counter when it belongs to this run of the server,
/// else `nil` and why (-1: no counter; -2: a counter stamped by another run, which the
/// server brought back from older data: an RDB snapshot, an append-only file that lost its
/// tail, a promoted replica), with that stale value. A counter without a stamp (written
/// before stamps existed, or set by hand) is adopted by this run. `check` "0" skips the
/// stamp's comparison (a test's switch, see `fence::Safeguard::Incarnation`).
pub(super) const INCARNATION: &str = r#"local function server_run_id()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The parts' answers make what the fenced scripts answer (see their Lua).
    #[test]
    fn a_fenced_acquisition_taken_apart_answers_as_the_whole() {
        let counter = Value::String("41".into());
        let pair =
            |done, counter| Value::Array(vec![Value::Integer(done), Value::Integer(counter)]);
        assert_eq!(
            FencedReply::Lock.compose(Value::Integer(1), &counter),
            Some(pair(1, 41))
        );
        // A fair waiter that is not the head answers a table: not done.
        let waiting = Value::Array(vec![Value::Integer(0), Value::Integer(3)]);
        assert_eq!(
            FencedReply::Lock.compose(waiting, &counter),
            Some(pair(0, 41))
        );
        assert_eq!(
            FencedReply::Lock.compose(Value::Integer(0), &Value::Null),
            Some(pair(0, -1))
        );
        let taken = Value::Array(vec![Value::Integer(1), Value::Integer(0)]);
        assert_eq!(
            FencedReply::Permits.compose(taken, &counter),
            Some(Value::Array(vec![pair(1, 41), pair(0, 41)]))
        );
        assert_eq!(
            FencedReply::Permits.compose(Value::Integer(1), &counter),
            None
        );
    }

    #[test]
    fn a_counter_reads_as_the_scripts_read_it() {
        let read = |text: &str| counter_of(&Value::String(text.into()));
        assert_eq!(read("7"), 7);
        assert_eq!(read(" 7 "), 7);
        assert_eq!(read("7.0"), 7);
        assert_eq!(read("seven"), -1);
        assert_eq!(counter_of(&Value::Null), -1);
        for out_of_range in ["-1", "1e19", "inf", "nan"] {
            assert_eq!(read(out_of_range), 1 << 62, "{out_of_range}");
        }
    }
}

//! A kind's acquisition (see the `kind` module for the Lua it is composed from), the
//! batches of group commit (acquisitions of many locks of one key each in one call per
//! node), and the extension of many locks of any kind in one call.
//!
//! None of these calls a kind's `held` with a waiter (only the fair queue's scripts do),
//! so they leave out the release message's helpers (`handed_to` and the rest, see
//! [`crate::message`]) that `held` may call for one: every call of a script defines its
//! functions again, and group commit's batches run under load.

/// How a script composed for a kind binds the kind's argument: `ARGV[at]` for a kind that
/// has one, nil otherwise.
pub(super) fn arg_at(has_arg: bool, at: usize) -> String {
    if has_arg {
        format!("local arg = ARGV[{at}]")
    } else {
        "local arg = nil".to_string()
    }
}

/// A kind's acquisition: `KEYS` = the lock's keys, `ARGV[1]` = token, `ARGV[2]` = TTL in
/// ms, `ARGV[3]` = the kind's argument (a reentrant lock's owner) when it has one. Renews a
/// hold the caller has already (`held`) or takes the free keys (`take`), all or none.
/// Returns 1 when it did, 0 otherwise.
pub(crate) fn acquire(lua: &str, has_arg: bool) -> String {
    let arg = arg_at(has_arg, 3);
    format!(
        r#"{lua}
local token, ttl = ARGV[1], ARGV[2]
{arg}
if held(1, #KEYS, token, ttl, nil, arg) or take(1, #KEYS, token, ttl, arg) then return 1 end
return 0"#
    )
}

/// Acquisitions of distinct locks of one key each, of a kind without an argument,
/// coalesced into one call per node (group commit, see `group`): `KEYS[i]` taken with
/// token `ARGV[2i-1]` and TTL `ARGV[2i]` ms, each on its own (not all or nothing). Returns
/// one 1 (taken) or 0 (held) per key, in order.
pub(crate) fn grouped_acquire(lua: &str) -> String {
    format!(
        r#"{lua}
local results = {{}}
for i = 1, #KEYS do
  if take(i, i, ARGV[2 * i - 1], ARGV[2 * i], nil) then
    results[i] = 1
  else
    results[i] = 0
  end
end
return results"#
    )
}

/// Extends locks of any of `kinds` (each a tag, its Lua, and whether that Lua has a
/// `lengthen` of its own) in one call. `ARGV[1]` is
/// ignored (reserved); then five arguments per lock: its kind's tag, its number of keys,
/// token, the kind's argument (or ""), TTL in ms. `KEYS` holds each lock's keys in the
/// same order. A lock is extended (all its keys) only if its token holds every one of them
/// (the kind's `holds`); `PEXPIRE` never recreates a missing key. Returns one 1 or 0 per
/// lock.
///
/// An extension only ever lengthens: a key whose TTL is already at least the one asked for
/// keeps it (the rule of `PEXPIRE ... GT`, written out so that servers older than Redis 7
/// apply it too). So no extension, whether it won, lost its quorum, or arrived late, can
/// move a node's expiry before a validity that a guard reports: not another holder's of a
/// shared reentrant hold, not a longer manual extension's that renewal follows, and not
/// the validity a failed extension leaves in place. A kind whose key's expiry is not the
/// whole story (a reader's entry in a read-write lock's set, which expires by its own
/// score) brings its own `lengthen(key, token, ttl, arg)`, under the same rule.
pub(crate) fn extend_batch(kinds: &[(&str, &str, bool)]) -> String {
    let mut script = String::from(
        r#"local function pexpire_longer(key, token, ttl, arg)
  if redis.call("PTTL", key) < tonumber(ttl) then redis.call("PEXPIRE", key, ttl) end
end
local kinds = {}
"#,
    );
    for (tag, lua, own_lengthen) in kinds {
        let lengthen = if *own_lengthen {
            "lengthen"
        } else {
            "pexpire_longer"
        };
        script.push_str(&format!(
            "do\n{lua}\nkinds[\"{tag}\"] = {{holds, {lengthen}}}\nend\n"
        ));
    }
    script.push_str(
        r#"local results = {}
local k = 1
local a = 2
while a + 4 <= #ARGV do
  local kind, n, token, arg, ttl = kinds[ARGV[a]], tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  a = a + 5
  local ok = 1
  for i = k, k + n - 1 do
    if not kind[1](KEYS[i], token, arg) then ok = 0 end
  end
  if ok == 1 then
    for i = k, k + n - 1 do kind[2](KEYS[i], token, ttl, arg) end
  end
  k = k + n
  results[#results + 1] = ok
end
return results"#,
    );
    script
}

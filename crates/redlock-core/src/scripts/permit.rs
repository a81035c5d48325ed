//! The semaphore's acquisition (see `crate::acquire::permit`).

use std::sync::LazyLock;

use super::fence::IN_RANGE;
use super::Script;

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

/// The acquisition: answers `taken`.
pub(crate) static PERMIT_TAKE: LazyLock<Script> =
    LazyLock::new(|| Script::new(format!("{TAKE}\nreturn taken")));

/// The fenced acquisition: the node's fencing counter is read in the same call, as a
/// lock's fenced acquisition reads it (see `fence::fenced`); its key comes last in `KEYS`
/// and is taken off first. Answers `{flag, counter}` per permit, the counter -1 when the
/// node has none.
pub(crate) static PERMIT_TAKE_FENCED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(format!(
        r#"{IN_RANGE}
local fence_key = table.remove(KEYS)
{TAKE}
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
});

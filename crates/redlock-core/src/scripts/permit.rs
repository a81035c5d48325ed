//! The semaphore's acquisition (see `crate::semaphore`).

use std::sync::LazyLock;

use super::Script;

/// Takes the first free permit of those proposed. `KEYS`: the permits' keys in the order
/// the caller proposes; `ARGV`: the token and the TTL in milliseconds. Answers one flag per
/// key, in `KEYS`' order: 1 for the permit taken (at most one), 0 for every other. A node
/// where every proposed permit is held takes none.
pub(crate) static PERMIT_TAKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"local taken = {}
local free = true
for i = 1, #KEYS do
  if free and redis.call("SET", KEYS[i], ARGV[1], "NX", "PX", ARGV[2]) then
    taken[i] = 1
    free = false
  else
    taken[i] = 0
  end
end
return taken"#,
    )
});

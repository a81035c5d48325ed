//! Where the library keeps what it stores on a node, besides the lock keys themselves:
//! every key name built from a lock key lives here.
//!
//! A lock key `k` that waiters queue for has three companions: its queue (a sorted set of
//! waiters by ticket), the queue's expiry (waiters by the node time their entry ends) and
//! the waiters' registered hand-overs (a hash). Each is `<fair prefix><kind>:` followed by
//! the lock key inside a hash tag, `{k}`, so that it lives in the lock key's hash slot on a
//! Redis Cluster: a script that touches the key and its companions names keys of one slot.
//! A lock key that already has a hash tag (`app:{tenant}:job`) keeps it, unwrapped: the
//! companion's first tag is then the key's own. The fair prefix holds no braces (checked
//! with the configuration), so it never brings a tag of its own. (A key with a `}` but no
//! tag, such as `a{}b}`, hashes whole, and no companion that wraps it can: its companions
//! land in another slot, which matters only on a cluster.)
//!
//! Every key a script touches is passed to it in `KEYS`; no script builds a key name.
//!
//! A reentrant lock's key is a hash: field [`REENTRANT_OWNER_FIELD`] names the owner, and
//! each hold adds a field named by [`hold_field`], [`REENTRANT_HOLD_PREFIX`] followed by the
//! hold's token. Code that reads a reentrant lock straight off a node names its fields from
//! here.

use fred::types::Key;

/// The field of a reentrant lock's hash that names its owner.
pub const REENTRANT_OWNER_FIELD: &str = "owner";

/// The prefix of a reentrant lock's hold fields: each hold is a field
/// `<prefix><hold token>` (see [`hold_field`]), one per hold, whatever its value.
pub const REENTRANT_HOLD_PREFIX: &str = "hold:";

/// The field of a reentrant lock's hash that records the hold `token`.
pub fn hold_field(token: &str) -> String {
    format!("{REENTRANT_HOLD_PREFIX}{token}")
}

/// The hash tag of `key` by Redis Cluster's rule: what lies between the first `{` and the
/// first `}` after it, when that is not empty. The slot of a key with a tag is the tag's.
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let rest = &key[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
}

/// `items` grouped by the hash slot of each one's key (`key`), each group in `items`'
/// order, the groups in the order of their first item: how a lock over keys of several
/// slots is split on a cluster member, which runs a script on keys of one slot only.
pub(crate) fn by_slot<T: Clone>(items: &[T], key: impl Fn(&T) -> &[u8]) -> Vec<Vec<T>> {
    let mut groups: Vec<(u16, Vec<T>)> = Vec::new();
    for item in items {
        let slot = fred::util::redis_keyslot(key(item));
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(item.clone()),
            None => groups.push((slot, vec![item.clone()])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

/// `keys` laid out as `LockSpec::queued_keys` lays them out (a lock's `n` keys, then
/// each one's three queue keys, in its slot), split as `LockSpec::slot_shares` splits the
/// lock: for each share, its keys then their queue keys, in the same layout. Keys of one
/// slot (a lock of one key, a semaphore's or read-write lock's, whose layouts differ but
/// whose keys share a tag) stay one list, as they are.
pub(crate) fn queued_by_slot(keys: &[Key]) -> Vec<Vec<Key>> {
    let n = keys.len() / 4;
    let shares = if n > 1 && keys.len() == 4 * n {
        let indexed: Vec<(usize, &Key)> = keys[..n].iter().enumerate().collect();
        by_slot(&indexed, |(_, key)| key.as_bytes())
    } else {
        Vec::new()
    };
    if shares.len() < 2 {
        return vec![keys.to_vec()];
    }
    let share_keys = |share: Vec<(usize, &Key)>| {
        let mut out = Vec::with_capacity(4 * share.len());
        out.extend(share.iter().map(|(_, key)| (*key).clone()));
        for (i, _) in share {
            out.extend_from_slice(&keys[n + 3 * i..n + 3 * i + 3]);
        }
        out
    };
    shares.into_iter().map(share_keys).collect()
}

/// The name of lock key `key`'s companion of `kind` under `prefix`, in `key`'s hash slot:
/// built by hand rather than with `format!`, since a release names three of them per key.
/// (`tagged`: the key has a hash tag of its own.)
fn companion(prefix: &str, kind: &str, key: &str, tagged: bool) -> Key {
    let mut name = String::with_capacity(prefix.len() + kind.len() + key.len() + 3);
    name.push_str(prefix);
    name.push_str(kind);
    name.push(':');
    if tagged {
        name.push_str(key);
    } else {
        name.push('{');
        name.push_str(key);
        name.push('}');
    }
    Key::from(name)
}

/// Lock key `key`'s queue, the queue's expiry and its hand-overs, under the fair prefix
/// `prefix`, in that order (the order the scripts take them in).
pub(crate) fn queue_keys(prefix: &str, key: &str) -> [Key; 3] {
    let tagged = hash_tag(key).is_some();
    [
        companion(prefix, "queue", key, tagged),
        companion(prefix, "expiry", key, tagged),
        companion(prefix, "handover", key, tagged),
    ]
}

/// What the keys of semaphore or read-write lock `name` start with under their prefix
/// `prefix`: `<prefix>{name}`, in `name`'s hash slot (a name with a hash tag of its own
/// keeps it, unwrapped), so that one script may touch all of them. Permit `i` is
/// `<base>:<i>` ([`permit_keys`]); a read-write lock's keys are in [`rwlock_keys`].
pub fn named_base(prefix: &str, name: &str) -> String {
    if hash_tag(name).is_some() {
        format!("{prefix}{name}")
    } else {
        format!("{prefix}{{{name}}}")
    }
}

/// The keys of semaphore `name`'s permits under the semaphores' prefix `prefix`:
/// `<base>:<i>` for `i` from 1 to `permits` (see [`named_base`]).
pub fn permit_keys(prefix: &str, name: &str, permits: u32) -> Vec<String> {
    let base = named_base(prefix, name);
    (1..=permits).map(|i| format!("{base}:{i}")).collect()
}

/// The base of the semaphore whose permit's key is `permit` (`<base>:<i>`, see
/// [`permit_keys`]): the key whose fair queue the semaphore's waiters share.
pub(crate) fn permit_base(permit: &str) -> &str {
    permit.rsplit_once(':').map_or(permit, |(base, _)| base)
}

/// The keys of read-write lock `name` under the read-write locks' prefix `prefix`, in
/// `name`'s hash slot as a semaphore's permits are (see [`named_base`]): the writer's
/// key (`<base>:write`, a string holding the writer's token), the readers' set
/// (`<base>:read`, a sorted set of reader tokens scored by the node time their hold ends)
/// and a waiting writer's intent (`<base>:intent`, a string holding the writer's id, which
/// new readers respect so that readers cannot starve writers), in that order.
pub fn rwlock_keys(prefix: &str, name: &str) -> [String; 3] {
    let base = named_base(prefix, name);
    [
        format!("{base}:write"),
        format!("{base}:read"),
        format!("{base}:intent"),
    ]
}

/// Whether `prefix` may prefix companion keys: it must not bring a hash tag of its own.
pub(crate) fn prefix_has_no_tag(prefix: &str) -> bool {
    !prefix.contains(['{', '}'])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys go by hash slot, each slot's keys in their order, the slots in the order of
    /// their first key: an undo on a cluster member is split as the lock was taken.
    #[test]
    fn keys_are_grouped_by_slot_in_their_order() {
        let keys: Vec<Key> = ["{a}:1", "b", "{a}:2"].map(Key::from).to_vec();
        let groups = by_slot(&keys, |key| key.as_bytes());
        let groups: Vec<Vec<&str>> = groups
            .iter()
            .map(|group| group.iter().map(|k| k.as_str().unwrap()).collect())
            .collect();
        assert_eq!(groups, [vec!["{a}:1", "{a}:2"], vec!["b"]]);
        assert_eq!(by_slot(&keys[..1], |key| key.as_bytes()).len(), 1);
    }

    #[test]
    fn a_permits_base_is_its_semaphores() {
        for key in permit_keys("p-", "jobs", 12) {
            assert_eq!(permit_base(&key), named_base("p-", "jobs"));
        }
        assert_eq!(permit_base("app:{t}:x:3"), "app:{t}:x");
    }

    #[test]
    fn a_hash_tag_is_the_first_non_empty_braced_part() {
        assert_eq!(hash_tag("plain"), None);
        assert_eq!(hash_tag("a{b}c"), Some("b"));
        assert_eq!(hash_tag("{user1000}.following"), Some("user1000"));
        assert_eq!(
            hash_tag("foo{}{bar}"),
            None,
            "an empty first tag means no tag"
        );
        assert_eq!(hash_tag("foo{{bar}}zap"), Some("{bar"));
        assert_eq!(hash_tag("foo{bar}{zap}"), Some("bar"));
        assert_eq!(hash_tag("open{only"), None);
        assert_eq!(hash_tag("close}only{"), None);
    }

    #[test]
    fn queue_keys_carry_the_lock_key_as_their_tag_and_never_collide_between_locks() {
        let [q, e, h] = queue_keys("redlock:fair-", "redlock:a");
        assert_eq!(q.as_str(), Some("redlock:fair-queue:{redlock:a}"));
        assert_eq!(e.as_str(), Some("redlock:fair-expiry:{redlock:a}"));
        assert_eq!(h.as_str(), Some("redlock:fair-handover:{redlock:a}"));
        for key in [&q, &e, &h] {
            assert_eq!(hash_tag(key.as_str().unwrap()), Some("redlock:a"));
        }
        let [other, ..] = queue_keys("redlock:fair-", "redlock:b");
        assert_ne!(q, other);
    }

    #[test]
    fn a_lock_key_with_its_own_tag_keeps_it() {
        let [q, e, h] = queue_keys("redlock:fair-", "redlock:{tenant}:job");
        assert_eq!(q.as_str(), Some("redlock:fair-queue:redlock:{tenant}:job"));
        for key in [&q, &e, &h] {
            assert_eq!(hash_tag(key.as_str().unwrap()), Some("tenant"));
        }
    }

    #[test]
    fn a_reentrant_hash_has_an_owner_field_and_one_prefixed_field_per_hold() {
        // The stored format: nodes may hold hashes written by another version.
        assert_eq!(REENTRANT_OWNER_FIELD, "owner");
        assert_eq!(REENTRANT_HOLD_PREFIX, "hold:");
        assert_eq!(hold_field("t1"), "hold:t1");
        assert_eq!(
            hold_field("t1").strip_prefix(REENTRANT_HOLD_PREFIX),
            Some("t1")
        );
        assert!(
            !REENTRANT_OWNER_FIELD.starts_with(REENTRANT_HOLD_PREFIX),
            "the owner field is never read as a hold"
        );
    }

    #[test]
    fn permit_keys_share_the_names_slot_and_never_collide_between_names() {
        let keys = permit_keys("redlock:semaphore-", "jobs", 3);
        assert_eq!(
            keys,
            [
                "redlock:semaphore-{jobs}:1",
                "redlock:semaphore-{jobs}:2",
                "redlock:semaphore-{jobs}:3"
            ]
        );
        assert!(keys.iter().all(|k| hash_tag(k) == Some("jobs")));
        // A name that ends like another's permit is not one of them.
        assert!(!permit_keys("p-", "jobs}:1", 1)
            .iter()
            .any(|k| keys.iter().any(|other| other.ends_with(k.as_str()))));
        let tagged = permit_keys("p-", "app:{tenant}:jobs", 2);
        assert_eq!(tagged, ["p-app:{tenant}:jobs:1", "p-app:{tenant}:jobs:2"]);
    }

    #[test]
    fn a_prefix_with_braces_is_refused() {
        assert!(prefix_has_no_tag("redlock:fair-"));
        assert!(!prefix_has_no_tag("redlock:{fair}-"));
        assert!(!prefix_has_no_tag("x}"));
    }
}

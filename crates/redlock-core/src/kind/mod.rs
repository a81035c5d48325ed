//! Lock kinds: what differs between a plain lock of one key, one over several keys and a
//! reentrant hold is how a node stores the lock, and that is all a kind says. Each kind is
//! a [`Kind`] with its Lua (four functions, below); every script a lock needs is composed
//! once from that Lua and the modifiers (see [`KindScripts`]): fencing reads the node's
//! counter around the acquisition, the fair queue gates it and its release passes the key
//! on, group commit runs it for many locks in one call. So a new kind is one file here with
//! its Lua, and touches neither the modifiers nor the rounds.
//!
//! # The Lua of a kind
//! Each function reads and writes only the `KEYS` it is given (indices into `KEYS`, or a
//! key name from them), and `arg` is the kind's own argument (a reentrant lock's owner; nil
//! for a kind without one):
//! - `take(first, last, token, ttl, arg)`: takes the free keys `KEYS[first..last]` for
//!   `token` with a TTL of `ttl` ms; returns whether it did, and changes nothing when not.
//! - `held(first, last, token, ttl, waiter, arg)`: whether the lock is already the caller's
//!   on this node without a round of its own: a further hold of the same owner, or a key
//!   handed over to `waiter` (nil outside the fair queue, whose scripts alone define the
//!   release message's helpers such as `handed_to`). When it is, it renews the lock
//!   under `token`, never shortening a TTL that other holds count on.
//! - `free(key, token, arg)`: drops `token`'s hold of `key`; returns whether the hold was
//!   there and whether the key is now free (deleted).
//! - `holds(key, token, arg)`: whether `token` holds `key` (what an extension checks before
//!   it lengthens the key's TTL, which works the same for every kind but one whose holds
//!   expire inside the key: that kind also has `lengthen(key, token, ttl, arg)`, see
//!   [`Kind::own_lengthen`]).
//!
//! Every function that writes checks the holder first, so a holder whose lock expired never
//! changes a newer holder's key; reads that may meet a key of another kind go through
//! `redis.pcall`, so they count as "not ours".

use std::sync::LazyLock;

use crate::scripts::{self, Script};

mod plain;
mod reader;
mod reentrant;
#[cfg(test)]
mod test_kind;

pub(crate) use plain::{MANY, ONE, PERMIT, WRITER};
pub(crate) use reader::READER;
pub(crate) use reentrant::REENTRANT;

/// A lock kind: its Lua (see the module docs) and the properties the rounds ask about.
pub(crate) trait Kind: Sync + Send + 'static {
    /// How errors and `Debug` name the kind.
    fn name(&self) -> &'static str;

    /// The extension batch's tag for the kind: one character, unique among the kinds.
    fn tag(&self) -> &'static str;

    /// Its Lua: `take`, `held`, `free` and `holds` (see the module docs).
    fn lua(&self) -> &'static str;

    /// Whether it has an argument of its own (a reentrant lock's owner).
    fn has_arg(&self) -> bool {
        false
    }

    /// Whether every waiter that wants a wake-up queues for it, so that a release that
    /// finds nobody queued is announced to nobody, and a fair waiter can be handed the key
    /// by the release itself. A plain lock of one key only: its waiters queue from their
    /// second attempt; a reentrant lock's waiters that are not fair do not queue, and a
    /// hand-over sets a string under one key.
    fn waiters_queue(&self) -> bool {
        false
    }

    /// Whether its acquisition is the bare `SET key token NX PX ttl` (no script), and
    /// concurrent acquisitions and releases of different locks of the kind may share one
    /// call per node (group commit).
    fn is_set_nx(&self) -> bool {
        false
    }

    /// Whether a lock of the kind is one key that holds the token as a string, so that a
    /// release with nothing else to do (no notification, no queue to pass the key on to) is
    /// a bare compare-and-delete, which a node with `DELIFEQ` runs without a script (see
    /// `LockSpec::release`).
    fn native_release(&self) -> bool {
        false
    }

    /// Whether its Lua has a `lengthen(key, token, ttl, arg)` of its own for an extension
    /// (see `scripts::extend_batch`); otherwise an extension lengthens the key's TTL.
    fn own_lengthen(&self) -> bool {
        false
    }

    /// The key whose fair queue the waiters for `key` share, and from which a release of
    /// `key` passes it on to the next waiter: the key itself, but a semaphore's waiters
    /// queue once per semaphore, not per permit.
    fn queue_of<'k>(&self, key: &'k str) -> &'k str {
        key
    }

    /// The scripts composed from the kind's Lua ([`KindScripts::of`]), built once.
    fn scripts(&self) -> &'static KindScripts;
}

impl std::fmt::Debug for dyn Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The kind of a lock over `keys` (how many) held by `owner` when reentrant: the one place
/// that picks a built-in kind.
pub(crate) fn of(owner: bool, keys: usize) -> &'static dyn Kind {
    match (owner, keys) {
        (true, _) => &REENTRANT,
        (false, 1) => &ONE,
        (false, _) => &MANY,
    }
}

/// Every kind, for the extension batch (one script extends locks of any kind) and for
/// loading the scripts on a node before the first round.
pub(crate) fn all() -> impl Iterator<Item = &'static dyn Kind> {
    let built_in: [&'static dyn Kind; 6] = [&ONE, &MANY, &PERMIT, &WRITER, &READER, &REENTRANT];
    #[cfg(test)]
    let built_in = built_in
        .into_iter()
        .chain([&test_kind::LABELLED as &dyn Kind]);
    #[cfg(not(test))]
    let built_in = built_in.into_iter();
    built_in
}

/// The scripts of one kind, composed from its Lua with each modifier (see
/// [`crate::scripts`] for their arguments).
#[derive(Debug)]
pub(crate) struct KindScripts {
    /// Takes the lock (`held()` or `take()`).
    pub(crate) acquire: Script,
    /// [`acquire`](Self::acquire) reading the node's fencing counter in the same call.
    pub(crate) fenced: Script,
    /// The acquisition of a waiter with a place in the keys' fair queues.
    pub(crate) queued: Script,
    /// [`queued`](Self::queued), fenced.
    pub(crate) fenced_queued: Script,
    /// The rollback of a queued acquisition, which puts the waiter back in the queues.
    pub(crate) queued_rollback: Script,
    /// The release (and the rollback of an acquisition outside the queues).
    pub(crate) release: Script,
    /// Group commit's acquisition and release of many locks of one key each, for a kind
    /// that [`is_set_nx`](Kind::is_set_nx).
    pub(crate) grouped: Option<(Script, Script)>,
}

impl KindScripts {
    /// Every script of `kind`, the grouped forms for a kind that
    /// [`is_set_nx`](Kind::is_set_nx).
    pub(crate) fn of(kind: &dyn Kind) -> KindScripts {
        let (lua, has_arg) = (kind.lua(), kind.has_arg());
        let acquire = scripts::acquire(lua, has_arg);
        let queued = scripts::queued(lua, has_arg);
        KindScripts {
            fenced: scripts::fenced(&acquire),
            fenced_queued: scripts::fenced(&queued),
            acquire: Script::new(acquire),
            queued: Script::new(queued),
            queued_rollback: Script::new(scripts::queued_rollback(lua, has_arg)),
            release: Script::new(scripts::release(lua, has_arg)),
            grouped: kind.is_set_nx().then(|| {
                (
                    Script::new(scripts::grouped_acquire(lua)),
                    Script::new(scripts::grouped_release(lua)),
                )
            }),
        }
    }

    /// Every script, for loading them on a node.
    pub(crate) fn each(&self) -> impl Iterator<Item = &Script> {
        let grouped = self.grouped.iter().flat_map(|(a, r)| [a, r]);
        [
            &self.acquire,
            &self.fenced,
            &self.queued,
            &self.fenced_queued,
            &self.queued_rollback,
            &self.release,
        ]
        .into_iter()
        .chain(grouped)
    }
}

/// The extension of locks of any kind, many in one call (see `scripts::extend_batch`).
pub(crate) static EXTEND_BATCH: LazyLock<Script> = LazyLock::new(|| {
    let kinds: Vec<(&str, &str, bool)> = all()
        .map(|kind| (kind.tag(), kind.lua(), kind.own_lengthen()))
        .collect();
    Script::new(scripts::extend_batch(&kinds))
});

/// Every script, for loading them on a node before the first round.
pub(crate) fn every_script() -> Vec<&'static Script> {
    let mut every: Vec<&'static Script> = scripts::own().to_vec();
    every.push(&EXTEND_BATCH);
    for kind in all() {
        every.extend(kind.scripts().each());
    }
    every
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_is_distinct() {
        let every = every_script();
        for (i, a) in every.iter().enumerate() {
            assert_eq!(a.sha().len(), 40);
            for b in &every[i + 1..] {
                assert_ne!(a.sha(), b.sha(), "{}", a.source());
            }
        }
    }

    /// A fenced acquisition taken apart on a cluster member runs its acquisition alone by
    /// SHA: that script must be one every node loads.
    #[test]
    fn every_fenced_acquisition_alone_is_a_loaded_script() {
        let every = every_script();
        let fenced = every.iter().filter_map(|s| s.unfenced());
        let mut count = 0;
        for unfenced in fenced {
            count += 1;
            assert!(
                every.iter().any(|s| s.sha() == unfenced.script.sha()),
                "{}",
                unfenced.script.source()
            );
        }
        assert!(count >= 6, "{count} fenced scripts");
    }

    #[test]
    fn the_kinds_tags_are_distinct() {
        let tags: Vec<&str> = all().map(|kind| kind.tag()).collect();
        for (i, tag) in tags.iter().enumerate() {
            assert!(!tags[i + 1..].contains(tag), "{tag}");
        }
    }
}

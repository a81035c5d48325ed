//! The Lua scripts. Every script that deletes or extends checks that the key still holds our
//! token first, so a holder whose lock expired can never delete or extend a newer holder's
//! key (guarantee G3). Reads that might meet a key of the other kind (a reentrant hash where
//! a string is expected, or the reverse) go through `redis.pcall`, so they count as "not
//! ours" instead of failing the whole script.
//!
//! One file per concern: `plain.rs` (several keys, group commit's batches), `release.rs`
//! (releases and the helpers that pass a freed key on), `reentrant.rs`, `fence.rs`,
//! `fair.rs` (the fair queue), `inspect.rs`.

use std::borrow::Cow;

use fred::bytes_utils::Str;
use fred::types::Value;

use crate::message::message_lua;

/// Lua: `node_time_ms()`, the node's clock (`TIME`) in whole milliseconds: the one clock
/// the fair queues' expiries are read by. A macro, so that `release::ANNOUNCE` can include it in
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
pub(super) const NODE_TIME_MS: &str = node_time_ms!();

/// The release message's Lua (see [`crate::message`]), for scripts that do not include
/// `release::ANNOUNCE`.
pub(super) const MESSAGE: &str = message_lua!();

mod fair;
mod fence;
mod inspect;
mod plain;
mod reentrant;
mod release;

pub(crate) use fair::{
    FAIR_ACQUIRE, FAIR_ACQUIRE_MANY, FAIR_LEAVE, FAIR_REENTRANT_ACQUIRE, FAIR_REENTRANT_ROLLBACK,
    FAIR_ROLLBACK, FENCED_FAIR_ACQUIRE, FENCED_FAIR_ACQUIRE_MANY, FENCED_FAIR_REENTRANT_ACQUIRE,
};
pub(crate) use fence::{
    FENCED_ACQUIRE_MANY, FENCED_ACQUIRE_ONE, FENCED_REENTRANT_ACQUIRE, FENCE_MARK, FENCE_READ,
    FENCE_RECORD, FENCE_SEED,
};
pub(crate) use inspect::INSPECT;
pub(crate) use plain::{ACQUIRE_BATCH, ACQUIRE_MANY, EXTEND_BATCH};
pub(crate) use reentrant::REENTRANT_ACQUIRE;
pub(crate) use release::{REENTRANT_RELEASE, RELEASE, RELEASE_BATCH};

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

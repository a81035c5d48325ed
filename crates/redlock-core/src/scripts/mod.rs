//! The Lua scripts. Every script that deletes or extends checks that the key still holds our
//! token first, so a holder whose lock expired can never delete or extend a newer holder's
//! key (guarantee G3). Reads that might meet a key of the other kind (a reentrant hash where
//! a string is expected, or the reverse) go through `redis.pcall`, so they count as "not
//! ours" instead of failing the whole script.
//!
//! A lock kind (see the `kind` module) brings the Lua that differs between kinds; the
//! functions here compose it into each script a lock needs, one file per concern:
//! `plain.rs` (the acquisition, group commit's batches, the extension), `release.rs`
//! (releases and the helpers that pass a freed key on), `fence.rs` (the fenced form and
//! the fencing counters' own scripts), `fair.rs` (the fair queue), `inspect.rs`,
//! `permit.rs` (the semaphore's acquisition), `rwlock.rs` (a read-write lock's).

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
pub(crate) const NODE_TIME_MS: &str = node_time_ms!();

/// The release message's Lua (see [`crate::message`]), for scripts that do not include
/// `release::ANNOUNCE`.
pub(super) const MESSAGE: &str = message_lua!();

mod fair;
mod fence;
mod inspect;
mod permit;
mod plain;
mod release;
mod rwlock;

pub(crate) use fair::{queued, queued_rollback, FAIR_LEAVE};
pub(crate) use fence::{fenced, Unfenced, FENCE_MARK, FENCE_READ, FENCE_RECORD, FENCE_SEED};
pub(crate) use inspect::INSPECT;
pub(crate) use permit::{
    PERMIT_TAKE, PERMIT_TAKE_FENCED, PERMIT_TAKE_QUEUED, PERMIT_TAKE_QUEUED_FENCED,
};
pub(crate) use plain::{acquire, extend_batch, grouped_acquire};
pub(crate) use release::{grouped_release, release};
pub(crate) use rwlock::{
    RW_LEAVE, RW_READ, RW_READ_QUEUED, RW_WRITE, RW_WRITE_FENCED, RW_WRITE_QUEUED,
    RW_WRITE_QUEUED_FENCED,
};

/// A Lua script with its SHA-1, computed once.
#[derive(Debug)]
pub struct Script {
    source: Cow<'static, str>,
    /// Shared by every call's arguments: no copy per command.
    sha: Str,
    /// For a fenced acquisition, the same acquisition without the counter's read, for a
    /// node whose counter is on another server than the lock's keys (see
    /// [`fence::Unfenced`]).
    unfenced: Option<Box<fence::Unfenced>>,
}

impl Script {
    /// A script from its source.
    pub fn new(source: impl Into<Cow<'static, str>>) -> Self {
        let source = source.into();
        let sha = Str::from(fred::util::sha1_hash(&source));
        Script {
            source,
            sha,
            unfenced: None,
        }
    }

    /// A fenced acquisition's script, whose acquisition alone is `unfenced`.
    fn with_unfenced(mut self, unfenced: fence::Unfenced) -> Self {
        self.unfenced = Some(Box::new(unfenced));
        self
    }

    /// For a fenced acquisition: the acquisition without the counter's read, and how
    /// its answer and the counter's make this script's answer.
    pub(crate) fn unfenced(&self) -> Option<&fence::Unfenced> {
        self.unfenced.as_deref()
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

/// The scripts that no lock kind composes, for preloading (see `kind` for the rest).
pub(crate) fn own() -> [&'static Script; 17] {
    [
        &RW_READ,
        &RW_READ_QUEUED,
        &RW_WRITE_QUEUED,
        &RW_WRITE_QUEUED_FENCED,
        &RW_WRITE,
        &RW_WRITE_FENCED,
        &RW_LEAVE,
        &PERMIT_TAKE,
        &PERMIT_TAKE_FENCED,
        &PERMIT_TAKE_QUEUED,
        &PERMIT_TAKE_QUEUED_FENCED,
        &FENCE_RECORD,
        &FENCE_READ,
        &FENCE_MARK,
        &FENCE_SEED,
        &INSPECT,
        &FAIR_LEAVE,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha_of_the_empty_script() {
        // SHA-1 of the empty string, as Redis would compute it for SCRIPT LOAD "".
        assert_eq!(
            Script::new("").sha(),
            "da39a3ee5e6b4b0d3255bfef95601890afd80709"
        );
    }
}

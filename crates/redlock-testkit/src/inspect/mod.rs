//! [`RedisAt`]: inspecting and manipulating the data of any Redis server by address (a local
//! [`Node`](crate::Node) or a container), through fresh, short-lived fred connections.
//!
//! Each call builds its own client with ~1 s connection/command timeouts and no reconnection,
//! so a paused or dead server yields an error instead of a hang, and no state leaks between
//! calls. A hard outer deadline backs up fred's own timeouts.
//!
//! `redis_at` holds the handle and its data commands, `stats` the `INFO` counters, `evict`
//! key loss, `session` the one connection a call opens, and `node` the same commands on a
//! local [`Node`](crate::Node).

mod evict;
mod node;
mod redis_at;
mod session;
mod stats;

use std::time::Duration;

pub use redis_at::RedisAt;

/// fred's connection and command timeout for inspection.
pub const INSPECT_TIMEOUT: Duration = Duration::from_secs(1);

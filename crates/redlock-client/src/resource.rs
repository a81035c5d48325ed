//! The resource side of fencing: a write that the protected resource accepts only with a
//! fencing token at least as high as every token it has seen, so that a holder that paused
//! past its validity (and whose lock a newer holder has since taken) cannot overwrite the
//! newer holder's work.
//!
//! Two ready-made checks:
//! - [`fenced_set`]: a value kept in Redis (any Redis, not necessarily a lock node), written
//!   by a Lua script that compares the token with the highest recorded for the key and
//!   records it in the same step;
//! - [`FENCED_UPDATE_SQL`]: the SQL pattern, for data in a database: the row keeps the
//!   highest token that wrote it, and the `UPDATE` matches only while that is not higher.

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::config::Options;
use fred::types::{CustomCommand, Value};

use redlock_core::FencingToken;

/// `KEYS[1]` = the value's key, `KEYS[2]` = where its highest token is kept, `ARGV[1]` =
/// the writer's token, `ARGV[2]` = the value. Writes (and records the token) unless a
/// higher token was recorded; returns 1 when written, 0 when rejected.
const FENCED_SET: &str = r#"local seen = tonumber(redis.call("GET", KEYS[2]) or "0") or 0
if tonumber(ARGV[1]) < seen then return 0 end
redis.call("SET", KEYS[2], ARGV[1])
redis.call("SET", KEYS[1], ARGV[2])
return 1"#;

/// The key under which [`fenced_set`] keeps the highest token that wrote `key`.
pub fn fence_record_key(key: &str) -> String {
    format!("{key}:fence")
}

/// Sets `key` to `value` on the Redis behind `client`, unless a write with a higher fencing
/// token already happened (it then returns `Ok(false)` and changes nothing). The highest
/// token is kept under [`fence_record_key`]. Several writes with the same token are
/// accepted: one holder may write many times. Each hold of a reentrant lock has its own
/// token, a nested hold's higher: once it has written, the holds before it are refused
/// here although they still hold the lock (write from one hold, see the README's "Fencing
/// tokens").
///
/// The write is sent once, whatever `client`'s `max_command_attempts`: fred replays a
/// command in flight when its connection drops, and a replayed earlier write of this
/// holder (same token, so accepted) would land after its later ones. An error therefore
/// means "written or not, unknown": write again (in order) or read back.
///
/// ```no_run
/// # async fn demo(redlock: redlock_client::Redlock, redis: fred::clients::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let guard = redlock
///     .lock_with("report", &redlock_client::LockOptions { fenced: Some(true), ..Default::default() })
///     .await?;
/// let token = guard.fencing_token().expect("a fenced lock");
/// if !redlock_client::fenced_set(&redis, "report:latest", "v2", token).await? {
///     // A newer holder has written since: this holder's lock is gone, stop.
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub async fn fenced_set(
    client: &Client,
    key: &str,
    value: &str,
    token: FencingToken,
) -> Result<bool, fred::error::Error> {
    // Through `custom`: fred's `eval` ignores per-command options.
    let args: Vec<Value> = vec![
        FENCED_SET.into(),
        2.into(),
        key.into(),
        fence_record_key(key).into(),
        token.get().to_string().into(),
        value.into(),
    ];
    let once = Options {
        max_attempts: Some(1),
        ..Options::default()
    };
    let written: Value = client
        .with_options(&once)
        .custom(CustomCommand::new_static("EVAL", None, false), args)
        .await?;
    Ok(matches!(written, Value::Integer(1)))
}

/// The SQL form of the check, for a table whose rows carry the highest token that wrote
/// them (`fence BIGINT NOT NULL DEFAULT 0`): `$1` is the new value, `$2` the row's id, `$3`
/// the fencing token. It updates one row, or none when a higher token has written the row
/// since; treat zero rows as "this holder lost its lock". Same token, same row: accepted
/// again, so one holder may write many times.
///
/// ```text
/// client.execute(FENCED_UPDATE_SQL, &[&value, &id, &(token.get() as i64)]).await? == 1
/// ```
pub const FENCED_UPDATE_SQL: &str =
    "UPDATE accounts SET balance = $1, fence = $3 WHERE id = $2 AND fence <= $3";

//! Counters from `INFO` and `PUBSUB`: how often a command ran, how many clients are connected
//! or subscribed. They let a test assert what a mechanism did instead of timing it.

use fred::prelude::{ClientLike, Error as FredError, ErrorKind};
use fred::types::{CustomCommand, InfoKind, Value};

use super::RedisAt;
use crate::HarnessError;

impl RedisAt {
    /// How many times the server has executed `command` (lower case, e.g. `"evalsha"`) since
    /// it started, from `INFO commandstats`. Lets a test assert how many commands a
    /// mechanism sent, instead of timing it.
    pub async fn command_calls(&self, command: &str) -> Result<u64, HarnessError> {
        let stats: String = self
            .one("INFO commandstats", |c| async move {
                c.info(Some(InfoKind::CommandStats)).await
            })
            .await?;
        Ok(parse_info_field(&stats, &format!("cmdstat_{command}"), "calls").unwrap_or(0))
    }

    /// How many client connections the server has open, from `INFO clients` (the one this
    /// call opens included). Lets a test assert that a client closed its connections.
    pub async fn connected_clients(&self) -> Result<u64, HarnessError> {
        let info: String = self
            .one("INFO clients", |c| async move {
                c.info(Some(InfoKind::Clients)).await
            })
            .await?;
        parse_info_field(&info, "connected_clients", "").ok_or_else(|| {
            self.redis_error(
                "INFO clients",
                FredError::new(ErrorKind::Protocol, "no connected_clients field"),
            )
        })
    }

    /// How many clients are subscribed to `channel` (`PUBSUB NUMSUB`). Lets a test wait
    /// until a subscriber is in place instead of sleeping.
    pub async fn subscribers(&self, channel: &str) -> Result<u64, HarnessError> {
        let reply: Vec<Value> = self
            .one("PUBSUB NUMSUB", |c| async move {
                c.custom(
                    CustomCommand::new_static("PUBSUB", None, false),
                    vec!["NUMSUB".to_owned(), channel.to_owned()],
                )
                .await
            })
            .await?;
        Ok(match reply.get(1) {
            Some(Value::Integer(n)) => u64::try_from(*n).unwrap_or(0),
            _ => 0,
        })
    }
}

/// Finds `field=N` on the `INFO` line `<line>:...` (or `<line>:N` when `field` is empty).
pub(super) fn parse_info_field(info: &str, line: &str, field: &str) -> Option<u64> {
    let prefix = format!("{line}:");
    let rest = info
        .lines()
        .find_map(|l| l.trim().strip_prefix(prefix.as_str()))?;
    if field.is_empty() {
        return rest.parse().ok();
    }
    let field = format!("{field}=");
    rest.split(',')
        .find_map(|kv| kv.strip_prefix(field.as_str()))
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod info_tests {
    use super::parse_info_field;

    #[test]
    fn parses_calls_of_one_command() {
        let info =
            "# Commandstats\r\ncmdstat_set:calls=7,usec=10\r\ncmdstat_evalsha:calls=3,usec=5\r\n";
        assert_eq!(parse_info_field(info, "cmdstat_evalsha", "calls"), Some(3));
        assert_eq!(parse_info_field(info, "cmdstat_set", "calls"), Some(7));
        assert_eq!(parse_info_field(info, "cmdstat_get", "calls"), None);
    }

    #[test]
    fn parses_a_plain_counter() {
        let info = "# Stats\r\nexpired_keys:2\r\nevicted_keys:12\r\nevicted_clients:0\r\n";
        assert_eq!(parse_info_field(info, "evicted_keys", ""), Some(12));
        assert_eq!(parse_info_field(info, "evicted", ""), None);
    }
}

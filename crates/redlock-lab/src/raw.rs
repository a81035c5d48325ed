//! Plain fred clients for what the library never does: the fenced resource's own Redis
//! commands, and the lab-side token issuers of the fencing demonstrations.

use std::future::Future;
use std::time::Duration;

use fred::prelude::{Builder, Client, ClientLike, Config, ReconnectPolicy};

use crate::error::LabError;

/// A connected fred client for `url` whose every command, the connect included, gives up
/// after `timeout`. One attempt per command: a command that timed out is never sent again
/// later (a reconnect that replayed it after a healed link would change a counter behind
/// the schedule's back).
pub async fn connect(url: &str, timeout: Duration) -> Result<Client, LabError> {
    let config = Config::from_url(url)?;
    let client = bounded(
        Config {
            fail_fast: true,
            ..config
        },
        timeout,
    )
    .build()?;
    client.init().await?;
    Ok(client)
}

/// `command`, or `None` when it failed or took longer than `timeout`: fred's own timeout
/// is the first line, this one the safety net.
pub async fn within<T>(
    timeout: Duration,
    command: impl Future<Output = Result<T, fred::error::Error>>,
) -> Option<T> {
    tokio::time::timeout(timeout * 2, command).await.ok()?.ok()
}

/// Closes `client`, waiting at most `timeout` for the goodbye.
pub async fn close(client: &Client, timeout: Duration) {
    let _ = tokio::time::timeout(timeout, client.quit()).await;
}

/// A builder for `config` whose connect and every command give up after `timeout`, with one
/// attempt per command and a reconnect every 20 ms: the lab's direct clients (these, and
/// the observer's samplers) must never replay a command or wait on a node for long.
pub(crate) fn bounded(config: Config, timeout: Duration) -> Builder {
    let mut builder = Builder::from_config(config);
    builder
        .with_connection_config(|c| {
            c.connection_timeout = timeout;
            c.internal_command_timeout = timeout;
            c.max_command_attempts = 1;
        })
        .with_performance_config(|p| p.default_command_timeout = timeout)
        .set_policy(ReconnectPolicy::new_constant(0, 20));
    builder
}

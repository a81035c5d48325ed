//! The one place that builds fred clients for lock nodes: the connections rounds use, and
//! the subscribers that hear release notifications. Both get the same timeouts, reconnect
//! policy, credentials and TLS settings from the node's URL and the [`Config`].

use fred::clients::{Client, SubscriberClient};
use fred::types::config::ReconnectPolicy;
use fred::types::Builder;

use crate::config::{Config, Endpoint};
use crate::error::ConfigError;

/// What a client is for; each use adds what it alone needs to the shared settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// The connection that every round's commands go through.
    Rounds,
    /// A pub/sub connection that hears release notifications.
    Notifications,
}

/// A builder with the settings every connection to a lock node needs.
fn builder(endpoint: &Endpoint, config: &Config, purpose: Purpose) -> Builder {
    let timeout = config.node_timeout;
    let mut fred_config = endpoint.fred.clone();
    // `false` makes fred apply the reconnect policy to the first connection as well: a
    // node that is down at start-up is retried in the background instead of being dead
    // for good. (Round commands still fail fast, through per-command options.)
    fred_config.fail_fast = false;
    let max_delay = u32::try_from(config.reconnect_max_delay.as_millis()).unwrap_or(u32::MAX);
    let mut builder = Builder::from_config(fred_config);
    builder
        .with_connection_config(|c| {
            c.connection_timeout = timeout;
            c.internal_command_timeout = timeout;
            // fred replays a command in flight when its connection drops, by default up
            // to three times: a replayed SET NX can answer "not set" for a key that the
            // first attempt set. One attempt, and an unanswered command is ambiguous.
            c.max_command_attempts = 1;
            c.tcp.nodelay = Some(true);
        })
        .with_performance_config(|p| {
            p.default_command_timeout = timeout;
            if purpose == Purpose::Notifications {
                // fred's default of 32 buffered messages is easily overrun by a burst of
                // releases; a reader that lags anyway wakes every key's oldest waiter.
                p.broadcast_channel_capacity = 1024;
            }
        })
        // Without a policy a fred client whose server went away is dead for good. fred
        // also sleeps one policy delay (plus jitter, 100 ms by default) before the
        // *first* connection, and cancels commands sent meanwhile: start at 1 ms with
        // little jitter so a fresh client is usable at once.
        .set_policy({
            let mut policy = ReconnectPolicy::new_exponential(0, 1, max_delay.max(1), 2);
            policy.set_jitter(5);
            policy
        });
    builder
}

fn client_error(endpoint: &Endpoint, e: fred::error::Error) -> ConfigError {
    ConfigError::Client {
        node: endpoint.name.to_string(),
        reason: e.details().to_string(),
    }
}

/// The client that a node's rounds go through.
pub(crate) fn round_client(endpoint: &Endpoint, config: &Config) -> Result<Client, ConfigError> {
    builder(endpoint, config, Purpose::Rounds)
        .build()
        .map_err(|e| client_error(endpoint, e))
}

/// A subscriber for release notifications from one node.
pub(crate) fn subscriber(
    endpoint: &Endpoint,
    config: &Config,
) -> Result<SubscriberClient, ConfigError> {
    builder(endpoint, config, Purpose::Notifications)
        .build_subscriber_client()
        .map_err(|e| client_error(endpoint, e))
}

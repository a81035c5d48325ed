//! Reading a node's settings for the health check (`INFO`, `CONFIG GET appendfsync`) over
//! its connection; what they mean is judged in the crate's `health` module.

use fred::types::Value;

use super::Connection;
use crate::health::NodeHealth;

impl Connection {
    /// Reads the node's settings for the health check: `INFO` (timed, for the latency) and
    /// `CONFIG GET appendfsync`, which managed services may refuse (then unknown).
    pub(crate) async fn health(&self) -> NodeHealth {
        let started = tokio::time::Instant::now();
        // Not gated: a node that casts no vote is still reachable, and its settings count.
        let info = match self.send_custom("INFO", Vec::new()).await {
            Ok(reply) => reply
                .as_str()
                .map(|text| text.to_string())
                .unwrap_or_default(),
            Err(why) => return NodeHealth::unreachable(self.name.clone(), why),
        };
        let latency = started.elapsed();
        let appendfsync = match self
            .send_custom(
                "CONFIG",
                vec![Value::from("GET"), Value::from("appendfsync")],
            )
            .await
        {
            Ok(reply) => config_value(reply, "appendfsync"),
            Err(why) => {
                tracing::debug!(node = %self.name, %why, "CONFIG GET appendfsync not answered; reported as unknown");
                None
            }
        };
        NodeHealth::from_info(self.name.clone(), latency, &info, appendfsync)
    }
}

/// The value of `name` in a `CONFIG GET` reply (an array of name, value pairs, or a map).
fn config_value(reply: Value, name: &str) -> Option<String> {
    match reply {
        Value::Array(items) => items
            .chunks(2)
            .find(|pair| pair[0].as_str().as_deref() == Some(name))
            .and_then(|pair| pair.get(1)?.as_string()),
        Value::Map(map) => map
            .inner()
            .into_iter()
            .find(|(k, _)| k.as_str() == Some(name))
            .and_then(|(_, v)| v.as_string()),
        _ => None,
    }
}

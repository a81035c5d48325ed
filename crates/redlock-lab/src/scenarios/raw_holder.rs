//! A holder of a lab-side lock that is not the library's (a demonstration's broken
//! semaphore or read-write lock): client `c`'s raw connections to some of the nodes,
//! through its links, its own script run on each, held once a majority of the node set
//! admitted it, with the validity the library would give it.

use fred::prelude::{Client, LuaInterface};
use futures::future::join_all;
use tokio::time::Instant;

use crate::error::LabError;
use crate::history::Event;
use crate::lab::Lab;
use crate::raw;

pub(super) struct RawHolder {
    /// How the history names its client.
    pub(super) name: String,
    /// Its token (or member), unique to it.
    pub(super) token: String,
    nodes: Vec<Client>,
}

impl RawHolder {
    /// Client `c`'s holder, reaching the nodes of `reach`.
    pub(super) async fn connect(lab: &Lab, c: usize, reach: &[usize]) -> Result<Self, LabError> {
        let urls = lab.links.urls(c);
        let mut nodes = Vec::with_capacity(reach.len());
        // Up to a TTL to connect and for each command: a container just restarted for
        // the scenario can take longer than a node timeout to answer its first connection,
        // and an admission that slow has no validity left anyway.
        for &n in reach {
            nodes.push(raw::connect(&urls[n], lab.timing.ttl).await?);
        }
        Ok(RawHolder {
            name: format!("client-{c}"),
            token: format!("{c}-{:032x}", rand::random::<u128>()),
            nodes,
        })
    }

    /// Runs `script` on each of its nodes with `keys` and `args`: held once a majority of
    /// the node set answered 1, with a Redlock validity (the TTL less the time taken and
    /// the library's drift allowance), recorded as a holder of `key`. Whether it was.
    pub(super) async fn take(
        &self,
        lab: &Lab,
        script: &str,
        keys: Vec<String>,
        args: Vec<String>,
        key: String,
    ) -> bool {
        let ttl = lab.timing.ttl;
        let (t0, started) = (Instant::now(), lab.history.now());
        let answers = join_all(self.nodes.iter().map(|n| {
            raw::within(
                ttl,
                n.eval::<i64, _, _, _>(script, keys.clone(), args.clone()),
            )
        }))
        .await;
        let yes = answers.iter().filter(|a| **a == Some(1)).count();
        let drift = redlock_core::drift(ttl, redlock_core::DEFAULT_DRIFT_FACTOR);
        if yes < redlock_core::quorum(lab.node_count()) || t0.elapsed() + drift >= ttl {
            return false;
        }
        lab.history.record(Event::Acquired {
            client: self.name.clone(),
            token: self.token.clone(),
            key,
            started,
            acquired: lab.history.now(),
            valid_until: lab.history.at(t0 + ttl - drift),
            fencing: None,
            owner: None,
        });
        true
    }

    /// Leaves `key` on each of its nodes with `script` (its claim ends as the call starts).
    pub(super) async fn leave(&self, lab: &Lab, script: &str, key: &str) {
        lab.history.record(Event::ReleaseStarted {
            client: self.name.clone(),
            token: self.token.clone(),
            at: lab.history.now(),
        });
        join_all(self.nodes.iter().map(|n| {
            let leave = n.eval::<i64, _, _, _>(script, vec![key], vec![self.token.as_str()]);
            raw::within(lab.timing.ttl, leave)
        }))
        .await;
    }

    pub(super) async fn close(self, lab: &Lab) {
        join_all(
            self.nodes
                .iter()
                .map(|n| raw::close(n, lab.timing.node_timeout)),
        )
        .await;
    }
}

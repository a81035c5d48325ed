//! Lab-side fencing token issuers that skip one step of the library's design, in raw fred
//! commands on the counter key the library uses. The fencing demonstrations hand their
//! tokens to plain locks and show that the token rule catches what goes wrong.

use std::future::Future;
use std::time::Duration;

use fred::prelude::{Client, KeysInterface, LuaInterface};
use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::error::LabError;
use crate::lab::{Lab, FENCING_COUNTER};
use crate::raw;

/// `KEYS[1]` = the counter, `ARGV[1]` = the token: raise-only, like the library's
/// write-back, but with a missing counter read as 0 by the caller.
const RAISE: &str = r#"local counter = tonumber(redis.call("GET", KEYS[1]) or "0") or 0
if counter < tonumber(ARGV[1]) then redis.call("SET", KEYS[1], ARGV[1]) end
return 1"#;

/// How long [`Issuer::reach`] waits for a restarted node to answer through the links (a
/// container restart takes a second or two).
const REACH_WITHIN: Duration = Duration::from_secs(10);

/// How a broken issuer makes a token from the nodes it reaches.
#[derive(Clone, Copy, Debug)]
pub(super) enum Naive {
    /// `INCR` the counter on every node reached and take the highest answer: no read of a
    /// quorum before, no write-back to a quorum after. Two quorums need not share the node
    /// with the highest counter.
    IncrMax,
    /// The library's read-max-write-back (the highest counter of a quorum plus one, written
    /// back raise-only, handed out once a quorum recorded it), except that a node without a
    /// counter counts as 0 instead of not at all: a node that restarted empty then passes
    /// for one that never saw a token.
    MissingAsZero,
}

/// One client's issuer: a raw connection through each of the client's links.
pub(super) struct Issuer {
    naive: Naive,
    nodes: Vec<Client>,
    counter: String,
    quorum: usize,
    timeout: Duration,
}

impl Issuer {
    /// Connects through client `c`'s links, which must all pass traffic now.
    pub(super) async fn connect(lab: &Lab, c: usize, naive: Naive) -> Result<Issuer, LabError> {
        let timeout = lab.timing.node_timeout;
        let mut nodes = Vec::new();
        for url in lab.links.urls(c) {
            nodes.push(raw::connect(&url, timeout).await?);
        }
        Ok(Issuer {
            naive,
            nodes,
            counter: lab.full_key(FENCING_COUNTER),
            quorum: lab.node_count() / 2 + 1,
            timeout,
        })
    }

    /// A token from the first quorum of nodes to answer (sent to every node, each within
    /// the node timeout), or an error when fewer than a quorum answered. The schedules leave
    /// each client exactly a quorum of nodes, so the first quorum is the one it reaches.
    pub(super) async fn issue(&self) -> Result<u64, LabError> {
        let counter = self.counter.as_str();
        match self.naive {
            Naive::IncrMax => {
                let counts = self.nodes.iter().map(|n| n.incr::<u64, _>(counter));
                let counts = self.first_quorum(counts, "INCR").await?;
                Ok(counts.into_iter().max().unwrap_or(0))
            }
            Naive::MissingAsZero => {
                let read = self.nodes.iter().map(|n| n.get::<Option<u64>, _>(counter));
                let read = self.first_quorum(read, "GET").await?;
                let token = read.into_iter().map(|c| c.unwrap_or(0)).max().unwrap_or(0) + 1;
                let acks = self
                    .nodes
                    .iter()
                    .map(|n| n.eval::<i64, _, _, _>(RAISE, vec![counter], vec![token]));
                self.first_quorum(acks, "the write-back").await?;
                Ok(token)
            }
        }
    }

    /// The answers of the first quorum of `commands` to answer, each within the node
    /// timeout; the rest are dropped unanswered.
    async fn first_quorum<T>(
        &self,
        commands: impl Iterator<Item = impl Future<Output = Result<T, fred::error::Error>>>,
        what: &str,
    ) -> Result<Vec<T>, LabError> {
        let mut pending: FuturesUnordered<_> = commands
            .map(|command| raw::within(self.timeout, command))
            .collect();
        let mut answered = Vec::new();
        while answered.len() < self.quorum {
            match pending.next().await {
                Some(Some(answer)) => answered.push(answer),
                Some(None) => {}
                None => break,
            }
        }
        if answered.len() < self.quorum {
            return Err(LabError::Schedule(format!(
                "{what} of the lab-side issuer reached {} nodes, fewer than a quorum of {}",
                answered.len(),
                self.quorum
            )));
        }
        Ok(answered)
    }

    /// Waits until each of `nodes` answers through this issuer's links (after a restart,
    /// the connections come back on their own).
    pub(super) async fn reach(&self, nodes: &[usize]) -> Result<(), LabError> {
        let deadline = Instant::now() + REACH_WITHIN;
        for &n in nodes {
            loop {
                let read = self.nodes[n].get::<Option<u64>, _>(self.counter.as_str());
                if raw::within(self.timeout, read).await.is_some() {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(LabError::Schedule(format!(
                        "node-{n} did not answer the lab-side issuer within {REACH_WITHIN:?}"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }

    /// Closes the connections.
    pub(super) async fn close(self) {
        join_all(self.nodes.iter().map(|n| raw::close(n, self.timeout))).await;
    }
}

//! Reads what each node holds for a guard, straight to the node (not through the clients'
//! fault proxies), right after asking the guard for its validity: the record the
//! checker's validity rule judges ([`Event::NodesRead`]).

use std::time::Duration;

use fred::prelude::{Client, LuaInterface};
use futures::future::join_all;
use redlock_client::LockGuard;
use redlock_core::layout::hold_field;

use crate::error::LabError;
use crate::history::{Event, History, NodeHold};
use crate::lab::Lab;
use crate::raw;

/// For a lock's keys and token (`ARGV[1]`), and the token's hold field in a reentrant
/// lock's hash (`ARGV[2]`, [`hold_field`]): `-2` unless every key holds the token (a plain
/// or multi-key lock's value, or one of a reentrant lock's holds), else the least `PTTL`
/// of the keys (`-1`: none expires). One script: the keys are read at one instant.
const HELD: &str = r#"local least = -1
for _, key in ipairs(KEYS) do
  local kind = redis.call('TYPE', key).ok
  local mine = false
  if kind == 'string' then mine = redis.call('GET', key) == ARGV[1]
  elseif kind == 'hash' then mine = redis.call('HEXISTS', key, ARGV[2]) == 1 end
  if not mine then return -2 end
  local pttl = redis.call('PTTL', key)
  if pttl >= 0 and (least < 0 or pttl < least) then least = pttl end
end
return least"#;

/// One direct client per node of the scenario.
#[derive(Debug)]
pub(super) struct Reader {
    history: History,
    /// `None` for a node that could not be reached when the reader started: unknown.
    nodes: Vec<Option<Client>>,
    quorum: usize,
    timeout: Duration,
}

impl Reader {
    pub(super) async fn connect(lab: &Lab) -> Reader {
        // The holder waits for the reads (they must come before its release): a node that
        // does not answer within a node timeout is unknown, as it is to the client.
        let timeout = lab.timing.node_timeout;
        let mut addrs = lab.nodes().addrs();
        addrs.truncate(lab.node_count());
        let connects = addrs
            .iter()
            .map(|addr| async move { raw::connect(&format!("redis://{addr}"), timeout).await });
        let nodes = join_all(connects)
            .await
            .into_iter()
            .map(Result::<_, LabError>::ok)
            .collect();
        Reader {
            history: lab.history.clone(),
            nodes,
            quorum: lab.node_count() / 2 + 1,
            timeout,
        }
    }

    /// Asks `guard` for its validity and reads every node; records the reads. A guard that
    /// no longer reports itself valid claims nothing, and is not read.
    pub(super) async fn check(&self, client: &str, guard: &LockGuard) {
        let at = self.history.now();
        let valid_until = self.history.at(guard.valid_until());
        if !guard.is_valid() {
            return;
        }
        let lock = guard.lock();
        let token = lock.token().as_str().to_owned();
        let keys: Vec<String> = lock.keys().map(str::to_owned).collect();
        let args = vec![token.clone(), hold_field(&token)];
        let reads = self.nodes.iter().enumerate().map(|(node, redis)| {
            let (keys, args) = (keys.clone(), args.clone());
            async move {
                let sent = self.history.now();
                let pttl = match redis {
                    Some(redis) => {
                        let read = redis.eval::<i64, _, _, _>(HELD, keys, args);
                        tokio::time::timeout(self.timeout, read)
                            .await
                            .ok()
                            .and_then(Result::ok)
                    }
                    None => None,
                };
                NodeHold {
                    node,
                    sent,
                    received: self.history.now(),
                    pttl,
                }
            }
        });
        let nodes = join_all(reads).await;
        self.history.record(Event::NodesRead {
            client: client.to_owned(),
            token,
            at,
            valid_until,
            quorum: self.quorum,
            nodes,
        });
    }

    pub(super) async fn close(self) {
        for redis in self.nodes.iter().flatten() {
            raw::close(redis, self.timeout).await;
        }
    }
}

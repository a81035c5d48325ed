//! The observer: samples every scenario key on every node, straight to the node (never
//! through the clients' fault proxies), so the checker can see who removed or extended a
//! token and when.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fred::prelude::{ClientLike, Config, LuaInterface, ServerConfig};
use redlock_core::layout::{REENTRANT_HOLD_PREFIX, REENTRANT_OWNER_FIELD};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::checker::{Observation, REENTRANT};
use crate::history::History;

/// Time between two samples of one node: short against the 0.5-1 s TTLs of the scenarios, so
/// a removal is pinned to a window of a few milliseconds.
const EVERY: Duration = Duration::from_millis(5);
/// The value and PTTL in one atomic step: done as two commands, a key replaced in between
/// would pair one holder's token with the next holder's expiry. A reentrant lock's hash is
/// read as its owner (`reentrant:{owner}`, never a token) and the tokens of its holds.
///
/// `ARGV` is [`SAMPLE_ARGS`]: the owner's mark in a sample ([`REENTRANT`]), then the hash's
/// owner field and hold prefix as the library stores them ([`redlock_core::layout`]).
const SAMPLE: &str = r#"local mark, owner_field, hold_prefix = ARGV[1], ARGV[2], ARGV[3]
local kind = redis.call('TYPE', KEYS[1]).ok
local pttl = redis.call('PTTL', KEYS[1])
if kind == 'hash' then
  local holds = {}
  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(field, 1, #hold_prefix) == hold_prefix then
      holds[#holds + 1] = string.sub(field, #hold_prefix + 1)
    end
  end
  return {mark .. (redis.call('HGET', KEYS[1], owner_field) or ''), pttl, holds}
end
if kind == 'string' then return {redis.call('GET', KEYS[1]), pttl, {}} end
return {false, pttl, {}}"#;
/// [`SAMPLE`]'s `ARGV`.
const SAMPLE_ARGS: [&str; 3] = [REENTRANT, REENTRANT_OWNER_FIELD, REENTRANT_HOLD_PREFIX];
/// A sample that takes longer (paused or dead node) is skipped.
const SAMPLE_TIMEOUT: Duration = Duration::from_millis(50);

/// A running observer. [`Observer::stop`] ends it and returns the samples.
#[derive(Debug)]
pub struct Observer {
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    samples: Samples,
}

/// The samples taken so far, shared with the scenario's driver so that its schedule can wait
/// for what the checker needs to have seen (a new holder's token on the nodes, a sample taken
/// after a fault) instead of sleeping and hoping the 5 ms sampling caught it. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    taken: Arc<Mutex<Vec<Observation>>>,
    added: Arc<Notify>,
}

impl Samples {
    fn push(&self, observation: Observation) {
        self.taken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(observation);
        self.added.notify_waiters();
    }

    fn take(&self) -> Vec<Observation> {
        std::mem::take(&mut *self.taken.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Waits until a sample that `wanted` accepts has been taken (one taken before the call
    /// counts) and returns it, or `None` after `within`.
    pub async fn wait_for(
        &self,
        within: Duration,
        wanted: impl Fn(&Observation) -> bool,
    ) -> Option<Observation> {
        let deadline = Instant::now() + within;
        let mut scanned = 0;
        loop {
            // Registered before the scan, so a sample pushed between the scan and the wait
            // still wakes this waiter.
            let added = self.added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            {
                let taken = self.taken.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(found) = taken
                    .get(scanned..)
                    .unwrap_or_default()
                    .iter()
                    .find(|o| wanted(o))
                {
                    return Some(found.clone());
                }
                scanned = taken.len();
            }
            if tokio::time::timeout_at(deadline, added).await.is_err() {
                return None;
            }
        }
    }
}

impl Observer {
    /// Starts sampling `keys` on each node in `nodes` (index order).
    pub fn start(history: &History, nodes: &[SocketAddr], keys: &[String]) -> Observer {
        let (stop, stopped) = watch::channel(false);
        let samples = Samples::default();
        let tasks = nodes
            .iter()
            .enumerate()
            .map(|(node, addr)| {
                let task = Sampler {
                    node,
                    addr: *addr,
                    keys: keys.to_vec(),
                    history: history.clone(),
                    samples: samples.clone(),
                };
                tokio::spawn(task.run(stopped.clone()))
            })
            .collect();
        Observer {
            stop,
            tasks,
            samples,
        }
    }

    /// The samples taken so far, as they come.
    pub fn samples(&self) -> Samples {
        self.samples.clone()
    }

    /// Stops sampling and returns every sample taken.
    pub async fn stop(self) -> Vec<Observation> {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        self.samples.take()
    }
}

struct Sampler {
    node: usize,
    addr: SocketAddr,
    keys: Vec<String>,
    history: History,
    samples: Samples,
}

impl Sampler {
    async fn run(self, mut stopped: watch::Receiver<bool>) {
        let config = Config {
            server: ServerConfig::new_centralized(self.addr.ip().to_string(), self.addr.port()),
            fail_fast: false,
            ..Config::default()
        };
        let Ok(client) = crate::raw::bounded(config, SAMPLE_TIMEOUT).build() else {
            return;
        };
        let task = client.init().await.ok();
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !*stopped.borrow() {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopped.changed() => break,
            }
            for key in &self.keys {
                let sent = self.history.now();
                let read = client.eval::<(Option<String>, i64, Vec<String>), _, _, _>(
                    SAMPLE,
                    vec![key.as_str()],
                    SAMPLE_ARGS.to_vec(),
                );
                let Ok((token, pttl, holds)) = read.await else {
                    continue;
                };
                let received = self.history.now();
                self.samples.push(Observation {
                    node: self.node,
                    key: key.clone(),
                    sent,
                    received,
                    token,
                    pttl,
                    holds,
                });
            }
        }
        let _ = tokio::time::timeout(SAMPLE_TIMEOUT, client.quit()).await;
        if let Some(task) = task {
            task.abort();
        }
    }
}

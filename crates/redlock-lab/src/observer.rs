//! The observer: samples every scenario key on every node, straight to the node (never
//! through the clients' fault proxies), so the checker can see who removed or extended a
//! token and when.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fred::prelude::{Builder, ClientLike, Config, LuaInterface, ReconnectPolicy, ServerConfig};
use tokio::sync::watch;

use crate::checker::Observation;
use crate::history::History;

/// Time between two samples of one node: short against the 0.5-1 s TTLs of the scenarios, so
/// a removal is pinned to a window of a few milliseconds.
const EVERY: Duration = Duration::from_millis(5);
/// GET and PTTL in one atomic step: done as two commands, a key replaced in between would
/// pair one holder's token with the next holder's expiry.
const SAMPLE: &str = "return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}";
/// A sample that takes longer (paused or dead node) is skipped.
const SAMPLE_TIMEOUT: Duration = Duration::from_millis(50);

/// A running observer. [`Observer::stop`] ends it and returns the samples.
#[derive(Debug)]
pub struct Observer {
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    samples: Arc<Mutex<Vec<Observation>>>,
}

impl Observer {
    /// Starts sampling `keys` on each node in `nodes` (index order).
    pub fn start(history: &History, nodes: &[SocketAddr], keys: &[String]) -> Observer {
        let (stop, stopped) = watch::channel(false);
        let samples = Arc::new(Mutex::new(Vec::new()));
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

    /// Stops sampling and returns every sample taken.
    pub async fn stop(self) -> Vec<Observation> {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

struct Sampler {
    node: usize,
    addr: SocketAddr,
    keys: Vec<String>,
    history: History,
    samples: Arc<Mutex<Vec<Observation>>>,
}

impl Sampler {
    async fn run(self, mut stopped: watch::Receiver<bool>) {
        let config = Config {
            server: ServerConfig::new_centralized(self.addr.ip().to_string(), self.addr.port()),
            fail_fast: false,
            ..Config::default()
        };
        let Ok(client) = Builder::from_config(config)
            .with_connection_config(|c| {
                c.connection_timeout = SAMPLE_TIMEOUT;
                c.internal_command_timeout = SAMPLE_TIMEOUT;
                c.max_command_attempts = 1;
            })
            .with_performance_config(|p| p.default_command_timeout = SAMPLE_TIMEOUT)
            .set_policy(ReconnectPolicy::new_constant(0, 20))
            .build()
        else {
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
                let read = client.eval::<(Option<String>, i64), _, _, _>(
                    SAMPLE,
                    vec![key.as_str()],
                    Vec::<String>::new(),
                );
                let Ok((token, pttl)) = read.await else {
                    continue;
                };
                let received = self.history.now();
                self.samples
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Observation {
                        node: self.node,
                        key: key.clone(),
                        sent,
                        received,
                        token,
                        pttl,
                    });
            }
        }
        let _ = tokio::time::timeout(SAMPLE_TIMEOUT, client.quit()).await;
        if let Some(task) = task {
            task.abort();
        }
    }
}

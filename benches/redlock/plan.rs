//! How long each scenario family runs, in the quick and the full mode.

use std::time::Duration;

use redlock_core::DEFAULT_NODE_TIMEOUT;

use crate::latency::Budget;

/// How long each family runs: a few seconds in all for `--quick`, about five minutes for
/// the full run.
pub struct Plan {
    /// P6 cases: locks, node timeout, glibc's `MALLOC_ARENA_MAX` for the case's process
    /// (`None`: the bench's own environment's, by default glibc's, up to eight arenas per
    /// core), and how long they are held. The first is the target's (`--p6-target-only`).
    pub renewal_cases: Vec<(usize, Duration, Option<u32>, Duration)>,
    pub p1: Budget,
    pub p2: Budget,
    pub p3: Budget,
    pub contention_warmup: Duration,
    pub contention_time: Duration,
    pub throughput_warmup: Duration,
    pub throughput_time: Duration,
    pub benchmark_requests: u64,
    /// P10: the masters per member to measure.
    pub scale_shards: Vec<usize>,
}

impl Plan {
    pub fn new(quick: bool) -> Plan {
        let budget = |warmup, cycles, secs| Budget {
            warmup,
            cycles,
            time: Duration::from_secs_f64(secs),
        };
        if quick {
            Plan {
                renewal_cases: vec![(1_000, DEFAULT_NODE_TIMEOUT, None, Duration::from_secs(5))],
                p1: budget(50, 2_000, 0.6),
                p2: budget(20, 1_000, 0.6),
                p3: budget(20, 1_000, 0.6),
                contention_warmup: Duration::from_millis(300),
                contention_time: Duration::from_millis(1500),
                throughput_warmup: Duration::from_millis(300),
                throughput_time: Duration::from_secs(1),
                benchmark_requests: 20_000,
                scale_shards: vec![1],
            }
        } else {
            Plan {
                // The target's 10,000 under the defaults, held five minutes; again for a
                // minute with a node timeout long enough for one batched renewal of all of
                // them, and with one malloc arena: the RSS that glibc's per-thread arenas
                // add while holding, as against what the client keeps.
                renewal_cases: vec![
                    (10_000, DEFAULT_NODE_TIMEOUT, None, Duration::from_secs(300)),
                    (
                        10_000,
                        Duration::from_secs(1),
                        None,
                        Duration::from_secs(60),
                    ),
                    (
                        10_000,
                        DEFAULT_NODE_TIMEOUT,
                        Some(1),
                        Duration::from_secs(60),
                    ),
                ],
                p1: budget(300, 20_000, 3.5),
                p2: budget(100, 20_000, 10.0),
                p3: budget(100, 20_000, 8.0),
                contention_warmup: Duration::from_secs(1),
                contention_time: Duration::from_secs(8),
                throughput_warmup: Duration::from_secs(1),
                throughput_time: Duration::from_secs(5),
                benchmark_requests: 300_000,
                scale_shards: vec![1, 2, 3],
            }
        }
    }
}

//! Cluster members under faults, beside the fault lab's cluster scenarios
//! (`cluster_shard_fails_over`, `cluster_member_cut_off`, `cluster_majority_fails_over`):
//! the lab's demonstration, a majority of members failing over at once without
//! `replica_acks`, run again with `replica_acks = 1`, which refuses the first acquisition
//! instead. Each hold is recorded as its holder saw it, and the fault lab's checker
//! (`overlaps`) looks for two holders inside their validity at once.

use std::sync::Mutex;
use std::time::Duration;

use redlock_core::{Config, Coordinator, Error, Lock};
use redlock_lab::checker::{overlaps, Holder};
use redlock_testkit::{ClusterSet, Failover, NodeSet};
use tokio::time::Instant;

const KEY: &str = "job";

/// The holds of one run, for the fault lab's checker (`overlaps`): who held [`KEY`] with
/// which token, from the return of its acquisition until its release started or its
/// validity ended, whichever came first, in time since the run started.
struct Holds {
    start: Instant,
    list: Mutex<Vec<Holder>>,
}

impl Holds {
    fn new() -> Holds {
        Holds {
            start: Instant::now(),
            list: Mutex::new(Vec::new()),
        }
    }

    /// `at`, as time since the run started.
    fn at(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.start)
    }

    /// Records that `client` held `lock` from `from` until `until` or the end of its
    /// validity, whichever came first.
    fn record(&self, client: usize, lock: &Lock, from: Instant, until: Instant) {
        self.list.lock().unwrap().push(Holder {
            client: format!("client-{client}"),
            token: lock.token().as_str().to_string(),
            key: KEY.to_string(),
            from: self.at(from),
            until: self.at(until.min(lock.valid_until())),
            owner: None,
        });
    }

    fn into_vec(self) -> Vec<Holder> {
        self.list.into_inner().unwrap()
    }
}

/// The checker's control here: it reports holds of two clients that overlap, and neither
/// holds that follow each other nor two holds of one reentrant owner (which share it).
#[test]
fn the_checker_reports_two_holders_at_once_and_nothing_else() {
    let hold = |client: &str, from, until, owner: Option<&str>| Holder {
        client: client.to_string(),
        token: format!("{client}-{from}"),
        key: KEY.to_string(),
        from: Duration::from_millis(from),
        until: Duration::from_millis(until),
        owner: owner.map(str::to_string),
    };
    let overlap = |a, b| overlaps(&[a, b]).len();
    assert_eq!(overlap(hold("a", 0, 10, None), hold("b", 5, 20, None)), 1);
    assert_eq!(overlap(hold("a", 0, 30, None), hold("b", 5, 20, None)), 1);
    assert_eq!(overlap(hold("a", 0, 10, None), hold("b", 10, 20, None)), 0);
    assert_eq!(
        overlap(hold("a", 0, 10, Some("o")), hold("b", 5, 20, Some("o"))),
        0
    );
}

fn config(nodes: Vec<String>, node_timeout: Duration, replica_acks: u32) -> Config {
    Config {
        nodes,
        node_timeout,
        replica_acks,
        ..Default::default()
    }
}

/// Two cluster members of one master and one replica each, and a single server. Both
/// clusters' replication is held back, a first client takes the lock, both replicas take
/// over (`TAKEOVER`), then a second client tries until it is granted. Returns the holds
/// and the first client's error, if it was refused.
async fn a_majority_fails_over(replica_acks: u32) -> (Vec<Holder>, Option<Error>) {
    let (x, y, single) = tokio::join!(
        ClusterSet::start_with_replicas(1, 1),
        ClusterSet::start_with_replicas(1, 1),
        NodeSet::start(1)
    );
    let (x, y, single) = (x.unwrap(), y.unwrap(), single.unwrap());
    let urls = vec![x.url(), y.url(), single.urls().remove(0)];
    let ttl = Duration::from_secs(30);
    let timeout = Duration::from_millis(500);
    let first = Coordinator::connect(config(urls.clone(), timeout, replica_acks))
        .await
        .unwrap();
    x.hold_back_replication(0).await.unwrap();
    y.hold_back_replication(0).await.unwrap();
    let holds = Holds::new();
    let refused = match first.acquire(KEY, ttl).await {
        Ok(lock) => {
            // Held to the end of its validity: it is never released.
            holds.record(0, &lock, Instant::now(), lock.valid_until());
            // The lock is on both masters, and neither replica has it.
            for cluster in [&x, &y] {
                assert_eq!(cluster.master(0).redis().dbsize().await.unwrap(), 1);
                assert_eq!(
                    cluster.replica(0).unwrap().redis().dbsize().await.unwrap(),
                    0
                );
            }
            None
        }
        Err(e) => {
            if let Error::NoQuorum { report } = &e {
                report.settled().await;
            }
            Some(e)
        }
    };
    x.fail_over(0, Failover::Takeover).await.unwrap();
    y.fail_over(0, Failover::Takeover).await.unwrap();
    let second = Coordinator::connect(config(urls, timeout, replica_acks))
        .await
        .unwrap();
    // Until both clusters' old masters have learnt that they were replaced.
    let give_up = Instant::now() + Duration::from_secs(10);
    let lock = loop {
        match second.acquire(KEY, ttl).await {
            Ok(lock) => break lock,
            Err(e) if Instant::now() > give_up => panic!("the second client: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    holds.record(1, &lock, Instant::now(), lock.valid_until());
    (holds.into_vec(), refused)
}

/// Must pass, the same faults with `replica_acks = 1`: no replica acknowledges the first
/// client's acquisition, so neither cluster member's vote counts and it is refused, with
/// the reason; the second client is the only holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acks_the_same_failovers_admit_no_second_holder() {
    let (holds, refused) = a_majority_fails_over(1).await;
    let refused = refused.expect("the first acquisition is refused");
    assert!(
        refused
            .to_string()
            .contains("not acknowledged by enough replicas"),
        "{refused}"
    );
    assert_eq!(holds.len(), 1);
    assert!(overlaps(&holds).is_empty());
}

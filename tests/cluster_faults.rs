//! Cluster members under faults: one member's shard failing over under load, a whole
//! cluster member cut off, and a majority of members failing over at once, with and
//! without `replica_acks`. Each run records every hold as its holder saw it, and the fault
//! lab's checker (`overlaps`) looks for two holders inside their validity at once; the
//! demonstration (a majority failing over without `replica_acks`) is its negative control
//! on real servers.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use redlock_core::{Config, Coordinator, Error, Lock};
use redlock_lab::checker::{overlaps, Holder};
use redlock_testkit::{ClusterSet, Failover, NodeSet};
use tokio::time::Instant;

use common::eventually;

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

/// Takes, holds for a moment and releases [`KEY`] over and over until `until`, recording
/// each hold. Returns how many it took.
async fn contend(
    c: &Coordinator,
    client: usize,
    ttl: Duration,
    until: Instant,
    holds: &Holds,
) -> usize {
    let mut taken = 0;
    while Instant::now() < until {
        match c.acquire(KEY, ttl).await {
            Ok(lock) => {
                let from = Instant::now();
                tokio::time::sleep(Duration::from_millis(10)).await;
                holds.record(client, &lock, from, Instant::now());
                taken += 1;
                // A release that fails (a node failing over) leaves the key to its TTL,
                // which the acquisitions that follow wait out.
                let _ = c.release(&lock).await;
            }
            // A randomized pause, as `redlock-client`'s retries take: with a member cut
            // off, two clients that each won one single server wait out the node timeout
            // together, and would again and again if they retried in step.
            Err(_) => tokio::time::sleep(Duration::from_millis(jitter_ms(40))).await,
        }
    }
    taken
}

/// A random number of milliseconds below `below`.
fn jitter_ms(below: u64) -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(Instant::now()) % below
}

/// Three clients contend for `run_for` while `faults` runs, recording every hold in
/// `holds`.
async fn contend_under<F>(
    urls: Vec<String>,
    replica_acks: u32,
    ttl: Duration,
    run_for: Duration,
    holds: &Holds,
    faults: F,
) where
    F: std::future::Future<Output = ()>,
{
    let mut clients = Vec::new();
    for _ in 0..3 {
        let c = Coordinator::connect(config(
            urls.clone(),
            Duration::from_millis(200),
            replica_acks,
        ));
        clients.push(c.await.unwrap());
    }
    let until = Instant::now() + run_for;
    let contenders = futures::future::join_all(
        clients
            .iter()
            .enumerate()
            .map(|(i, c)| contend(c, i, ttl, until, holds)),
    );
    let (taken, ()) = tokio::join!(contenders, faults);
    assert!(
        taken.iter().all(|&n| n > 0),
        "every client took the lock: {taken:?}"
    );
    for c in &clients {
        c.quiesce().await;
    }
}

/// Whether, within `within`, no key is left on the cluster's masters and no single server
/// holds [`KEY`].
async fn cleared(cluster: &ClusterSet, singles: &NodeSet, within: Duration) -> bool {
    eventually(within, || async {
        cluster.dbsize().await.unwrap() == 0 && singles.nodes_holding(KEY).await.is_empty()
    })
    .await
}

/// Must pass: the shard of one cluster member that serves the key fails over (`FORCE`)
/// while three clients contend, with `replica_acks` on. No two holders at once, and once
/// the TTL has passed no key is left on any member (a release the failover lost leaves
/// its key until then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_failing_over_under_load_with_replica_acks_admits_no_second_holder() {
    let (cluster, singles) = tokio::join!(ClusterSet::start_with_replicas(2, 1), NodeSet::start(2));
    let (cluster, singles) = (cluster.unwrap(), singles.unwrap());
    let mut urls = vec![cluster.url()];
    urls.extend(singles.urls());
    let shard = cluster.shard_of(KEY);
    let promoted = cluster.replica(shard).unwrap().port();
    let ttl = Duration::from_secs(1);
    let holds = Holds::new();
    contend_under(urls, 1, ttl, Duration::from_secs(4), &holds, async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        cluster.fail_over(shard, Failover::Force).await.unwrap();
    })
    .await;
    let holds = holds.into_vec();
    assert_eq!(
        cluster.master(shard).port(),
        promoted,
        "the failover happened"
    );
    let found = overlaps(&holds);
    assert!(found.is_empty(), "two holders at once: {found:?}");
    assert!(
        cleared(&cluster, &singles, ttl * 3).await,
        "a key was left behind"
    );
}

/// Must pass: a whole cluster member is cut off (every process paused) for two seconds while
/// three clients contend: the two single servers carry the quorum on, no two holders are
/// at once, and the acquisitions the cluster runs late, when it comes back, are rolled
/// back: nothing is left, long before the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_member_cut_off_under_load_admits_no_second_holder_and_leaves_nothing() {
    let (cluster, singles) = tokio::join!(ClusterSet::start(2), NodeSet::start(2));
    let (cluster, singles) = (cluster.unwrap(), singles.unwrap());
    let mut urls = vec![cluster.url()];
    urls.extend(singles.urls());
    let cut_off = Mutex::new(None);
    let holds = Holds::new();
    contend_under(
        urls,
        0,
        Duration::from_secs(30),
        Duration::from_secs(4),
        &holds,
        async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            cluster.pause_all().unwrap();
            let from = Instant::now();
            tokio::time::sleep(Duration::from_secs(2)).await;
            cluster.resume_all().unwrap();
            *cut_off.lock().unwrap() = Some((holds.at(from), holds.at(Instant::now())));
        },
    )
    .await;
    let holds = holds.into_vec();
    let found = overlaps(&holds);
    assert!(found.is_empty(), "two holders at once: {found:?}");
    let (from, to) = cut_off.into_inner().unwrap().unwrap();
    assert!(
        holds.iter().any(|h| h.from > from && h.from < to),
        "the single servers carried the quorum while the cluster was cut off"
    );
    // Well under the 30 s TTL: what is left was rolled back, not expired.
    let clean = cleared(&cluster, &singles, Duration::from_secs(5)).await;
    assert!(clean, "a key was left behind");
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

/// The demonstration, and the checker's negative control on real servers: without
/// `replica_acks`, a majority of members failing over at once loses the first holder's
/// lock on both, and the second client is granted it while the first still holds it.
/// Redlock assumes a member keeps what it granted for its TTL (H2); a cluster member keeps
/// that promise through a failover only with `replica_acks`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replica_acks_a_majority_failing_over_admits_a_second_holder() {
    let (holds, refused) = a_majority_fails_over(0).await;
    assert!(refused.is_none(), "{refused:?}");
    let found = overlaps(&holds);
    assert_eq!(
        found.len(),
        1,
        "the checker finds the second holder: {holds:?}"
    );
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

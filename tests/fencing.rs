//! Fencing tokens against real nodes: they strictly increase across acquisitions, clients
//! and kinds of lock, are recorded on a quorum before they are handed out, survive a node
//! that lost its data, and let the resource reject a paused holder's stale write.

mod common;

use std::time::Duration;

use common::{client, coordinator_at, linked, raw};
use fred::prelude::KeysInterface;
use redlock_client::{fenced_set, FencingCounter, FencingToken, LockOptions, Owner};
use redlock_core::{Acquisition, Error as CoreError};
use redlock_testkit::{LinkFault, NodeSet};

const COUNTER: &str = "redlock:fencing-counter";

fn fenced() -> LockOptions {
    LockOptions {
        fenced: Some(true),
        ..Default::default()
    }
}

/// Each node's counter (`None`: the node has none).
async fn counters(set: &NodeSet) -> Vec<Option<u64>> {
    let mut all = Vec::new();
    for node in set.iter() {
        all.push(node.get(COUNTER).await.unwrap().map(|c| c.parse().unwrap()));
    }
    all
}

/// A fenced acquisition of `key` with a 10 s TTL.
fn fenced_of(key: &'static [&'static str; 1]) -> Acquisition<'static> {
    Acquisition {
        fenced: true,
        ..Acquisition::new(key, Duration::from_secs(10))
    }
}

/// A fenced acquisition of `key` by a coordinator whose links to `set` hold every reply
/// back, once its script has run on every node (it read the counters there): heal the
/// links to let it decide. Also a coordinator straight to the nodes, which has seeded
/// every counter with token 1 first.
async fn held_back(
    set: &NodeSet,
    key: &'static [&'static str; 1],
) -> (
    redlock_testkit::Links,
    redlock_core::Coordinator,
    tokio::task::JoinHandle<Result<redlock_core::Lock, CoreError>>,
) {
    let links = linked(set).await;
    let slow = coordinator_at(links.urls(0), Duration::from_secs(5)).await;
    let other = coordinator_at(set.urls(), Duration::from_secs(5)).await;
    let first = other.acquire_with(fenced_of(&["seed"])).await.unwrap();
    assert_eq!(first.fencing_token().map(FencingToken::get), Some(1));
    other.release(&first).await.unwrap();
    other.quiesce().await;
    assert_eq!(counters(set).await, vec![Some(1); set.len()]);

    links.set_client(0, LinkFault::HoldReplies);
    let acquiring = tokio::spawn(async move { slow.acquire_with(fenced_of(key)).await });
    let applied = common::eventually(Duration::from_secs(10), || async {
        set.nodes_holding(key[0]).await.len() == set.len()
    })
    .await;
    assert!(applied, "the held-back acquisition never reached the nodes");
    (links, other, acquiring)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_strictly_increase_across_acquisitions_clients_and_kinds() {
    let set = NodeSet::start(3).await.unwrap();
    let a = client(&set, |b| b.fencing(true)).await;
    let b = client(&set, |b| b).await;
    let mut last: Option<FencingToken> = None;
    let mut check = |token: Option<FencingToken>| {
        let token = token.expect("a fenced lock has a token");
        assert!(
            last.is_none_or(|last| token > last),
            "{token} after {last:?}"
        );
        last = Some(token);
    };
    for _ in 0..5 {
        let guard = a.lock("account:1").await.unwrap();
        check(guard.fencing_token());
        guard.release().await.unwrap();
    }
    // Another client, per call; a lock over several keys; reentrant holds.
    let guard = b.lock_with("account:2", &fenced()).await.unwrap();
    check(guard.fencing_token());
    guard.release().await.unwrap();
    let guard = b.lock_many(&["x", "y"], &fenced()).await.unwrap();
    check(guard.fencing_token());
    guard.release().await.unwrap();
    let owner = Owner::new();
    let outer = b.lock_reentrant("nested", &owner, &fenced()).await.unwrap();
    check(outer.fencing_token());
    let inner = b.lock_reentrant("nested", &owner, &fenced()).await.unwrap();
    check(inner.fencing_token());
    inner.release().await.unwrap();
    outer.release().await.unwrap();
    // Plain locks are not fenced, and extensions keep the token.
    let plain = b.lock("plain").await.unwrap();
    assert_eq!(plain.fencing_token(), None);
    plain.release().await.unwrap();
    let guard = a.lock("kept").await.unwrap();
    let token = guard.fencing_token();
    guard.extend(None).await.unwrap();
    assert_eq!(guard.fencing_token(), token);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_recorded_on_a_quorum_before_it_is_handed_out() {
    let set = NodeSet::start(5).await.unwrap();
    let c = client(&set, |b| b.fencing(true)).await;
    let guard = c.lock("recorded").await.unwrap();
    let token = guard.fencing_token().unwrap().get();
    let recorded = counters(&set)
        .await
        .into_iter()
        .filter(|c| *c >= Some(token))
        .count();
    assert!(recorded >= 3, "recorded on {recorded} of 5 nodes");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_counter_is_not_counted_until_it_is_repaired() {
    let (logs, _capture) = common::logs::capture(tracing_subscriber::filter::LevelFilter::WARN);
    let set = NodeSet::start(3).await.unwrap();
    let links = linked(&set).await;
    let core = coordinator_at(links.urls(0), Duration::from_millis(1000)).await;
    let acquisition = || Acquisition {
        fenced: true,
        ..Acquisition::new(&["redlock:k"], Duration::from_secs(5))
    };
    let mut last = 0;
    for _ in 0..4 {
        let lock = core.acquire_with(acquisition()).await.unwrap();
        last = lock.fencing_token().unwrap().get();
        core.release(&lock).await.unwrap();
    }
    core.quiesce().await;
    // Node 0 loses everything; the others keep the counter. Node 2 answers late, so every
    // round is decided by node 0 (no counter) and node 1 (one counter, less than a quorum
    // of counters): the acquisition must not trust node 0's silence, and must not give up
    // either while node 2, which has a counter, is still to answer.
    set.node(0).flushall().await.unwrap();
    links.set_node(
        2,
        LinkFault::Latency {
            to_server: Duration::from_millis(100),
            to_client: Duration::from_millis(100),
        },
    );
    for _ in 0..3 {
        let lock = core.acquire_with(acquisition()).await.unwrap();
        let token = lock.fencing_token().unwrap().get();
        assert_eq!(token, last + 1);
        last = token;
        core.release(&lock).await.unwrap();
    }
    core.quiesce().await;
    // No write-back gave node 0 a counter again (see the stale-token tests below): the
    // repair did, in the background (tests/fencing_repair.rs), and the first acquisition
    // that found it without one said so, once.
    let repaired = common::eventually(Duration::from_secs(10), || async {
        counters(&set).await == vec![Some(last); 3]
    })
    .await;
    assert!(repaired, "{:?}", counters(&set).await);
    let warning = "the node has no intact fencing counter";
    assert_eq!(logs.count(warning), 1, "{}", logs.text());
    let node = &links.urls(0)[0];
    assert!(
        logs.text()
            .lines()
            .any(|l| l.contains(warning) && l.contains(node.as_str())),
        "{}",
        logs.text()
    );
    assert!(set.nodes_holding("redlock:k").await.is_empty());
    // Two nodes without a counter beside one that has it: no token (the quorum lost its
    // data), whatever order they answer in.
    links.heal_all();
    set.node(0).flushall().await.unwrap();
    set.node(1).flushall().await.unwrap();
    match core.acquire_with(acquisition()).await {
        Err(
            e @ CoreError::FencingCountersLost {
                seeded: 1,
                missing: 2,
                ..
            },
        ) => {
            // Which nodes have none, by name.
            let message = e.to_string();
            let urls = links.urls(0);
            assert!(
                message.contains(&format!("have none ({}, {})", urls[0], urls[1])),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    core.quiesce().await;
    assert!(set.nodes_holding("redlock:k").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_key_cannot_be_the_fencing_counter() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    let err = c.lock("fencing-counter").await.unwrap_err();
    assert!(err.to_string().contains("reserved"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_stale_write_is_rejected_by_the_fenced_resource() {
    let set = NodeSet::start(3).await.unwrap();
    // The protected value lives on a Redis of its own.
    let store = NodeSet::start(1).await.unwrap();
    let resource = raw(&store.node(0).url()).await;
    let ttl = Duration::from_millis(600);
    let c = client(&set, |b| b.ttl(ttl).no_renewal().fencing(true)).await;

    let first = c.lock("ledger").await.unwrap();
    let stale = first.fencing_token().unwrap();
    // The first holder stalls past its validity (a GC pause, SIGSTOP)...
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    assert!(!first.is_valid());
    // ...a second holder takes the lock and writes...
    let second = c.lock("ledger").await.unwrap();
    let fresh = second.fencing_token().unwrap();
    assert!(fresh > stale);
    assert!(fenced_set(&resource, "ledger", "second", fresh)
        .await
        .unwrap());
    // ...and the first one wakes up and writes: the resource rejects it.
    assert!(!fenced_set(&resource, "ledger", "first", stale)
        .await
        .unwrap());
    let value: Option<String> = resource.get("ledger").await.unwrap();
    assert_eq!(value.as_deref(), Some("second"));
    // The holder may write again with its own token.
    assert!(fenced_set(&resource, "ledger", "second again", fresh)
        .await
        .unwrap());
    second.release().await.unwrap();
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_stale_update_is_rejected_by_postgres() {
    let set = NodeSet::start(3).await.unwrap();
    let postgres = redlock_testkit::Postgres::start().await.unwrap();
    let db = postgres.client().await.unwrap();
    db.batch_execute(
        "CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL, \
         fence BIGINT NOT NULL DEFAULT 0); INSERT INTO accounts (id, balance) VALUES (1, 0);",
    )
    .await
    .unwrap();
    let ttl = Duration::from_millis(600);
    let c = client(&set, |b| b.ttl(ttl).no_renewal().fencing(true)).await;
    let update = |balance: i64, token: FencingToken| {
        let db = &db;
        async move {
            db.execute(
                redlock_client::FENCED_UPDATE_SQL,
                &[&balance, &1i32, &(token.get() as i64)],
            )
            .await
            .unwrap()
        }
    };

    let first = c.lock("account:1").await.unwrap();
    let stale = first.fencing_token().unwrap();
    assert_eq!(update(10, stale).await, 1, "the holder writes while valid");
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let second = c.lock("account:1").await.unwrap();
    let fresh = second.fencing_token().unwrap();
    assert_eq!(update(20, fresh).await, 1);
    assert_eq!(
        update(30, stale).await,
        0,
        "the stale update must be rejected"
    );
    let row = db
        .query_one("SELECT balance, fence FROM accounts WHERE id = 1", &[])
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1)),
        (20, fresh.get() as i64)
    );
    second.release().await.unwrap();
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_is_handed_out_once_the_lock_expired_during_the_write_back() {
    let set = NodeSet::start(3).await.unwrap();
    let links = linked(&set).await;
    let core = coordinator_at(links.urls(0), Duration::from_millis(250)).await;
    // Every round now takes about 200 ms: the acquisition of a 300 ms lock still wins
    // (about 95 ms left), and the validity runs out during the token's write-back.
    for node in 0..set.len() {
        links.set_node(
            node,
            LinkFault::Latency {
                to_server: Duration::from_millis(100),
                to_client: Duration::from_millis(100),
            },
        );
    }
    let keys = ["late-token"];
    let result = core
        .acquire_with(Acquisition {
            fenced: true,
            ..Acquisition::new(&keys, Duration::from_millis(300))
        })
        .await;
    match result {
        Err(CoreError::NotFenced { reason, .. }) => {
            assert!(reason.contains("validity ran out"), "{reason}")
        }
        other => panic!("a token for an expired lock: {other:?}"),
    }
    core.quiesce().await;
    links.heal_all();
    assert!(set.nodes_holding("late-token").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_locks_on_many_keys_leave_one_counter_per_node_and_nothing_else() {
    let stamp = format!("{COUNTER}:run");
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.fencing(true)).await;
    for i in 0..50 {
        let guard = c.lock(&format!("resource:{i}")).await.unwrap();
        guard.release().await.unwrap();
    }
    c.shutdown().await;
    for node in set.iter() {
        let mut keys = node.keys("*").await.unwrap();
        keys.sort();
        // The counter and its stamp (the server run that wrote it).
        assert_eq!(keys, [COUNTER, stamp.as_str()]);
    }
}

/// A quorum that lost its counters beside a node that kept one gets no token: starting
/// again would go below tokens handed out. Only an operator can mend it, so the error says
/// so (`FencingCountersLost`, not the "retry" of `NotFenced`), `lock` returns it at once
/// instead of retrying until its wait ran out, and raising the counters mends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_that_lost_its_counters_gets_no_token_until_an_operator_raises_them() {
    use redlock_client::{Error, RetryPolicy};

    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| {
        b.fencing(true).retry(RetryPolicy {
            max_wait: Some(Duration::from_secs(30)),
            ..Default::default()
        })
    })
    .await;
    for _ in 0..3 {
        let guard = c.lock("k").await.unwrap();
        guard.release().await.unwrap();
    }
    c.coordinator().quiesce().await;
    // A quorum restarts empty; node 2 keeps counter 3.
    set.node(0).flushall().await.unwrap();
    set.node(1).flushall().await.unwrap();
    let keys = ["redlock:k"];
    for _ in 0..3 {
        match c
            .coordinator()
            .acquire_with(Acquisition {
                fenced: true,
                ..Acquisition::new(&keys, Duration::from_secs(2))
            })
            .await
        {
            Err(e @ CoreError::FencingCountersLost { .. }) => {
                assert!(e.to_string().contains("redlock fence --raise-to"), "{e}")
            }
            other => panic!("token handed out after a quorum lost its counters: {other:?}"),
        }
    }
    // The client does not retry it for its 30 s (that would end in `DeadlinePassed`).
    match c.lock("k").await {
        Err(Error::Round(CoreError::FencingCountersLost { .. })) => {}
        other => panic!("{other:?}"),
    }
    c.coordinator().quiesce().await;
    assert!(set.nodes_holding("redlock:k").await.is_empty());
    assert_eq!(counters(&set).await, [None, None, Some(3)]);
    // What an operator sees, and the repair.
    let seen = c.coordinator().fencing_counters().await;
    assert!(seen.lost && seen.next.is_none(), "{seen:?}");
    let values: Vec<_> = seen.nodes.iter().map(|(_, c)| c.clone()).collect();
    assert_eq!(
        values,
        [
            FencingCounter::Missing,
            FencingCounter::Missing,
            FencingCounter::At(3)
        ]
    );
    // 0 and values past 2^53 (scripts compare numbers as doubles) are refused.
    for wrong in [0, redlock_core::MAX_FENCING_COUNTER + 1] {
        match c.coordinator().raise_fencing_counters(wrong).await {
            Err(CoreError::Argument(redlock_core::ArgumentError::FencingCounter { value })) => {
                assert_eq!(value, wrong)
            }
            other => panic!("{other:?}"),
        }
    }
    let raised = c.coordinator().raise_fencing_counters(3).await.unwrap();
    assert!(!raised.lost, "{raised:?}");
    assert_eq!(raised.next.map(FencingToken::get), Some(4));
    assert_eq!(counters(&set).await, [Some(3); 3]);
    let guard = c.lock("k").await.unwrap();
    assert_eq!(guard.fencing_token().map(FencingToken::get), Some(4));
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_acquisition_dropped_during_the_write_back_leaves_no_key() {
    let set = NodeSet::start(3).await.unwrap();
    let links = linked(&set).await;
    let core = coordinator_at(links.urls(0), Duration::from_secs(5)).await;
    // The acquisition's SETs reach the nodes; their replies are held back.
    links.set_client(0, LinkFault::HoldReplies);
    let acquiring = tokio::spawn({
        let core = core.clone();
        async move {
            let keys = ["dropped-while-fenced"];
            core.acquire_with(Acquisition {
                fenced: true,
                ..Acquisition::new(&keys, Duration::from_secs(30))
            })
            .await
        }
    });
    let set_everywhere = common::eventually(Duration::from_secs(5), || async {
        set.nodes_holding("dropped-while-fenced").await.len() == 3
    })
    .await;
    assert!(
        set_everywhere,
        "the acquisition's SETs did not reach the nodes"
    );
    // The held replies arrive now and win the round; the token's write-back that follows
    // gets its replies two seconds late. The acquisition is dropped in between.
    links.set_client(
        0,
        LinkFault::Latency {
            to_server: Duration::ZERO,
            to_client: Duration::from_secs(2),
        },
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    acquiring.abort();
    assert!(
        acquiring.await.unwrap_err().is_cancelled(),
        "the acquisition ended before it was dropped"
    );
    // The won lock is released in the background, long before its 30 s TTL.
    let gone = common::eventually(Duration::from_secs(5), || async {
        set.nodes_holding("dropped-while-fenced").await.is_empty()
    })
    .await;
    links.heal_all();
    assert!(gone, "a dropped fenced acquisition left its key behind");
}

/// Two fenced acquisitions never get the same token, even when one read the counters
/// before the other recorded its token: here the first one's `SET`s and counter reads
/// reach the nodes, their replies are held back while another client takes a fenced lock
/// of another key (the counters go up by one), and only then does the first one decide.
/// It read the old counters, so it computes the same token; its write-back used to be
/// acknowledged anyway (a counter already at the token was "recorded"), and both held that
/// token, so that a resource rejecting only lower tokens would have taken the older
/// holder's late writes. Now a write-back acknowledges only a counter it raised, and the
/// acquisition goes above the counters it found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_recorded_by_another_acquisition_meanwhile_is_not_handed_out_twice() {
    let set = NodeSet::start(3).await.unwrap();
    let (links, other, acquiring) = held_back(&set, &["older"]).await;
    let newer = other.acquire_with(fenced_of(&["newer"])).await.unwrap();
    links.heal_all();
    let older = acquiring
        .await
        .unwrap()
        .expect("the held-back acquisition wins");

    let (older, newer) = (older.fencing_token(), newer.fencing_token());
    assert_ne!(older, newer, "two holders with one fencing token");
    assert!(older > newer, "{older:?} recorded after {newer:?}");
    assert_eq!(
        counters(&set).await,
        vec![older.map(FencingToken::get); set.len()]
    );
}

/// A node that loses its data between a fenced acquisition's read of the counters and its
/// write-back is not seeded by that write-back, nor counted as a node that recorded the
/// token (no acquisition's write-back seeds a node without a counter). Here the acquisition read 1 everywhere; meanwhile tokens 2 and 3 were recorded on
/// nodes 0 and 1 (node 2 missed them), and node 1 lost its data. Its write-back of 2 used
/// to seed node 1 with 2 and raise node 2 to 2: a quorum, and token 2 handed out a second
/// time (and later a 3 again, from nodes 1 and 2). Now node 1 is left alone, node 0 is
/// ahead, and the acquisition goes above 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_counter_after_the_read_does_not_record_the_stale_token() {
    let set = NodeSet::start(3).await.unwrap();
    // The slow acquisition's script runs everywhere (it reads 1 on every node); its
    // answers are held back.
    let (links, other, acquiring) = held_back(&set, &["stale"]).await;
    // Tokens 2 and 3 recorded on nodes 0 and 1 (and handed out); node 2 missed them.
    for node in [0, 1] {
        set.node(node).set(COUNTER, "3", None).await.unwrap();
    }
    // Node 1 restarts without persistence.
    set.node(1).flushall().await.unwrap();
    links.heal_all();
    let stale = acquiring
        .await
        .unwrap()
        .expect("the held-back acquisition wins on nodes 0 and 2");
    let token = stale.fencing_token().unwrap().get();
    assert!(token > 3, "token {token} after 3 was handed out");
    lost_or_repaired(&counters(&set).await, token);
    // Node 1 gets no counter from later write-backs; tokens go on up with nodes 0 and 2,
    // and the operator's raise restores node 1 (as the repair does, in the background).
    let next = other.acquire_with(fenced_of(&["next"])).await.unwrap();
    let next = next.fencing_token().unwrap().get();
    assert!(next > token, "{next} after {token}");
    other.quiesce().await;
    lost_or_repaired(&counters(&set).await, next);
    other.raise_fencing_counters(next).await.unwrap();
    assert_eq!(counters(&set).await, vec![Some(next); 3]);
}

/// Nodes 0 and 2 at `token`; node 1, which lost its counter, still without one, or with the
/// one a repair gave it back since (the highest of the others: `token`). Never a lower one.
fn lost_or_repaired(counters: &[Option<u64>], token: u64) {
    assert_eq!(
        (counters[0], counters[2]),
        (Some(token), Some(token)),
        "{counters:?}"
    );
    assert!(
        counters[1].is_none() || counters[1] == Some(token),
        "{counters:?}"
    );
}

/// A brand-new node set's first fenced acquisition while another one's first write-back is
/// on its way: it reads one node seeded and two not, which is also how a quorum that lost
/// its counters looks, and it used to give up (`NotFenced`). It now reads again a few
/// times before it says the counters are lost, and gets the next token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_node_sets_fenced_acquisition_during_the_first_write_back_gets_a_token() {
    let set = NodeSet::start(3).await.unwrap();
    // `a` reaches node 0 at once and nodes 1 and 2 100 ms each way; `b` reaches all at once.
    let links = linked(&set).await;
    for node in [1, 2] {
        links.set_node(
            node,
            LinkFault::Latency {
                to_server: Duration::from_millis(100),
                to_client: Duration::from_millis(100),
            },
        );
    }
    let a = coordinator_at(links.urls(0), Duration::from_secs(2)).await;
    let b = common::coordinator(&set, Duration::from_secs(2)).await;
    let acquisition = |key| Acquisition {
        fenced: true,
        ..Acquisition::new(std::slice::from_ref(key), Duration::from_secs(10))
    };
    let first = tokio::spawn({
        let a = a.clone();
        async move { a.acquire_with(acquisition(&"first")).await }
    });
    // `a`'s write-back of token 1 has reached node 0, not yet nodes 1 and 2.
    let seeded = common::eventually(Duration::from_secs(5), || async {
        counters(&set).await[0].is_some()
    })
    .await;
    assert!(seeded, "the first write-back never reached node 0");
    let second = b.acquire_with(acquisition(&"second")).await;
    let first = first.await.unwrap();
    let tokens = [&first, &second].map(|r| match r {
        Ok(lock) => lock.fencing_token().unwrap().get(),
        Err(e) => panic!("{e}"),
    });
    assert_eq!(tokens, [1, 2]);
}

/// Fenced acquisitions of distinct keys started at once (one counter for all of them) each
/// get a token of their own: a write-back that finds its token taken goes above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_fenced_acquisitions_of_distinct_keys_all_get_distinct_tokens() {
    let set = NodeSet::start(3).await.unwrap();
    let a = common::coordinator(&set, Duration::from_secs(2)).await;
    let b = common::coordinator(&set, Duration::from_secs(2)).await;
    // Counters on every node first: a new node set's first tokens are the next test's.
    let seed = a
        .acquire_with(Acquisition {
            fenced: true,
            ..Acquisition::new(&["seed"], Duration::from_secs(10))
        })
        .await
        .unwrap();
    a.release(&seed).await.unwrap();
    let keys: Vec<String> = (0..16).map(|i| format!("distinct:{i}")).collect();
    let acquisitions = keys.iter().enumerate().map(|(i, key)| {
        let core = if i % 2 == 0 { a.clone() } else { b.clone() };
        async move {
            core.acquire_with(Acquisition {
                fenced: true,
                ..Acquisition::new(&[key.as_str()], Duration::from_secs(10))
            })
            .await
        }
    });
    let locks: Vec<_> = futures::future::join_all(acquisitions)
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("every fenced acquisition gets a token");
    let mut tokens: Vec<u64> = locks
        .iter()
        .map(|lock| lock.fencing_token().unwrap().get())
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), keys.len(), "shared tokens: {tokens:?}");
    let highest = *tokens.last().unwrap();
    assert_eq!(counters(&set).await, vec![Some(highest); set.len()]);
}

/// `fenced_set` sends its write once, whatever the resource client's
/// `max_command_attempts`: with fred's default of 3 and a reconnect policy, a write in
/// flight when its connection dropped was replayed after the reconnect, where (same
/// token, so accepted) it could land after the holder's later writes. Counted on the
/// server: the script ran twice before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_in_flight_when_its_connection_drops_is_not_replayed() {
    use fred::prelude::ClientLike;
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.fencing(true)).await;
    let guard = c.lock("replayed").await.unwrap();
    let token = guard.fencing_token().unwrap();
    let links = linked(&set).await;
    let config = fred::types::config::Config::from_url(&links.urls(0)[0]).unwrap();
    let resource = fred::types::Builder::from_config(config)
        .set_policy(fred::types::config::ReconnectPolicy::new_constant(0, 50))
        .build()
        .unwrap();
    resource.init().await.unwrap();
    let node = set.iter().next().unwrap();
    let before = node.command_calls("eval").await.unwrap();
    links.set_client(0, LinkFault::DropReplies);
    let write = tokio::spawn({
        let resource = resource.clone();
        async move { fenced_set(&resource, "replayed:value", "v1", token).await }
    });
    assert!(
        common::eventually(Duration::from_secs(10), || async {
            node.command_calls("eval").await.unwrap() > before
        })
        .await,
        "the write never reached the server"
    );
    // The reply is lost; lifting the fault resets the connection, and fred reconnects.
    links.heal_all();
    let written = tokio::time::timeout(Duration::from_secs(10), write)
        .await
        .expect("the write ended")
        .unwrap();
    assert!(written.is_err(), "no reply came, yet: {written:?}");
    // Time for a replay to arrive, had there been one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(node.command_calls("eval").await.unwrap(), before + 1);
    resource.quit().await.unwrap();
    guard.release().await.unwrap();
    c.shutdown().await;
}

/// A node whose counter was set past 2^53 (by hand, or by another program) is counted as
/// one that did not answer: tokens still come from the others' counters and strictly
/// increase from them. The nodes' scripts count in doubles, which above 2^53 cannot tell
/// one number from the next: counting that node used to hand out tokens past it (here
/// 10^17 + 1, + 9, + 24), which the nodes compared and read back rounded, and no raise could
/// bring the node set back below them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_set_past_the_maximum_on_one_node_is_not_counted() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.fencing(true)).await;
    for node in set.iter() {
        node.set(COUNTER, "5", None).await.unwrap();
    }
    // 10^17, exact as a double, past 2^53.
    let far = 100_000_000_000_000_000_u64;
    set.node(0)
        .set(COUNTER, &far.to_string(), None)
        .await
        .unwrap();
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let guard = c.lock("k").await.unwrap();
        tokens.push(guard.fencing_token().unwrap().get());
        guard.release().await.unwrap();
    }
    assert_eq!(tokens, [6, 7, 8]);
    let seen = c.coordinator().fencing_counters().await;
    assert_eq!(seen.nodes[0].1, FencingCounter::OutOfRange(far), "{seen:?}");
    assert_eq!(seen.next.map(FencingToken::get), Some(9));
    // The raise ignores it (a raise to it would hand out tokens the scripts cannot tell
    // apart) and cannot lower it: the operator sets or deletes it by hand.
    let raised = c.coordinator().raise_fencing_counters(20).await.unwrap();
    assert_eq!(raised.next.map(FencingToken::get), Some(21));
    c.coordinator().quiesce().await;
    assert!(set.nodes_holding("redlock:k").await.is_empty());
}

/// A fenced acquisition after the counters reached 2^53 (the most an operator may raise them
/// to) gets no token and writes none: it used to write 2^53 + 2 (2^53 + 1 reads as 2^53 in
/// the nodes' doubles), which put every counter out of range, so that no later acquisition
/// could get a token and only a hand edit of every node mended it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_is_written_past_the_highest_counter() {
    let set = NodeSet::start(3).await.unwrap();
    let core = common::coordinator(&set, Duration::from_secs(1)).await;
    let max = redlock_core::MAX_FENCING_COUNTER;
    core.raise_fencing_counters(max).await.unwrap();
    let acquisition = Acquisition {
        fenced: true,
        ..Acquisition::new(&["past-max"], Duration::from_secs(10))
    };
    match core.acquire_with(acquisition).await {
        Err(CoreError::NotFenced { reason, .. }) => assert!(reason.contains("2^53"), "{reason}"),
        other => panic!("{other:?}"),
    }
    core.quiesce().await;
    assert_eq!(counters(&set).await, vec![Some(max); 3]);
    assert!(set.nodes_holding("past-max").await.is_empty());
}

/// A counter set by hand beyond what Redis can answer as an integer (`1e19`, `inf`) reads
/// as out of range, not as "no counter": Redis turned it into a negative integer, so a
/// node set without counters but for it started tokens at 1, below that counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_beyond_an_integer_reads_as_out_of_range_not_as_missing() {
    let set = NodeSet::start(3).await.unwrap();
    let core = common::coordinator(&set, Duration::from_secs(1)).await;
    for value in ["1e19", "inf", "-3"] {
        set.node(0).set(COUNTER, value, None).await.unwrap();
        let read = core.fencing_counters().await;
        assert!(
            matches!(read.nodes[0].1, FencingCounter::OutOfRange(_)),
            "{value}: {read:?}"
        );
        assert_eq!(read.next, None, "{value}");
        let acquisition = Acquisition {
            fenced: true,
            deadline: Some(tokio::time::Instant::now() + Duration::from_millis(300)),
            ..Acquisition::new(&["beyond"], Duration::from_secs(10))
        };
        match core.acquire_with(acquisition).await {
            Err(CoreError::NotFenced { .. }) => {}
            other => panic!("{value}: {other:?}"),
        }
    }
    core.quiesce().await;
    assert!(set.nodes_holding("beyond").await.is_empty());
}

//! The read-write lock over the quorum (`Coordinator::acquire_rw`) against real
//! redis-server processes: readers share, a writer is alone, a waiting writer's intent
//! holds new readers back, a reader's hold ends by itself and is never brought back.

mod common;

use std::time::Duration;

use common::{client, coordinator, raw};
use fred::prelude::ClientLike;
use fred::types::{CustomCommand, Value};
use redlock_client::{Error as ClientError, LockOptions};
use redlock_core::support::FairPlace;
use redlock_core::{ArgumentError, Error, RwAcquisition};
use redlock_testkit::NodeSet;

const TTL: Duration = Duration::from_secs(10);
const WRITE: &str = "redlock:rwlock-{doc}:write";
const READ: &str = "redlock:rwlock-{doc}:read";
const INTENT: &str = "redlock:rwlock-{doc}:intent";

fn read() -> RwAcquisition<'static> {
    RwAcquisition::read("doc", TTL)
}

fn write() -> RwAcquisition<'static> {
    RwAcquisition::write("doc", TTL)
}

/// The readers' entries on the node at `url`: each token, then its score.
async fn readers_on(url: &str) -> Vec<String> {
    let node = raw(url).await;
    let reply: Value = node
        .custom(
            CustomCommand::new_static("ZRANGE", None, false),
            vec![
                READ.to_string(),
                "0".into(),
                "-1".into(),
                "WITHSCORES".into(),
            ],
        )
        .await
        .unwrap();
    node.quit().await.unwrap();
    reply.convert().unwrap()
}

/// Every key on every node, sorted.
async fn keys(set: &NodeSet) -> Vec<Vec<String>> {
    let mut nodes = Vec::new();
    for node in set.nodes() {
        let mut keys = node.keys("*").await.unwrap();
        keys.sort();
        nodes.push(keys);
    }
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_is_alone() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let first = c.acquire_rw(read()).await.unwrap();
    let second = c.acquire_rw(read()).await.unwrap();
    assert_eq!(first.key(), READ);
    assert!(first.is_valid() && second.is_valid());
    // Readers keep the writer out, and its refused round leaves nothing.
    let err = c.acquire_rw(write()).await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    c.quiesce().await;
    for node_keys in keys(&set).await {
        assert_eq!(node_keys, [READ]);
    }
    c.release(&first).await.unwrap().settled().await;
    assert!(c.acquire_rw(write()).await.is_err(), "one reader is left");
    c.release(&second).await.unwrap().settled().await;
    c.quiesce().await;
    assert!(
        keys(&set).await.iter().all(Vec::is_empty),
        "the last reader takes the set"
    );
    // A writer keeps readers and other writers out.
    let writer = c.acquire_rw(write()).await.unwrap();
    assert_eq!(writer.key(), WRITE);
    assert!(c.acquire_rw(read()).await.is_err());
    assert!(c.acquire_rw(write()).await.is_err());
    let extended = c.extend(&writer, Duration::from_secs(60)).await.unwrap();
    c.release(&extended).await.unwrap().settled().await;
    let reader = c.acquire_rw(read()).await.unwrap();
    c.release(&reader).await.unwrap().settled().await;
    c.quiesce().await;
    let left = keys(&set).await;
    assert!(left.iter().all(Vec::is_empty), "{left:?}");
}

/// A writer refused by readers leaves its intent: new readers wait for it, the readers in
/// finish, and the writer's next round wins and takes its intent back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writers_intent_holds_new_readers_back() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let reader = c.acquire_rw(read()).await.unwrap();
    // A writer without an id leaves no intent (the negative control): readers come in.
    assert!(c.acquire_rw(write()).await.is_err());
    let another = c.acquire_rw(read()).await.unwrap();
    c.release(&another).await.unwrap().settled().await;
    let writer = || RwAcquisition {
        writer: Some(("writer-1", Duration::from_secs(30))),
        ..write()
    };
    assert!(c.acquire_rw(writer()).await.is_err());
    for node in set.nodes() {
        assert_eq!(node.get(INTENT).await.unwrap().as_deref(), Some("writer-1"));
    }
    let err = c.acquire_rw(read()).await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    c.release(&reader).await.unwrap().settled().await;
    let won = c.acquire_rw(writer()).await.unwrap();
    c.quiesce().await;
    for node in set.nodes() {
        assert_eq!(
            node.get(INTENT).await.unwrap(),
            None,
            "the winner's intent is gone"
        );
    }
    c.release(&won).await.unwrap().settled().await;
    // A writer that gives up takes its intent back.
    let reader = c.acquire_rw(read()).await.unwrap();
    assert!(c.acquire_rw(writer()).await.is_err());
    c.leave_write_intent("doc", "writer-1").await.unwrap();
    c.quiesce().await;
    let other_reader = c.acquire_rw(read()).await.unwrap();
    for held in [&reader, &other_reader] {
        c.release(held).await.unwrap().settled().await;
    }
    c.quiesce().await;
    let left = keys(&set).await;
    assert!(left.iter().all(Vec::is_empty), "{left:?}");
}

/// A crashed reader frees its share after its TTL, though other readers keep the set
/// alive; its extension then fails and never brings it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readers_hold_ends_by_itself_and_is_never_brought_back() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let short = c
        .acquire_rw(RwAcquisition::read("doc", Duration::from_millis(600)))
        .await
        .unwrap();
    let long = c.acquire_rw(read()).await.unwrap();
    // The long reader's extension lengthens its own entry, not the short one's.
    let long = c.extend(&long, Duration::from_secs(60)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let err = c.extend(&short, TTL).await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    c.quiesce().await;
    // The short reader's entry may wait for a trim, but its end stayed where it was: nearly
    // a minute before the long reader's.
    for url in set.urls() {
        let entries = readers_on(&url).await;
        let end = |token: &str| -> Option<u64> {
            let at = entries.iter().position(|e| e == token)?;
            entries[at + 1].parse().ok()
        };
        let long_end = end(long.token().as_str()).expect("the long reader's entry");
        if let Some(short_end) = end(short.token().as_str()) {
            assert!(short_end + 50_000 < long_end, "{entries:?}");
        }
    }
    // The expired reader keeps no writer out; the live one does.
    assert!(c.acquire_rw(write()).await.is_err());
    c.release(&long).await.unwrap().settled().await;
    let writer = c.acquire_rw(write()).await.unwrap();
    c.release(&writer).await.unwrap().settled().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_writer_gets_a_token_and_bad_input_sends_nothing() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let fenced = |write| RwAcquisition {
        fenced: true,
        ..if write { self::write() } else { read() }
    };
    let w1 = c.acquire_rw(fenced(true)).await.unwrap();
    let t1 = w1.fencing_token().expect("a fenced writer has a token");
    c.release(&w1).await.unwrap().settled().await;
    let r = c.acquire_rw(fenced(false)).await.unwrap();
    assert_eq!(r.fencing_token(), None, "readers get no token");
    c.release(&r).await.unwrap().settled().await;
    let w2 = c.acquire_rw(fenced(true)).await.unwrap();
    assert!(w2.fencing_token().unwrap() > t1);
    c.release(&w2).await.unwrap().settled().await;
    c.quiesce().await;

    let err = c
        .acquire_rw(RwAcquisition::read("", TTL))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Argument(ArgumentError::EmptyKey)),
        "{err}"
    );
    let err = c.acquire(WRITE, TTL).await.unwrap_err();
    assert!(
        matches!(err, Error::Argument(ArgumentError::ReservedKey { .. })),
        "{err}"
    );
    for node_keys in keys(&set).await {
        assert!(
            node_keys
                .iter()
                .all(|k| k.starts_with("redlock:fencing-counter")),
            "{node_keys:?}"
        );
    }
}

/// Readers and writers at once from several tasks: a writer never shares the lock, with a
/// reader or another writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_never_overlaps_another_holder() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let set = NodeSet::start(3).await.unwrap();
    // A second per node: on a loaded machine every release must still reach its quorum.
    let c = coordinator(&set, Duration::from_secs(1)).await;
    let (readers, writers) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (wrote, reads) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let (c, readers, writers) = (c.clone(), readers.clone(), writers.clone());
            let (wrote, reads) = (wrote.clone(), reads.clone());
            tokio::spawn(async move {
                let id = format!("writer-{i}");
                for round in 0..15 {
                    let write = (i + round) % 3 == 0;
                    // A fresh token for each attempt, as the client's are.
                    let what = || {
                        if write {
                            RwAcquisition {
                                writer: Some((&id, Duration::from_millis(50))),
                                ..self::write()
                            }
                        } else {
                            read()
                        }
                    };
                    // Retried until won, as a client would, within a bound.
                    let mut lock = None;
                    for _ in 0..2_000 {
                        if let Ok(won) = c.acquire_rw(what()).await {
                            lock = Some(won);
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    let lock = lock.expect("a holder within 2,000 attempts");
                    let (mine, other) = if write {
                        (&writers, &readers)
                    } else {
                        (&readers, &writers)
                    };
                    let now = mine.fetch_add(1, Ordering::SeqCst) + 1;
                    assert_eq!(other.load(Ordering::SeqCst), 0, "a reader with a writer");
                    if write {
                        assert_eq!(now, 1, "two writers");
                        wrote.fetch_add(1, Ordering::SeqCst);
                    } else {
                        reads.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    mine.fetch_sub(1, Ordering::SeqCst);
                    c.release(&lock).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert!(wrote.load(Ordering::SeqCst) > 0, "no writer got in");
    assert!(reads.load(Ordering::SeqCst) > 0, "no reader got in");
    // A writer whose last attempt lost leaves its intent until it takes it back.
    for i in 0..6 {
        c.leave_write_intent("doc", &format!("writer-{i}"))
            .await
            .unwrap();
    }
    c.quiesce().await;
    let left = keys(&set).await;
    assert!(left.iter().all(Vec::is_empty), "{left:?}");
}

/// The client's read-write lock: readers share and are renewed, a writer is alone, an
/// owner that reads may not write, and a writer's intent goes with its call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_rwlock_shares_reads_and_refuses_an_upgrade() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.ttl(Duration::from_millis(600))).await;
    let doc = c.rwlock("doc").unwrap();
    let other = c.rwlock("doc").unwrap();
    let first = doc.read().await.unwrap();
    let second = other.try_read().await.unwrap();
    assert_eq!(first.key(), READ);
    // An owner that reads may not write: nothing is sent.
    let err = doc.write().await.unwrap_err();
    assert!(
        matches!(&err, ClientError::InvalidArgument(ArgumentError::Upgrade { name }) if name == "doc"),
        "{err}"
    );
    // Another owner is refused while readers hold it; its intent goes with its call.
    let third = c.rwlock("doc").unwrap();
    let err = third.try_write().await.unwrap_err();
    assert!(matches!(err, ClientError::NotAcquired { .. }), "{err}");
    c.coordinator().quiesce().await;
    for node in set.nodes() {
        assert_eq!(node.get(INTENT).await.unwrap(), None);
    }
    // Readers are renewed past their TTL, each by its own entry, and a quorum says so.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(first.is_valid() && second.is_valid());
    assert!(first.check().await.unwrap() && second.check().await.unwrap());
    let inspection = c.coordinator().inspect(READ).await.unwrap();
    assert_eq!(inspection.held, Some(true));
    first.release().await.unwrap();
    drop(second);
    let writing = doc.write().await.unwrap();
    assert_eq!(writing.key(), WRITE);
    assert!(writing.check().await.unwrap());
    assert_eq!(
        c.coordinator().inspect(READ).await.unwrap().held,
        Some(false),
        "no reader is left"
    );
    assert!(matches!(
        other.try_read().await.unwrap_err(),
        ClientError::NotAcquired { .. }
    ));
    writing.release().await.unwrap();
    c.coordinator().quiesce().await;
    assert!(keys(&set).await.iter().all(Vec::is_empty));
}

/// A writer waiting for readers is woken by the last reader's release, not by its
/// backoff; a fenced writer's guard carries a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_is_woken_by_the_last_readers_release() {
    let set = NodeSet::start(3).await.unwrap();
    let readers = client(&set, |b| b).await;
    let writers = client(&set, |b| b.fencing(true)).await;
    let reading = readers.rwlock("doc").unwrap().read().await.unwrap();
    let options = LockOptions {
        retry: Some(common::slow_retry()),
        ..Default::default()
    };
    let doc = writers.rwlock("doc").unwrap();
    let waiting = tokio::spawn(async move { doc.write_with(&options).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    reading.release().await.unwrap();
    let writing = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("woken before the backoff ran out")
        .unwrap()
        .unwrap();
    assert_eq!(writing.attempts(), 2);
    assert!(writing.fencing_token().is_some());
    writing.release().await.unwrap();
}

/// A fair reader's or writer's acquisition with a place in the lock's one queue.
fn fair(waiter: &'static str, ticket: u64, write: bool) -> RwAcquisition<'static> {
    let place = FairPlace {
        waiter,
        ticket,
        patience: Duration::from_secs(30),
        handover: None,
    };
    let side = if write {
        RwAcquisition {
            writer: Some((waiter, Duration::from_secs(30))),
            ..self::write()
        }
    } else {
        read()
    };
    RwAcquisition {
        fair: Some(place),
        ..side
    }
}

/// The fair queue of a read-write lock: writers go one at a time in the order they came,
/// readers that came before a waiting writer share the lock, and a reader that came after
/// one waits for it, even where the lock is free; a writer whose turn has not come takes
/// its intent back; each win leaves the queue, and nothing is left at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fair_queue_lets_writers_go_in_order_and_readers_between_them_share() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let lost = |result: Result<redlock_core::Lock, Error>| match result {
        Err(Error::NoQuorum { .. }) => {}
        other => panic!("not the waiter's turn, yet {other:?}"),
    };
    // A place the queue cannot take is a typed error, and nothing is sent.
    let bad = RwAcquisition {
        fair: Some(FairPlace {
            patience: Duration::ZERO,
            ..fair("r1", 1, false).fair.unwrap()
        }),
        ..read()
    };
    let err = c.acquire_rw(bad).await.unwrap_err();
    assert!(
        matches!(err, Error::Argument(ArgumentError::FairPlace { .. })),
        "{err}"
    );
    assert!(keys(&set).await.iter().all(Vec::is_empty));
    // A writer outside the queue holds the lock: the waiters queue in this order.
    let holder = c.acquire_rw(write()).await.unwrap();
    for (waiter, ticket, write) in [("r1", 1, false), ("w1", 2, true), ("r2", 3, false)] {
        lost(c.acquire_rw(fair(waiter, ticket, write)).await);
    }
    lost(c.acquire_rw(fair("w2", 4, true)).await);
    c.release(&holder).await.unwrap().settled().await;
    // The lock is free, but w1 came after r1, and r2 after the waiting w1.
    lost(c.acquire_rw(fair("w1", 2, true)).await);
    lost(c.acquire_rw(fair("r2", 3, false)).await);
    // (The negative control: outside the queue, a writer takes the free lock at once.)
    let outside = c.acquire_rw(write()).await.unwrap();
    c.release(&outside).await.unwrap().settled().await;
    let r1 = c.acquire_rw(fair("r1", 1, false)).await.unwrap();
    // w1 heads the queue now: r1 refuses it, and it leaves its intent.
    lost(c.acquire_rw(fair("w1", 2, true)).await);
    for node in set.nodes() {
        assert_eq!(node.get(INTENT).await.unwrap().as_deref(), Some("w1"));
    }
    // A reader older than w1 that comes now is ahead of it, so w1's turn is gone: its
    // next attempt takes its intent back, and the older reader shares with r1.
    lost(c.acquire_rw(fair("r0", 0, false)).await);
    lost(c.acquire_rw(fair("w1", 2, true)).await);
    for node in set.nodes() {
        assert_eq!(node.get(INTENT).await.unwrap(), None);
    }
    let r0 = c.acquire_rw(fair("r0", 0, false)).await.unwrap();
    lost(c.acquire_rw(fair("r2", 3, false)).await);
    for reader in [&r0, &r1] {
        c.release(reader).await.unwrap().settled().await;
    }
    // w2 waits behind w1, r2 behind w1 still.
    lost(c.acquire_rw(fair("w2", 4, true)).await);
    let w1 = c.acquire_rw(fair("w1", 2, true)).await.unwrap();
    c.release(&w1).await.unwrap().settled().await;
    lost(c.acquire_rw(fair("w2", 4, true)).await);
    let r2 = c.acquire_rw(fair("r2", 3, false)).await.unwrap();
    c.release(&r2).await.unwrap().settled().await;
    let w2 = c.acquire_rw(fair("w2", 4, true)).await.unwrap();
    c.release(&w2).await.unwrap().settled().await;
    c.quiesce().await;
    let left = keys(&set).await;
    assert!(left.iter().all(Vec::is_empty), "{left:?}");
}

/// The client's fair read-write lock, end to end: a fair writer that came after a fair
/// reader waits for that reader's release, and a fair reader that came after the writer
/// waits for the writer's, each woken by a release or the turn passed on; nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_fair_rwlock_takes_turns_in_order() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.fair(true)).await;
    let holder = c.rwlock("doc").unwrap().write().await.unwrap();
    let options = LockOptions {
        retry: Some(common::slow_retry()),
        ..Default::default()
    };
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut calls = Vec::new();
    for (who, write) in [("reader-1", false), ("writer", true), ("reader-2", false)] {
        let (doc, options, order) = (c.rwlock("doc").unwrap(), options.clone(), order.clone());
        calls.push(tokio::spawn(async move {
            let guard = if write {
                doc.write_with(&options).await
            } else {
                doc.read_with(&options).await
            }
            .unwrap();
            order.lock().unwrap().push(format!("{who} in"));
            tokio::time::sleep(Duration::from_millis(300)).await;
            order.lock().unwrap().push(format!("{who} out"));
            guard.release().await.unwrap();
        }));
        // Each call queues before the next comes.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    holder.release().await.unwrap();
    for call in calls {
        tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("each waiter is woken in its turn")
            .unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order,
        [
            "reader-1 in",
            "reader-1 out",
            "writer in",
            "writer out",
            "reader-2 in",
            "reader-2 out"
        ]
    );
    c.coordinator().quiesce().await;
    let left = keys(&set).await;
    assert!(left.iter().all(Vec::is_empty), "{left:?}");
}

/// A fair waiter that dies holds its place only for its patience: the waiter behind it is
/// let in once the entry has expired on the nodes, and the queue's keys go with the patience.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_fair_writer_holds_the_queue_only_for_its_patience() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    // The client gives a writer's intent the queue's patience too.
    let short = |waiter, ticket, write| {
        let mut side = fair(waiter, ticket, write);
        let patience = Duration::from_millis(300);
        side.fair = side.fair.map(|place| FairPlace { patience, ..place });
        side.writer = side.writer.map(|(id, _)| (id, patience));
        side
    };
    let holder = c.acquire_rw(write()).await.unwrap();
    // "dead" queues first, then never comes back.
    assert!(c.acquire_rw(short("dead", 1, true)).await.is_err());
    assert!(c.acquire_rw(short("reader", 2, false)).await.is_err());
    c.release(&holder).await.unwrap().settled().await;
    assert!(
        c.acquire_rw(short("reader", 2, false)).await.is_err(),
        "behind the dead writer, while its entry lives"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let reader = c.acquire_rw(short("reader", 2, false)).await.unwrap();
    c.release(&reader).await.unwrap().settled().await;
    c.quiesce().await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let left = keys(&set).await;
    assert!(left.iter().all(Vec::is_empty), "{left:?}");
}

/// A fenced writer in the fair queue gets its token as any fenced writer does, in its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_writer_in_the_fair_queue_gets_its_token_in_its_turn() {
    let set = NodeSet::start(3).await.unwrap();
    let c = coordinator(&set, redlock_core::DEFAULT_NODE_TIMEOUT).await;
    let fenced = |waiter, ticket| RwAcquisition {
        fenced: true,
        ..fair(waiter, ticket, true)
    };
    let first = c.acquire_rw(fenced("w1", 1)).await.unwrap();
    let t1 = first.fencing_token().expect("fenced");
    for (waiter, ticket) in [("w2", 2), ("w3", 3)] {
        let err = c.acquire_rw(fenced(waiter, ticket)).await.unwrap_err();
        assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    }
    c.release(&first).await.unwrap().settled().await;
    let err = c.acquire_rw(fenced("w3", 3)).await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "w2's turn: {err}");
    let second = c.acquire_rw(fenced("w2", 2)).await.unwrap();
    assert!(second.fencing_token().expect("fenced") > t1);
    c.release(&second).await.unwrap().settled().await;
}

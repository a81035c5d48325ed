//! Fair hand-off across clients: the waiter queue per key on every node (`fair`).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{client, eventually, raw};
use fred::prelude::{ClientLike, HashesInterface, KeysInterface, LuaInterface};
use fred::types::{CustomCommand, Value};
use redlock_client::{Error, LockOptions, Redlock, RetryPolicy};
use redlock_core::support::FairPlace;
use redlock_core::{Acquisition, ArgumentError, Token};
use redlock_testkit::NodeSet;

const QUEUE: &str = "redlock:fair-queue:{redlock:job}";

/// A fair client: notifications on, a short backoff, patience 2 × 50 ms + 4 × 200 ms.
async fn fair_client(set: &NodeSet) -> Redlock {
    client(set, |b| b.fair(true)).await
}

/// How many waiters the queue of `redlock:job` holds on each node.
async fn queue_lengths(set: &NodeSet) -> Vec<i64> {
    queue_lengths_on(set, set.len()).await
}

/// [`queue_lengths`] on the first `up` nodes only (the others are down).
async fn queue_lengths_on(set: &NodeSet, up: usize) -> Vec<i64> {
    let mut lengths = Vec::new();
    for node in set.iter().take(up) {
        let r = raw(&node.url()).await;
        let reply: Value = r
            .custom(
                CustomCommand::new_static("ZCARD", None, false),
                vec![QUEUE.to_string()],
            )
            .await
            .unwrap();
        r.quit().await.unwrap();
        lengths.push(reply.as_i64().unwrap_or(-1));
    }
    lengths
}

/// Waits until `n` waiters are queued on every node.
async fn queued_everywhere(set: &NodeSet, n: i64) {
    queued_on(set, set.len(), n).await;
}

/// Waits until `n` waiters are queued on each of the first `up` nodes.
async fn queued_on(set: &NodeSet, up: usize, n: i64) {
    let ok = eventually(Duration::from_secs(10), || async {
        queue_lengths_on(set, up).await.iter().all(|&len| len == n)
    })
    .await;
    assert!(ok, "expected {n} queued waiters on each live node");
}

/// A holder takes `redlock:job`; `waiters` separate clients start waiting one after the
/// other (each once the one before it is queued on the first `up` nodes, so their tickets
/// are in this order); the holder releases. Returns the order in which they got the lock.
async fn arrival_order(set: &NodeSet, up: usize, waiters: usize) -> Vec<usize> {
    let holder = fair_client(set).await;
    let guard = holder.lock("job").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..waiters {
        let c = fair_client(set).await;
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let g = c.lock("job").await.unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await.unwrap();
            c.shutdown().await;
        }));
        queued_on(set, up, i as i64 + 1).await;
        // Tickets are wall-clock milliseconds: keep the next one strictly later.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    guard.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    holder.shutdown().await;
    let order = order.lock().unwrap().clone();
    order
}

/// Asserts that no key under the default prefix is left on any node, naming those that are.
async fn no_keys_left(set: &NodeSet) {
    let left = keys_left(set).await;
    assert!(left.is_empty(), "keys left behind: {left:?}");
}

/// Every key under the default prefix on every node: locks and queues (not the fencing
/// counter and its stamp, which outlive every lock by design).
async fn keys_left(set: &NodeSet) -> Vec<String> {
    let mut keys = Vec::new();
    for node in set.iter() {
        keys.extend(node.redis().keys("redlock:*").await.unwrap());
    }
    // The fencing counter and its companions (its stamp, a repair's marker).
    keys.retain(|key| !key.starts_with("redlock:fencing-counter"));
    keys
}

/// Starts `n` clients, configured by `tweak`, that each wait for `redlock:job`, one after
/// the other (each once the one before it is queued on every node), and release it once
/// they hold it. Returns the clients and their waits.
async fn queue_waiters(
    set: &NodeSet,
    n: i64,
    tweak: impl Fn(redlock_client::LockConfigBuilder) -> redlock_client::LockConfigBuilder,
) -> (Vec<Redlock>, Vec<tokio::task::JoinHandle<()>>) {
    let mut clients = Vec::new();
    let mut waiting = Vec::new();
    for i in 0..n {
        let c = client(set, &tweak).await;
        let waiter = c.clone();
        waiting.push(tokio::spawn(async move {
            let g = waiter.lock("job").await.unwrap();
            g.release().await.unwrap();
        }));
        clients.push(c);
        queued_everywhere(set, i + 1).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (clients, waiting)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_separate_clients_get_the_lock_in_arrival_order() {
    let set = NodeSet::start(3).await.unwrap();
    assert_eq!(arrival_order(&set, 3, 4).await, [0, 1, 2, 3]);
    no_keys_left(&set).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_releasing_holder_cannot_take_the_lock_back_while_another_waits() {
    // The waiter sleeps a long backoff and hears no release (notifications off), so only
    // the queue stands between the releasing holder and the lock.
    for fair in [true, false] {
        let set = NodeSet::start(3).await.unwrap();
        let slow = |b: redlock_client::LockConfigBuilder| {
            b.fair(fair)
                .notify(false)
                .backoff(Duration::from_secs(2), Duration::from_secs(2))
        };
        let holder = client(&set, slow).await;
        let waiter = client(&set, slow).await;
        let guard = holder.lock("job").await.unwrap();
        let waiting = tokio::spawn(async move { waiter.lock("job").await.map(|g| g.attempts()) });
        if fair {
            queued_everywhere(&set, 1).await;
        } else {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        guard.release().await.unwrap();
        let again = holder.try_lock("job").await;
        if fair {
            let err = again.expect_err("the queue keeps the holder out");
            assert!(
                matches!(err, Error::NotAcquired { attempts: 1, .. }),
                "{err}"
            );
            // Its first attempt was refused (the key was held); a later one won (the next,
            // unless a slow machine timed a node out).
            let attempts = waiting.await.unwrap().unwrap();
            assert!(attempts >= 2, "won at attempt {attempts}");
        } else {
            // The negative control: without the queue the holder takes the lock straight
            // back, and the waiter gets it only after that hold.
            let g = again.expect("without a queue the holder barges in");
            g.release().await.unwrap();
            assert!(waiting.await.unwrap().is_ok());
        }
        holder.shutdown().await;
        no_keys_left(&set).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_waiter_holds_up_the_queue_only_for_its_patience() {
    let set = NodeSet::start(3).await.unwrap();
    let holder = fair_client(&set).await;
    let guard = holder.lock("job").await.unwrap();
    // A waiter that queues with the oldest ticket and then never comes back: the core does
    // not leave the queue by itself, as a crashed process would not.
    let core = common::coordinator(&set, Duration::from_millis(200)).await;
    let keys = ["redlock:job"];
    let crashed = Acquisition {
        fair: Some(FairPlace {
            waiter: "crashed",
            ticket: 1,
            patience: Duration::from_millis(800),
            handover: None,
        }),
        ..Acquisition::new(&keys, Duration::from_secs(2))
    };
    assert!(core.acquire_with(crashed).await.is_err());
    queued_everywhere(&set, 1).await;
    guard.release().await.unwrap();
    // The next waiter is not the head until the crashed one's entry expires, then wins.
    let next = fair_client(&set).await;
    let g = next.lock("job").await.unwrap();
    assert!(
        g.attempts() > 1,
        "won at once past a live head: {}",
        g.attempts()
    );
    g.release().await.unwrap();
    next.shutdown().await;
    holder.shutdown().await;
    core.close().await;
    // The crashed entry is dropped by the next script on each node after its expiry. On a
    // node whose expiry came a moment after the winning round (the crashed waiter's script
    // ran a little later there), the round was refused and the winner's leave drops it;
    // a node where even that came first keeps it until the queue's keys expire, within
    // the patience.
    let gone = eventually(Duration::from_secs(2), || async {
        keys_left(&set).await.is_empty()
    })
    .await;
    assert!(gone, "keys left behind: {:?}", keys_left(&set).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_or_are_cancelled_leave_the_queue() {
    // Fair waiters queue from their first attempt; the others from their second, only to be
    // woken: both leave.
    for fair in [true, false] {
        waiters_leave_the_queue(fair).await;
    }
}

async fn waiters_leave_the_queue(fair: bool) {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b.fair(fair)).await;
    let guard = c.lock("job").await.unwrap();
    let short = LockOptions {
        retry: Some(RetryPolicy {
            max_wait: Some(Duration::from_millis(150)),
            // Several attempts: a waiter that is not fair queues from its second.
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_millis(20),
            ..RetryPolicy::default()
        }),
        ..Default::default()
    };
    let other = client(&set, |b| b.fair(fair)).await;
    assert!(other.lock_with("job", &short).await.is_err());
    other.coordinator().quiesce().await;
    assert_eq!(queue_lengths(&set).await, [0, 0, 0], "gave up");
    let cancelled = tokio::time::timeout(Duration::from_millis(100), other.lock("job")).await;
    assert!(cancelled.is_err());
    other.coordinator().quiesce().await;
    assert_eq!(queue_lengths(&set).await, [0, 0, 0], "cancelled");
    // A try_lock is one attempt: it leaves too.
    assert!(other.try_lock("job").await.is_err());
    other.coordinator().quiesce().await;
    assert_eq!(queue_lengths(&set).await, [0, 0, 0], "try_lock");
    guard.release().await.unwrap();
    other.shutdown().await;
    c.shutdown().await;
    no_keys_left(&set).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_holds_with_a_node_down() {
    let set = NodeSet::start(3).await.unwrap();
    set.node(2).kill().unwrap();
    assert_eq!(arrival_order(&set, 2, 3).await, [0, 1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_takes_every_shape_of_lock_and_reserves_its_keys() {
    let set = NodeSet::start(3).await.unwrap();
    let c = fair_client(&set).await;
    let fair = LockOptions {
        fair: Some(true),
        ..Default::default()
    };
    // Every shape queues: several keys, fenced, reentrant.
    c.lock_many(&["a", "b"], &fair)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let fenced = LockOptions {
        fenced: Some(true),
        ..fair.clone()
    };
    let g = c.lock_with("job", &fenced).await.unwrap();
    assert!(g.fencing_token().is_some());
    g.release().await.unwrap();
    let owner = redlock_client::Owner::new();
    c.lock_reentrant("job", &owner, &fair)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let err = c.lock("fair-queue:x").await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument(ArgumentError::ReservedKey { .. })
        ),
        "{err}"
    );
    let core = common::coordinator(&set, Duration::from_millis(200)).await;
    let keys = ["redlock:job"];
    let empty = Acquisition {
        token: Token::random(),
        fair: Some(FairPlace {
            waiter: "",
            ticket: 1,
            patience: Duration::from_secs(1),
            handover: None,
        }),
        ..Acquisition::new(&keys, Duration::from_secs(2))
    };
    assert!(matches!(
        core.acquire_with(empty).await,
        Err(redlock_core::Error::Argument(
            ArgumentError::FairPlace { .. }
        ))
    ));
    c.shutdown().await;
    core.close().await;
    no_keys_left(&set).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_the_client_of_the_next_waiter() {
    let set = NodeSet::start(3).await.unwrap();
    // Waiters sleep 2 s between attempts unless woken: within that time only a wake-up
    // makes them try again.
    let slow = |b: redlock_client::LockConfigBuilder| {
        b.fair(true)
            .backoff(Duration::from_secs(2), Duration::from_secs(2))
    };
    let holder = client(&set, slow).await;
    let guard = holder.lock("job").await.unwrap();
    let mut clients = Vec::new();
    let mut waiting = Vec::new();
    for i in 0..4 {
        let c = client(&set, slow).await;
        let waiter = c.clone();
        waiting.push(tokio::spawn(
            async move { waiter.lock("job").await.unwrap() },
        ));
        clients.push(c);
        queued_everywhere(&set, i + 1).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    common::subscribed(&set, 5).await;
    let before = set.node(0).command_calls("evalsha").await.unwrap();
    let release = guard.release().await.unwrap();
    let first = waiting.remove(0);
    let g = first.await.unwrap();
    // On a loaded machine node 0 may not answer the release within the node timeout; it is
    // then sent again (up to three tries), which is not a wake-up.
    let resent = if release.settled().await.nodes[0].cleanup.is_some() {
        3
    } else {
        0
    };
    let calls = set.node(0).command_calls("evalsha").await.unwrap() - before;
    // The head's attempt was the only round the release set off: the release itself, the
    // head's acquisition, and the head leaving the queue on the nodes that had not answered
    // when it won (the round is decided at the quorum). Waking every client would add an
    // attempt per other waiter. (Attempts before the release are not counted: a wake-up
    // subscriber that connects late wakes its client's waiters once, which is allowed.)
    assert!(
        calls <= 3 + resent,
        "the other waiters ran rounds too: {calls} scripts"
    );
    g.release().await.unwrap();
    // The others get their turns (within their 2 s backoff only through wake-ups).
    for w in waiting {
        w.await.unwrap().release().await.unwrap();
    }
    for c in clients {
        c.shutdown().await;
    }
    holder.shutdown().await;
}

/// A raw subscriber to node `url`'s release channel of the default prefix and to every
/// client's own channel under it (`redlock:released:<tag>`).
async fn release_listener(
    url: &str,
) -> (
    fred::clients::SubscriberClient,
    tokio::sync::broadcast::Receiver<fred::types::Message>,
) {
    use fred::interfaces::{EventInterface, PubsubInterface};
    let config = fred::types::config::Config::from_url(url).unwrap();
    let sub = fred::types::Builder::from_config(config)
        .build_subscriber_client()
        .unwrap();
    sub.init().await.unwrap();
    let rx = sub.message_rx();
    sub.subscribe("redlock:released").await.unwrap();
    sub.psubscribe("redlock:released:*").await.unwrap();
    // Subscribed once the node counts the pattern (only this listener subscribes to one),
    // which it does after the channel: sent on the same connection, in that order.
    let r = raw(url).await;
    let counted = eventually(Duration::from_secs(10), || async {
        let reply: Value = r
            .custom(
                CustomCommand::new_static("PUBSUB", None, false),
                vec!["NUMPAT".to_string()],
            )
            .await
            .unwrap();
        reply.as_i64().unwrap_or(0) >= 1
    })
    .await;
    assert!(counted, "the listener did not subscribe");
    r.quit().await.unwrap();
    (sub, rx)
}

/// The messages `messages` receives until it has `n` of them, or 10 s passed, then any that
/// come within the next 100 ms (which a test expecting exactly `n` must not get).
async fn hear(
    messages: &mut tokio::sync::broadcast::Receiver<fred::types::Message>,
    n: usize,
) -> Vec<(String, String)> {
    let mut heard = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while heard.len() < n {
        match tokio::time::timeout_at(deadline, messages.recv()).await {
            Ok(Ok(m)) => heard.push((m.channel.to_string(), m.value.as_string().unwrap())),
            _ => break,
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    while let Ok(m) = messages.try_recv() {
        heard.push((m.channel.to_string(), m.value.as_string().unwrap()));
    }
    heard
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fair_a_release_is_announced_only_to_the_oldest_queued_waiters_client() {
    announced_only_to_the_oldest_queued_waiters_client(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_waiters_queue_too_and_a_release_is_announced_only_to_the_oldest_ones_client() {
    announced_only_to_the_oldest_queued_waiters_client(true).await;
}

async fn announced_only_to_the_oldest_queued_waiters_client(fencing: bool) {
    let set = NodeSet::start(3).await.unwrap();
    // Not fair: each waiter queues from its second attempt (every 10 ms at most) only to
    // be woken.
    let quick = move |b: redlock_client::LockConfigBuilder| {
        b.backoff(Duration::from_millis(10), Duration::from_millis(10))
            .fencing(fencing)
    };
    let holder = client(&set, quick).await;
    let guard = holder.lock("job").await.unwrap();
    let (clients, waiting) = queue_waiters(&set, 3, quick).await;
    let (listener, mut messages) = release_listener(&set.node(0).url()).await;
    guard.release().await.unwrap();
    // The holder's release, heard on node 0: once, on the channel of the client whose
    // waiter heads the queue, naming that waiter; never on the channel every client hears.
    let heard = tokio::time::timeout(Duration::from_secs(5), messages.recv())
        .await
        .expect("the release is announced")
        .unwrap();
    let channel = heard.channel.to_string();
    let text = heard.value.as_string().unwrap();
    assert!(
        channel.starts_with("redlock:released:") && text.contains('\t'),
        "announced on {channel}: {text:?}"
    );
    for w in waiting {
        w.await.unwrap();
    }
    for c in clients {
        c.shutdown().await;
    }
    // Each waiter's release but the last found another waiter queued, and the last one
    // found the queue empty: none went to every client.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut shared = 0;
    while let Ok(m) = messages.try_recv() {
        if m.channel == "redlock:released" {
            shared += 1;
        }
    }
    assert_eq!(shared, 0, "releases announced to every client");
    listener.quit().await.unwrap();
    holder.shutdown().await;
    no_keys_left(&set).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_run_no_rounds_while_they_wait_for_their_turn() {
    let set = NodeSet::start(3).await.unwrap();
    let holder = client(&set, |b| b).await;
    let held = LockOptions {
        ttl: Some(Duration::from_secs(30)),
        renew: Some(false),
        ..Default::default()
    };
    let guard = holder.lock_with("job", &held).await.unwrap();
    // Fair waiters whose backoff starts at 10 ms: without wake-ups they would try about
    // every 10, 20, 40, ... ms. With them, every 10 s (their TTL is 30 s).
    let patient = |b: redlock_client::LockConfigBuilder| {
        b.fair(true)
            .ttl(Duration::from_secs(30))
            .backoff(Duration::from_millis(10), Duration::from_secs(10))
            .max_wait(Duration::from_secs(60))
    };
    let (clients, waiting) = queue_waiters(&set, 2, patient).await;
    common::subscribed(&set, 3).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    // With every subscriber up, they wait to be told that their turn came: at most one
    // attempt each that was already due, in a second.
    let before = set.node(0).command_calls("evalsha").await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let calls = set.node(0).command_calls("evalsha").await.unwrap() - before;
    assert!(calls <= 2, "{calls} refused rounds while the key was held");
    // Each is woken in its turn.
    guard.release().await.unwrap();
    for w in waiting {
        tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .expect("woken in turn")
            .unwrap();
    }
    for c in clients {
        c.shutdown().await;
    }
    holder.shutdown().await;
    no_keys_left(&set).await;
}

/// A fair client whose waiters, with their subscribers up, try again only every 10 s unless
/// woken (a TTL of 30 s: not within half of it); the key `redlock:job` held by the core;
/// a head "gone" queued behind it that will not try again by itself (the test acts for
/// it); and one of the client's waiters queued behind that head. Returns the client, its
/// core, the held lock, the head's attempt and the waiter's call.
async fn a_head_and_a_waiter_behind_it(
    set: &NodeSet,
) -> (
    Redlock,
    redlock_core::Coordinator,
    redlock_core::Lock,
    Acquisition<'static>,
    tokio::task::JoinHandle<Result<redlock_client::LockGuard, redlock_client::Error>>,
) {
    let c = client(set, |b| {
        b.fair(true)
            .ttl(Duration::from_secs(30))
            .backoff(Duration::from_millis(10), Duration::from_secs(10))
            .max_wait(Duration::from_secs(60))
    })
    .await;
    common::subscribed(set, 1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let core = c.coordinator().clone();
    let held = core
        .acquire("redlock:job", Duration::from_secs(30))
        .await
        .unwrap();
    let attempt = Acquisition {
        fair: Some(FairPlace {
            waiter: "gone",
            ticket: 1,
            patience: Duration::from_secs(60),
            handover: None,
        }),
        ..Acquisition::new(&["redlock:job"], Duration::from_secs(5))
    };
    assert!(core.acquire_with(attempt.clone()).await.is_err());
    let waiter = c.clone();
    let waiting = tokio::spawn(async move { waiter.lock("job").await });
    queued_everywhere(set, 2).await;
    (c, core, held, attempt, waiting)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_that_leaves_while_the_key_is_free_wakes_the_next_waiter() {
    let set = NodeSet::start(3).await.unwrap();
    let (c, core, held, _, waiting) = a_head_and_a_waiter_behind_it(&set).await;
    // The release names the head, whose client is not there: nobody is woken.
    core.release(&held).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the waiter behind the head took the key"
    );
    // The head leaves while the key is free: the leave tells the next waiter.
    the_heads_leave_wakes_the_waiter(&set, c, &core, waiting).await;
}

/// A head whose round took the key and was then abandoned (its call cancelled while the
/// round was out): the winning script took it out of the queue, the abandoned round's
/// rollback freed the key without putting it back (and tells nobody), and its leave then
/// found it no longer queued. The leave used to pass the free key on only when it took the
/// waiter out of the queue itself, so the next waiter learnt of the free key only by
/// polling (every 10 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leave_after_an_abandoned_winning_round_wakes_the_next_waiter() {
    let set = NodeSet::start(3).await.unwrap();
    let (c, core, held, attempt, waiting) = a_head_and_a_waiter_behind_it(&set).await;
    core.release(&held).await.unwrap();
    // The head's round wins (its script takes it out of every queue) ...
    let _won = core
        .acquire_with(attempt)
        .await
        .expect("the head takes the free key");
    queued_everywhere(&set, 1).await;
    // ... and is abandoned: what its rollback does (the round's keys deleted, the waiter
    // not put back, nobody told).
    for node in set.iter() {
        node.del("redlock:job").await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the next waiter was told by someone"
    );
    // The abandoned call's leave: the key is free, so the next waiter hears of it.
    the_heads_leave_wakes_the_waiter(&set, c, &core, waiting).await;
}

/// The same, in the other order on the nodes: the head's call is dropped while its winning
/// round's replies are still on their way, so its leave (sent at once) reaches every node
/// while the round's key is still there and passes nothing on, and the abandoned round's
/// rollback, sent only when the replies come, frees the key after it. The rollback used to
/// tell nobody, and the next waiter learnt of the free key only by polling (every 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_winning_rounds_rollback_after_its_leave_wakes_the_next_waiter() {
    use redlock_testkit::LinkFault;

    let set = NodeSet::start(3).await.unwrap();
    let links = common::linked(&set).await;
    let (c, core, held, attempt, waiting) = a_head_and_a_waiter_behind_it(&set).await;
    // The head, through links whose replies come 2 s late.
    let head = announcing_coordinator_timed(links.urls(0), Duration::from_secs(3)).await;
    links.set_client(
        0,
        LinkFault::Latency {
            to_server: Duration::ZERO,
            to_client: Duration::from_secs(2),
        },
    );
    core.release(&held).await.unwrap();
    // The head's round runs on every node at once (it takes the key, and the head out of
    // the queues); its call is dropped before the replies come, and its leave follows.
    let cancelled = tokio::time::timeout(Duration::from_millis(300), head.acquire_with(attempt));
    assert!(cancelled.await.is_err(), "the head's round came back early");
    assert!(
        !waiting.is_finished(),
        "the next waiter took the key while the head's round held it"
    );
    head.waiters().leave("redlock:job", "gone").await.unwrap();
    // The rollback, about 2 s later, frees the key and passes it on.
    let guard = tokio::time::timeout(Duration::from_secs(6), waiting)
        .await
        .expect("the next waiter was not woken by the abandoned round's rollback")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
    links.set_client(0, LinkFault::Pass);
    head.close().await;
    c.shutdown().await;
    no_keys_left(&set).await;
}

/// The head of [`a_head_and_a_waiter_behind_it`] leaves while the key is free: the waiter
/// must be woken by it (within 3 s; it would poll only after 10 s) and take the key.
async fn the_heads_leave_wakes_the_waiter(
    set: &NodeSet,
    c: Redlock,
    core: &redlock_core::Coordinator,
    waiting: tokio::task::JoinHandle<Result<redlock_client::LockGuard, redlock_client::Error>>,
) {
    assert!(
        !waiting.is_finished(),
        "the waiter behind the head took the key before the head left"
    );
    core.waiters().leave("redlock:job", "gone").await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the next waiter was not woken by the leave")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
    c.shutdown().await;
    no_keys_left(set).await;
}

/// Regression: a waiter queued only to be woken made its second attempt (the one that
/// queues it) at once after the first, which cost every contended call a round more than
/// polling; it now comes after the backoff's first delay, as a polling waiter's would, but
/// at most a node timeout after the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_queues_at_its_second_attempt_after_the_first_delay_or_a_node_timeout() {
    let set = NodeSet::start(3).await.unwrap();
    let holder = client(&set, |b| b).await;
    let guard = holder.lock("job").await.unwrap();
    // A seed whose first delay (uniform up to 20 s) is over 10 s, far past the node timeout.
    let (base, max) = (Duration::from_secs(20), Duration::from_secs(40));
    let seed = (0..1000u64)
        .find(|&seed| {
            let policy = RetryPolicy {
                base_delay: base,
                max_delay: max,
                seed: Some(seed),
                ..RetryPolicy::default()
            };
            policy.backoff().next().unwrap() >= Duration::from_secs(10)
        })
        .expect("a seed with a long first delay");
    let node_timeout = Duration::from_millis(1500);
    let waiter = client(&set, |b| {
        b.ttl(Duration::from_secs(30))
            .node_timeout(node_timeout)
            .backoff(base, max)
            .seed(seed)
            .max_wait(Duration::from_secs(120))
    })
    .await;
    let start = std::time::Instant::now();
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.lock("job").await })
    };
    // Its first attempt (a plain `SET NX`) lost at once; the second is not due yet.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(queue_lengths(&set).await, [0, 0, 0], "queued at once");
    assert!(!waiting.is_finished());
    // A node timeout after the first, the second attempt queues it on every node (not at
    // its first delay, 10 s or more).
    let queued = eventually(Duration::from_secs(4), || async {
        queue_lengths(&set).await == [1, 1, 1]
    })
    .await;
    assert!(
        queued,
        "not queued {:?} after the first attempt",
        start.elapsed()
    );
    assert!(start.elapsed() >= node_timeout);
    guard.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the queued waiter was not woken by the release")
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
    waiter.shutdown().await;
    holder.shutdown().await;
    no_keys_left(&set).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_wake_ups_keep_losing_leaves_the_queue_and_polls() {
    // Not fair; the backoff's largest delay is 20 ms, a few woken rounds' worth.
    waiter_leaves_after_lost_wake_ups(Duration::from_millis(5), Duration::from_millis(20)).await;
}

/// Regression: a waiter queued only to be woken stayed queued until its pause window had
/// doubled up to `max_delay` (about a dozen woken rounds lost at the default 1 s), running
/// rounds at each wake-up far more often than its backoff would, while a holder that locks
/// again at once took the key back after each release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_lost_two_woken_attempts_leaves_the_queue_long_before_its_largest_delay() {
    // The backoff's largest delay (a minute) is far above any window the woken rounds'
    // pauses reach: only the losses can make it leave. Its first delay (up to 5 ms) comes
    // before its second attempt, which queues it.
    waiter_leaves_after_lost_wake_ups(Duration::from_millis(5), Duration::from_secs(60)).await;
}

/// A waiter (not fair, backoff `base`..`max`) queued for a held key is told of releases
/// that name it, on every node, while the key stays held: each wakes it, and each woken
/// attempt loses. It leaves the queue, on every node, while it still waits, and polls from
/// then on (its attempts no longer queue it).
async fn waiter_leaves_after_lost_wake_ups(base: Duration, max: Duration) {
    let set = NodeSet::start(3).await.unwrap();
    let holder = client(&set, |b| b).await;
    let guard = holder.lock("job").await.unwrap();
    let waiter = client(&set, |b| {
        b.backoff(base, max).max_wait(Duration::from_secs(120))
    })
    .await;
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.lock("job").await })
    };
    queued_everywhere(&set, 1).await;
    let node = raw(&set.node(0).url()).await;
    let id: Value = node
        .custom(
            CustomCommand::new_static("ZRANGE", None, false),
            vec![QUEUE.to_string(), "0".to_string(), "0".to_string()],
        )
        .await
        .unwrap();
    let id = id.into_array()[0].as_string().unwrap();
    let channel = format!("redlock:released:{}", id.split(':').next().unwrap());
    let mut nodes = Vec::new();
    for n in set.iter() {
        nodes.push(raw(&n.url()).await);
    }
    // One announcement on every node wakes it once a quorum of them came; a pause of
    // 100 ms after each leaves time for the woken round.
    let mut announced = 0;
    let left = eventually(Duration::from_secs(20), || {
        announced += 1;
        let message = format!("release-{announced}\t{id} redlock:job");
        let (nodes, channel, set) = (&nodes, &channel, &set);
        async move {
            for node in nodes {
                let _: Value = node
                    .custom(
                        CustomCommand::new_static("PUBLISH", None, false),
                        vec![channel.clone(), message.clone()],
                    )
                    .await
                    .unwrap();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            queue_lengths(set).await == [0, 0, 0]
        }
    })
    .await;
    assert!(left, "still queued after {announced} lost wake-ups");
    // Two woken attempts lost; a third announcement may come before the leave shows.
    assert!(
        announced <= 4,
        "left the queue only after {announced} wake-ups"
    );
    assert!(!waiting.is_finished(), "the waiter stopped waiting");
    // It polls from then on: its attempts no longer queue it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(queue_lengths(&set).await, [0, 0, 0]);
    guard.release().await.unwrap();
    if max <= Duration::from_secs(1) {
        let g = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the polling waiter never took the released key")
            .unwrap()
            .unwrap();
        g.release().await.unwrap();
    } else {
        // Its next poll could be a minute away.
        waiting.abort();
        let _ = waiting.await;
    }
    node.quit().await.unwrap();
    for node in nodes {
        node.quit().await.unwrap();
    }
    waiter.shutdown().await;
    holder.shutdown().await;
    no_keys_left(&set).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_queued_only_to_be_woken_may_take_a_free_key_out_of_turn() {
    let set = NodeSet::start(3).await.unwrap();
    let core = common::coordinator(&set, Duration::from_millis(500)).await;
    let key = ["redlock:job"];
    let patience = Duration::from_secs(5);
    let held = core.acquire(key[0], Duration::from_secs(5)).await.unwrap();
    for (waiter, ticket, gated) in [("a", 1, false), ("b", 2, false), ("b", 2, true)] {
        let place = FairPlace {
            waiter,
            ticket,
            patience,
            handover: None,
        };
        let attempt = Acquisition {
            fair: gated.then_some(place),
            queued: (!gated).then_some(place),
            ..Acquisition::new(&key, Duration::from_secs(5))
        };
        assert!(
            core.acquire_with(attempt).await.is_err(),
            "{waiter} while held"
        );
    }
    queued_everywhere(&set, 2).await;
    core.release(&held).await.unwrap();
    // Gated, "b" is not the head ("a" is): refused without writing.
    let b = FairPlace {
        waiter: "b",
        ticket: 2,
        patience,
        handover: None,
    };
    let gated = Acquisition {
        fair: Some(b),
        ..Acquisition::new(&key, Duration::from_secs(5))
    };
    assert!(core.acquire_with(gated).await.is_err());
    // Queued only to be woken, it takes the free key and leaves the queue; "a" stays.
    let ungated = Acquisition {
        queued: Some(b),
        ..Acquisition::new(&key, Duration::from_secs(5))
    };
    let lock = core.acquire_with(ungated).await.unwrap();
    queued_everywhere(&set, 1).await;
    core.release(&lock).await.unwrap();
    core.waiters().leave(key[0], "a").await.unwrap();
    core.close().await;
    no_keys_left(&set).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_win_on_every_node_sends_no_leave() {
    // The winning script takes the waiter out of the queue on every node that set the key;
    // when every node did (late answers included), nothing more is sent.
    let set = NodeSet::start(3).await.unwrap();
    let c = fair_client(&set).await;
    for _ in 0..3 {
        let before = set.node(0).command_calls("evalsha").await.unwrap();
        let guard = c.lock("job").await.unwrap();
        c.coordinator().quiesce().await;
        let calls = set.node(0).command_calls("evalsha").await.unwrap() - before;
        assert_eq!(calls, 1, "scripts on node 0 for one fair win");
        assert_eq!(queue_lengths(&set).await, [0, 0, 0]);
        guard.release().await.unwrap();
    }
    c.shutdown().await;
    no_keys_left(&set).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_win_leaves_the_queue_on_the_node_that_refused_it() {
    // Node 2 holds a stranger's key, so the winning round queues the waiter there without
    // taking it out: the waiter leaves that node's queue after its win, and only that
    // node's (the others took it out with the win).
    let set = NodeSet::start(3).await.unwrap();
    let stranger = raw(&set.node(2).url()).await;
    let _: () = stranger
        .set("redlock:job", "stranger", None, None, false)
        .await
        .unwrap();
    let c = fair_client(&set).await;
    let before = script_calls(&set).await;
    let guard = c.lock("job").await.unwrap();
    c.coordinator().quiesce().await;
    assert_eq!(queue_lengths(&set).await, [0, 0, 0]);
    let after = script_calls(&set).await;
    let sent: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(
        sent,
        [1, 1, 2],
        "scripts per node: the win, and a leave on node 2 only"
    );
    guard.release().await.unwrap();
    let _: () = stranger.del("redlock:job").await.unwrap();
    stranger.quit().await.unwrap();
    c.shutdown().await;
    no_keys_left(&set).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_with_nobody_queued_is_announced_to_nobody_unless_waiters_cannot_queue() {
    let set = NodeSet::start(3).await.unwrap();
    let c = client(&set, |b| b).await;
    common::subscribed(&set, 1).await;
    let (listener, mut messages) = release_listener(&set.node(0).url()).await;
    // A lock of one key, plain or fenced: its waiters queue, and nobody did.
    c.lock("job").await.unwrap().release().await.unwrap();
    let fenced = LockOptions {
        fenced: Some(true),
        ..LockOptions::default()
    };
    let g = c.lock_with("job", &fenced).await.unwrap();
    assert!(g.fencing_token().is_some());
    g.release().await.unwrap();
    // Locks whose waiters do not queue: over several keys, and reentrant.
    let keys = ["a", "b"];
    let none = LockOptions::default();
    let many = c.lock_many(&keys, &none).await.unwrap();
    many.release().await.unwrap();
    let owner = redlock_client::Owner::new();
    let reentrant = c.lock_reentrant("r", &owner, &none).await.unwrap();
    reentrant.release().await.unwrap();
    c.coordinator().quiesce().await;
    // Three releases are heard (two keys, one reentrant), and no more.
    let heard: Vec<String> = hear(&mut messages, 3)
        .await
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    let about = |key: &str| heard.iter().filter(|m| m.ends_with(key)).count();
    assert_eq!(about(" redlock:job"), 0, "{heard:?}");
    assert_eq!(about(" redlock:a") + about(" redlock:b"), 2, "{heard:?}");
    assert_eq!(about(" redlock:r"), 1, "{heard:?}");
    listener.quit().await.unwrap();
    c.shutdown().await;
    no_keys_left(&set).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_grouped_into_one_script_call_name_each_keys_next_waiter() {
    let set = NodeSet::start(3).await.unwrap();
    let config = redlock_core::Config {
        nodes: set.urls(),
        node_timeout: Duration::from_millis(500),
        release_channel: Some("redlock:released".into()),
        ..Default::default()
    };
    let core = redlock_core::Coordinator::connect(config).await.unwrap();
    let keys = ["redlock:g0", "redlock:g1", "redlock:g2", "redlock:g3"];
    let locks = futures::future::try_join_all(
        keys.iter()
            .map(|key| core.acquire(key, Duration::from_secs(5))),
    )
    .await
    .unwrap();
    // One waiter queued (ungated) on each key, from a client tagged `tag`.
    let waiters: Vec<String> = (0..keys.len()).map(|i| format!("tag:w{i}")).collect();
    for (key, waiter) in keys.iter().zip(&waiters) {
        let place = FairPlace {
            waiter,
            ticket: 1,
            patience: Duration::from_secs(5),
            handover: None,
        };
        let attempt = Acquisition {
            queued: Some(place),
            ..Acquisition::new(std::slice::from_ref(key), Duration::from_secs(5))
        };
        assert!(core.acquire_with(attempt).await.is_err());
    }
    // Refused at a quorum: wait until node 0 has queued them too.
    core.quiesce().await;
    let (listener, mut messages) = release_listener(&set.node(0).url()).await;
    // Released at once: the first runs its own round, the others share the next one.
    futures::future::try_join_all(locks.iter().map(|lock| core.release(lock)))
        .await
        .unwrap();
    core.quiesce().await;
    let heard = hear(&mut messages, keys.len()).await;
    // Each key's release, on the waiters' client's channel, naming its waiter.
    assert_eq!(heard.len(), keys.len(), "{heard:?}");
    for (key, waiter) in keys.iter().zip(&waiters) {
        let named = format!("\t{waiter} {key}");
        assert!(
            heard
                .iter()
                .any(|(channel, text)| channel == "redlock:released:tag" && text.ends_with(&named)),
            "{key}: {heard:?}"
        );
    }
    listener.quit().await.unwrap();
    for key in keys {
        for waiter in &waiters {
            core.waiters().leave(key, waiter).await.unwrap();
        }
    }
    core.close().await;
    no_keys_left(&set).await;
}

/// The value of `redlock:job` on each node (`None` where it is absent).
async fn job_values(set: &NodeSet) -> Vec<Option<String>> {
    let mut values = Vec::new();
    for node in set.iter() {
        values.push(node.redis().get("redlock:job").await.unwrap());
    }
    values
}

/// The scripts each node of `set` has run so far (`EVALSHA` calls), in node order.
async fn script_calls(set: &NodeSet) -> Vec<u64> {
    let mut calls = Vec::new();
    for node in set.iter() {
        calls.push(node.command_calls("evalsha").await.unwrap());
    }
    calls
}

/// A core coordinator for `set` whose releases announce themselves (and so hand keys over).
async fn announcing_coordinator(set: &NodeSet) -> redlock_core::Coordinator {
    announcing_coordinator_of(set.urls()).await
}

/// [`announcing_coordinator`] for the nodes at `nodes` (some of a set's, to play a
/// release that reaches only those).
async fn announcing_coordinator_of(nodes: Vec<String>) -> redlock_core::Coordinator {
    announcing_coordinator_timed(nodes, Duration::from_millis(500)).await
}

/// [`announcing_coordinator_of`] with the node timeout `node_timeout`.
async fn announcing_coordinator_timed(
    nodes: Vec<String>,
    node_timeout: Duration,
) -> redlock_core::Coordinator {
    let config = redlock_core::Config {
        nodes,
        node_timeout,
        release_channel: Some("redlock:released".into()),
        ..Default::default()
    };
    redlock_core::Coordinator::connect(config).await.unwrap()
}

/// A fair waiter's settings: with its subscribers up, it tries again only after 10 s (or
/// half its TTL) unless woken.
fn patient(b: redlock_client::LockConfigBuilder) -> redlock_client::LockConfigBuilder {
    b.fair(true)
        .backoff(Duration::from_millis(10), Duration::from_secs(10))
        .max_wait(Duration::from_secs(60))
}

/// A fair holder client and a patient waiter's client with a 30 s TTL (not woken, the
/// waiter tries again only after 10 s, so a release comes before any second attempt however
/// slow the machine), both subscribed. The waiter's node timeout is a second: a waiter
/// handed the key by the first nodes gives the others one node timeout to say so before
/// it takes the key on with a round of its own, and on a loaded machine the release
/// messages of a quorum can take longer than the default 100 ms.
async fn holder_and_patient(set: &NodeSet) -> (Redlock, Redlock) {
    let holder = fair_client(set).await;
    let c = client(set, |b| {
        patient(b)
            .ttl(Duration::from_secs(30))
            .node_timeout(Duration::from_secs(1))
    })
    .await;
    common::subscribed(set, 2).await;
    (holder, c)
}

/// Starts `c`'s wait for `redlock:job` (held by another client), once it is queued on
/// every node.
async fn start_waiting(
    set: &NodeSet,
    c: &Redlock,
) -> tokio::task::JoinHandle<Result<redlock_client::LockGuard, Error>> {
    let waiter = c.clone();
    let waiting = tokio::spawn(async move { waiter.lock("job").await });
    queued_everywhere(set, 1).await;
    waiting
}

/// The guard a waiting `lock` call returns within 3 s, and its token, which must be the
/// hand-over token of the call's first attempt (`"<waiter>~1"`).
async fn handed_over_at_first_attempt(
    waiting: tokio::task::JoinHandle<Result<redlock_client::LockGuard, Error>>,
) -> (redlock_client::LockGuard, String) {
    let handed = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the head was not handed the key")
        .unwrap()
        .unwrap();
    let token = handed.lock().token().as_str().to_string();
    assert!(token.ends_with("~1"), "not a hand-over: {token}");
    (handed, token)
}

/// A fair attempt of waiter `waiter` on `redlock:job` that registers hand-over `number`.
fn fair_attempt<'a>(
    key: &'a [&'a str],
    waiter: &'a str,
    number: u64,
    token: Token,
) -> Acquisition<'a> {
    Acquisition {
        token,
        fair: Some(FairPlace {
            waiter,
            ticket: 1,
            patience: Duration::from_secs(5),
            handover: Some(number),
        }),
        ..Acquisition::new(key, Duration::from_secs(5))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_key_to_the_fair_head_which_runs_no_round_of_its_own() {
    let set = NodeSet::start(3).await.unwrap();
    let (holder, c) = holder_and_patient(&set).await;
    let guard = holder.lock("job").await.unwrap();
    let waiting = start_waiting(&set, &c).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let scripts = script_calls(&set).await;
    guard.release().await.unwrap();
    let (handed, token) = handed_over_at_first_attempt(waiting).await;
    // The key holds the hand-over token of the waiter's only attempt on every node whose
    // message counted, and the waiter ran no round after the release. The head holds the
    // lock at the quorum's messages: a node not heard from yet is left in the background
    // (a script, but no round), and that leave may reach it before the release does, which
    // then frees the key there instead of handing it over: such a node holds the token or
    // nothing, never another value. Every node whose message counted saw no script after
    // the release but the release itself.
    assert_eq!(
        handed.attempts(),
        1,
        "the head ran a round after the release"
    );
    let report = handed.lock().report().clone();
    assert!(report.accepted >= 2);
    for (i, value) in job_values(&set).await.into_iter().enumerate() {
        if report.nodes[i].outcome == redlock_core::NodeOutcome::Acquired {
            assert_eq!(value.as_deref(), Some(token.as_str()), "node {i}");
        } else {
            assert!(
                value.is_none() || value.as_deref() == Some(token.as_str()),
                "node {i}: {value:?}"
            );
        }
    }
    for (i, node) in set.iter().enumerate() {
        if report.nodes[i].outcome == redlock_core::NodeOutcome::Acquired {
            assert_eq!(
                node.command_calls("evalsha").await.unwrap() - scripts[i],
                1,
                "node {i} saw a script of the head after the release"
            );
        }
    }
    handed.release().await.unwrap();
    holder.shutdown().await;
    c.shutdown().await;
    no_keys_left(&set).await;
}

/// Waiters whose processes died stay in the queue until their patience passes. A release
/// looked at the first 16 entries only: with more dead ones at the head, it found no live
/// waiter, handed nothing over and told nobody, and the live waiter behind them waited for
/// its own next attempt (up to `max_delay`, 10 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_finds_the_live_waiter_behind_many_dead_ones() {
    let set = NodeSet::start(3).await.unwrap();
    let (holder, c) = holder_and_patient(&set).await;
    let guard = holder.lock("job").await.unwrap();
    // Twenty waiters that queued first (the oldest tickets) and died: their entries expire
    // a second from now.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    for node in set.iter() {
        let r = raw(&node.url()).await;
        for i in 0..20_i64 {
            let zadd = |key: &str, score: i64| {
                (
                    CustomCommand::new_static("ZADD", None, false),
                    vec![
                        Value::from(key),
                        Value::from(score),
                        Value::from(format!("dead-{i}")),
                    ],
                )
            };
            for (command, args) in [
                zadd(QUEUE, i),
                zadd("redlock:fair-expiry:{redlock:job}", now_ms + 1_000),
            ] {
                let _: Value = r.custom(command, args).await.unwrap();
            }
        }
        r.quit().await.unwrap();
    }
    let waiter = c.clone();
    let waiting = tokio::spawn(async move { waiter.lock("job").await });
    queued_everywhere(&set, 21).await;
    // The dead entries expire; the live waiter is not woken before the release.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    guard.release().await.unwrap();
    let (handed, _) = handed_over_at_first_attempt(waiting).await;
    handed.release().await.unwrap();
    holder.shutdown().await;
    c.shutdown().await;
    no_keys_left(&set).await;
}

/// A release that hands the key to the head on fewer nodes than a quorum (here the other
/// nodes had lost their queue, as a node restarted without persistence does; in the fault
/// lab, a client that cannot hear some nodes met the same) leaves the key handed to the head
/// there, out of everyone else's reach. The head, woken by the first of those nodes, waits
/// for the rest at most a node timeout and then takes the key on with a round, instead of
/// sleeping its fair delay (10 s here) while nobody can have the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_handed_the_key_by_fewer_than_a_quorum_takes_it_on_at_once() {
    let set = NodeSet::start(3).await.unwrap();
    let (holder, c) = holder_and_patient(&set).await;
    let guard = holder.lock("job").await.unwrap();
    let waiting = start_waiting(&set, &c).await;
    for node in set.iter().skip(1) {
        for key in ["queue", "expiry", "handover"] {
            node.del(&format!("redlock:fair-{key}:{{redlock:job}}"))
                .await
                .unwrap();
        }
    }
    guard.release().await.unwrap();
    let won = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the head slept while the key was handed to it on one node alone")
        .unwrap()
        .unwrap();
    // Its second attempt took the key on where it was handed over, and the free nodes.
    assert_eq!(won.attempts(), 2);
    let token = won.lock().token().as_str().to_string();
    assert!(!token.contains('~'), "held under the hand-over: {token}");
    // Decided at a quorum: the third node's answer may still be on its way.
    let everywhere = eventually(Duration::from_secs(5), || async {
        job_values(&set).await == vec![Some(token.clone()); 3]
    })
    .await;
    assert!(everywhere, "{:?}", job_values(&set).await);
    won.release().await.unwrap();
    holder.shutdown().await;
    c.shutdown().await;
    no_keys_left(&set).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_of_the_waiters_round_cannot_delete_a_key_handed_over_meanwhile() {
    let set = NodeSet::start(3).await.unwrap();
    let core = announcing_coordinator(&set).await;
    let key = ["redlock:job"];
    let held = core.acquire(key[0], Duration::from_secs(30)).await.unwrap();
    let since = tokio::time::Instant::now();
    let round_token = Token::random();
    let refused = core
        .acquire_with(fair_attempt(&key, "w:1", 1, round_token.clone()))
        .await;
    assert!(refused.is_err());
    core.release(&held).await.unwrap();
    let handed = redlock_core::support::handover_token("w:1", 1);
    assert_eq!(
        job_values(&set).await,
        vec![Some(handed.as_str().to_string()); 3]
    );
    // What a late rollback of the waiter's round does on every node: a compare-and-delete
    // of the round's token. The handed-over key is not the round's, and stays.
    for node in set.iter() {
        let r = raw(&node.url()).await;
        let deleted: i64 = r
            .eval(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
                vec!["redlock:job"],
                vec![round_token.as_str()],
            )
            .await
            .unwrap();
        r.quit().await.unwrap();
        assert_eq!(deleted, 0);
    }
    let lock = core
        .waiters()
        .handed_over(redlock_core::support::Handover {
            key: key[0],
            waiter: "w:1",
            number: 1,
            ttl: Duration::from_secs(5),
            since,
            suspended: redlock_core::support::host_suspended(),
            nodes: &[0, 1, 2],
        })
        .unwrap();
    assert_eq!(lock.token(), &handed);
    assert!(lock.remaining().unwrap() <= Duration::from_secs(5));
    core.release(&lock).await.unwrap();
    core.close().await;
    no_keys_left(&set).await;
}

/// A fencing token needs the waiter's own round: a fenced fair attempt that asks for a
/// hand-over registers none (as a reentrant one), so the release frees the key instead of
/// setting it to a hand-over token that carries no fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_fair_attempt_is_never_handed_the_key() {
    let set = NodeSet::start(3).await.unwrap();
    let core = announcing_coordinator(&set).await;
    let key = ["redlock:job"];
    let held = core.acquire(key[0], Duration::from_secs(30)).await.unwrap();
    let refused = core
        .acquire_with(Acquisition {
            fenced: true,
            ..fair_attempt(&key, "w:1", 1, Token::random())
        })
        .await;
    assert!(refused.is_err());
    core.release(&held).await.unwrap();
    core.quiesce().await;
    assert_eq!(job_values(&set).await, vec![None; 3]);
    core.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_needs_a_quorum_and_validity_left() {
    let set = NodeSet::start(3).await.unwrap();
    let core = announcing_coordinator(&set).await;
    let handover = |nodes: &'static [usize], since| redlock_core::support::Handover {
        key: "redlock:job",
        waiter: "w:1",
        number: 1,
        ttl: Duration::from_secs(5),
        since,
        suspended: redlock_core::support::host_suspended(),
        nodes,
    };
    let now = tokio::time::Instant::now();
    let few = core
        .waiters()
        .handed_over(handover(&[2, 2, 7], now))
        .unwrap_err();
    assert!(matches!(few, redlock_core::Error::NoQuorum { .. }), "{few}");
    let old = now - Duration::from_secs(6);
    let late = core
        .waiters()
        .handed_over(handover(&[0, 1], old))
        .unwrap_err();
    assert!(
        matches!(late, redlock_core::Error::ValidityExhausted { .. }),
        "{late}"
    );
    let lock = core.waiters().handed_over(handover(&[0, 2], now)).unwrap();
    let report = lock.report();
    assert_eq!((report.accepted, report.quorum), (2, 2));
    assert_eq!(report.nodes[0].outcome, redlock_core::NodeOutcome::Acquired);
    assert_eq!(report.nodes[1].outcome, redlock_core::NodeOutcome::Pending);
    core.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_attempt_takes_a_handed_over_key_on_and_a_leave_passes_one_on() {
    let set = NodeSet::start(3).await.unwrap();
    let core = announcing_coordinator(&set).await;
    let key = ["redlock:job"];
    let held = core.acquire(key[0], Duration::from_secs(30)).await.unwrap();
    for (waiter, number) in [("a:1", 1), ("b:1", 1)] {
        let attempt = fair_attempt(&key, waiter, number, Token::random());
        assert!(core.acquire_with(attempt).await.is_err());
    }
    queued_everywhere(&set, 2).await;
    // "a" heads the queue (same ticket, lower id): the release hands it the key.
    core.release(&held).await.unwrap();
    let handed = redlock_core::support::handover_token("a:1", 1);
    assert_eq!(
        job_values(&set).await,
        vec![Some(handed.as_str().to_string()); 3]
    );
    // Its next attempt (it never heard the hand-over) takes the key on under the round's
    // own token and TTL.
    let won = core
        .acquire_with(fair_attempt(&key, "a:1", 2, Token::random()))
        .await
        .unwrap();
    assert_eq!(
        job_values(&set).await,
        vec![Some(won.token().as_str().to_string()); 3]
    );
    // "a" releases: the key goes to "b". "b" gives up without hearing of it: its leave
    // deletes the handed-over key, and passes the free key on to nobody.
    core.release(&won).await.unwrap();
    let to_b = redlock_core::support::handover_token("b:1", 1);
    assert_eq!(
        job_values(&set).await,
        vec![Some(to_b.as_str().to_string()); 3]
    );
    core.waiters().leave(key[0], "b:1").await.unwrap();
    core.quiesce().await;
    core.close().await;
    no_keys_left(&set).await;
}

/// Regression: a leave passed the free key on under the leaving waiter's id as the
/// message's token, the same for every leave of that waiter. A client counts a release's
/// messages per token and wakes its waiter when a quorum of nodes sent them, so a waiter
/// passed the key by a second leave of the same waiter (a head that could not win stepped
/// back twice while it was next, as in the fault lab's `fair_head_answers_late`) was not
/// woken by it, and found the free key only at its next attempt, up to its longest delay
/// later. Each leave's message now has a token of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_leave_that_passes_the_key_on_is_announced_under_a_token_of_its_own() {
    let set = NodeSet::start(1).await.unwrap();
    let core = announcing_coordinator(&set).await;
    let (_listener, mut messages) = release_listener(&set.urls()[0]).await;
    let key = ["redlock:job"];
    let held = core.acquire(key[0], Duration::from_secs(30)).await.unwrap();
    // "a" queues ahead of "b" (the same ticket, a lower id); neither registers a hand-over,
    // so the release only tells "a" and leaves the key free.
    for waiter in ["a:1", "b:1"] {
        let attempt = Acquisition {
            fair: Some(FairPlace {
                waiter,
                ticket: 1,
                patience: Duration::from_secs(30),
                handover: None,
            }),
            ..Acquisition::new(&key, Duration::from_secs(5))
        };
        assert!(core.acquire_with(attempt).await.is_err());
    }
    core.release(&held).await.unwrap();
    let told_a = hear(&mut messages, 1).await;
    assert_eq!(told_a.len(), 1, "{told_a:?}");
    // "a" steps back twice while "b" is next: it leaves, queues again behind "b" (a later
    // ticket), and leaves again. Each leave passes the free key on to "b".
    core.waiters().leave_up_to(key[0], "a:1", 1).await.unwrap();
    let behind = Acquisition {
        fair: Some(FairPlace {
            waiter: "a:1",
            ticket: 2,
            patience: Duration::from_secs(30),
            handover: None,
        }),
        ..Acquisition::new(&key, Duration::from_secs(5))
    };
    assert!(
        core.acquire_with(behind).await.is_err(),
        "\"a\" is not next"
    );
    core.waiters().leave_up_to(key[0], "a:1", 2).await.unwrap();
    let told_b = hear(&mut messages, 2).await;
    let tokens: Vec<&str> = told_b
        .iter()
        .map(|(channel, text)| {
            assert_eq!(channel, "redlock:released:b", "{told_b:?}");
            let (token, rest) = text.split_once('\t').expect("a token and a waiter");
            assert_eq!(rest, "b:1 redlock:job", "{told_b:?}");
            token
        })
        .collect();
    assert_eq!(tokens.len(), 2, "{told_b:?}");
    assert_ne!(
        tokens[0], tokens[1],
        "two leaves passed the key on under one token: the second wakes nobody"
    );
    core.waiters().leave(key[0], "b:1").await.unwrap();
    core.quiesce().await;
    core.close().await;
    no_keys_left(&set).await;
}

/// A holder's release that reached one node late (its link there was slow) came after the
/// waiter that the other nodes handed the key to had held the lock and released it. The
/// waiter was still queued on the late node (its leave after the win goes in the
/// background), so the late release handed the key to it there again, and its leave, which
/// keeps a key handed over under the won lock's token, kept it: the key stayed for the
/// hand-over's TTL, and the next waiter could not take it. Seen once in CI, where
/// `fair_waiters_run_no_rounds_while_they_wait_for_their_turn` left `redlock:job` behind.
/// The release of a handed-over lock now takes its waiter out of the key's queue on every
/// node it reaches, whether or not the key is still the waiter's there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_hands_nothing_to_a_waiter_that_held_and_released_meanwhile() {
    let set = NodeSet::start(3).await.unwrap();
    let core = announcing_coordinator(&set).await;
    let key = ["redlock:job"];
    let held = core.acquire(key[0], Duration::from_secs(30)).await.unwrap();
    let attempt = fair_attempt(&key, "a:1", 1, Token::random());
    assert!(core.acquire_with(attempt).await.is_err());
    queued_everywhere(&set, 1).await;
    // The holder's release reaches nodes 0 and 1 first: they hand the key to "a".
    let urls = set.urls();
    let first_two = announcing_coordinator_of(urls[..2].to_vec()).await;
    first_two.release_token(key[0], held.token()).await.unwrap();
    let handed = redlock_core::support::handover_token("a:1", 1);
    let values = job_values(&set).await;
    assert_eq!(
        values[..2],
        [
            Some(handed.as_str().to_string()),
            Some(handed.as_str().to_string())
        ]
    );
    // "a" holds the lock (a quorum handed it over) and releases it at once; node 2 still
    // holds the old holder's key, so the release deletes nothing there.
    let lock = core
        .waiters()
        .handed_over(redlock_core::support::Handover {
            key: key[0],
            waiter: "a:1",
            number: 1,
            ttl: Duration::from_secs(30),
            since: tokio::time::Instant::now(),
            suspended: redlock_core::support::host_suspended(),
            nodes: &[0, 1],
        })
        .unwrap();
    core.release(&lock).await.unwrap();
    // Then the holder's release reaches node 2, and then "a"'s leave after its win.
    let last = announcing_coordinator_of(urls[2..].to_vec()).await;
    last.release_token(key[0], held.token()).await.unwrap();
    assert!(core
        .waiters()
        .leave_after_win(&lock, "a:1".to_string(), None));
    core.quiesce().await;
    assert_eq!(
        job_values(&set).await,
        vec![None; 3],
        "the key is left behind"
    );
    for c in [core, first_two, last] {
        c.close().await;
    }
    no_keys_left(&set).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_with_too_little_validity_left_is_taken_on_by_a_round() {
    let set = NodeSet::start(3).await.unwrap();
    let holder = fair_client(&set).await;
    // A fair waiter that wants almost the whole TTL (2 s) of validity: its attempts, with
    // its subscribers up, come every half TTL, and a hand-over counts its validity from the
    // attempt that registered it.
    let c = client(&set, |b| {
        patient(b).min_validity(Duration::from_millis(1_950))
    })
    .await;
    common::subscribed(&set, 2).await;
    let held = LockOptions {
        ttl: Some(Duration::from_secs(30)),
        renew: Some(false),
        ..Default::default()
    };
    let guard = holder.lock_with("job", &held).await.unwrap();
    let waiting = start_waiting(&set, &c).await;
    // Released 200 ms after one of the waiter's attempts (its scripts are the only ones
    // now): the hand-over has about 1.8 s of validity left, less than the waiter's minimum.
    let node = set.node(0);
    let before = node.command_calls("evalsha").await.unwrap();
    let attempted = eventually(Duration::from_secs(5), || async {
        node.command_calls("evalsha").await.unwrap() > before
    })
    .await;
    assert!(attempted, "the waiter made no attempt");
    tokio::time::sleep(Duration::from_millis(200)).await;
    guard.release().await.unwrap();
    let won = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the head did not take the handed-over key on")
        .unwrap()
        .unwrap();
    // Its round took the key on under the round's own token, with a fresh TTL.
    let token = won.lock().token().as_str().to_string();
    assert!(!token.contains('~'), "held under the hand-over: {token}");
    assert!(won.lock().remaining().unwrap() > Duration::from_millis(1_900));
    // On a quorum at least. A node that the release reached only after the round's
    // command refused the round, then handed the key over, and the winner's leave deleted
    // that hand-over: such a node ends with no key.
    let settled = eventually(Duration::from_secs(5), || async {
        let values = job_values(&set).await;
        let ours = values
            .iter()
            .filter(|v| v.as_deref() == Some(&*token))
            .count();
        ours >= 2
            && values
                .iter()
                .all(|v| v.is_none() || v.as_deref() == Some(&*token))
    })
    .await;
    assert!(settled, "{:?}", job_values(&set).await);
    won.release().await.unwrap();
    holder.shutdown().await;
    c.shutdown().await;
    no_keys_left(&set).await;
}

/// Three nodes; a holder of `redlock:job` (a core coordinator whose releases announce
/// themselves, for 30 s); and a fair waiter's client through fault-proxy links, with a
/// 60 s TTL and `tweak`'s settings, subscribed.
async fn holder_and_linked_fair_waiter(
    tweak: impl FnOnce(redlock_client::LockConfigBuilder) -> redlock_client::LockConfigBuilder,
) -> (
    NodeSet,
    redlock_testkit::Links,
    redlock_core::Coordinator,
    redlock_core::Lock,
    Redlock,
) {
    let set = NodeSet::start(3).await.unwrap();
    let links = common::linked(&set).await;
    let holder = announcing_coordinator(&set).await;
    let held = holder
        .acquire("redlock:job", Duration::from_secs(30))
        .await
        .unwrap();
    let builder = redlock_client::LockConfig::builder()
        .nodes(links.urls(0))
        .ttl(Duration::from_secs(60))
        .fair(true);
    let c = Redlock::connect(tweak(builder).build().unwrap())
        .await
        .unwrap();
    common::subscribed(&set, 1).await;
    (set, links, holder, held, c)
}

/// A quorum of hand-overs that came while the waiter's own round was out, with too little
/// validity left once the round came back (lost: it was refused before the release), is
/// taken on by a round at once. The waiter's own stale hand-over holds the key meanwhile:
/// sleeping its delay first (half its TTL here) would keep everyone out that long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_that_came_during_the_waiters_round_too_late_is_taken_on_at_once() {
    use redlock_testkit::LinkFault;

    // A fair waiter that wants 59 s of its 60 s TTL; with its subscribers up and not
    // woken, it would try again only after 30 s.
    let (set, links, holder, held, c) = holder_and_linked_fair_waiter(|b| {
        b.min_validity(Duration::from_secs(59))
            .node_timeout(Duration::from_secs(5))
            .backoff(Duration::from_millis(10), Duration::from_secs(60))
            .max_wait(Duration::from_secs(120))
    })
    .await;
    // The round's replies are read into a 1.5 s delay line; what the nodes send after the
    // fault is lifted (the hand-over messages) passes at once on nodes 0 and 1, and 1.5 s
    // late on node 2.
    let late = LinkFault::Latency {
        to_server: Duration::ZERO,
        to_client: Duration::from_millis(1_500),
    };
    links.set_client(0, late);
    let waiting = start_waiting(&set, &c).await;
    // (The replies were sent as the scripts ran; a moment for the links to read them.)
    tokio::time::sleep(Duration::from_millis(50)).await;
    links.link(0, 0).set(LinkFault::Pass);
    links.link(0, 1).set(LinkFault::Pass);
    holder.release(&held).await.unwrap();
    // Two nodes' hand-overs are heard before the round comes back lost; the third comes
    // while the waiter waits for it after the round. By then the hand-over has about 57.7 s
    // of validity left, less than the waiter's minimum: its next round takes the key on.
    let won = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter slept instead of taking the handed-over key on")
        .unwrap()
        .unwrap();
    let token = won.lock().token().as_str().to_string();
    assert!(!token.contains('~'), "held under the hand-over: {token}");
    assert_eq!(won.attempts(), 2);
    links.link(0, 2).set(LinkFault::Pass);
    let everywhere = eventually(Duration::from_secs(5), || async {
        job_values(&set).await == vec![Some(token.clone()); 3]
    })
    .await;
    assert!(
        everywhere,
        "the round did not take the key on on every node"
    );
    won.release().await.unwrap();
    c.shutdown().await;
    holder.close().await;
    no_keys_left(&set).await;
}

/// A release that reaches the nodes while the fair head's own round is out can hand the
/// key over on one node (the round came there first and was refused) and free it on
/// another before the round comes there, which then takes it: the round, refused by the
/// third node, loses, and its rollback passes the key on where it took it. The head has
/// heard one hand-over, fewer than a quorum, and will hear no more for this attempt: the
/// node that freed the key had not queued it, and the third never frees it. Its next round
/// goes as soon as the lost one settled (its rollback first, on the same slow link, or
/// that round finds its own old token and loses too; the node that took the key may also
/// answer after the round was decided), and takes on the key handed to it, instead of
/// waiting a node timeout for messages that cannot come: that wait runs past the call's
/// `max_wait` here (it failed so every time; without waiting for the settled round, in 3
/// of 10 runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_whose_lost_round_took_the_key_where_the_release_came_first_tries_again_at_once() {
    use redlock_testkit::LinkFault;

    // A fair waiter with a node timeout far past its `max_wait`; with its subscribers up
    // and not woken, it would try again only after 10 s.
    let (set, links, holder, held, c) = holder_and_linked_fair_waiter(|b| {
        b.node_timeout(Duration::from_secs(20))
            .backoff(Duration::from_millis(10), Duration::from_secs(10))
            .max_wait(Duration::from_secs(6))
    })
    .await;
    // The waiter's commands reach nodes 1 and 2 700 ms late, node 0 at once; replies and
    // messages come back at once.
    let late = LinkFault::Latency {
        to_server: Duration::from_millis(700),
        to_client: Duration::ZERO,
    };
    links.link(0, 1).set(late);
    links.link(0, 2).set(late);
    let waiter = c.clone();
    let waiting = tokio::spawn(async move { waiter.lock("job").await });
    // Queued (and refused) on node 0; the release hands the key over there, and frees it
    // on nodes 1 and 2, where nobody is queued yet. Someone else takes node 2 before the
    // waiter's round gets there.
    let queued = eventually(Duration::from_secs(5), || async {
        queue_lengths(&set).await == vec![1, 0, 0]
    })
    .await;
    assert!(
        queued,
        "the waiter's round reached nodes 1 and 2 before the release"
    );
    holder.release(&held).await.unwrap();
    set.node(2)
        .set("redlock:job", "someone-else", Some(30_000))
        .await
        .unwrap();
    let won = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the lock call outlived its max_wait")
        .unwrap()
        .expect("the head waited for hand-overs that could not come");
    // Its first round took node 1 alone; its second took the key on on node 0 and took
    // node 1 again.
    assert_eq!(won.attempts(), 2);
    let token = won.lock().token().as_str().to_string();
    assert!(!token.contains('~'), "held under the hand-over: {token}");
    assert_eq!(
        job_values(&set).await,
        vec![
            Some(token.clone()),
            Some(token),
            Some("someone-else".to_string())
        ]
    );
    links.heal_all();
    won.release().await.unwrap();
    set.node(2).del("redlock:job").await.unwrap();
    c.shutdown().await;
    holder.close().await;
    no_keys_left(&set).await;
}

/// A fair head that cannot win because every answer it gets comes after its node timeout
/// (though its commands run at once) steps back once it lost three rounds that no node
/// refused: it leaves the queues, which wakes the waiter behind it, and queues again
/// under a new ticket. Its attempts kept its place fresh, so the waiter behind it, which
/// could win, waited out its whole `max_wait` (the head's own wait is ten times longer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_head_whose_answers_come_late_steps_back_for_the_waiter_behind_it() {
    use redlock_testkit::LinkFault;

    head_that_cannot_win(3, |links| {
        links.set_client(
            0,
            LinkFault::Latency {
                to_server: Duration::ZERO,
                to_client: Duration::from_millis(600),
            },
        )
    })
    .await;
}

/// [`a_fair_head_whose_answers_come_late_steps_back_for_the_waiter_behind_it`] for a head
/// that reaches only half of four nodes: it heads their queues (the others dropped its
/// entry after its patience), so the waiter behind it gets two votes of the three it
/// needs, and the head gets the other two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_head_that_reaches_half_the_nodes_steps_back_for_the_waiter_behind_it() {
    use redlock_testkit::LinkFault;

    head_that_cannot_win(4, |links| {
        links.link(0, 2).set(LinkFault::Blackhole);
        links.link(0, 3).set(LinkFault::Blackhole);
    })
    .await;
}

/// `nodes` nodes; a holder of `redlock:job` that dies (its key expires after 1 s); a fair
/// head waiting through fault-proxy links and a fair waiter behind it. Once `fault` is set
/// on the head's links, the waiter behind must get the lock within its 6 s `max_wait`;
/// then the head gets it too once its links heal, and no key is left.
async fn head_that_cannot_win(nodes: usize, fault: impl FnOnce(&redlock_testkit::Links)) {
    let set = NodeSet::start(nodes).await.unwrap();
    let links = common::linked(&set).await;
    let holder = common::coordinator(&set, Duration::from_millis(500)).await;
    holder
        .acquire("redlock:job", Duration::from_secs(1))
        .await
        .unwrap();
    let head = linked_fair_head(&set, &links, Duration::from_millis(100)).await;
    let waiting_head = start_waiting(&set, &head).await;
    tokio::time::sleep(Duration::from_millis(2)).await;
    let behind = client(&set, |b| b.fair(true).max_wait(Duration::from_secs(6))).await;
    let waiter = behind.clone();
    let waiting = tokio::spawn(async move { waiter.lock("job").await });
    queued_everywhere(&set, 2).await;
    fault(&links);
    let won = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the lock call outlived its max_wait")
        .unwrap()
        .expect("the head that could not win held the waiter behind it up");
    won.release().await.unwrap();
    the_head_gets_it_once_healed(&set, &links, waiting_head, [head, behind], holder).await;
}

/// A fair client through client 0's fault-proxy links to `set`: a 10 s TTL, a 100 ms node
/// timeout, a backoff of 5 ms to `max_delay`, a 60 s `max_wait`; subscribed.
async fn linked_fair_head(
    set: &NodeSet,
    links: &redlock_testkit::Links,
    max_delay: Duration,
) -> Redlock {
    let config = redlock_client::LockConfig::builder()
        .nodes(links.urls(0))
        .ttl(Duration::from_secs(10))
        .node_timeout(Duration::from_millis(100))
        .backoff(Duration::from_millis(5), max_delay)
        .max_wait(Duration::from_secs(60))
        .fair(true)
        .build()
        .unwrap();
    let head = Redlock::connect(config).await.unwrap();
    common::subscribed(set, 1).await;
    head
}

/// Heals every link: the head's wait must then end with the lock, which it releases. Then
/// the clients and the holder shut down, and no key may be left.
async fn the_head_gets_it_once_healed(
    set: &NodeSet,
    links: &redlock_testkit::Links,
    waiting_head: tokio::task::JoinHandle<Result<redlock_client::LockGuard, Error>>,
    clients: [Redlock; 2],
    holder: redlock_core::Coordinator,
) {
    links.heal_all();
    let held = tokio::time::timeout(Duration::from_secs(10), waiting_head)
        .await
        .expect("the head did not get the lock once its links healed")
        .unwrap()
        .unwrap();
    // Replies that a fault delayed before the heal may still be on their way (a link keeps
    // their order), so the release's answers can come after the 100 ms node timeout: its
    // commands ran all the same (what is left is checked below).
    let _ = held.release().await;
    for c in clients {
        c.shutdown().await;
    }
    holder.close().await;
    let gone = eventually(Duration::from_secs(5), || async {
        keys_left(set).await.is_empty()
    })
    .await;
    assert!(gone, "keys left behind: {:?}", keys_left(set).await);
}

/// A head that steps back forgets the hand-over it registered: the release that handed it
/// the key while it was stepping back (here right after its third unrefused round reached
/// the nodes) is undone by its leave, which deletes the key handed to it and passes it on
/// to the waiter behind; the hand-over's messages, which come 250 ms late, must not make
/// it a holder too. It used to take them as a quorum's hand-over and hold the lock beside
/// the waiter that the leave had passed it on to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_that_steps_back_does_not_take_a_hand_over_its_leave_undid() {
    use redlock_testkit::LinkFault;

    let set = NodeSet::start(3).await.unwrap();
    let links = common::linked(&set).await;
    let holder = announcing_coordinator(&set).await;
    let held = holder
        .acquire("redlock:job", Duration::from_secs(30))
        .await
        .unwrap();
    let head = linked_fair_head(&set, &links, Duration::from_secs(1)).await;
    // Identified at connect; from now on every answer and message comes 250 ms late: after
    // the step-back's leave, and before the head's next attempt, a second later.
    links.set_client(
        0,
        LinkFault::Latency {
            to_server: Duration::ZERO,
            to_client: Duration::from_millis(250),
        },
    );
    let waiting_head = start_waiting(&set, &head).await;
    let node = raw(&set.node(0).url()).await;
    let head_id: Vec<String> = node
        .custom::<Value, _>(
            CustomCommand::new_static("ZRANGE", None, false),
            vec![QUEUE, "0", "0"],
        )
        .await
        .unwrap()
        .convert()
        .unwrap();
    let head_id = head_id[0].clone();
    tokio::time::sleep(Duration::from_millis(2)).await;
    let behind = client(&set, |b| b.fair(true).max_wait(Duration::from_secs(10))).await;
    let waiter = behind.clone();
    let waiting = tokio::spawn(async move { waiter.lock("job").await });
    queued_everywhere(&set, 2).await;
    // Its third attempt (the third round that no node refused) has reached node 0: the
    // release now comes before its step-back's leave.
    let third = eventually(Duration::from_secs(10), || async {
        let registered: Option<String> = node
            .hget("redlock:fair-handover:{redlock:job}", &head_id)
            .await
            .unwrap();
        registered.is_some_and(|r| r.starts_with("3 "))
    })
    .await;
    assert!(third, "the head's third attempt never reached node 0");
    holder.release(&held).await.unwrap();
    let won = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the lock call outlived its max_wait")
        .unwrap()
        .expect("the waiter behind got the lock");
    // The late messages of the undone hand-over reach the head meanwhile.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        !waiting_head.is_finished(),
        "the head holds the lock too: {:?}",
        waiting_head
            .await
            .unwrap()
            .map(|g| g.lock().token().clone())
    );
    won.release().await.unwrap();
    node.quit().await.unwrap();
    the_head_gets_it_once_healed(&set, &links, waiting_head, [head, behind], holder).await;
}

/// A waiter that queues again under a newer ticket (a fair head that stepped back, whose
/// leave did not get through to a node) moves behind the waiters queued meanwhile on that
/// node too. Its entry used to keep the old ticket there (`ZADD NX`), so it stayed the
/// head of that node's queue, refused everyone else there, and, refused elsewhere itself,
/// never lost enough unrefused rounds to step back again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_ticket_moves_a_waiter_behind_those_queued_meanwhile() {
    let set = NodeSet::start(3).await.unwrap();
    let core = common::coordinator(&set, Duration::from_millis(500)).await;
    let key = ["redlock:job"];
    let held = core.acquire(key[0], Duration::from_secs(30)).await.unwrap();
    let attempt = |waiter, ticket| Acquisition {
        fair: Some(FairPlace {
            waiter,
            ticket,
            patience: Duration::from_secs(5),
            handover: None,
        }),
        ..Acquisition::new(&key, Duration::from_secs(5))
    };
    let head = |set: &NodeSet| {
        let urls = set.urls();
        async move {
            let mut heads = Vec::new();
            for url in urls {
                let r = raw(&url).await;
                let first: Vec<String> = r
                    .custom::<Value, _>(
                        CustomCommand::new_static("ZRANGE", None, false),
                        vec![QUEUE, "0", "0"],
                    )
                    .await
                    .unwrap()
                    .convert()
                    .unwrap();
                r.quit().await.unwrap();
                heads.push(first.concat());
            }
            heads
        }
    };
    assert!(core.acquire_with(attempt("a:1", 10)).await.is_err());
    assert!(core.acquire_with(attempt("b:1", 20)).await.is_err());
    assert_eq!(head(&set).await, vec!["a:1"; 3]);
    // The same ticket again keeps the place; a newer one moves "a:1" behind "b:1".
    assert!(core.acquire_with(attempt("a:1", 10)).await.is_err());
    assert_eq!(head(&set).await, vec!["a:1"; 3]);
    assert!(core.acquire_with(attempt("a:1", 30)).await.is_err());
    assert_eq!(head(&set).await, vec!["b:1"; 3]);
    // An older ticket never moves a waiter forward.
    assert!(core.acquire_with(attempt("a:1", 10)).await.is_err());
    assert_eq!(head(&set).await, vec!["b:1"; 3]);
    core.release(&held).await.unwrap();
    for waiter in ["a:1", "b:1"] {
        core.waiters().leave(key[0], waiter).await.unwrap();
    }
    core.close().await;
    no_keys_left(&set).await;
}

/// A fair head that steps back after its attempt 3 leaves with `leave_queue_up_to(.., 3)`:
/// its leave is sent again to a node that did not answer (its answers come late), and may
/// land after its attempt 4, when a release has handed it the key for that attempt
/// ("a:1~4"), which it then holds. That leave must leave the key alone: it used to delete
/// it and pass it on to the next waiter, so that two held it (the lab's
/// `fair_head_answers_late` on the docker backend). A leave for good deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_leave_of_a_head_that_stepped_back_keeps_a_later_hand_over() {
    let set = NodeSet::start(3).await.unwrap();
    let core = announcing_coordinator(&set).await;
    let key = ["redlock:job"];
    let held = core.acquire(key[0], Duration::from_secs(30)).await.unwrap();
    // Attempt 4 of waiter "a:1", refused: it registers hand-over 4.
    assert!(core
        .acquire_with(fair_attempt(&key, "a:1", 4, Token::random()))
        .await
        .is_err());
    core.release(&held).await.unwrap();
    assert_eq!(job_values(&set).await, vec![Some("a:1~4".to_string()); 3]);
    // The late leave of the step-back after attempt 3.
    core.waiters().leave_up_to(key[0], "a:1", 3).await.unwrap();
    assert_eq!(
        job_values(&set).await,
        vec![Some("a:1~4".to_string()); 3],
        "a late leave deleted a later attempt's hand-over"
    );
    // Up to attempt 4, or for good: deleted.
    core.waiters().leave_up_to(key[0], "a:1", 4).await.unwrap();
    assert_eq!(job_values(&set).await, vec![None; 3]);
    core.close().await;
    no_keys_left(&set).await;
}

/// A patience past a year is refused before anything is sent: the nodes could not expire
/// the queue's keys after it (`PEXPIRE` out of range fails the script after its writes),
/// and they would stay forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patience_past_a_year_is_a_typed_error_and_leaves_no_key() {
    let set = NodeSet::start(3).await.unwrap();
    let core = common::coordinator(&set, Duration::from_millis(500)).await;
    let key = ["redlock:job"];
    let held = core.acquire(key[0], Duration::from_secs(30)).await.unwrap();
    for patience in [
        redlock_core::MAX_TTL + Duration::from_secs(1),
        Duration::MAX,
    ] {
        let mut attempt = fair_attempt(&key, "w:1", 1, Token::random());
        if let Some(place) = &mut attempt.fair {
            place.patience = patience;
        }
        let err = core.acquire_with(attempt).await.unwrap_err();
        assert!(
            matches!(
                err,
                redlock_core::Error::Argument(ArgumentError::FairPlace { .. })
            ),
            "{err}"
        );
    }
    core.release(&held).await.unwrap();
    core.quiesce().await;
    no_keys_left(&set).await;
}

/// A client with the longest `max_delay` there is still waits in the fair queue: the
/// patience it derives (twice `max_delay`, and more) is capped at a year.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_client_with_an_extreme_max_delay_still_queues() {
    let set = NodeSet::start(3).await.unwrap();
    let holder = fair_client(&set).await;
    let c = client(&set, |b| {
        b.fair(true)
            .backoff(Duration::from_millis(10), Duration::MAX)
            .max_wait(Duration::from_secs(60))
    })
    .await;
    common::subscribed(&set, 2).await;
    let guard = holder.lock("job").await.unwrap();
    // One attempt while the key is held: refused and queued on every node, where the
    // queue's keys expire after the patience (it used to fail with a server error after
    // queuing: the patience was out of `PEXPIRE`'s range, and those keys had no expiry).
    let once = LockOptions {
        retry: Some(RetryPolicy {
            max_attempts: Some(1),
            max_delay: Duration::MAX,
            ..RetryPolicy::default()
        }),
        ..Default::default()
    };
    let refused = c.lock_with("job", &once).await.unwrap_err();
    let report = refused.report().expect("a round's report");
    assert!(
        report
            .nodes
            .iter()
            .all(|n| !matches!(n.outcome, redlock_core::NodeOutcome::ServerError(_))),
        "{refused}"
    );
    let waiting = start_waiting(&set, &c).await;
    guard.release().await.unwrap();
    let won = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter did not get the key")
        .unwrap()
        .unwrap();
    won.release().await.unwrap();
    holder.shutdown().await;
    c.shutdown().await;
    no_keys_left(&set).await;
}

/// What a waiter of [`every_shape_waits_its_turn_in_one_queue`] takes: a plain, reentrant,
/// fenced lock, or one over `redlock:job` and another key.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Plain,
    Reentrant,
    Fenced,
    Many,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shape_waits_its_turn_in_one_queue() {
    // Reentrant, fenced and multi-key waiters queue with plain ones, in arrival order.
    // They used to take no place: every release handed the key to the next plain waiter,
    // so they got it only once no plain waiter queued.
    let set = NodeSet::start(3).await.unwrap();
    let holder = fair_client(&set).await;
    let guard = holder.lock("job").await.unwrap();
    let shapes = [
        Shape::Reentrant,
        Shape::Fenced,
        Shape::Many,
        Shape::Plain,
        Shape::Reentrant,
    ];
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, shape) in shapes.into_iter().enumerate() {
        let c = fair_client(&set).await;
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let none = LockOptions::default();
            let owner = redlock_client::Owner::new();
            let g = match shape {
                Shape::Plain => c.lock("job").await,
                Shape::Reentrant => c.lock_reentrant("job", &owner, &none).await,
                Shape::Fenced => {
                    let fenced = LockOptions {
                        fenced: Some(true),
                        ..none
                    };
                    c.lock_with("job", &fenced).await
                }
                Shape::Many => c.lock_many(&["job", "other"], &none).await,
            }
            .unwrap();
            order.lock().unwrap().push((i, g.fencing_token().is_some()));
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await.unwrap();
            c.shutdown().await;
        }));
        queued_everywhere(&set, i as i64 + 1).await;
        // Tickets are wall-clock milliseconds: keep the next one strictly later.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    guard.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    holder.shutdown().await;
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order,
        [(0, false), (1, true), (2, false), (3, false), (4, false)],
        "(waiter, fenced) in the order they held the lock"
    );
    no_keys_left(&set).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_owner_adds_a_hold_out_of_turn_and_its_last_release_hands_the_key_on() {
    let set = NodeSet::start(3).await.unwrap();
    let (holder, c) = holder_and_patient(&set).await;
    let owner = redlock_client::Owner::new();
    let none = LockOptions::default();
    let first = holder.lock_reentrant("job", &owner, &none).await.unwrap();
    let waiting = start_waiting(&set, &c).await;
    // The owner holds the key: its next hold needs no turn, though a waiter queues.
    let second = tokio::time::timeout(
        Duration::from_secs(3),
        holder.lock_reentrant("job", &owner, &none),
    )
    .await
    .expect("the owner waited behind the queue")
    .unwrap();
    assert_eq!(second.attempts(), 1);
    first.release().await.unwrap();
    second.release().await.unwrap();
    // The last hold's release hands the key to the queue's head, as a plain release does.
    let (handed, _) = handed_over_at_first_attempt(waiting).await;
    assert_eq!(handed.attempts(), 1);
    handed.release().await.unwrap();
    holder.shutdown().await;
    c.shutdown().await;
    no_keys_left(&set).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owners_other_waiter_is_woken_when_the_owner_takes_the_key() {
    // Two calls of one owner wait in the queue behind a holder. The first one's turn
    // comes with the release; the second may then add a hold at once, and is woken for
    // it instead of trying again only after `max_delay` (10 s here).
    let set = NodeSet::start(3).await.unwrap();
    let (holder, c) = holder_and_patient(&set).await;
    let guard = holder.lock("job").await.unwrap();
    let owner = redlock_client::Owner::new();
    let mut calls = Vec::new();
    for queued in 1..=2 {
        let (c, owner) = (c.clone(), owner.clone());
        calls.push(tokio::spawn(async move {
            c.lock_reentrant("job", &owner, &LockOptions::default())
                .await
        }));
        queued_everywhere(&set, queued).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    guard.release().await.unwrap();
    let mut holds = Vec::new();
    for call in calls {
        let hold = tokio::time::timeout(Duration::from_secs(3), call)
            .await
            .expect("the owner's call waited for a turn it did not need")
            .unwrap()
            .unwrap();
        holds.push(hold);
    }
    // Each was refused once (the key was held) and won at its next attempt.
    assert_eq!(
        holds.iter().map(|h| h.attempts()).collect::<Vec<_>>(),
        [2, 2]
    );
    for hold in holds {
        hold.release().await.unwrap();
    }
    holder.shutdown().await;
    c.shutdown().await;
    no_keys_left(&set).await;
}

/// How many waiters the queue of `redlock:<key>` holds on node `node`.
async fn queue_length(set: &NodeSet, node: usize, key: &str) -> i64 {
    let r = raw(&set.node(node).url()).await;
    let reply: Value = r
        .custom(
            CustomCommand::new_static("ZCARD", None, false),
            vec![format!("redlock:fair-queue:{{redlock:{key}}}")],
        )
        .await
        .unwrap();
    r.quit().await.unwrap();
    reply.as_i64().unwrap_or(-1)
}

/// Waits until `n` waiters are queued for `redlock:<key>` on every node.
async fn queued_for(set: &NodeSet, key: &str, n: i64) {
    let ok = eventually(Duration::from_secs(10), || async {
        for node in 0..set.len() {
            if queue_length(set, node, key).await != n {
                return false;
            }
        }
        true
    })
    .await;
    assert!(ok, "expected {n} queued waiters for {key} on each node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_over_several_keys_takes_its_turn_on_each_and_those_behind_it_wait() {
    let set = NodeSet::start(3).await.unwrap();
    let holder = fair_client(&set).await;
    let (a, b) = (
        holder.lock("a").await.unwrap(),
        holder.lock("b").await.unwrap(),
    );
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    // First a waiter for both keys, then one for each key alone.
    // Each waiter's keys, then how many wait for each key once it queued.
    let waits = [
        (vec!["a", "b"], vec![("a", 1), ("b", 1)]),
        (vec!["a"], vec![("a", 2)]),
        (vec!["b"], vec![("b", 2)]),
    ];
    for (keys, queued) in waits {
        let c = fair_client(&set).await;
        let order = order.clone();
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        tasks.push(tokio::spawn(async move {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let g = c.lock_many(&keys, &LockOptions::default()).await.unwrap();
            order.lock().unwrap().push(keys.join("+"));
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await.unwrap();
            c.shutdown().await;
        }));
        for (key, n) in queued {
            queued_for(&set, key, n).await;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // `a` is free now, but its head waits for `b` too: the waiter behind it for `a` alone
    // does not go first.
    a.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        order.lock().unwrap().is_empty(),
        "{:?}",
        order.lock().unwrap()
    );
    b.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order[0], "a+b", "{order:?}");
    assert_eq!(order.len(), 3, "{order:?}");
    holder.shutdown().await;
    no_keys_left(&set).await;
}

/// Each node's queue of `redlock:job` in order, with each waiter's ticket and registered
/// hand-over (`"<number> <ttl ms>"`, or `None`).
async fn queues(set: &NodeSet) -> Vec<Vec<(String, i64, Option<String>)>> {
    let mut all = Vec::new();
    for node in set.iter() {
        let r = raw(&node.url()).await;
        let reply: Value = r
            .custom(
                CustomCommand::new_static("ZRANGE", None, false),
                vec![
                    QUEUE.to_string(),
                    "0".into(),
                    "-1".into(),
                    "WITHSCORES".into(),
                ],
            )
            .await
            .unwrap();
        let flat: Vec<String> = reply.convert().unwrap();
        let mut queue = Vec::new();
        for pair in flat.chunks(2) {
            let registered: Option<String> = r
                .hget("redlock:fair-handover:{redlock:job}", &pair[0])
                .await
                .unwrap();
            queue.push((pair[0].clone(), pair[1].parse().unwrap(), registered));
        }
        r.quit().await.unwrap();
        all.push(queue);
    }
    all
}

/// Another holder takes `redlock:job` on nodes 1 and 2 of three (through a coordinator of
/// those two), for 30 s: a round of all three can then take node 0 only, and loses.
async fn held_on_nodes_1_and_2(set: &NodeSet) -> (redlock_core::Coordinator, redlock_core::Lock) {
    let last = announcing_coordinator_of(set.urls()[1..].to_vec()).await;
    let held = last
        .acquire("redlock:job", Duration::from_secs(30))
        .await
        .unwrap();
    (last, held)
}

/// Releases `held` (taken by `holder`), closes both coordinators, and checks that nothing
/// is left on the nodes.
async fn release_and_close(
    set: &NodeSet,
    holder: redlock_core::Coordinator,
    held: redlock_core::Lock,
    core: redlock_core::Coordinator,
) {
    holder.release(&held).await.unwrap();
    for c in [core, holder] {
        c.close().await;
    }
    no_keys_left(set).await;
}

/// A fair waiter's round that took the key on some nodes and lost on the others used to
/// leave the queues unequal: the script takes the waiter out of the queue where it sets the
/// key, and the rollback only deleted the key. The waiter kept its place only where it
/// lost, so the next waiter headed the other queues, and each could block the other's
/// quorum until the first waiter's next attempt (a backoff away) or its patience: the slow
/// runs of the lab's `restart_after_ttl` with every client fair. The rollback of a queued
/// round now puts the waiter back, under its ticket and hand-over, wherever it freed the
/// key. Every shape that queues (plain, reentrant, several keys) is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_fair_round_keeps_the_waiters_place_where_it_took_the_key() {
    let set = NodeSet::start(3).await.unwrap();
    let core = announcing_coordinator(&set).await;
    let (last, held) = held_on_nodes_1_and_2(&set).await;
    let one = ["redlock:job"];
    let two = ["redlock:job", "redlock:other"];
    let shapes: [(&str, Acquisition<'_>); 3] = [
        ("plain", fair_attempt(&one, "a:1", 1, Token::random())),
        (
            "reentrant",
            Acquisition {
                owner: Some("owner-a"),
                ..fair_attempt(&one, "a:1", 1, Token::random())
            },
        ),
        (
            "several keys",
            fair_attempt(&two, "a:1", 1, Token::random()),
        ),
    ];
    for (shape, attempt) in shapes {
        // The round takes node 0 (free, nobody queued) and loses at nodes 1 and 2.
        let lost = core.acquire_with(attempt).await;
        assert!(lost.is_err(), "{shape}: the round won");
        core.quiesce().await;
        // Only a plain lock of one key registers a hand-over (see `FairPlace::handover`).
        let registered = (shape == "plain").then(|| "1 5000".to_string());
        let entry = vec![("a:1".to_string(), 1, registered)];
        assert_eq!(
            queues(&set).await,
            vec![entry.clone(), entry.clone(), entry],
            "{shape}: the waiter's place after its lost round"
        );
        assert_eq!(job_values(&set).await[0], None, "{shape}");
        // A younger waiter may not take the free node meanwhile: it heads no queue.
        let younger = Acquisition {
            fair: Some(FairPlace {
                ticket: 2,
                ..fair_attempt(&one, "b:1", 1, Token::random()).fair.unwrap()
            }),
            ..fair_attempt(&one, "b:1", 1, Token::random())
        };
        assert!(core.acquire_with(younger).await.is_err());
        core.quiesce().await;
        assert_eq!(job_values(&set).await[0], None, "{shape}");
        for waiter in ["a:1", "b:1"] {
            let keys: &[&str] = if shape == "several keys" { &two } else { &one };
            for key in keys {
                core.waiters().leave(key, waiter).await.unwrap();
            }
        }
        core.quiesce().await;
        assert_eq!(queue_lengths(&set).await, vec![0; 3], "{shape}");
    }
    release_and_close(&set, last, held, core).await;
}

/// The other side of the test above: a round dropped before its decision (its caller
/// cancelled the call) puts nobody back. Its waiter no longer waits, and its leave may reach
/// a node before the rollback there, which would then leave its entry at the head of the
/// queue for its patience.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_fair_round_puts_its_waiter_back_nowhere() {
    use redlock_testkit::LinkFault;

    let set = NodeSet::start(3).await.unwrap();
    let links = common::linked(&set).await;
    let (last, held) = held_on_nodes_1_and_2(&set).await;
    let core = announcing_coordinator_timed(links.urls(0), Duration::from_secs(3)).await;
    // Nodes 1 and 2 answer 2 s late; node 0 takes the key at once.
    let late = LinkFault::Latency {
        to_server: Duration::ZERO,
        to_client: Duration::from_secs(2),
    };
    links.link(0, 1).set(late);
    links.link(0, 2).set(late);
    let key = ["redlock:job"];
    let attempt = core.acquire_with(fair_attempt(&key, "a:1", 1, Token::random()));
    let cancelled = tokio::time::timeout(Duration::from_millis(500), attempt).await;
    assert!(cancelled.is_err(), "the round was decided: {cancelled:?}");
    core.quiesce().await;
    let lengths = queue_lengths(&set).await;
    assert_eq!(lengths[0], 0, "put back on node 0: {lengths:?}");
    assert_eq!(job_values(&set).await[0], None);
    links.link(0, 1).set(LinkFault::Pass);
    links.link(0, 2).set(LinkFault::Pass);
    core.waiters().leave(key[0], "a:1").await.unwrap();
    release_and_close(&set, last, held, core).await;
}

/// The leave after a fair win is tried again on a node whose connection failed, as a
/// rollback is, once it is back: it used to be tried once, so a node cut off for a moment
/// kept the winner's entry, at the head of its queue, for the waiter's patience (and could
/// hand the key to it there, for a TTL, if the key came free meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_win_leaves_the_queue_on_a_node_that_was_cut_off_for_a_moment() {
    use redlock_testkit::LinkFault;

    let set = NodeSet::start(3).await.unwrap();
    let links = common::linked(&set).await;
    // Node 2 holds a stranger's key: the winning round queues the waiter there.
    let stranger = raw(&set.node(2).url()).await;
    let _: () = stranger
        .set("redlock:job", "stranger", None, None, false)
        .await
        .unwrap();
    let core = announcing_coordinator_of(links.urls(0)).await;
    let key = ["redlock:job"];
    let lock = core
        .acquire_with(fair_attempt(&key, "a:1", 1, Token::random()))
        .await
        .unwrap();
    lock.report().settled().await;
    assert_eq!(queue_lengths(&set).await, [0, 0, 1]);
    // Node 2 is cut off (its connection stays open, nothing gets through) for a little
    // longer than the node timeout (500 ms) as the leave goes out, so its first try times
    // out; then the cut connection is reset, well before a second try would time out.
    links.link(0, 2).set(LinkFault::Blackhole);
    assert!(core
        .waiters()
        .leave_after_win(&lock, "a:1".to_string(), None));
    tokio::time::sleep(Duration::from_millis(600)).await;
    links.link(0, 2).set(LinkFault::Pass);
    // The entry's patience is 5 s.
    let left = eventually(Duration::from_secs(3), || async {
        queue_lengths(&set).await == [0, 0, 0]
    })
    .await;
    assert!(
        left,
        "node 2 kept the winner's entry: {:?}",
        queues(&set).await
    );
    core.release(&lock).await.unwrap();
    let _: () = stranger.del("redlock:job").await.unwrap();
    stranger.quit().await.unwrap();
    core.close().await;
    no_keys_left(&set).await;
}

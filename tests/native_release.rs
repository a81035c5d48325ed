//! The native compare-and-delete: a plain lock's release with nothing else to do (no
//! notifications, not fair) goes as `DELIFEQ` to a node that has it (Valkey 9), never
//! deletes another holder's key, and goes as the release script to a node whose ACL refuses
//! `DELIFEQ`, until the node reconnects. Each test skips itself, saying so, on a server
//! without `DELIFEQ`.

mod common;

use std::io::Write;
use std::time::Duration;

use fred::interfaces::ClientLike;
use fred::types::{CustomCommand, InfoKind, Value};
use redlock_core::{Acquisition, Config, Coordinator, NodeOutcome, RoundReport, Token};
use redlock_testkit::NodeSet;

const TTL: Duration = Duration::from_secs(10);

/// `true` when the server lacks `DELIFEQ` (asked with `COMMAND INFO`, as the lock asks),
/// and the test should return at once; it says so on the run's own standard error.
async fn skip_without_delifeq(set: &NodeSet, test: &str) -> bool {
    let admin = common::raw(&set.node(0).url()).await;
    let described: Value = admin
        .custom(
            CustomCommand::new_static("COMMAND", None, false),
            vec!["INFO", "DELIFEQ"],
        )
        .await
        .unwrap();
    admin.quit().await.unwrap();
    let has_it = matches!(&described, Value::Array(e) if e.first().is_some_and(|e| !e.is_null()));
    if !has_it {
        let binary = redlock_testkit::server_binary().unwrap();
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {test}: it needs DELIFEQ, and {} {} lacks it; run it against Valkey 9 \
             (REDIS_SERVER=$(./scripts/fetch-server.sh valkey-9))",
            binary.name,
            binary.version
        );
    }
    !has_it
}

/// What node `i` of `set` has run: `DELIFEQ` calls, `DELIFEQ` calls refused before they
/// ran (the ACL), and script calls (`EVALSHA`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ran {
    delifeq: u64,
    delifeq_refused: u64,
    evalsha: u64,
}

async fn ran(set: &NodeSet, i: usize) -> Ran {
    let admin = common::raw(&set.node(i).url()).await;
    let stats: String = admin.info(Some(InfoKind::CommandStats)).await.unwrap();
    admin.quit().await.unwrap();
    let field = |command: &str, name: &str| -> u64 {
        let prefix = format!("cmdstat_{command}:");
        stats
            .lines()
            .find_map(|line| line.trim().strip_prefix(prefix.as_str()))
            .and_then(|fields| {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(&format!("{name}=")))
            })
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    Ran {
        delifeq: field("delifeq", "calls"),
        delifeq_refused: field("delifeq", "rejected_calls"),
        evalsha: field("evalsha", "calls"),
    }
}

async fn ran_everywhere(set: &NodeSet) -> Vec<Ran> {
    let mut all = Vec::new();
    for i in 0..set.len() {
        all.push(ran(set, i).await);
    }
    all
}

fn outcomes(report: &RoundReport) -> Vec<NodeOutcome> {
    report.nodes.iter().map(|n| n.outcome.clone()).collect()
}

/// A plain lock's release with notifications off is one `DELIFEQ` per node and no script;
/// a lock over several keys keeps its script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_release_goes_as_delifeq_where_the_node_has_it() {
    let set = NodeSet::start(3).await.unwrap();
    if skip_without_delifeq(
        &set,
        "a_plain_release_goes_as_delifeq_where_the_node_has_it",
    )
    .await
    {
        return;
    }
    let c = common::coordinator(&set, Duration::from_millis(500)).await;
    let lock = c.acquire("native", TTL).await.unwrap();
    lock.report().settled().await;
    let before = ran_everywhere(&set).await;
    let released = c.release(&lock).await.unwrap().settled().await;
    assert!(
        outcomes(&released)
            .iter()
            .all(|o| *o == NodeOutcome::Released),
        "{released}"
    );
    let after = ran_everywhere(&set).await;
    for (i, (before, after)) in before.iter().zip(&after).enumerate() {
        assert_eq!(after.delifeq, before.delifeq + 1, "node {i}");
        assert_eq!(after.evalsha, before.evalsha, "node {i} ran a script");
    }
    assert!(set.nodes_holding("native").await.is_empty());

    let keys = ["native:a", "native:b"];
    let many = c.acquire_with(Acquisition::new(&keys, TTL)).await.unwrap();
    many.report().settled().await;
    let before = ran_everywhere(&set).await;
    c.release(&many).await.unwrap().settled().await;
    let after = ran_everywhere(&set).await;
    for (i, (before, after)) in before.iter().zip(&after).enumerate() {
        assert_eq!(after.delifeq, before.delifeq, "node {i}");
        assert_eq!(after.evalsha, before.evalsha + 1, "node {i}");
    }
    c.close().await;
}

/// `DELIFEQ` deletes only a key that holds the release's token: a key rewritten to another
/// holder's token survives the release on the nodes where it was rewritten, and a stale
/// token releases nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_by_delifeq_never_deletes_another_holders_key() {
    let set = NodeSet::start(3).await.unwrap();
    if skip_without_delifeq(
        &set,
        "a_release_by_delifeq_never_deletes_another_holders_key",
    )
    .await
    {
        return;
    }
    let c = common::coordinator(&set, Duration::from_millis(500)).await;
    let lock = c.acquire("taken-over", TTL).await.unwrap();
    lock.report().settled().await;
    // Our lock expired on nodes 0 and 1 and another holder took it there.
    for node in &set.nodes()[..2] {
        node.set("taken-over", "another-holder", Some(60_000))
            .await
            .unwrap();
    }
    let before = ran_everywhere(&set).await;
    let released = c.release(&lock).await.unwrap().settled().await;
    assert_eq!(
        outcomes(&released),
        [
            NodeOutcome::NotHeld,
            NodeOutcome::NotHeld,
            NodeOutcome::Released
        ],
        "{released}"
    );
    for node in &set.nodes()[..2] {
        assert_eq!(
            node.get("taken-over").await.unwrap().as_deref(),
            Some("another-holder")
        );
    }
    assert_eq!(set.node(2).get("taken-over").await.unwrap(), None);

    let stale = Token::from_string("stale-token".to_string());
    let released = c
        .release_token("taken-over", &stale)
        .await
        .unwrap()
        .settled()
        .await;
    assert!(
        outcomes(&released)
            .iter()
            .all(|o| *o == NodeOutcome::NotHeld),
        "{released}"
    );
    assert_eq!(set.nodes_holding("taken-over").await, [0, 1]);
    // Both releases went by DELIFEQ.
    for (i, (before, after)) in before.iter().zip(ran_everywhere(&set).await).enumerate() {
        assert_eq!(after.delifeq, before.delifeq + 2, "node {i}");
        assert_eq!(after.evalsha, before.evalsha, "node {i}");
    }
    c.close().await;
}

/// A node whose ACL allows the scripts but not `DELIFEQ` refuses it once: that release
/// runs the script there, and so do the next ones, without trying `DELIFEQ` again, until the
/// node reconnects and is asked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_acl_refuses_delifeq_releases_by_the_script() {
    let set = NodeSet::start(3).await.unwrap();
    if skip_without_delifeq(
        &set,
        "a_node_whose_acl_refuses_delifeq_releases_by_the_script",
    )
    .await
    {
        return;
    }
    let admin = common::raw(&set.node(0).url()).await;
    let acl = |rules: &'static [&'static str]| {
        let mut args = vec!["SETUSER", "nodelifeq"];
        args.extend_from_slice(rules);
        admin.custom::<Value, _>(CustomCommand::new_static("ACL", None, false), args)
    };
    acl(&["on", ">secret", "~*", "&*", "+@all", "-delifeq"])
        .await
        .unwrap();
    let mut nodes = set.urls();
    nodes[0] = set.node(0).url_as("nodelifeq", "secret");
    let c = Coordinator::connect(Config {
        nodes,
        node_timeout: Duration::from_millis(500),
        ..Default::default()
    })
    .await
    .unwrap();

    let cycle = |key: &'static str| {
        let c = &c;
        async move {
            let lock = c.acquire(key, TTL).await.unwrap();
            lock.report().settled().await;
            let released = c.release(&lock).await.unwrap().settled().await;
            assert!(
                outcomes(&released)
                    .iter()
                    .all(|o| *o == NodeOutcome::Released),
                "{released}"
            );
        }
    };
    let before = ran(&set, 0).await;
    cycle("refused:1").await;
    cycle("refused:2").await;
    let after = ran(&set, 0).await;
    assert_eq!(after.delifeq, before.delifeq, "{after:?}");
    assert_eq!(
        after.delifeq_refused,
        before.delifeq_refused + 1,
        "{after:?}"
    );
    assert_eq!(after.evalsha, before.evalsha + 2, "{after:?}");
    assert!(set.nodes_holding("refused:1").await.is_empty());
    assert!(ran(&set, 1).await.delifeq >= 2);

    // Allowed now, and the connection cut: the node is asked again once it reconnects.
    acl(&["+delifeq"]).await.unwrap();
    let _: Value = admin
        .custom(
            CustomCommand::new_static("CLIENT", None, false),
            vec!["KILL", "USER", "nodelifeq"],
        )
        .await
        .unwrap();
    let native = common::eventually(Duration::from_secs(10), || async {
        let key = "refused:again";
        if let Ok(lock) = c.acquire(key, TTL).await {
            lock.report().settled().await;
            let _ = c.release(&lock).await;
        }
        ran(&set, 0).await.delifeq > after.delifeq
    })
    .await;
    assert!(
        native,
        "node 0 never released by DELIFEQ once allowed and reconnected"
    );
    admin.quit().await.unwrap();
    c.close().await;
}

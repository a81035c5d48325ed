//! Connecting a coordinator against real redis-server processes: URLs that cannot name a
//! server, URLs that name one server twice, and nodes that refuse the connection (wrong or
//! missing password, database out of range), whose reason must reach logs and reports
//! without the password.

mod common;

use std::time::Duration;

use fred::prelude::{Builder, ClientLike, Config as FredConfig, ServerConfig};
use fred::types::CustomCommand;
use redlock_core::{Config, ConfigError, Coordinator, Error, NodeOutcome, RoundReport};
use redlock_testkit::{Node, NodeSet};
use tracing_subscriber::filter::LevelFilter;

const TTL: Duration = Duration::from_secs(10);
/// The password the server requires.
const SERVER_PASSWORD: &str = "server-Pa55word";
/// The wrong password given in a node URL; must never show anywhere.
const WRONG_PASSWORD: &str = "wrong-Pa55word";

fn config(nodes: Vec<String>) -> Config {
    Config {
        nodes,
        node_timeout: Duration::from_millis(200),
        ..Default::default()
    }
}

/// `CONFIG SET requirepass <password>` on `node`, through a plain fred client (the
/// harness has no CONFIG SET). Existing connections stay authenticated; new ones need it.
async fn require_password(node: &Node, password: &str) {
    let fred = FredConfig {
        server: ServerConfig::new_centralized("127.0.0.1", node.port()),
        ..Default::default()
    };
    let client = Builder::from_config(fred).build().unwrap();
    client.init().await.unwrap();
    let () = client
        .custom(
            CustomCommand::new_static("CONFIG", None, false),
            vec!["SET", "requirepass", password],
        )
        .await
        .unwrap();
    client.quit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_url_with_port_zero_is_rejected() {
    let set = NodeSet::start(2).await.unwrap();
    let mut nodes = set.urls();
    nodes.push("redis://:port-zero-pw@127.0.0.1:0".to_string());
    let err = Coordinator::connect(config(nodes)).await.unwrap_err();
    let ConfigError::InvalidUrl { url, reason } = &err else {
        panic!("expected InvalidUrl, got {err}");
    };
    assert_eq!(url, "redis://:***@127.0.0.1:0");
    assert!(reason.contains("port 0"), "{reason}");
    assert!(!err.to_string().contains("port-zero-pw"), "{err}");
    assert!(!format!("{err:?}").contains("port-zero-pw"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_under_two_host_names_is_rejected_at_connect() {
    let set = NodeSet::start(3).await.unwrap();
    let alias = format!("redis://localhost:{}", set.node(0).port());
    let mut nodes = set.urls();
    nodes.push(alias.clone());
    let err = Coordinator::connect(config(nodes)).await.unwrap_err();
    let ConfigError::DuplicateServer { first, second } = &err else {
        panic!("expected DuplicateServer, got {err}");
    };
    assert_eq!(first, &set.node(0).url());
    assert_eq!(second, &alias);
    assert!(err.to_string().contains(&alias), "{err}");
}

/// Two databases of one server are one server: one failure domain, one vote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_databases_of_one_server_are_rejected_at_connect_without_the_password() {
    let set = NodeSet::start(3).await.unwrap();
    require_password(set.node(0), SERVER_PASSWORD).await;
    let port = set.node(0).port();
    let nodes = vec![
        format!("redis://:{SERVER_PASSWORD}@127.0.0.1:{port}/0"),
        set.node(1).url(),
        format!("redis://:{SERVER_PASSWORD}@127.0.0.1:{port}/1"),
        set.node(2).url(),
    ];
    // The URL text differs (another database): only the server's identity tells.
    assert!(config(nodes.clone()).validate().is_ok());
    let err = Coordinator::connect(config(nodes)).await.unwrap_err();
    let ConfigError::DuplicateServer { first, second } = &err else {
        panic!("expected DuplicateServer, got {err}");
    };
    assert_eq!(first, &format!("redis://:***@127.0.0.1:{port}/0"));
    assert_eq!(second, &format!("redis://:***@127.0.0.1:{port}/1"));
    assert!(!err.to_string().contains(SERVER_PASSWORD), "{err}");
    assert!(!format!("{err:?}").contains(SERVER_PASSWORD), "{err:?}");
}

/// A node that cannot be reached at connect cannot be identified: the coordinator starts,
/// and a warning names the nodes it could not check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_down_at_connect_are_named_as_unchecked() {
    let set = NodeSet::start(3).await.unwrap();
    set.node(0).kill().unwrap();
    let alias = format!("redis://localhost:{}", set.node(0).port());
    let mut nodes = set.urls();
    nodes.push(alias.clone());
    let (logs, guard) = common::logs::capture(LevelFilter::WARN);
    let c = Coordinator::connect(config(nodes)).await.unwrap();
    drop(guard);
    assert_eq!(c.nodes().len(), 4);
    let logs = logs.text();
    let unchecked = logs
        .lines()
        .find(|l| l.contains("not checked"))
        .unwrap_or_else(|| panic!("no warning about unchecked nodes:\n{logs}"));
    assert!(unchecked.contains(&set.node(0).url()), "{unchecked}");
    assert!(unchecked.contains(&alias), "{unchecked}");
    assert!(!unchecked.contains(&set.node(1).url()), "{unchecked}");
    c.close().await;
}

/// Connects a coordinator where node 0 of a three-node set is reached through `bad_url`,
/// and checks that the connect warning, the rounds' reports and a one-node coordinator's
/// error all carry `expected` (the server's reason and our explanation), and never
/// `secret`.
async fn a_refused_node_says_why(set: &NodeSet, bad_url: &str, expected: &[&str], secret: &str) {
    let shown = |text: &str, what: &str| {
        for part in expected {
            assert!(text.contains(part), "{what} lacks `{part}`: {text}");
        }
        assert!(!text.contains(secret), "{what} shows the password: {text}");
    };
    let hidden = |text: &str, what: &str| {
        assert!(!text.contains(secret), "{what} shows the password: {text}");
    };
    let node0 = |report: &RoundReport| report.nodes[0].outcome.clone();

    let mut nodes = set.urls();
    nodes[0] = bad_url.to_string();
    let (logs, guard) = common::logs::capture(LevelFilter::WARN);
    // A minority of misconfigured nodes does not stop the coordinator.
    let c = Coordinator::connect(config(nodes)).await.unwrap();
    drop(guard);
    let logs = logs.text();
    let warning = logs
        .lines()
        .find(|l| l.contains("not usable at start-up"))
        .unwrap_or_else(|| panic!("no start-up warning:\n{logs}"));
    shown(warning, "the connect warning");
    hidden(&logs, "the logs");
    let name = c.nodes()[0].to_string();
    assert!(warning.contains(&name), "{warning}");
    hidden(&name, "the node name");

    // Rounds: the two good nodes are a quorum; node 0 says why it refused.
    let lock = c.acquire("refused", TTL).await.unwrap();
    let settled = lock.report().settled().await;
    assert!(
        matches!(node0(&settled), NodeOutcome::ServerError(_)),
        "{settled}"
    );
    shown(&node0(&settled).to_string(), "the acquire outcome");
    hidden(&settled.to_string(), "the acquire report");
    hidden(&format!("{settled:?}"), "the acquire report's Debug");
    hidden(&format!("{lock:?}"), "the lock's Debug");

    let err = c.acquire("refused", TTL).await.unwrap_err();
    let settled = err.report().unwrap().settled().await;
    shown(&node0(&settled).to_string(), "the refused acquire outcome");
    hidden(&err.to_string(), "the error");
    hidden(&format!("{err:?}"), "the error's Debug");

    let released = c.release(&lock).await.unwrap().settled().await;
    shown(&node0(&released).to_string(), "the release outcome");
    hidden(&format!("{c:?}"), "the coordinator's Debug");
    hidden(&format!("{:?}", c.config()), "the configuration's Debug");
    c.close().await;

    // Alone, the node fails every round, and the error itself says why.
    let alone = Coordinator::connect(config(vec![bad_url.to_string()]))
        .await
        .unwrap();
    let err = alone.acquire("refused", TTL).await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    shown(&err.to_string(), "the one-node error");
    hidden(&format!("{err:?}"), "the one-node error's Debug");
    alone.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_reported_as_an_authentication_failure() {
    let set = NodeSet::start(3).await.unwrap();
    require_password(set.node(0), SERVER_PASSWORD).await;
    let bad = format!("redis://:{WRONG_PASSWORD}@127.0.0.1:{}", set.node(0).port());
    a_refused_node_says_why(
        &set,
        &bad,
        &[
            "authentication failed",
            "WRONGPASS",
            "check the user name and password",
        ],
        WRONG_PASSWORD,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_password_is_reported_as_an_authentication_failure() {
    let set = NodeSet::start(3).await.unwrap();
    require_password(set.node(0), SERVER_PASSWORD).await;
    a_refused_node_says_why(
        &set,
        &set.node(0).url(),
        &[
            "authentication failed",
            "NOAUTH",
            "check the user name and password",
        ],
        SERVER_PASSWORD,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_out_of_range_is_reported_with_the_server_reason() {
    let set = NodeSet::start(3).await.unwrap();
    require_password(set.node(0), SERVER_PASSWORD).await;
    let bad = format!(
        "redis://:{SERVER_PASSWORD}@127.0.0.1:{}/99",
        set.node(0).port()
    );
    a_refused_node_says_why(
        &set,
        &bad,
        &["DB index is out of range", "check the database number"],
        SERVER_PASSWORD,
    )
    .await;
}

/// A coordinator dropped without `close()` closes its connections: fred's tasks hold their
/// own references, and kept every node's socket open (reconnecting for ever) before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_coordinator_closes_its_connections() {
    let set = NodeSet::start(3).await.unwrap();
    let baseline = set.node(0).redis().connected_clients().await.unwrap();
    let c = common::coordinator(&set, Duration::from_millis(200)).await;
    let lock = c.acquire("dropped", Duration::from_secs(10)).await.unwrap();
    c.release(&lock).await.unwrap();
    c.quiesce().await;
    assert!(set.node(0).redis().connected_clients().await.unwrap() > baseline);
    drop(lock);
    drop(c);
    assert!(
        redlock_testkit::eventually(Duration::from_secs(10), || async {
            set.node(0).redis().connected_clients().await.unwrap() <= baseline
        })
        .await,
        "the dropped coordinator's connections stayed open"
    );
}

/// A coordinator dropped right after a lost round still rolls that round back: the
/// rollback runs in the background, holding the connections but not the coordinator, and
/// the drop used to close the connections at once, so it sent nothing and the key it had
/// set on one node stayed for its TTL. (A current-thread runtime: the rollback task runs
/// only after the drop.)
#[tokio::test]
async fn a_coordinator_dropped_after_a_lost_round_still_rolls_it_back() {
    let set = NodeSet::start(3).await.unwrap();
    for node in [0, 1] {
        set.node(node)
            .set("redlock:dropped", "someone-else", None)
            .await
            .unwrap();
    }
    let c = common::coordinator(&set, Duration::from_millis(500)).await;
    assert!(c
        .acquire("redlock:dropped", Duration::from_secs(60))
        .await
        .is_err());
    drop(c);
    assert!(
        redlock_testkit::eventually(Duration::from_secs(5), || async {
            set.node(2).get("redlock:dropped").await.unwrap().is_none()
        })
        .await,
        "the lost round's key stayed on node 2"
    );
}

/// A node that was down at connect and turns out, once it connects, to be another node's
/// server (here another database of node 0, through a proxy that refused connections at
/// first) casts no vote: its commands are refused, unsent, saying which node it repeats.
/// It used to vote: with node 1 held by another owner, the two databases of node 0 made a
/// quorum of this three-node configuration, while a client of the real three servers could
/// hold the lock too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_connects_late_as_another_nodes_server_casts_no_vote() {
    use redlock_core::ServerErrorKind;
    use redlock_testkit::{LinkFault, Links, Nodes};

    let set = NodeSet::start(3).await.unwrap();
    let links = Links::start(1, &set.addrs()[..1]).await.unwrap();
    links.set_client(0, LinkFault::Refuse);
    let alias = format!("{}/1", links.urls(0)[0]);
    let nodes = vec![set.node(0).url(), set.node(1).url(), alias.clone()];
    let c = Coordinator::connect(config(nodes)).await.unwrap();
    set.node(1).set("late", "someone-else", None).await.unwrap();
    links.set_client(0, LinkFault::Pass);
    // Refused while not identified, then for being node 0's server.
    let refused = redlock_testkit::eventually(Duration::from_secs(10), || async {
        let err = c.acquire("late", TTL).await.unwrap_err();
        c.quiesce().await;
        matches!(
            &err.report().unwrap().nodes[2].outcome,
            NodeOutcome::ServerError(e) if e.kind == ServerErrorKind::SameServer
        )
    })
    .await;
    assert!(
        refused,
        "the alias of node 0 was never refused as the same server"
    );
    let err = c.acquire("late", TTL).await.unwrap_err();
    let shown = err.to_string();
    assert!(shown.contains(&set.node(0).url()), "{shown}");
    assert!(
        shown.contains("list each independent master once"),
        "{shown}"
    );
    c.quiesce().await;
    // Nothing was sent there: database 1 never saw the key.
    let db1 = common::raw(&format!("{}/1", set.node(0).url())).await;
    let value: Option<String> = fred::prelude::KeysInterface::get(&db1, "late")
        .await
        .unwrap();
    assert_eq!(value, None);
    c.close().await;
}

/// A node that answers `INFO` with an error (here an ACL user without it, as managed
/// services often give) cannot be identified, and votes, with a warning: also one that was
/// down at connect and comes back later, which must not stay "not identified" for ever.
/// (Other error replies, `INFO` renamed away, no `run_id`, go the same way: unit test in
/// `connection::identity`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_may_not_run_info_votes_once_it_connects() {
    use redlock_testkit::{LinkFault, Links, NodeOptions, Nodes};

    let options = NodeOptions {
        acl_users: vec!["noinfo on >secret ~* &* +@all -info".into()],
        ..Default::default()
    };
    let set = NodeSet::start_with(3, options).await.unwrap();
    let links = Links::start(1, &set.addrs()[..1]).await.unwrap();
    links.set_client(0, LinkFault::Refuse);
    let as_user = |url: String| url.replacen("redis://", "redis://noinfo:secret@", 1);
    let nodes = vec![
        as_user(links.urls(0)[0].clone()),
        set.node(1).url_as("noinfo", "secret"),
        set.node(2).url_as("noinfo", "secret"),
    ];
    let c = Coordinator::connect(config(nodes)).await.unwrap();
    links.set_client(0, LinkFault::Pass);
    let votes = redlock_testkit::eventually(Duration::from_secs(10), || async {
        let won = c.acquire("unnamed", TTL).await;
        let node0 = won.as_ref().map(|l| l.report().nodes[0].outcome.clone());
        if let Ok(lock) = &won {
            c.release(lock).await.unwrap();
        }
        matches!(node0, Ok(NodeOutcome::Acquired))
    })
    .await;
    assert!(votes, "node 0 never voted once back");
    c.close().await;
}

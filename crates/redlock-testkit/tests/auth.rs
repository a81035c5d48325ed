//! Nodes with a password (`NodeOptions::password`) and ACL users (`NodeOptions::acl_users`):
//! outside clients must authenticate, the harness's own connections do, and no secret shows
//! in `Debug` output or errors.

mod cli;

use cli::Cli;
use fred::prelude::{Builder, ClientLike, Config};
use redlock_testkit::{HarnessError, NodeOptions, NodeSet, Nodes};

/// Characters that need percent-encoding in a URL, and a space.
const PASSWORD: &str = "p@ss:w/rd %1";
const LOCKER: &str = "locker on >l0cker-pw ~redlock:* &* +ping +set +eval";

fn password_options() -> NodeOptions {
    NodeOptions {
        password: Some(PASSWORD.to_owned()),
        ..NodeOptions::default()
    }
}

#[tokio::test]
async fn a_password_node_refuses_unauthenticated_clients() {
    let nodes = NodeSet::start_with(2, password_options())
        .await
        .expect("start password nodes");
    for node in &nodes {
        let anonymous = Cli::tcp(node.port()).run(&["PING"]);
        assert!(
            !anonymous.ok && anonymous.text.contains("NOAUTH"),
            "{anonymous:?}"
        );
        let wrong = Cli::tcp(node.port()).password("wrong").run(&["PING"]);
        assert!(!wrong.ok, "{wrong:?}");
        Cli::tcp(node.port())
            .password(PASSWORD)
            .assert_pong("with the password");
    }
}

#[tokio::test]
async fn the_harness_authenticates_its_own_connections() {
    let nodes = NodeSet::start_with(3, password_options())
        .await
        .expect("start password nodes");
    nodes.node(0).set("k", "v", Some(60_000)).await.unwrap();
    nodes.redis(2).set("k", "v", None).await.unwrap();
    assert_eq!(nodes.node(0).get("k").await.unwrap().as_deref(), Some("v"));
    assert_eq!(nodes.nodes_holding("k").await, vec![0, 2]);
    nodes
        .node(1)
        .restart()
        .await
        .expect("restart with the password");
    assert_eq!(nodes.node(1).dbsize().await.unwrap(), 0);
    let anonymous = Cli::tcp(nodes.node(1).port()).run(&["PING"]);
    assert!(anonymous.text.contains("NOAUTH"), "{anonymous:?}");
}

#[tokio::test]
async fn urls_carry_the_password_percent_encoded() {
    let nodes = NodeSet::start_with(1, password_options())
        .await
        .expect("start");
    let node = nodes.node(0);
    let url = format!("redis://:p%40ss%3Aw%2Frd%20%251@127.0.0.1:{}", node.port());
    assert_eq!(node.url(), url);
    assert_eq!(nodes.urls(), vec![url.clone()]);
    assert_eq!(Nodes::urls(&nodes), vec![url.clone()]);

    let client = Builder::from_config(Config::from_url(&url).unwrap())
        .build()
        .unwrap();
    client
        .init()
        .await
        .expect("fred connects with the node's URL");
    let pong: String = client.ping(None).await.unwrap();
    assert_eq!(pong, "PONG");
    client.quit().await.unwrap();
}

#[tokio::test]
async fn an_acl_user_runs_allowed_commands_only() {
    let opts = NodeOptions {
        acl_users: vec![LOCKER.to_owned()],
        ..NodeOptions::default()
    };
    let nodes = NodeSet::start_with(1, opts).await.expect("start");
    let node = nodes.node(0);
    let locker = Cli::tcp(node.port()).user("locker", "l0cker-pw");
    let set = locker.run(&["SET", "redlock:a", "1"]);
    assert!(set.ok && set.text == "OK", "{set:?}");
    let get = locker.run(&["GET", "redlock:a"]);
    assert!(!get.ok && get.text.contains("NOPERM"), "{get:?}");
    let other_key = locker.run(&["SET", "elsewhere", "1"]);
    assert!(other_key.text.contains("NOPERM"), "{other_key:?}");
    // The default user is untouched: no password.
    Cli::tcp(node.port()).assert_pong("the default user");
    assert_eq!(node.get("redlock:a").await.unwrap().as_deref(), Some("1"));
    assert_eq!(
        node.url_as("locker", "l0cker-pw"),
        format!("redis://locker:l0cker-pw@127.0.0.1:{}", node.port())
    );
    node.restart().await.expect("restart");
    locker.assert_pong("the ACL user after a restart");
}

#[tokio::test]
async fn acl_users_beside_a_password() {
    let opts = NodeOptions {
        acl_users: vec![LOCKER.to_owned()],
        ..password_options()
    };
    let nodes = NodeSet::start_with(1, opts).await.expect("start");
    let port = nodes.node(0).port();
    Cli::tcp(port)
        .user("locker", "l0cker-pw")
        .assert_pong("the ACL user");
    Cli::tcp(port)
        .user("default", PASSWORD)
        .assert_pong("the default user with the password");
    assert!(Cli::tcp(port).run(&["PING"]).text.contains("NOAUTH"));
}

#[tokio::test]
async fn no_secret_shows_in_debug_output_or_errors() {
    let opts = NodeOptions {
        acl_users: vec![LOCKER.to_owned()],
        ..password_options()
    };
    let nodes = NodeSet::start_with(1, opts.clone()).await.expect("start");
    for shown in [
        format!("{opts:?}"),
        format!("{nodes:?}"),
        format!("{:?}", nodes.node(0).redis()),
    ] {
        assert!(!shown.contains(PASSWORD), "{shown}");
        assert!(!shown.contains("l0cker-pw"), "{shown}");
    }

    // redis-server quotes the rule it rejects, password included, in its log.
    let bad = NodeOptions {
        acl_users: vec!["locker on >l0cker-pw no-such-rule".to_owned()],
        ..password_options()
    };
    let err = NodeSet::start_with(1, bad).await.expect_err("bad ACL rule");
    let msg = err.to_string();
    assert!(matches!(err, HarnessError::StartFailed { .. }), "{msg}");
    assert!(
        msg.contains("no-such-rule"),
        "the log tail is quoted: {msg}"
    );
    assert!(
        !msg.contains("l0cker-pw") && !msg.contains(PASSWORD),
        "{msg}"
    );
    assert!(!format!("{err:?}").contains("l0cker-pw"));
}

#[tokio::test]
async fn invalid_options_fail_before_starting() {
    let opts = NodeOptions {
        password: Some(String::new()),
        ..NodeOptions::default()
    };
    let err = NodeSet::start_with(1, opts)
        .await
        .expect_err("empty password");
    assert!(matches!(err, HarnessError::InvalidOptions { .. }), "{err}");
}

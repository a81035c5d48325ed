//! Nodes that also listen on a unix socket (`NodeOptions::unix_socket`).

mod cli;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};

use cli::Cli;
use redlock_testkit::{NodeOptions, NodeSet};

fn socket_options() -> NodeOptions {
    NodeOptions {
        unix_socket: true,
        ..NodeOptions::default()
    }
}

#[tokio::test]
async fn a_unix_socket_node_answers_on_its_socket() {
    let nodes = NodeSet::start_with(2, socket_options())
        .await
        .expect("start unix-socket nodes");
    for node in &nodes {
        let socket = node.unix_socket().expect("a socket path");
        assert_eq!(socket, node.dir().join("redis.sock"));
        let meta = std::fs::metadata(socket).expect("the socket exists");
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        assert_eq!(
            node.unix_url(),
            Some(format!("redis+unix://{}", socket.display()))
        );
        Cli::unix(socket).assert_pong("PING on the socket");
        node.set("k", "over tcp", None).await.unwrap();
        let get = Cli::unix(socket).run(&["GET", "k"]);
        assert_eq!(get.text, "over tcp", "same server behind both: {get:?}");
    }
    assert_eq!(nodes.unix_urls().map(|u| u.len()), Some(2));
}

#[tokio::test]
async fn restart_keeps_the_socket_and_its_password() {
    let opts = NodeOptions {
        password: Some("sock-pw".to_owned()),
        ..socket_options()
    };
    let nodes = NodeSet::start_with(1, opts).await.expect("start");
    let node = nodes.node(0);
    let socket = node.unix_socket().unwrap().to_owned();
    assert_eq!(
        node.unix_url(),
        Some(format!(
            "redis+unix://:sock-pw@localhost{}",
            socket.display()
        ))
    );
    assert_eq!(
        node.unix_url_as("locker", "s3"),
        Some(format!(
            "redis+unix://locker:s3@localhost{}",
            socket.display()
        ))
    );
    let anonymous = Cli::unix(&socket).run(&["PING"]);
    assert!(anonymous.text.contains("NOAUTH"), "{anonymous:?}");
    node.kill().unwrap();
    assert!(!Cli::unix(&socket).password("sock-pw").run(&["PING"]).ok);
    node.restart().await.expect("restart");
    assert_eq!(node.unix_socket(), Some(socket.as_path()));
    Cli::unix(&socket)
        .password("sock-pw")
        .assert_pong("after restart");
}

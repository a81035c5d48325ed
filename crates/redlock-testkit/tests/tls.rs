//! TLS nodes (`NodeOptions::tls`): a second, TLS port with certificates from the set's
//! `TestPki`, checked with `redis-cli --tls` as an outside client.

mod cli;

use cli::Cli;
use redlock_testkit::{NodeOptions, NodeSet, TlsNodeOptions};

fn tls_options(require_client_cert: bool) -> NodeOptions {
    NodeOptions {
        tls: Some(TlsNodeOptions {
            require_client_cert,
            ..TlsNodeOptions::default()
        }),
        ..NodeOptions::default()
    }
}

#[tokio::test]
async fn a_tls_node_answers_with_the_ca_and_refuses_a_client_trusting_another() {
    if redlock_testkit::skip_without_tls(
        "a_tls_node_answers_with_the_ca_and_refuses_a_client_trusting_another",
    ) {
        return;
    }
    let nodes = NodeSet::start_with(2, tls_options(false))
        .await
        .expect("start TLS nodes");
    let pki = nodes.pki().expect("a TLS set has a PKI");
    for node in &nodes {
        let tls_port = node.tls_port().expect("a TLS port");
        assert_ne!(tls_port, node.port());
        assert_eq!(
            node.tls_url(),
            Some(format!("rediss://localhost:{tls_port}"))
        );
        assert!(std::ptr::eq(node.pki().unwrap(), pki), "one CA per set");

        Cli::tcp(tls_port)
            .tls(pki.ca_path())
            .assert_pong("TLS with the set's CA");
        let wrong_ca = Cli::tcp(tls_port).tls(pki.other_ca_path()).run(&["PING"]);
        assert!(
            !wrong_ca.ok && wrong_ca.text.contains("certificate verify failed"),
            "a client trusting another CA must refuse the node: {wrong_ca:?}"
        );
        // TLS without --tls on the TLS port is no Redis protocol.
        assert!(!Cli::tcp(tls_port).run(&["PING"]).ok);
        // The plain port stays open for the harness.
        Cli::tcp(node.port()).assert_pong("plain port of a TLS node");
        node.set("k", "v", None)
            .await
            .expect("inspection over the plain port");
    }
    assert_eq!(
        nodes.tls_urls(),
        Some(nodes.iter().map(|n| n.tls_url().unwrap()).collect())
    );
}

#[tokio::test]
async fn require_client_cert_accepts_only_a_certificate_of_the_sets_ca() {
    if redlock_testkit::skip_without_tls(
        "require_client_cert_accepts_only_a_certificate_of_the_sets_ca",
    ) {
        return;
    }
    let nodes = NodeSet::start_with(1, tls_options(true))
        .await
        .expect("start a mutual-TLS node");
    let (node, pki) = (nodes.node(0), nodes.pki().unwrap());
    let port = node.tls_port().unwrap();

    let without_cert = Cli::tcp(port).tls(pki.ca_path()).run(&["PING"]);
    assert!(!without_cert.ok, "no client certificate: {without_cert:?}");
    let other_cert = Cli::tcp(port)
        .tls(pki.ca_path())
        .client_cert(pki.other_client_cert_path(), pki.other_client_key_path())
        .run(&["PING"]);
    assert!(
        !other_cert.ok,
        "a certificate of another CA: {other_cert:?}"
    );
    Cli::tcp(port)
        .tls(pki.ca_path())
        .client_cert(pki.client_cert_path(), pki.client_key_path())
        .assert_pong("the set's client certificate");
}

#[tokio::test]
async fn restart_keeps_the_tls_port_and_certificates() {
    if redlock_testkit::skip_without_tls("restart_keeps_the_tls_port_and_certificates") {
        return;
    }
    let opts = NodeOptions {
        password: Some("tls-pw".to_owned()),
        ..tls_options(false)
    };
    let nodes = NodeSet::start_with(1, opts).await.expect("start");
    let (node, pki) = (nodes.node(0), nodes.pki().unwrap());
    let port = node.tls_port().unwrap();
    assert_eq!(
        node.tls_url(),
        Some(format!("rediss://:tls-pw@localhost:{port}"))
    );
    assert_eq!(
        node.tls_url_as("locker", "s3"),
        Some(format!("rediss://locker:s3@localhost:{port}"))
    );
    node.kill().unwrap();
    assert!(
        !Cli::tcp(port)
            .tls(pki.ca_path())
            .password("tls-pw")
            .run(&["PING"])
            .ok
    );
    node.restart().await.expect("restart");
    assert_eq!(node.tls_port(), Some(port));
    Cli::tcp(port)
        .tls(pki.ca_path())
        .password("tls-pw")
        .assert_pong("after restart");
}

#[tokio::test]
async fn plain_sets_have_no_tls() {
    let nodes = NodeSet::start(1).await.expect("start");
    assert!(nodes.pki().is_none());
    assert_eq!(nodes.node(0).tls_port(), None);
    assert_eq!(nodes.node(0).tls_url(), None);
    assert_eq!(nodes.tls_urls(), None);
    assert_eq!(nodes.unix_urls(), None);
}

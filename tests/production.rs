//! Production connectivity against real redis-server nodes: TLS (custom CA, server name
//! check on and off, mutual TLS, a wrong CA), a password and a minimal ACL user, unix
//! sockets mixed with TCP, typed server errors, the node health check, and secrets that
//! never show in any error, report or `Debug` output.

mod common;

use std::time::Duration;

use fred::interfaces::ClientLike;
use redlock_client::{
    Error, HealthPolicy, HealthProblem, LockConfig, LockConfigBuilder, LockOptions, NodeOutcome,
    Owner, Redlock, ServerErrorKind, TlsConfig,
};
use redlock_core::ConfigError;
use redlock_testkit::{NodeOptions, NodeSet, TlsNodeOptions};

use common::{eventually, raw};

/// A password no message may ever show.
const SECRET: &str = "Pa55-w0rd-never-shown";

/// The minimal ACL rules for a lock user under the default key prefix `redlock:`, as the
/// README documents them (the password added in front).
const LOCK_ACL: &str = "resetchannels ~redlock:* &redlock:* -@all +ping +info +client|id \
    +set +get +del +exists +pttl +pexpire +type +hset +hget +hdel +hlen +hexists +hkeys \
    +eval +evalsha +script|load +publish +subscribe +unsubscribe \
    +zadd +zrem +zrange +zrangebyscore +zremrangebyscore +zscore +time";

fn builder(urls: Vec<String>) -> LockConfigBuilder {
    LockConfig::builder()
        .nodes(urls)
        .ttl(Duration::from_secs(5))
        .node_timeout(Duration::from_millis(500))
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
}

fn no_retry() -> LockOptions {
    LockOptions {
        retry: Some(redlock_client::RetryPolicy::no_retry()),
        ..Default::default()
    }
}

async fn connect(config: LockConfigBuilder) -> Redlock {
    Redlock::connect(config.build().expect("a valid config"))
        .await
        .expect("the client connects")
}

/// Every path of the API once: plain, fenced, fair, several keys, reentrant, extend,
/// inspect, release; then no key is left on any node.
async fn every_path(client: &Redlock, set: &NodeSet) {
    let guard = client.lock("paths").await.expect("plain lock");
    guard.extend(None).await.expect("extend");
    assert_eq!(client.inspect("paths").await.unwrap().held, Some(true));
    guard.release().await.expect("release");
    let fenced = client
        .lock_with(
            "paths",
            &LockOptions {
                fenced: Some(true),
                ..Default::default()
            },
        )
        .await
        .expect("fenced lock");
    assert!(fenced.fencing_token().is_some());
    fenced.release().await.expect("release fenced");
    let fair = LockOptions {
        fair: Some(true),
        ..Default::default()
    };
    let first = client.lock_with("paths", &fair).await.expect("fair lock");
    // A second fair waiter queues behind the first and is handed the lock on release.
    let next = {
        let client = client.clone();
        let fair = fair.clone();
        tokio::spawn(async move { client.lock_with("paths", &fair).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.release().await.expect("release fair");
    let second = next.await.unwrap().expect("fair lock after a wait");
    second.release().await.expect("release fair again");
    client.coordinator().quiesce().await;
    let many = client
        .lock_many(&["a", "b"], &LockOptions::default())
        .await
        .expect("lock_many");
    many.release().await.expect("release many");
    let owner = Owner::named("worker-1");
    let first = client
        .lock_reentrant("shared", &owner, &LockOptions::default())
        .await
        .expect("reentrant");
    let second = client
        .lock_reentrant("shared", &owner, &LockOptions::default())
        .await
        .expect("reentrant again");
    let inspection = client
        .inspect("shared")
        .await
        .expect("inspect a reentrant lock");
    assert_eq!(inspection.held_by(first.lock().token()), Some(true));
    first.release().await.expect("release first hold");
    second.release().await.expect("release last hold");
    for key in [
        "redlock:paths",
        "redlock:a",
        "redlock:b",
        "redlock:shared",
        "redlock:fair-queue:{redlock:paths}",
        "redlock:fair-expiry:{redlock:paths}",
    ] {
        assert!(set.nodes_holding(key).await.is_empty(), "{key} left behind");
    }
}

fn tls_nodes(require_client_cert: bool, server_names: &[&str]) -> NodeOptions {
    NodeOptions {
        tls: Some(TlsNodeOptions {
            require_client_cert,
            server_names: server_names.iter().map(|s| s.to_string()).collect(),
        }),
        ..Default::default()
    }
}

/// The reasons the nodes of a failed round give, joined.
fn reasons(error: &Error) -> String {
    let report = match error {
        Error::NotAcquired { report, .. } | Error::Unreachable { report, .. } => report,
        other => panic!("not a round failure: {other}"),
    };
    report
        .nodes
        .iter()
        .map(|n| format!("{}: {}", n.node, n.outcome))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_the_ca_in_the_config_runs_every_path() {
    if redlock_testkit::skip_without_tls("tls_with_the_ca_in_the_config_runs_every_path") {
        return;
    }
    let set = NodeSet::start_with(3, tls_nodes(false, &["localhost", "127.0.0.1"]))
        .await
        .unwrap();
    let pki = set.pki().expect("a TLS set has its PKI");
    // The CA inline, as PEM text.
    let inline = TlsConfig {
        ca_pem: Some(pki.ca_pem().to_string()),
        ..Default::default()
    };
    let client = connect(builder(set.tls_urls().unwrap()).tls(inline)).await;
    every_path(&client, &set).await;
    client.shutdown().await;
    // The CA as a file, read from the TOML form of the configuration.
    let toml = format!(
        "nodes = {:?}\n[tls]\nca_file = {:?}\n",
        set.tls_urls().unwrap(),
        pki.ca_path().display().to_string()
    );
    let config: LockConfig = toml::from_str(&toml).expect("TOML with a [tls] table");
    assert_eq!(
        config.tls.as_ref().unwrap().ca_file.as_deref(),
        Some(pki.ca_path())
    );
    let client = Redlock::connect(config).await.unwrap();
    client
        .lock("from-toml")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    client.shutdown().await;
}

/// A TLS node addressed by its IPv6 address (`rediss://[::1]:port`) is checked against that
/// address: the URL's host keeps its brackets, which were passed on as the name to check,
/// and the handshake failed as "not a valid DNS name" (blaming the certificate), though
/// the node's certificate names `::1`. The nodes listen on 127.0.0.1: a forwarder on
/// `[::1]` stands in front of each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_node_at_an_ipv6_address_is_checked_against_that_address() {
    if redlock_testkit::skip_without_tls(
        "a_tls_node_at_an_ipv6_address_is_checked_against_that_address",
    ) {
        return;
    }
    let set = NodeSet::start_with(3, tls_nodes(false, &["::1"]))
        .await
        .unwrap();
    let pki = set.pki().expect("a TLS set has its PKI");
    let mut urls = Vec::new();
    for node in set.iter() {
        let listener = tokio::net::TcpListener::bind("[::1]:0")
            .await
            .expect("IPv6 loopback");
        let port = listener.local_addr().unwrap().port();
        let target = format!("127.0.0.1:{}", node.tls_port().unwrap());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        urls.push(format!("rediss://[::1]:{port}"));
    }
    let ca = TlsConfig {
        ca_pem: Some(pki.ca_pem().to_string()),
        ..Default::default()
    };
    let client = connect(builder(urls).tls(ca)).await;
    let guard = client.lock("ipv6").await.expect("locked over TLS at ::1");
    guard.release().await.unwrap();
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_name_is_checked_unless_told_otherwise() {
    if redlock_testkit::skip_without_tls("the_server_name_is_checked_unless_told_otherwise") {
        return;
    }
    // Certificates issued for a name the URLs do not use.
    let set = NodeSet::start_with(3, tls_nodes(false, &["redis.internal"]))
        .await
        .unwrap();
    let pki = set.pki().unwrap();
    let ca = || TlsConfig {
        ca_pem: Some(pki.ca_pem().to_string()),
        ..Default::default()
    };
    // Checked against the URL's host (localhost): refused, and the error says why.
    let client = connect(builder(set.tls_urls().unwrap()).tls(ca())).await;
    let error = client.lock_with("k", &no_retry()).await.unwrap_err();
    let text = reasons(&error);
    assert!(text.contains("TLS handshake failed"), "{text}");
    assert!(text.contains("tls.server_name"), "{text}");
    client.shutdown().await;
    // Checked against the configured name: accepted.
    let named = TlsConfig {
        server_name: Some("redis.internal".into()),
        ..ca()
    };
    let client = connect(builder(set.tls_urls().unwrap()).tls(named)).await;
    client.lock("k").await.unwrap().release().await.unwrap();
    client.shutdown().await;
    // Name check off: accepted, but the chain is still checked (next test).
    let unchecked = TlsConfig {
        skip_name_check: true,
        ..ca()
    };
    let client = connect(builder(set.tls_urls().unwrap()).tls(unchecked)).await;
    client.lock("k").await.unwrap().release().await.unwrap();
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_refused_with_the_node_named_even_without_the_name_check() {
    if redlock_testkit::skip_without_tls(
        "a_wrong_ca_is_refused_with_the_node_named_even_without_the_name_check",
    ) {
        return;
    }
    let set = NodeSet::start_with(3, tls_nodes(false, &["localhost"]))
        .await
        .unwrap();
    let pki = set.pki().unwrap();
    let wrong = TlsConfig {
        ca_file: Some(pki.other_ca_path().to_path_buf()),
        skip_name_check: true,
        ..Default::default()
    };
    let client = connect(builder(set.tls_urls().unwrap()).tls(wrong)).await;
    let error = client.lock_with("k", &no_retry()).await.unwrap_err();
    let text = error.to_string();
    for node in set.tls_urls().unwrap() {
        assert!(text.contains(&node), "{node} not named in: {text}");
    }
    assert!(reasons(&error).contains("TLS handshake failed"), "{text}");
    assert!(text.contains("tls.ca_file"), "{text}");
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_certificate() {
    if redlock_testkit::skip_without_tls("mutual_tls_needs_the_client_certificate") {
        return;
    }
    let set = NodeSet::start_with(3, tls_nodes(true, &["localhost"]))
        .await
        .unwrap();
    let pki = set.pki().unwrap();
    let ca = TlsConfig {
        ca_pem: Some(pki.ca_pem().to_string()),
        ..Default::default()
    };
    let client = connect(builder(set.tls_urls().unwrap()).tls(ca.clone())).await;
    let error = client.lock_with("k", &no_retry()).await.unwrap_err();
    // Each node is named with advice that points at the client certificate setting. (TLS
    // 1.3 reports the refusal after the client's side of the handshake: as the server's
    // `certificate required` alert, or, when the client wrote first, as a closed
    // connection.)
    let text = reasons(&error);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    for (line, node) in lines.iter().zip(set.tls_urls().unwrap()) {
        assert!(
            line.starts_with(&format!("{node}: ")),
            "{node} not named: {line}"
        );
        assert!(line.contains("requires a client certificate"), "{line}");
        assert!(line.contains("`tls.client_cert_file`"), "{line}");
    }
    client.shutdown().await;
    let mutual = TlsConfig {
        client_cert_file: Some(pki.client_cert_path().to_path_buf()),
        client_key_pem: Some(pki.client_key_pem().to_string()),
        ..ca
    };
    // The key never shows in the configuration's Debug output.
    let config = builder(set.tls_urls().unwrap())
        .tls(mutual)
        .build()
        .unwrap();
    assert!(!format!("{config:?}").contains("PRIVATE KEY"));
    let client = Redlock::connect(config).await.unwrap();
    every_path(&client, &set).await;
    client.shutdown().await;
}

#[tokio::test]
async fn unusable_tls_settings_are_typed_errors_before_anything_connects() {
    let urls = vec!["rediss://localhost:1".to_string()];
    let missing = TlsConfig {
        ca_file: Some("/nonexistent/ca.pem".into()),
        ..Default::default()
    };
    let error = builder(urls.clone()).tls(missing).build().unwrap_err();
    assert!(
        error
            .to_string()
            .contains("cannot read `/nonexistent/ca.pem`"),
        "{error}"
    );
    let not_pem = TlsConfig {
        ca_pem: Some("not a certificate".into()),
        ..Default::default()
    };
    let error = builder(urls.clone()).tls(not_pem).build().unwrap_err();
    assert!(error.to_string().contains("BEGIN CERTIFICATE"), "{error}");
    let bad_key = TlsConfig {
        client_cert_pem: Some("x".into()),
        client_key_pem: Some("-----BEGIN PRIVATE KEY-----\nnot-a-key-but-secret\n".into()),
        ..Default::default()
    };
    let error = builder(urls).tls(bad_key).build().unwrap_err();
    assert!(
        !error.to_string().contains("not-a-key-but-secret"),
        "{error}"
    );
    // TLS settings with no TLS node: the connections would not be encrypted.
    let error = builder(vec!["redis://127.0.0.1:1".into()])
        .tls(TlsConfig::default())
        .build()
        .unwrap_err();
    assert!(
        matches!(
            error,
            redlock_client::InvalidConfig::Core(ConfigError::TlsUnused)
        ),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_node_works_with_the_password_and_says_what_is_wrong_without_it() {
    let set = password_nodes().await;
    assert!(set.urls()[0].contains(SECRET));
    let client = connect(builder(set.urls())).await;
    every_path(&client, &set).await;
    client.shutdown().await;

    // Without a password: fred's handshake (PING) is refused with NOAUTH, so the
    // connection is not up and every round reports the refusal.
    let bare: Vec<String> = set
        .iter()
        .map(|n| format!("redis://127.0.0.1:{}", n.port()))
        .collect();
    let client = connect(builder(bare)).await;
    let error = client.lock_with("k", &no_retry()).await.unwrap_err();
    refused_by_every_node(&error, ServerErrorKind::Auth, "connect").await;
    assert!(
        error
            .to_string()
            .contains("check the user name and password"),
        "{error}"
    );
    client.shutdown().await;

    // A wrong password: the connection's AUTH is refused.
    let wrong: Vec<String> = set
        .iter()
        .map(|n| format!("redis://:wrong-{SECRET}@127.0.0.1:{}", n.port()))
        .collect();
    let client = connect(builder(wrong)).await;
    let error = client.lock_with("k", &no_retry()).await.unwrap_err();
    refused_by_every_node(&error, ServerErrorKind::Auth, "connect").await;
    assert_no_secret(&format!("{error} {error:?} {client:?}"));
    client.shutdown().await;
}

/// Three nodes with the user `noload`: the README's ACL line without `script|load`.
async fn nodes_with_a_user_that_may_not_load_scripts() -> NodeSet {
    NodeSet::start_with(
        3,
        NodeOptions {
            acl_users: vec![format!(
                "noload on >{SECRET} {}",
                LOCK_ACL.replace(" +script|load", "")
            )],
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

/// A user whose ACL lacks `script|load` (an ACL line older than the README's, or a proxy that
/// refuses `SCRIPT`): the scripts are never loaded, so acquisitions go as one `EVAL` with
/// the source (an acquisition is never sent twice, see `core_faults.rs`), and every path
/// works. Without that, every script acquisition was refused (`NOSCRIPT`) for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_that_may_not_load_scripts_runs_every_path() {
    let set = nodes_with_a_user_that_may_not_load_scripts().await;
    let client = connect(builder(set.urls_as("noload", SECRET))).await;
    every_path(&client, &set).await;
    client.shutdown().await;
}

/// The rollback of a failed acquisition on nodes that do not know the scripts (here a user
/// that may not load them; a node that restarted is the same until they are loaded again)
/// goes as one `EVAL` with the source. It went as `EVALSHA`, to be sent again as `EVAL` on
/// `NOSCRIPT`: but that answer comes after the acquisition it undoes has run, here long
/// after the rollback's node timeout, when nobody waits for it any more, so the `EVAL` was
/// never sent, by any of the three tries, and the acquisition's keys stayed for their TTL.
/// (A lock over many keys with a 5 ms node timeout met it at random in CI: the scripts'
/// load at connect timed out there now and then.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_on_nodes_without_the_scripts_is_sent_with_their_source() {
    let set = nodes_with_a_user_that_may_not_load_scripts().await;
    let client = connect(
        builder(set.urls_as("noload", SECRET))
            .node_timeout(Duration::from_millis(10))
            .ttl(Duration::from_secs(60)),
    )
    .await;
    // A lock over so many keys that each node takes far longer than the node timeout.
    let keys: Vec<String> = (0..100_000).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let err = client.lock_many(&keys, &no_retry()).await.unwrap_err();
    assert!(
        matches!(err, redlock_client::Error::Unreachable { .. }),
        "{err}"
    );
    let cleaned = redlock_testkit::eventually(Duration::from_secs(20), || async {
        let mut left = 0;
        for node in set.iter() {
            left += node.redis().dbsize().await.unwrap_or(1);
        }
        left == 0
    })
    .await;
    assert!(cleaned, "the failed acquisition's keys were left behind");
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_minimal_acl_user_runs_every_path_and_a_missing_permission_is_named() {
    let set = NodeSet::start_with(
        3,
        NodeOptions {
            acl_users: vec![
                format!("locker on >{SECRET} {LOCK_ACL}"),
                // Without the scripts: plain SET works, everything else is refused.
                format!(
                    "noscripts on >{SECRET} {}",
                    LOCK_ACL.replace("+eval +evalsha", "")
                ),
                // The lock's keys under another prefix only.
                format!(
                    "elsewhere on >{SECRET} {}",
                    LOCK_ACL.replace("~redlock:*", "~other:*")
                ),
            ],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let client = connect(builder(set.urls_as("locker", SECRET))).await;
    every_path(&client, &set).await;
    // Wake-up on release works under the ACL (SUBSCRIBE on the channel).
    let held = client.lock("wake").await.unwrap();
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move { client.lock("wake").await.map(|g| g.key()) })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.release().await.unwrap();
    assert_eq!(waiter.await.unwrap().unwrap(), "redlock:wake");
    client.shutdown().await;
    // Nothing the lock did was refused by the ACL.
    for node in set.iter() {
        // The health check's CONFIG GET and COMMAND INFO are refused by design (then
        // "unknown"); nothing else.
        let log = format!("{:?}", admin(&node.url(), "ACL", &["LOG"]).await);
        let refused = log.matches("String(\"object\")").count();
        let by_design = log.matches("String(\"config|get\")").count()
            + log.matches("String(\"command|info\")").count();
        assert_eq!(refused, by_design, "the ACL refused the lock user: {log}");
    }

    // Without the scripts on every node: refused at connect, the commands named (see
    // `production_health.rs`); with the check off, every lock that needs a script is
    // refused by every node, and says so.
    let error = Redlock::connect(builder(set.urls_as("noscripts", SECRET)).build().unwrap())
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("refuse EVALSHA, EVAL (NOPERM"),
        "{error}"
    );
    assert_no_secret(&format!("{error} {error:?}"));
    let client = connect(
        builder(set.urls_as("noscripts", SECRET)).health(redlock_client::HealthPolicy::Off),
    )
    .await;
    let error = client
        .lock_many(&["a", "b"], &no_retry())
        .await
        .unwrap_err();
    // EVALSHA, or EVAL when the node did not know the script yet.
    let command = refused_by_every_node(&error, ServerErrorKind::Permission, "").await;
    assert!(command.starts_with("EVAL"), "{command}");
    assert!(error.to_string().contains("ACL"), "{error}");
    assert_no_secret(&format!("{error} {error:?}"));
    client.shutdown().await;

    let client = connect(builder(set.urls_as("elsewhere", SECRET))).await;
    let error = client.lock_with("k", &no_retry()).await.unwrap_err();
    refused_by_every_node(&error, ServerErrorKind::Permission, "SET").await;
    // With the default retry policy too, one attempt: no wait can grant a permission.
    // (Before, `lock` retried until its 10 s `max_wait` and then reported the deadline.)
    let error = client.lock("k").await.unwrap_err();
    let Error::NotAcquired { attempts, .. } = &error else {
        panic!("expected NotAcquired, got {error}");
    };
    assert_eq!(*attempts, 1, "{error}");
    refused_by_every_node(&error, ServerErrorKind::Permission, "SET").await;
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_nodes_mix_with_tcp_nodes() {
    let set = NodeSet::start_with(
        3,
        NodeOptions {
            unix_socket: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let unix = set.unix_urls().unwrap();
    let urls = vec![unix[0].clone(), set.node(1).url(), unix[2].clone()];
    assert!(urls[0].starts_with("redis+unix://"));
    let client = connect(builder(urls)).await;
    every_path(&client, &set).await;
    // Every node voted: the unix ones are not silently left out.
    let guard = client.lock("all").await.unwrap();
    // Won at a quorum: wait for the last node's answer before reading the nodes.
    guard.lock().report().settled().await;
    assert_eq!(set.nodes_holding("redlock:all").await, vec![0, 1, 2]);
    guard.release().await.unwrap();
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_unix_socket_node_works_and_a_wrong_password_is_a_typed_auth_error() {
    let set = NodeSet::start_with(
        3,
        NodeOptions {
            unix_socket: true,
            password: Some(SECRET.into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let unix = set.unix_urls().unwrap();
    assert!(
        unix[0].starts_with(&format!("redis+unix://:{SECRET}@localhost/")),
        "{}",
        unix[0]
    );
    let client = connect(builder(unix.clone())).await;
    every_path(&client, &set).await;
    let guard = client.lock("all").await.unwrap();
    // Won at a quorum: wait for the last node's answer before reading the nodes.
    guard.lock().report().settled().await;
    assert_eq!(set.nodes_holding("redlock:all").await, vec![0, 1, 2]);
    guard.release().await.unwrap();
    client.shutdown().await;

    // A wrong password on every socket: the handshake is refused, typed, node by node.
    let wrong: Vec<String> = unix
        .iter()
        .map(|url| url.replacen(SECRET, &format!("wrong-{SECRET}"), 1))
        .collect();
    let client = connect(builder(wrong)).await;
    let error = client.lock_with("k", &no_retry()).await.unwrap_err();
    refused_by_every_node(&error, ServerErrorKind::Auth, "connect").await;
    let text = error.to_string();
    for node in set.iter() {
        let socket = node.unix_socket().unwrap().display().to_string();
        let named = format!("redis+unix://:***@localhost{socket}");
        assert!(text.contains(&named), "{named} not named in: {text}");
    }
    assert!(text.contains("check the user name and password"), "{text}");
    assert_no_secret(&format!("{error} {error:?} {client:?}"));
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_and_read_only_replicas_are_typed_with_what_to_do() {
    let set = NodeSet::start(3).await.unwrap();
    let client = connect(builder(set.urls())).await;
    for node in set.iter() {
        admin(&node.url(), "CONFIG", &["SET", "maxmemory", "1"]).await;
    }
    let error = client.lock_with("k", &no_retry()).await.unwrap_err();
    refused_by_every_node(&error, ServerErrorKind::OutOfMemory, "SET").await;
    assert!(error.to_string().contains("raise `maxmemory`"), "{error}");
    for node in set.iter() {
        admin(&node.url(), "CONFIG", &["SET", "maxmemory", "0"]).await;
    }

    // Node 2 becomes a replica of node 0: it refuses writes, and the health check says so.
    let primary = set.node(0).port().to_string();
    admin(&set.node(2).url(), "REPLICAOF", &["127.0.0.1", &primary]).await;
    let error = client
        .lock_many(&["x", "y"], &no_retry())
        .await
        .map(|_| ())
        .err();
    // Two masters still make the quorum: the lock may be won. Either way the replica's
    // answer is typed.
    let guard = client.try_lock("z").await;
    let report = match &guard {
        Ok(guard) => guard.lock().report().settled().await,
        Err(Error::NotAcquired { report, .. }) => report.settled().await,
        Err(other) => panic!("{other}"),
    };
    let NodeOutcome::ServerError(e) = &report.nodes[2].outcome else {
        panic!("{report} ({error:?})");
    };
    assert_eq!((e.kind, &*e.command), (ServerErrorKind::ReadOnly, "SET"));
    if let Ok(guard) = guard {
        guard.release().await.unwrap();
    }
    let health = client.health().await;
    assert!(health[0].is_healthy() || health[0].problems == [HealthProblem::NoAppendOnly]);
    assert!(
        health[2]
            .problems
            .contains(&HealthProblem::NotMaster("slave".into())),
        "{}",
        health[2]
    );
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_check_reads_each_node_and_strict_refuses_a_node_that_breaks_h2() {
    let persistent = NodeSet::start_with(
        3,
        NodeOptions {
            appendonly_always: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let client = connect(builder(persistent.urls()).health(HealthPolicy::Strict)).await;
    for health in client.health().await {
        assert!(health.is_healthy(), "{health}");
        assert_eq!(health.role.as_deref(), Some("master"));
        assert_eq!(health.appendfsync.as_deref(), Some("always"));
        assert_eq!(health.maxmemory_policy.as_deref(), Some("noeviction"));
        assert!(health.reachable.is_ok());
    }
    client.shutdown().await;

    // No persistence, and one node that evicts: warned by default, refused when strict.
    let volatile = NodeSet::start(3).await.unwrap();
    admin(
        &volatile.node(1).url(),
        "CONFIG",
        &["SET", "maxmemory-policy", "allkeys-lru"],
    )
    .await;
    let client = connect(builder(volatile.urls())).await;
    let health = client.health().await;
    assert_eq!(health[0].problems, vec![HealthProblem::NoAppendOnly]);
    assert!(health[1]
        .problems
        .contains(&HealthProblem::Evicting("allkeys-lru".into())));
    client.shutdown().await;
    let error = Redlock::connect(
        builder(volatile.urls())
            .health(HealthPolicy::Strict)
            .build()
            .unwrap(),
    )
    .await
    .unwrap_err();
    assert!(error.to_string().contains("appendonly is off"), "{error}");

    // A user without CONFIG (as on managed services): unknown, not a failure.
    let acl = NodeSet::start_with(
        3,
        NodeOptions {
            appendonly_always: true,
            acl_users: vec![format!("locker on >{SECRET} {LOCK_ACL}")],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let client = connect(builder(acl.urls_as("locker", SECRET)).health(HealthPolicy::Strict)).await;
    for health in client.health().await {
        assert_eq!(health.appendfsync, None, "{health}");
        assert_eq!(health.appendonly, Some(true), "{health}");
        assert!(health.is_healthy(), "{health}");
        assert!(
            health.to_string().contains("appendfsync unknown"),
            "{health}"
        );
    }
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_error_report_or_debug_output_shows_a_password() {
    let set = password_nodes().await;
    // One node with the right password, one with a wrong one, one that is down.
    let down = redlock_testkit::NodeSet::start(1).await.unwrap();
    let down_port = down.node(0).port();
    drop(down);
    let urls = vec![
        set.node(0).url(),
        format!("redis://user:{SECRET}x@127.0.0.1:{}", set.node(1).port()),
        format!("redis://:{SECRET}@127.0.0.1:{down_port}"),
    ];
    let config = builder(urls.clone()).build().unwrap();
    let mut shown = vec![format!("{config:?}")];
    let client = Redlock::connect(config).await.unwrap();
    shown.push(format!("{client:?}"));
    let error = client.lock_with("k", &no_retry()).await.unwrap_err();
    shown.push(format!("{error}"));
    shown.push(format!("{error:?}"));
    if let Some(report) = error.report() {
        let settled = report.settled().await;
        shown.push(format!("{settled}"));
        shown.push(format!("{settled:?}"));
        for node in &settled.nodes {
            shown.push(format!("{node} {node:?} {}", node.outcome));
        }
    }
    let inspection = client.inspect("k").await.unwrap();
    shown.push(format!("{inspection:?}"));
    for health in client.health().await {
        shown.push(format!("{health} {health:?}"));
    }
    client.shutdown().await;
    // Unusable URLs with a password in them.
    for bad in [
        format!("redis://:{SECRET}@127.0.0.1:0"),
        format!("http://:{SECRET}@127.0.0.1:6379"),
        format!("redis://:{SECRET}@[::1"),
    ] {
        let error = builder(vec![bad]).build().unwrap_err();
        shown.push(format!("{error} {error:?}"));
    }
    // A coordinator refusing a duplicate server.
    let duplicate = redlock_core::Config {
        nodes: vec![urls[0].clone(), urls[0].replace("127.0.0.1", "localhost")],
        ..Default::default()
    };
    let error = redlock_core::Coordinator::connect(duplicate)
        .await
        .unwrap_err();
    shown.push(format!("{error} {error:?}"));
    let all = shown.join("\n");
    assert_no_secret(&all);
    // The check itself can fail: the URLs do hold the secret.
    assert!(urls.join(" ").contains(SECRET));
    assert!(all.contains("***"), "{all}");
}

/// Checks that every node refused the failed acquisition `error` with an error reply of
/// `kind` to `command` (any command when empty), once all have answered. Returns the
/// command of the last.
async fn refused_by_every_node(error: &Error, kind: ServerErrorKind, command: &str) -> String {
    let Error::NotAcquired { report, .. } = error else {
        panic!("{error}");
    };
    let mut last = String::new();
    // The round is decided once a majority refused; the others answer later.
    for node in &report.settled().await.nodes {
        let NodeOutcome::ServerError(e) = &node.outcome else {
            panic!("{node}");
        };
        assert_eq!(e.kind, kind, "{node}");
        assert!(command.is_empty() || e.command == command, "{node}");
        last = e.command.to_string();
    }
    last
}

/// Runs one command on a node as its administrator (the harness's URL).
async fn admin(url: &str, command: &'static str, args: &[&str]) -> fred::types::Value {
    let client = raw(url).await;
    let reply = client
        .custom(
            fred::types::CustomCommand::new_static(command, None, false),
            args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        )
        .await
        .unwrap_or_else(|e| panic!("{command} {args:?}: {e}"));
    client.quit().await.unwrap();
    reply
}

/// The `Debug` of a client, a guard, its handle and the coordinator is a few lines a log
/// can hold (not every connection's and metric's internals) and shows no password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_debug_of_a_client_a_guard_and_the_coordinator_is_a_few_lines_without_a_password() {
    let set = password_nodes().await;
    assert!(set.urls()[0].contains(SECRET));
    let client = connect(builder(set.urls())).await;
    let guard = client.lock("debugged").await.unwrap();
    for (what, shown) in [
        ("client", format!("{client:?}")),
        ("guard", format!("{guard:?}")),
        ("handle", format!("{:?}", guard.handle())),
        ("coordinator", format!("{:?}", client.coordinator())),
        ("pretty client", format!("{client:#?}")),
    ] {
        assert_no_secret(&shown);
        assert!(
            shown.len() < 600,
            "the {what}'s Debug is {} bytes: {shown}",
            shown.len()
        );
        assert!(shown.lines().count() <= 20, "the {what}'s Debug: {shown}");
    }
    let shown = format!("{client:?} {guard:?}");
    assert!(
        shown.contains("127.0.0.1") && shown.contains("***"),
        "{shown}"
    );
    assert!(shown.contains("debugged"), "{shown}");
    guard.release().await.unwrap();
    client.shutdown().await;
}

/// Three nodes that ask for the password [`SECRET`] (their URLs carry it).
async fn password_nodes() -> NodeSet {
    NodeSet::start_with(
        3,
        NodeOptions {
            password: Some(SECRET.into()),
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

fn assert_no_secret(text: &str) {
    assert!(!text.contains(SECRET), "a password was shown: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_with_tls_is_reconnected() {
    if redlock_testkit::skip_without_tls("a_node_restarted_with_tls_is_reconnected") {
        return;
    }
    let set = NodeSet::start_with(3, tls_nodes(false, &["localhost"]))
        .await
        .unwrap();
    let pki = set.pki().unwrap();
    let client = connect(builder(set.tls_urls().unwrap()).tls(TlsConfig {
        ca_pem: Some(pki.ca_pem().to_string()),
        ..Default::default()
    }))
    .await;
    client.lock("r").await.unwrap().release().await.unwrap();
    set.node(1).restart().await.unwrap();
    // All three nodes vote again once the restarted one is back.
    let back = eventually(Duration::from_secs(10), || async {
        match client.try_lock("r").await {
            Ok(guard) => {
                // The round is decided at the quorum; the settled report has every node.
                let settled = guard.lock().report().settled().await;
                let all = settled
                    .nodes
                    .iter()
                    .all(|n| n.outcome == NodeOutcome::Acquired);
                guard.release().await.unwrap();
                all
            }
            Err(_) => false,
        }
    })
    .await;
    assert!(back, "the restarted TLS node was not reconnected");
    client.shutdown().await;
}

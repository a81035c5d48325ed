//! The fault proxy against real redis-server nodes, spoken to in raw RESP (and once through
//! fred).
//!
//! Time is used only as a lower bound (a delayed reply is not early) or in negative checks that
//! cannot flake (a dropped or held reply never arrives, so waiting 300 ms for it proves nothing
//! false). `bounded` turns a hang into a failure after a generous limit.

use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use fred::prelude::{Builder, ClientLike, Config, ErrorKind, KeysInterface};
use redlock_testkit::{FaultProxy, LinkFault, Links, Node, NodeSet};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How long a negative check waits for a reply that must not come.
const SILENCE: Duration = Duration::from_millis(300);

/// Fails the test instead of hanging forever.
async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

fn addr(node: &Node) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, node.port()))
}

/// A raw RESP connection: commands out, one-line replies in.
struct Resp {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Resp {
    async fn connect(addr: SocketAddr) -> Resp {
        let stream = TcpStream::connect(addr)
            .await
            .expect("connect to the proxy");
        Resp {
            stream,
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, args: &[&str]) {
        self.stream
            .write_all(&encode(args))
            .await
            .expect("write a command");
    }

    /// The next reply line without its CRLF. Cancel-safe: partial input stays in `buf`.
    async fn line(&mut self) -> io::Result<String> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                self.buf.drain(..end + 2);
                return Ok(line);
            }
            let mut chunk = [0; 4096];
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// `None` if no line arrives within [`SILENCE`].
    async fn line_within_silence(&mut self) -> Option<io::Result<String>> {
        tokio::time::timeout(SILENCE, self.line()).await.ok()
    }

    async fn ping(&mut self) -> io::Result<String> {
        self.send(&["PING"]).await;
        bounded("PING", self.line()).await
    }

    /// Asserts that the connection was reset (RST, not a clean close).
    async fn expect_reset(&mut self, what: &str) {
        match bounded(what, self.line()).await {
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            other => panic!("{what}: expected a connection reset, got {other:?}"),
        }
    }
}

fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

async fn one_node_behind_proxy() -> (NodeSet, FaultProxy) {
    let nodes = NodeSet::start(1).await.expect("start a node");
    let proxy = FaultProxy::start("client-0->node-0", addr(nodes.node(0)))
        .await
        .expect("start the proxy");
    (nodes, proxy)
}

/// Waits until `node` has `key` = `value` (a request crossed the proxy).
async fn until_applied(node: &Node, key: &str, value: &str) {
    bounded("the request reaching the node", async {
        while node.get(key).await.unwrap().as_deref() != Some(value) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn pass_forwards_both_ways() {
    let (nodes, proxy) = one_node_behind_proxy().await;
    assert_eq!(proxy.name(), "client-0->node-0");
    assert_eq!(proxy.upstream(), addr(nodes.node(0)));
    assert_eq!(
        proxy.url(),
        format!("redis://127.0.0.1:{}", proxy.addr().port())
    );
    assert_eq!(proxy.fault(), LinkFault::Pass);

    let mut c = Resp::connect(proxy.addr()).await;
    assert_eq!(c.ping().await.unwrap(), "+PONG");
    c.send(&["SET", "k", "v"]).await;
    assert_eq!(bounded("SET", c.line()).await.unwrap(), "+OK");
    assert_eq!(nodes.node(0).get("k").await.unwrap().as_deref(), Some("v"));

    assert_eq!(proxy.open_connections(), 1);
    let stats = proxy.stats();
    assert_eq!(stats.connections_accepted, 1);
    assert_eq!(stats.connections_reset, 0);
    assert!(stats.forwarded_to_server > 0 && stats.forwarded_to_client > 0);
    assert_eq!(stats.dropped_to_server + stats.dropped_to_client, 0);

    drop(c);
    bounded("the connection closing", async {
        while proxy.open_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn latency_delays_each_direction() {
    let (_nodes, proxy) = one_node_behind_proxy().await;
    let mut c = Resp::connect(proxy.addr()).await;
    assert_eq!(c.ping().await.unwrap(), "+PONG");
    let delay = Duration::from_millis(200);
    for fault in [
        LinkFault::Latency {
            to_server: delay,
            to_client: Duration::ZERO,
        },
        LinkFault::Latency {
            to_server: Duration::ZERO,
            to_client: delay,
        },
    ] {
        proxy.set(fault);
        let start = Instant::now();
        assert_eq!(c.ping().await.unwrap(), "+PONG");
        let took = start.elapsed();
        assert!(took >= delay, "{fault:?}: PING took only {took:?}");
    }
}

#[tokio::test]
async fn switching_latency_to_pass_keeps_byte_order() {
    let (nodes, proxy) = one_node_behind_proxy().await;
    let mut c = Resp::connect(proxy.addr()).await;
    proxy.set(LinkFault::Latency {
        to_server: Duration::from_secs(1),
        to_client: Duration::from_secs(1),
    });
    // The first half sits in the delay line when the link heals; the second half, read under
    // Pass, must queue behind it instead of overtaking it.
    let mut expected = String::new();
    for i in 0..200 {
        if i == 100 {
            tokio::time::sleep(Duration::from_millis(50)).await; // let the proxy read them
            let delayed = nodes.node(0).get("log").await.unwrap();
            assert_eq!(delayed, None, "the first half was not delayed");
            proxy.heal();
        }
        let item = format!("{i},");
        c.send(&["APPEND", "log", &item]).await;
        expected.push_str(&item);
    }
    let mut last_len = 0;
    for _ in 0..200 {
        let reply = bounded("APPEND reply", c.line()).await.unwrap();
        let len: usize = reply.trim_start_matches(':').parse().unwrap();
        assert!(
            len > last_len,
            "replies out of order: {len} after {last_len}"
        );
        last_len = len;
    }
    assert_eq!(nodes.node(0).get("log").await.unwrap(), Some(expected));
}

#[tokio::test]
async fn blackhole_forwards_nothing_and_resets_only_connections_that_lost_bytes() {
    let (nodes, proxy) = one_node_behind_proxy().await;
    let mut idle = Resp::connect(proxy.addr()).await;
    let mut busy = Resp::connect(proxy.addr()).await;
    assert_eq!(idle.ping().await.unwrap(), "+PONG");
    assert_eq!(busy.ping().await.unwrap(), "+PONG");

    proxy.set(LinkFault::Blackhole);
    busy.send(&["SET", "k", "v"]).await;
    assert!(busy.line_within_silence().await.is_none(), "reply crossed");
    let mut fresh = Resp::connect(proxy.addr()).await; // accepted, but nothing forwarded
    fresh.send(&["PING"]).await;
    assert!(fresh.line_within_silence().await.is_none(), "reply crossed");
    assert_eq!(
        nodes.node(0).get("k").await.unwrap(),
        None,
        "request crossed"
    );
    assert!(proxy.stats().dropped_to_server > 0);
    assert_eq!(proxy.open_connections(), 3);

    proxy.heal();
    busy.expect_reset("busy connection after heal").await;
    fresh
        .expect_reset("connection opened during the blackhole")
        .await;
    assert_eq!(
        idle.ping().await.unwrap(),
        "+PONG",
        "idle connection survives"
    );
    let mut after = Resp::connect(proxy.addr()).await;
    assert_eq!(after.ping().await.unwrap(), "+PONG");
    assert_eq!(proxy.stats().connections_reset, 2);
}

#[tokio::test]
async fn hold_replies_applies_requests_and_delivers_replies_late() {
    let (nodes, proxy) = one_node_behind_proxy().await;
    let mut c = Resp::connect(proxy.addr()).await;
    assert_eq!(c.ping().await.unwrap(), "+PONG");

    proxy.set(LinkFault::HoldReplies);
    c.send(&["SET", "k", "v"]).await;
    until_applied(nodes.node(0), "k", "v").await;
    assert!(c.line_within_silence().await.is_none(), "reply not held");
    assert!(proxy.stats().held_to_client > 0);

    proxy.heal();
    assert_eq!(bounded("held reply", c.line()).await.unwrap(), "+OK");
    assert_eq!(c.ping().await.unwrap(), "+PONG", "connection still usable");
    assert_eq!(proxy.stats().connections_reset, 0);
}

#[tokio::test]
async fn drop_replies_applies_requests_and_loses_replies() {
    let (nodes, proxy) = one_node_behind_proxy().await;
    let mut c = Resp::connect(proxy.addr()).await;
    assert_eq!(c.ping().await.unwrap(), "+PONG");

    proxy.set(LinkFault::DropReplies);
    c.send(&["SET", "k", "v"]).await;
    until_applied(nodes.node(0), "k", "v").await;
    assert!(c.line_within_silence().await.is_none(), "reply not dropped");
    assert!(proxy.stats().dropped_to_client > 0);

    proxy.heal();
    c.expect_reset("connection that lost a reply").await;
    let mut after = Resp::connect(proxy.addr()).await;
    assert_eq!(after.ping().await.unwrap(), "+PONG");
}

#[tokio::test]
async fn refuse_resets_open_and_new_connections() {
    let (_nodes, proxy) = one_node_behind_proxy().await;
    let mut open = Resp::connect(proxy.addr()).await;
    assert_eq!(open.ping().await.unwrap(), "+PONG");

    proxy.set(LinkFault::Refuse);
    open.expect_reset("open connection").await;
    let mut new = Resp::connect(proxy.addr()).await;
    new.expect_reset("new connection").await;
    assert_eq!(proxy.stats().connections_reset, 2);

    proxy.heal();
    let mut after = Resp::connect(proxy.addr()).await;
    assert_eq!(after.ping().await.unwrap(), "+PONG");
}

#[tokio::test]
async fn reset_connections_is_one_shot() {
    let (_nodes, proxy) = one_node_behind_proxy().await;
    let mut open = Resp::connect(proxy.addr()).await;
    assert_eq!(open.ping().await.unwrap(), "+PONG");

    proxy.reset_connections();
    open.expect_reset("open connection").await;
    assert_eq!(proxy.fault(), LinkFault::Pass);
    let mut after = Resp::connect(proxy.addr()).await;
    assert_eq!(after.ping().await.unwrap(), "+PONG");
    assert_eq!(proxy.stats().connections_reset, 1);
}

#[tokio::test]
async fn unreachable_upstream_resets_the_client() {
    let (nodes, proxy) = one_node_behind_proxy().await;
    nodes.node(0).kill().unwrap();
    let mut c = Resp::connect(proxy.addr()).await;
    c.expect_reset("connection to a killed node").await;
    assert_eq!(proxy.stats().upstream_failures, 1);

    // Behind a blackhole the dead node cannot be told from a live one until the heal.
    proxy.set(LinkFault::Blackhole);
    let mut hidden = Resp::connect(proxy.addr()).await;
    hidden.send(&["PING"]).await;
    assert!(hidden.line_within_silence().await.is_none());
    proxy.heal();
    hidden
        .expect_reset("blackholed connection to a killed node")
        .await;

    nodes.node(0).restart().await.unwrap();
    let mut c = Resp::connect(proxy.addr()).await;
    assert_eq!(c.ping().await.unwrap(), "+PONG");
}

#[tokio::test]
async fn links_give_each_client_its_own_view() {
    let nodes = NodeSet::start(2).await.expect("start 2 nodes");
    let upstreams: Vec<SocketAddr> = nodes.iter().map(addr).collect();
    let links = Links::start(2, &upstreams).await.expect("start links");
    assert_eq!((links.clients(), links.nodes()), (2, 2));
    assert_eq!(links.link(0, 1).name(), "client-0->node-1");
    assert_eq!(links.link(1, 0).upstream(), upstreams[0]);
    let urls = links.urls(1);
    assert_eq!(urls, vec![links.link(1, 0).url(), links.link(1, 1).url()]);
    assert_ne!(links.urls(0), urls);

    links.link(0, 1).set(LinkFault::Blackhole);
    let mut cut = Resp::connect(links.link(0, 1).addr()).await;
    cut.send(&["PING"]).await;
    assert!(
        cut.line_within_silence().await.is_none(),
        "client 0 reached node 1"
    );
    for (client, node) in [(1, 1), (0, 0), (1, 0)] {
        let mut c = Resp::connect(links.link(client, node).addr()).await;
        assert_eq!(
            c.ping().await.unwrap(),
            "+PONG",
            "client {client} node {node}"
        );
    }

    links.set_node(0, LinkFault::Refuse);
    links.set_client(1, LinkFault::HoldReplies);
    let faults: Vec<LinkFault> = (0..2)
        .flat_map(|c| (0..2).map(move |n| (c, n)))
        .map(|(c, n)| links.link(c, n).fault())
        .collect();
    use LinkFault::{Blackhole, HoldReplies, Refuse};
    assert_eq!(faults, vec![Refuse, Blackhole, HoldReplies, HoldReplies]);
    links.heal_all();
    for client in 0..2 {
        for node in 0..2 {
            assert_eq!(links.link(client, node).fault(), LinkFault::Pass);
        }
    }

    let out_of_range = catch_unwind(AssertUnwindSafe(|| links.link(2, 0).name().len()));
    assert!(out_of_range.is_err());
    let out_of_range = catch_unwind(AssertUnwindSafe(|| links.link(0, 2).name().len()));
    assert!(out_of_range.is_err());
}

#[tokio::test]
async fn dropping_the_proxy_closes_its_port_and_connections() {
    let (_nodes, proxy) = one_node_behind_proxy().await;
    let addr = proxy.addr();
    let mut c = Resp::connect(addr).await;
    assert_eq!(c.ping().await.unwrap(), "+PONG");

    drop(proxy);
    let refused = TcpStream::connect(addr).await;
    assert!(refused.is_err(), "port still open after drop");
    let closed = bounded("the connection closing", c.line()).await;
    assert!(closed.is_err(), "connection still open: {closed:?}");
}

#[tokio::test]
async fn thousands_of_pipelined_requests_pass_with_and_without_latency() {
    let (_nodes, proxy) = one_node_behind_proxy().await;
    let mut c = Resp::connect(proxy.addr()).await;
    let batch = encode(&["PING"]).repeat(5_000);
    for fault in [
        LinkFault::Pass,
        LinkFault::Latency {
            to_server: Duration::from_millis(50),
            to_client: Duration::from_millis(50),
        },
    ] {
        proxy.set(fault);
        c.stream.write_all(&batch).await.unwrap();
        for _ in 0..5_000 {
            assert_eq!(bounded("PONG", c.line()).await.unwrap(), "+PONG");
        }
    }
}

#[tokio::test]
async fn fred_client_works_through_the_proxy_and_times_out_behind_a_blackhole() {
    let (_nodes, proxy) = one_node_behind_proxy().await;
    let timeout = Duration::from_millis(500);
    let client = Builder::from_config(Config::from_url(&proxy.url()).unwrap())
        .with_connection_config(|c| {
            c.connection_timeout = timeout;
            c.internal_command_timeout = timeout;
            c.max_command_attempts = 1;
        })
        .with_performance_config(|p| p.default_command_timeout = timeout)
        .build()
        .unwrap();
    let task = bounded("fred connect", client.init()).await.unwrap();

    proxy.set(LinkFault::Latency {
        to_server: Duration::from_millis(20),
        to_client: Duration::from_millis(20),
    });
    client
        .set::<(), _, _>("k", "v", None, None, false)
        .await
        .unwrap();
    let got: Option<String> = client.get("k").await.unwrap();
    assert_eq!(got.as_deref(), Some("v"));

    proxy.set(LinkFault::Blackhole);
    let err = bounded(
        "GET behind a blackhole",
        client.get::<Option<String>, _>("k"),
    )
    .await
    .unwrap_err();
    assert_eq!(*err.kind(), ErrorKind::Timeout, "{err:?}");
    task.abort();
}

#[tokio::test]
async fn a_server_close_crosses_a_latency_link() {
    let (_nodes, proxy) = one_node_behind_proxy().await;
    proxy.set(LinkFault::Latency {
        to_server: Duration::from_millis(10),
        to_client: Duration::from_millis(10),
    });
    let mut c = Resp::connect(proxy.addr()).await;
    assert_eq!(c.ping().await.unwrap(), "+PONG");
    c.send(&["QUIT"]).await;
    assert_eq!(bounded("QUIT", c.line()).await.unwrap(), "+OK");
    // The server closes after QUIT: the client must see the end of the stream.
    match tokio::time::timeout(Duration::from_secs(2), c.line()).await {
        Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {}
        other => panic!("expected the close to reach the client, got {other:?}"),
    }
}

/// A connection that loses a request to a blackhole stays open for the whole blackhole; it
/// is reset only when the fault is lifted. The two directions of a connection pick up a new
/// fault each on its own: before the fix, the reply direction, not yet switched to the
/// blackhole when the request direction dropped the request, saw "bytes lost, and the fault
/// changed" and reset the connection at once, under the blackhole (a client saw its request
/// fail fast instead of time out, as a partition does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_lost_to_a_blackhole_is_not_reset_until_the_fault_is_lifted() {
    let (_nodes, proxy) = one_node_behind_proxy().await;
    for round in 0..200 {
        let mut conn = Resp::connect(proxy.addr()).await;
        assert_eq!(conn.ping().await.unwrap(), "+PONG");
        proxy.set(LinkFault::Blackhole);
        conn.send(&["PING"]).await;
        // A reset arrives in well under a millisecond on loopback; a reply never does.
        match tokio::time::timeout(Duration::from_millis(20), conn.line()).await {
            Err(_) => {}
            Ok(got) => panic!("round {round}: under the blackhole the request got {got:?}"),
        }
        proxy.heal();
        conn.expect_reset("the connection that lost a request, after the heal")
            .await;
    }
}

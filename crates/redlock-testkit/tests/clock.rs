//! Fake node clocks (`NodeOptions::fake_clock`) against real redis-server processes.
//!
//! The shim re-reads its control file at most every ~10 ms, so each check waits for a change to
//! show instead of assuming it is instant. Expiry checks leave wide margins (hundreds of ms)
//! between "must be gone" and "must still be there"; no performance is asserted.

use std::future::Future;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redlock_testkit::{ClockControl, HarnessError, Node, NodeOptions, NodeSet};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const HOUR_MS: i64 = 3_600_000;

/// Fails the test instead of hanging forever.
async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

async fn start(n: usize) -> NodeSet {
    let opts = NodeOptions {
        fake_clock: true,
        ..NodeOptions::default()
    };
    bounded("start", NodeSet::start_with(n, opts))
        .await
        .expect("start nodes with a fake clock")
}

fn clock(node: &Node) -> &ClockControl {
    node.clock().expect("started with fake_clock")
}

/// The server's `TIME` (gettimeofday in Redis 7) in ms since the epoch, over raw RESP.
async fn server_time_ms(node: &Node) -> f64 {
    let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, node.port()))
        .await
        .expect("connect");
    let mut conn = BufReader::new(stream);
    conn.get_mut().write_all(b"TIME\r\n").await.unwrap();
    let mut lines = Vec::new();
    // *2, $len, seconds, $len, microseconds
    for _ in 0..5 {
        let mut line = String::new();
        conn.read_line(&mut line).await.unwrap();
        lines.push(line.trim_end().to_owned());
    }
    assert_eq!(lines[0], "*2", "TIME reply {lines:?}");
    let secs: f64 = lines[2].parse().unwrap();
    let micros: f64 = lines[4].parse().unwrap();
    secs * 1e3 + micros / 1e3
}

fn real_time_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1e3
}

/// `TIME` minus the real time, in ms.
async fn observed_skew_ms(node: &Node) -> f64 {
    let before = real_time_ms();
    let server = server_time_ms(node).await;
    let after = real_time_ms();
    server - (before + after) / 2.0
}

/// Polls until the node's observed skew is within `tolerance_ms` of `expected_ms`; returns the
/// last observation (the caller asserts on it).
async fn skew_settles_at(node: &Node, expected_ms: f64, tolerance_ms: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let skew = observed_skew_ms(node).await;
        if (skew - expected_ms).abs() <= tolerance_ms || Instant::now() >= deadline {
            return skew;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_untouched_fake_clock_is_real_time() {
    let nodes = start(1).await;
    let node = nodes.node(0);
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", node.pid().unwrap())).unwrap();
    assert!(maps.contains("clockshim"), "the shim is not loaded");
    assert_eq!(
        std::fs::read_to_string(clock(node).path()).unwrap(),
        "0 1\n"
    );
    assert_eq!(clock(node).skew_ms(), 0.0);

    let skew = observed_skew_ms(node).await;
    assert!(skew.abs() < 5_000.0, "skew {skew} ms with no change");
    node.set("k", "v", Some(60_000)).await.unwrap();
    assert_eq!(node.get("k").await.unwrap().as_deref(), Some("v"));

    let plain = bounded("start", NodeSet::start(1)).await.unwrap();
    assert!(plain.node(0).clock().is_none());
}

#[tokio::test]
async fn jump_moves_time_and_survives_restart() {
    let nodes = start(1).await;
    let node = nodes.node(0);
    clock(node).jump(HOUR_MS).unwrap();
    assert!((clock(node).skew_ms() - HOUR_MS as f64).abs() < 1.0);
    let skew = skew_settles_at(node, HOUR_MS as f64, 5_000.0).await;
    assert!(
        (skew - HOUR_MS as f64).abs() < 5_000.0,
        "TIME skew {skew} ms"
    );

    bounded("restart", node.restart()).await.unwrap();
    let skew = observed_skew_ms(node).await;
    assert!(
        (skew - HOUR_MS as f64).abs() < 5_000.0,
        "after restart: {skew} ms"
    );

    clock(node).jump(-HOUR_MS).unwrap();
    let skew = skew_settles_at(node, 0.0, 5_000.0).await;
    assert!(skew.abs() < 5_000.0, "after jumping back: {skew} ms");
}

#[tokio::test]
async fn a_fast_clock_expires_keys_early() {
    let nodes = start(2).await;
    let (fast, control) = (nodes.node(0), nodes.node(1));
    clock(fast).set_rate(4.0).unwrap();
    // Let the shim pick the rate up (it re-reads every ~10 ms) before the key is written.
    tokio::time::sleep(Duration::from_millis(100)).await;

    // PX 2000 at 4x is gone after 500 real ms; on the real-rate control node it lives 2000 ms.
    // Checking at 1000 ms leaves 500 ms of margin on one side and 1000 ms on the other.
    let set_at = Instant::now();
    fast.set("k", "v", Some(2_000)).await.unwrap();
    control.set("k", "v", Some(2_000)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_000).saturating_sub(set_at.elapsed())).await;
    assert!(
        control.exists("k").await.unwrap(),
        "control node lost the key"
    );
    assert!(
        !fast.exists("k").await.unwrap(),
        "4x node still has the key"
    );

    // Rate changes do not jump: after about 1.1 s at 4x the clock is ~3.3 s ahead, not 0 or 1 h.
    let skew = clock(fast).skew_ms();
    assert!(skew > 2_000.0 && skew < 30_000.0, "skew {skew} ms");
    clock(fast).set_rate(1.0).unwrap();
    let frozen = clock(fast).skew_ms();
    assert!(
        (frozen - skew).abs() < 5_000.0,
        "set_rate(1) jumped: {skew} -> {frozen}"
    );
    let observed = skew_settles_at(fast, frozen, 2_000.0).await;
    assert!(
        (observed - frozen).abs() < 2_000.0,
        "observed {observed}, control says {frozen}"
    );
}

#[tokio::test]
async fn a_forward_jump_expires_keys_in_the_background() {
    let nodes = start(1).await;
    let node = nodes.node(0);
    node.set("short", "v", Some(2_000)).await.unwrap();
    node.set("long", "v", Some(600_000)).await.unwrap();
    clock(node).jump(5_000).unwrap();

    // DBSIZE does not touch keys, so only Redis' active expire cycle (10 times a second) can
    // remove "short". 3 s is a generous bound for it.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut size = node.dbsize().await.unwrap();
    while size != 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        size = node.dbsize().await.unwrap();
    }
    assert_eq!(
        size, 1,
        "the expired key was not removed by the expire cycle"
    );
    assert!(!node.exists("short").await.unwrap());
    let ttl = node.pttl("long").await.unwrap();
    assert!(
        ttl > 0 && ttl <= 595_000,
        "long key pttl {ttl} after a 5 s jump"
    );
}

#[tokio::test]
async fn invalid_changes_are_clear_errors() {
    let nodes = start(1).await;
    let clock = clock(nodes.node(0));
    clock.jump(1_000).unwrap();
    for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let err = clock.set_rate(rate).unwrap_err();
        assert!(matches!(err, HarnessError::InvalidClock { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.starts_with("node-0 clock: rate "), "{msg}");
        assert!(msg.contains("must be finite and greater than 0"), "{msg}");
    }
    let err = clock.jump(i64::MAX).unwrap_err();
    assert!(err.to_string().contains("overflows"), "{err}");
    assert_eq!(
        std::fs::read_to_string(clock.path()).unwrap(),
        "1000000000 1\n"
    );
    assert!(nodes.node(0).exists("nothing").await.is_ok());

    let scratch = tempfile::tempdir().unwrap();
    let missing = scratch.path().join("gone/clock");
    let err = ClockControl::new(&missing).unwrap_err();
    assert!(matches!(err, HarnessError::ClockFile { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );
}

#[tokio::test]
async fn a_malformed_control_file_keeps_the_previous_clock() {
    let nodes = start(1).await;
    let node = nodes.node(0);
    let clock = clock(node);
    clock.jump(HOUR_MS).unwrap();
    let skew = skew_settles_at(node, HOUR_MS as f64, 5_000.0).await;
    assert!(
        (skew - HOUR_MS as f64).abs() < 5_000.0,
        "TIME skew {skew} ms"
    );

    for garbage in [
        "",
        "not a clock\n",
        "5 0\n",
        "1 2 3 4\n",
        "9 nan\n",
        "12x 1\n",
    ] {
        std::fs::write(clock.path(), garbage).unwrap();
        // Several re-read intervals.
        tokio::time::sleep(Duration::from_millis(60)).await;
        let skew = observed_skew_ms(node).await;
        assert!(
            (skew - HOUR_MS as f64).abs() < 5_000.0,
            "after writing {garbage:?} the skew is {skew} ms"
        );
    }
    std::fs::remove_file(clock.path()).unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    let skew = observed_skew_ms(node).await;
    assert!(
        (skew - HOUR_MS as f64).abs() < 5_000.0,
        "file removed: {skew} ms"
    );
    assert!(node.is_running());

    clock.reset().unwrap();
    let skew = skew_settles_at(node, 0.0, 5_000.0).await;
    assert!(skew.abs() < 5_000.0, "after reset: {skew} ms");
}

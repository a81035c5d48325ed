//! The docker-compose node set, against real containers. Opt-in: set `REDLOCK_LAB_DOCKER=1`.
//!
//! Without the variable the test passes after printing one line. With it, a missing Docker is
//! a failure, not a skip. The set has fixed container names and ports, so everything runs in
//! one test, one set at a time.
//!
//! Time is only used with wide margins (a one-hour clock jump, a 4x clock against a 1 s TTL
//! checked at 700 ms); `bounded` turns a hang into a failure after a generous limit.

use std::future::Future;
use std::io::Write;
use std::time::Duration;

use redlock_testkit::{DockerOptions, DockerSet, HarnessError, Nodes};

const OPT_IN: &str = "REDLOCK_LAB_DOCKER";

/// Fails the test instead of hanging forever.
async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(300), f)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

/// `|a - b|`.
fn gap(a: Duration, b: Duration) -> Duration {
    a.max(b) - a.min(b)
}

#[tokio::test]
async fn docker_node_set() {
    if std::env::var_os(OPT_IN).is_none() {
        // Straight to stderr: the test harness captures `println!`/`eprintln!` of passing
        // tests, and this line must be seen.
        let _ = writeln!(
            std::io::stderr(),
            "docker backend skipped: set {OPT_IN}=1 to run it"
        );
        return;
    }
    if let Err(e) = DockerSet::available() {
        panic!("{OPT_IN} is set but the docker backend cannot run: {e}");
    }
    bounded("faults without persistence", faults_without_persistence()).await;
    bounded("persistence and fake clocks", persistence_and_fake_clocks()).await;
}

/// A set with `appendonly no`: every fault, and restarts that lose the data.
async fn faults_without_persistence() {
    let set = DockerSet::up(DockerOptions::default()).await.expect("up");
    assert_eq!(set.len(), 5);
    for i in 0..set.len() {
        assert_eq!(set.name(i), format!("redis{}", i + 1));
        assert_eq!(set.container(i), format!("redlock-redis{}", i + 1));
        assert_eq!(set.addr(i).port(), 7101 + i as u16);
        assert_eq!(set.urls()[i], format!("redis://127.0.0.1:{}", 7101 + i));
        set.redis(i).ping().await.expect("PING");
        assert_eq!(
            set.redis(i).dbsize().await.unwrap(),
            0,
            "every up starts empty"
        );
        assert!(set.clock(i).is_none(), "no fake clock unless asked for");
    }
    let second = DockerSet::up(DockerOptions::default()).await;
    assert!(
        matches!(second, Err(HarnessError::DockerUnavailable { .. })),
        "{second:?}"
    );
    assert!(matches!(
        set.kill(9).await,
        Err(HarnessError::NoSuchNode {
            index: 9,
            len: 5,
            ..
        })
    ));

    kill_and_start_lose_the_data(&set).await;
    restart_after_stays_down_then_returns_empty(&set).await;
    pause_times_out_until_resume(&set).await;
    disconnect_refuses_until_connect(&set).await;
    evict_all_in_a_container(&set).await;
}

async fn kill_and_start_lose_the_data(set: &DockerSet) {
    let node = set.redis(0);
    node.set("lock:a", "token", Some(60_000)).await.unwrap();
    set.kill(0).await.expect("kill");
    set.kill(0)
        .await
        .expect("killing a stopped node is a no-op");
    assert!(node.ping().await.is_err(), "down after kill");
    set.start(0).await.expect("start");
    assert_eq!(node.get("lock:a").await.unwrap(), None);
    assert_eq!(node.dbsize().await.unwrap(), 0);

    node.set("lock:a", "token", None).await.unwrap();
    set.restart(0).await.expect("restart");
    assert_eq!(
        node.dbsize().await.unwrap(),
        0,
        "restart loses the data too"
    );
}

async fn restart_after_stays_down_then_returns_empty(set: &DockerSet) {
    let node = set.redis(1);
    node.set("lock:a", "token", Some(60_000)).await.unwrap();
    let delay = Duration::from_secs(3);
    let (restarted, during) = tokio::join!(set.restart_after(1, delay), async {
        // Well inside the delay; `docker kill` itself takes a fraction of a second.
        tokio::time::sleep(delay * 2 / 3).await;
        node.ping().await
    });
    restarted.expect("restart_after");
    assert!(during.is_err(), "down during the delay: {during:?}");
    assert_eq!(node.dbsize().await.unwrap(), 0);
}

async fn pause_times_out_until_resume(set: &DockerSet) {
    let node = set.redis(2);
    node.set("k", "v", None).await.unwrap();
    set.pause(2).await.expect("pause");
    set.pause(2)
        .await
        .expect("pausing a paused node is a no-op");
    let read = node.get("k").await;
    assert!(
        matches!(read, Err(HarnessError::Timeout { .. })),
        "{read:?}"
    );
    set.resume(2).await.expect("resume");
    set.resume(2)
        .await
        .expect("resuming a running node is a no-op");
    assert_eq!(node.get("k").await.unwrap().as_deref(), Some("v"));
}

async fn disconnect_refuses_until_connect(set: &DockerSet) {
    let node = set.redis(3);
    node.set("k", "v", None).await.unwrap();
    set.disconnect(3).await.expect("disconnect");
    set.disconnect(3)
        .await
        .expect("disconnecting twice is a no-op");
    let read = node.get("k").await;
    assert!(matches!(read, Err(HarnessError::Redis { .. })), "{read:?}");
    set.connect(3).await.expect("connect");
    set.connect(3).await.expect("connecting twice is a no-op");
    node.ping().await.expect("reachable again after connect");
    assert_eq!(node.get("k").await.unwrap().as_deref(), Some("v"));
}

async fn evict_all_in_a_container(set: &DockerSet) {
    let node = set.redis(4);
    for i in 0..3 {
        node.set(&format!("lock:{i}"), "t", Some(60_000))
            .await
            .unwrap();
    }
    assert_eq!(node.evict_all().await.unwrap(), 3);
    assert_eq!(node.dbsize().await.unwrap(), 0);
    assert_eq!(
        node.config_get("maxmemory").await.unwrap().as_deref(),
        Some("0")
    );
    assert_eq!(
        node.config_get("maxmemory-policy")
            .await
            .unwrap()
            .as_deref(),
        Some("noeviction")
    );
    node.set("after", "v", None)
        .await
        .expect("writes work again");
}

/// A set with `appendonly yes` and fake clocks.
async fn persistence_and_fake_clocks() {
    let opts = DockerOptions {
        appendonly_always: true,
        fake_clock: true,
    };
    let set = DockerSet::up(opts).await.expect("up");

    let node = set.redis(0);
    node.set("lock:a", "token", None).await.unwrap();
    set.kill(0).await.expect("kill");
    set.start(0).await.expect("start");
    assert_eq!(node.get("lock:a").await.unwrap().as_deref(), Some("token"));

    clock_jump_shows_in_time_and_expires_keys(&set).await;
    fast_clock_expires_keys_early(&set).await;
}

async fn clock_jump_shows_in_time_and_expires_keys(set: &DockerSet) {
    const HOUR_MS: i64 = 3_600_000;
    let (jumped, control) = (set.redis(1), set.redis(2));
    for node in [&jumped, &control] {
        node.set("lock:a", "token", Some(60_000)).await.unwrap();
    }
    let before = jumped.time().await.unwrap();
    set.clock(1).expect("fake clock").jump(HOUR_MS).unwrap();
    // The shim re-reads its control file every ~10 ms.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = jumped.time().await.unwrap();
    let moved = after.saturating_sub(before);
    assert!(
        moved >= Duration::from_secs(3600) && moved < Duration::from_secs(3660),
        "TIME moved by {moved:?}"
    );
    let skew = gap(jumped.time().await.unwrap(), control.time().await.unwrap());
    assert!(skew >= Duration::from_secs(3590), "skew {skew:?}");
    assert_eq!(
        jumped.get("lock:a").await.unwrap(),
        None,
        "expired by the jump"
    );
    assert_eq!(
        control.get("lock:a").await.unwrap().as_deref(),
        Some("token")
    );

    set.clock(1).unwrap().reset().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let skew = gap(jumped.time().await.unwrap(), control.time().await.unwrap());
    assert!(
        skew < Duration::from_secs(60),
        "back to real time: {skew:?}"
    );
}

async fn fast_clock_expires_keys_early(set: &DockerSet) {
    let (fast, control) = (set.redis(3), set.redis(4));
    set.clock(3).expect("fake clock").set_rate(4.0).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    for node in [&fast, &control] {
        node.set("lock:b", "token", Some(1000)).await.unwrap();
    }
    // 700 real ms are 2800 ms on the 4x clock: past the 1000 ms TTL there, not on the control.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !fast.exists("lock:b").await.unwrap(),
        "gone on the 4x clock"
    );
    assert!(control.exists("lock:b").await.unwrap(), "still there at 1x");
}

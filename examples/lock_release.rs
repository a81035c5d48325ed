//! The basic cycle: connect, lock, check, work, release, and what the report says.
//!
//! Starts three `redis-server` processes on free loopback ports (real, independent masters,
//! removed when the program ends), then walks through one lock's life and the two ways of
//! asking the nodes about it.
//!
//! Run it: `cargo run --example lock_release`

use std::time::Duration;

use redlock_client::{LockConfig, Redlock};
use redlock_testkit::NodeSet;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. The nodes. In production these are N independent Redis masters (3 or 5), each
    //    with `appendfsync always` or restarted only after the longest TTL has passed.
    let nodes = NodeSet::start(3).await?;

    // 2. One client per node set, shared by the whole service (it is cheap to clone). The
    //    builder checks every value when it builds: a bad URL or a TTL that leaves no
    //    validity is an error here, never a panic later.
    let client = Redlock::connect(
        LockConfig::builder()
            .nodes(nodes.urls())
            .ttl(Duration::from_secs(5))
            .build()?,
    )
    .await?;

    // 3. `lock` waits for the lock, retrying with backoff (up to `retry.max_wait`, 10 s by
    //    default), and returns a guard. The guard is renewed in the background while held.
    let guard = client.lock("invoice:42").await?;
    println!(
        "locked {} after {} attempt(s), valid for another {:?}",
        guard.key(),
        guard.attempts(),
        guard.remaining().unwrap_or_default()
    );

    // 4. Another caller meanwhile: `try_lock` makes one attempt and says why it failed,
    //    node by node.
    match client.try_lock("invoice:42").await {
        Ok(_) => return Err("two holders at once".into()),
        Err(e) => println!("a second try_lock fails, as it must:\n  {e}"),
    }

    // 5. Work only while the lock is valid: the guard knows its validity without asking
    //    the nodes. To ask them whether they still hold the key for this guard (a quorum
    //    read), call `check`; `inspect` shows what every node holds.
    if guard.is_valid() && guard.check().await? {
        println!("a quorum of nodes holds invoice:42 for us: working on it");
        tokio::time::sleep(Duration::from_millis(50)).await; // the protected work
    }
    let inspection = client.inspect("invoice:42").await?;
    println!(
        "inspect: held {:?}, by this guard {:?}, for at least {:?}",
        inspection.held,
        inspection.held_by(guard.lock().token()),
        inspection.remaining.unwrap_or_default()
    );

    // 6. Release explicitly: it returns once a quorum has deleted the key, with a report of
    //    what each node did. (A guard dropped without `release` is released in the
    //    background, with a warning.)
    let report = guard.release().await?;
    println!("released: {report}");

    // 7. The key is free again for the next holder.
    client.try_lock("invoice:42").await?.release().await?;
    client.shutdown().await;
    println!("OK");
    Ok(())
}

//! A paused holder cannot overwrite a newer holder's work when the resource checks fencing
//! tokens: here the resource is a value in Redis written with `redlock_client::fenced_set`.
//!
//! Starts three lock nodes and one Redis for the data (real `redis-server` processes on free
//! loopback ports), then:
//! 1. holder A takes the lock (fenced) and stalls past its validity, as a GC pause would;
//! 2. holder B takes the lock and writes with its (higher) token;
//! 3. A wakes up and writes with its old token: the resource rejects it.
//!
//! Run it: `cargo run --example fenced_redis`

use std::time::Duration;

use fred::prelude::{Builder, ClientLike, Config, KeysInterface};
use redlock_client::{fenced_set, LockConfig, Redlock};
use redlock_testkit::NodeSet;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes = NodeSet::start(3).await?;
    let data = NodeSet::start(1).await?;
    let store = Builder::from_config(Config::from_url(&data.node(0).url())?).build()?;
    store.init().await?;

    let ttl = Duration::from_millis(500);
    let config = LockConfig::builder()
        .nodes(nodes.urls())
        .ttl(ttl)
        .no_renewal()
        .fencing(true)
        .build()?;
    let a = Redlock::connect(config.clone()).await?;
    let b = Redlock::connect(config).await?;

    let held_by_a = a.lock("ledger").await?;
    let token_a = held_by_a.fencing_token().expect("fenced");
    println!("A holds the lock with fencing token {token_a}, then stalls past its validity");
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;

    let held_by_b = b.lock("ledger").await?;
    let token_b = held_by_b.fencing_token().expect("fenced");
    let written = fenced_set(&store, "ledger:balance", "100 (by B)", token_b).await?;
    println!("B holds the lock with fencing token {token_b}; its write accepted: {written}");

    let stale = fenced_set(&store, "ledger:balance", "50 (by A)", token_a).await?;
    println!("A wakes up and writes with token {token_a}; accepted: {stale}");
    let balance: String = store.get("ledger:balance").await?;
    println!("ledger:balance = {balance}");

    held_by_b.release().await?;
    drop(held_by_a);
    if stale || balance != "100 (by B)" {
        return Err("the stale write got through".into());
    }
    println!("OK: the resource rejected the paused holder's stale write");
    Ok(())
}

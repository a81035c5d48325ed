//! The same paused holder as `fenced_redis`, against data in PostgreSQL: each row keeps the
//! highest fencing token that wrote it, and `redlock_client::FENCED_UPDATE_SQL` updates a
//! row only while no higher token has.
//!
//! Starts three lock nodes and a PostgreSQL server (Debian's `postgresql` package) on free
//! loopback ports. Run it: `cargo run --example fenced_sql`

use std::time::Duration;

use redlock_client::{LockConfig, Redlock, FENCED_UPDATE_SQL};
use redlock_testkit::{NodeSet, Postgres};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes = NodeSet::start(3).await?;
    let postgres = Postgres::start().await?;
    let db = postgres.client().await?;
    db.batch_execute(
        "CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL, \
         fence BIGINT NOT NULL DEFAULT 0); INSERT INTO accounts (id, balance) VALUES (1, 0);",
    )
    .await?;

    let ttl = Duration::from_millis(500);
    let config = LockConfig::builder()
        .nodes(nodes.urls())
        .ttl(ttl)
        .no_renewal()
        .fencing(true)
        .build()?;
    let a = Redlock::connect(config.clone()).await?;
    let b = Redlock::connect(config).await?;

    let held_by_a = a.lock("account:1").await?;
    let token_a = held_by_a.fencing_token().expect("fenced").get() as i64;
    println!("A holds account:1 with fencing token {token_a}, then stalls past its validity");
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;

    let held_by_b = b.lock("account:1").await?;
    let token_b = held_by_b.fencing_token().expect("fenced").get() as i64;
    let rows = db
        .execute(FENCED_UPDATE_SQL, &[&100i64, &1i32, &token_b])
        .await?;
    println!("B holds account:1 with fencing token {token_b}; rows it updated: {rows}");

    let stale = db
        .execute(FENCED_UPDATE_SQL, &[&50i64, &1i32, &token_a])
        .await?;
    println!("A wakes up and updates with token {token_a}; rows updated: {stale}");
    let row = db
        .query_one("SELECT balance, fence FROM accounts WHERE id = 1", &[])
        .await?;
    let (balance, fence): (i64, i64) = (row.get(0), row.get(1));
    println!("account 1: balance {balance}, fence {fence}");

    held_by_b.release().await?;
    drop(held_by_a);
    if rows != 1 || stale != 0 || balance != 100 || fence != token_b {
        return Err("the stale update got through".into());
    }
    println!("OK: PostgreSQL rejected the paused holder's stale update");
    Ok(())
}

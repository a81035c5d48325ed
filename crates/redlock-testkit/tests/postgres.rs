//! The PostgreSQL harness: a real server per test, the fenced-update pattern against it,
//! concurrent instances, and shutdown on drop.

use redlock_testkit::{Postgres, POSTGRES_USER};
use tokio_postgres::{Client, NoTls};

/// The resource-side check of a fencing token: the write lands only if its token is newer than
/// the last one the row accepted, in the same atomic statement. Returns the rows written.
async fn fenced_add(db: &Client, id: i32, amount: i64, token: i64) -> u64 {
    db.execute(
        "UPDATE accounts SET balance = balance + $2, fence = $3 WHERE id = $1 AND fence < $3",
        &[&id, &amount, &token],
    )
    .await
    .expect("fenced UPDATE")
}

#[tokio::test]
async fn a_stale_token_is_rejected_by_the_fenced_update() {
    let pg = Postgres::start().await.expect("start postgres");
    let db = pg.client().await.expect("connect");
    db.batch_execute(
        "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint, fence bigint NOT NULL DEFAULT 0);
         INSERT INTO accounts (id, balance) VALUES (1, 100);",
    )
    .await
    .unwrap();

    assert_eq!(fenced_add(&db, 1, 10, 5).await, 1, "token 5 > fence 0");
    // A holder that paused past its lease and still carries token 3.
    assert_eq!(fenced_add(&db, 1, 1000, 3).await, 0, "token 3 < fence 5");
    assert_eq!(fenced_add(&db, 1, 10, 5).await, 0, "a token is used once");
    assert_eq!(fenced_add(&db, 1, 20, 7).await, 1, "token 7 > fence 5");

    let row = db
        .query_one("SELECT balance, fence FROM accounts WHERE id = 1", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>("fence"), 7);
    assert_eq!(
        row.get::<_, i64>("balance"),
        130,
        "the stale write left no trace"
    );
}

#[tokio::test]
async fn two_instances_run_at_once_on_distinct_ports() {
    let (a, b) = tokio::join!(Postgres::start(), Postgres::start());
    let (a, b) = (a.expect("start a"), b.expect("start b"));
    assert_ne!(a.port(), b.port());
    assert_ne!(a.data_dir(), b.data_dir());
    for pg in [&a, &b] {
        // Through the connection string too, not only through `client()`.
        let (db, connection) = tokio_postgres::connect(&pg.config(), NoTls).await.unwrap();
        tokio::spawn(connection);
        let row = db
            .query_one("SELECT current_user::text, current_setting('port')", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), POSTGRES_USER);
        assert_eq!(row.get::<_, String>(1), pg.port().to_string());
    }
    let (db, connection) = tokio_postgres::connect(&a.url(), NoTls).await.unwrap();
    tokio::spawn(connection);
    db.simple_query("SELECT 1").await.unwrap();
}

#[tokio::test]
async fn dropping_stops_the_server() {
    let pg = Postgres::start().await.expect("start postgres");
    // An open session must not hold the shutdown up (fast shutdown ends it).
    let db = pg.client().await.expect("connect");
    db.simple_query("SELECT 1").await.unwrap();
    let (config, pid, dir) = (pg.config(), pg.pid(), pg.data_dir().to_owned());
    drop(pg);

    assert!(
        tokio_postgres::connect(&config, NoTls).await.is_err(),
        "the server still accepts connections after drop"
    );
    assert!(
        db.simple_query("SELECT 1").await.is_err(),
        "session still open"
    );
    assert!(!dir.exists(), "the data directory was not removed");
    // Reaped, not a zombie: /proc no longer has it (the pid could be reused, but not this fast).
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
}

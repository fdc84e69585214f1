//! The cluster's notification queue filled for real (issue 22, item 1): a
//! benchmark-sized test, about a minute and 8 GB of disk, so it is ignored in
//! the regular suite (which injects the notification's failure instead, in
//! `coordination.rs`). Run it with
//! `cargo test -p ticklease --test notify_queue -- --ignored --nocapture`.

use std::time::{Duration, Instant};

use ticklease::{Acquire, LeaseStore, PgStore, PgStoreOptions, Release, Role};
use ticklease_testkit::{connect, PgCluster};

#[tokio::test]
#[ignore = "fills the 8 GB notification queue: about a minute"]
async fn decisions_commit_while_the_notification_queue_is_full() {
    let cluster = PgCluster::start().unwrap();
    let db = cluster.create_database().await.unwrap();
    let owner = connect(&cluster.config(&db)).await.unwrap();
    ticklease::migrate(&mut connect(&cluster.config(&db)).await.unwrap())
        .await
        .unwrap();
    // The queue's tail cannot pass a listener idle in a transaction.
    let stuck = connect(&cluster.config(&db)).await.unwrap();
    stuck.batch_execute("LISTEN anything").await.unwrap();
    stuck.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let started = Instant::now();
    let mut senders = Vec::new();
    for _ in 0..4 {
        let sender = connect(&cluster.config(&db)).await.unwrap();
        senders.push(tokio::spawn(async move {
            loop {
                match sender
                    .batch_execute(
                        "SELECT count(pg_notify('unrelated', repeat('x', 7900))) FROM generate_series(1, 1000)",
                    )
                    .await
                {
                    Ok(()) => {}
                    Err(e) => return e.as_db_error().map_or(e.to_string(), |d| d.message().to_string()),
                }
            }
        }));
    }
    let mut why = Vec::new();
    for s in senders {
        why.push(s.await.unwrap());
    }
    let usage: f64 = owner
        .query_one("SELECT pg_notification_queue_usage()", &[])
        .await
        .unwrap()
        .get(0);
    println!(
        "queue full after {:?}: usage {usage:.3}, senders stopped with {:?}",
        started.elapsed(),
        why[0]
    );
    assert!(
        why.iter().all(|w| w.contains("too many notifications")),
        "{why:?}"
    );
    let denied = owner
        .batch_execute("SELECT pg_notify('ticklease', 'release billing')")
        .await
        .unwrap_err();
    let denied = denied
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_default();
    assert!(denied.contains("too many notifications"), "{denied}");

    let options = PgStoreOptions {
        pool_size: 2,
        statement_timeout: Duration::from_secs(2),
    };
    let store = PgStore::connect(cluster.config(&db), options).await.unwrap();
    let role = Role::new("billing").unwrap();
    let hour = Duration::from_secs(3600);
    let Acquire::Acquired(term) = store.acquire(&role, "a", hour, hour).await.unwrap() else {
        panic!("acquire")
    };
    let decided = Instant::now();
    assert!(store
        .release(&role, term.token, Release::Interrupted, hour)
        .await
        .unwrap());
    assert!(store.pause(&role, "ops", "queue full").await.unwrap());
    assert!(store.unpause(&role).await.unwrap());
    let held: bool = owner
        .query_one("SELECT held OR paused_at IS NOT NULL FROM leader_status", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!held, "released, paused and unpaused");
    println!(
        "RELEASE, pause and unpause committed in {:?} with the queue full",
        decided.elapsed()
    );
    stuck.batch_execute("ROLLBACK").await.unwrap();
}

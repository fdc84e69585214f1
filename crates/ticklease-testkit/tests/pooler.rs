//! The negative control for the PgBouncer suites: a leader built on a session
//! advisory lock breaks through a transaction-mode bouncer, while ticklease
//! (the same leadership suites, run again with TICKLEASE_TEST_POOLER=pgbouncer
//! in scripts/test) does not.

use std::convert::Infallible;
use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use ticklease::{Lead, Manager, PgStore, PgStoreOptions, Role};
use ticklease_testkit::{connect, migrated_db, test_config, PgBouncer, PgCluster};

/// The old leader gate: `pg_try_advisory_lock` on whatever server connection
/// the statement lands on.
async fn try_lead(client: &Client, key: i64) -> bool {
    let rows = client
        .query_typed("SELECT pg_try_advisory_lock($1)", &[(&key, Type::INT8)])
        .await
        .unwrap();
    rows[0].get(0)
}

async fn unlock(client: &Client, key: i64) -> bool {
    let rows = client
        .query_typed("SELECT pg_advisory_unlock($1)", &[(&key, Type::INT8)])
        .await
        .unwrap();
    rows[0].get(0)
}

#[tokio::test]
async fn a_session_advisory_lock_leader_breaks_through_pgbouncer() {
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    let bouncer = PgBouncer::start(cluster, 2).unwrap();
    let (a, b) = (
        connect(&bouncer.config(&db)).await.unwrap(),
        connect(&bouncer.config(&db)).await.unwrap(),
    );

    assert!(try_lead(&a, 7654001).await, "replica a takes the lock");
    // The lock belongs to the server connection a's statement ran on, which the
    // bouncer now hands to b.
    let b_leads = try_lead(&b, 7654001).await;
    let a_unlocked = unlock(&a, 7654001).await;
    let stranded: i64 = ticklease_testkit::scalar(
        &connect(&cluster.config(&db)).await.unwrap(),
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 7654001",
    )
    .await;
    println!("b also leads: {b_leads}; a's unlock found its lock: {a_unlocked}; locks left: {stranded}");
    assert!(
        b_leads || stranded > 0,
        "expected two leaders at once, or a lock stranded on a server connection"
    );

    // Directly (one session per replica) the same gate holds.
    let (da, db_) = (
        connect(&cluster.config(&db)).await.unwrap(),
        connect(&cluster.config(&db)).await.unwrap(),
    );
    assert!(
        try_lead(&da, 7654002).await && !try_lead(&db_, 7654002).await,
        "control: the gate works without a pooler"
    );
}

#[tokio::test]
async fn ticklease_keeps_one_leader_through_pgbouncer() {
    let cluster = PgCluster::shared();
    let direct = migrated_db(cluster).await;
    let bouncer = PgBouncer::start(cluster, 2).unwrap();
    let pooled = bouncer.config(direct.get_dbname().unwrap());
    let config = test_config();
    let role = Role::new("billing").unwrap();
    let mut managers = Vec::new();
    for _ in 0..3 {
        let store = PgStore::connect(pooled.clone(), PgStoreOptions::from_config(&config))
            .await
            .unwrap();
        managers.push(Manager::start(store, config, [role.clone()]).await.unwrap());
    }
    let leading = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for m in managers {
        let (role, leading) = (role.clone(), leading.clone());
        tasks.push(tokio::spawn(async move {
            let mut led = 0;
            for _ in 0..30 {
                let lead = m
                    .lead(&role, Duration::from_millis(1), |_| async {
                        assert_eq!(
                            leading.fetch_add(1, std::sync::atomic::Ordering::SeqCst),
                            0,
                            "two leaders"
                        );
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        leading.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        Ok::<_, Infallible>(())
                    })
                    .await
                    .unwrap();
                if matches!(lead, Lead::Completed { .. }) {
                    led += 1;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            led
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert!(total >= 10, "led {total} ticks through the bouncer");
}

//! PgStore statements in races that only a real Postgres can hold open, and
//! the operator view over every row state.

use std::time::Duration;

use ticklease::{Acquire, LeaseStore, LossReason, PgStore, PgStoreOptions, Release, Renew, Role, StoreError};
use ticklease_testkit::{connect, direct, migrated_db, pg_store, scalar, test_config, PgCluster};

fn billing() -> Role {
    Role::new("billing").unwrap()
}

/// A RENEW that started before a pause committed, and waited for its row lock,
/// reports the pause: the loss is classified by the row after the statement.
#[tokio::test]
async fn renew_racing_a_pause_reports_the_pause_not_a_takeover() {
    let db = migrated_db(PgCluster::shared()).await;
    let store = PgStore::connect(
        db.clone(),
        PgStoreOptions {
            pool_size: 2,
            statement_timeout: Duration::from_secs(10),
        },
    )
    .await
    .unwrap();
    let ttl = Duration::from_secs(30);
    let Acquire::Acquired(term) = store
        .acquire(&billing(), "a", ttl, Duration::from_secs(1))
        .await
        .unwrap()
    else {
        panic!("acquire")
    };
    let mut operator = connect(&direct(&db)).await.unwrap();
    let observer = connect(&direct(&db)).await.unwrap();
    let pause = operator.transaction().await.unwrap();
    pause
        .batch_execute("SELECT leader_pause('billing', 'ops', 'race')")
        .await
        .unwrap();
    let renew = tokio::spawn({
        let store = store.clone();
        async move { store.renew(&billing(), term.token, ttl).await }
    });
    // Hold the pause open until the RENEW waits for its row lock.
    let blocked = "SELECT count(*) FROM pg_stat_activity
                    WHERE datname = current_database() AND wait_event_type = 'Lock'";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while scalar::<i64>(&observer, blocked).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the RENEW never waited for the pause's row lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pause.commit().await.unwrap();
    assert_eq!(renew.await.unwrap().unwrap(), Renew::Lost(LossReason::Paused));
}

/// `leader_status` (and so `ticklease status` and the metrics scrape) answers
/// for every state a row can be in.
#[tokio::test]
async fn leader_status_answers_in_every_row_state() {
    let db = migrated_db(PgCluster::shared()).await;
    let config = test_config();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let owner = connect(&direct(&db)).await.unwrap();
    let answers = |state: &'static str| {
        let (store, owner) = (&store, &owner);
        async move {
            let n: i64 = scalar(owner, "SELECT count(*) FROM leader_status").await;
            let rows = store.status().await.unwrap_or_else(|e| panic!("{state}: {e}"));
            assert_eq!(rows.len() as i64, n, "{state}");
        }
    };
    store.seed(&[billing()]).await.unwrap();
    answers("free, never ran").await;
    let short = Duration::from_millis(300);
    let role = billing();
    let acquired = |ttl| store.acquire(&role, "a", ttl, Duration::from_millis(1));
    let Acquire::Acquired(t) = acquired(short).await.unwrap() else {
        panic!()
    };
    answers("held").await;
    tokio::time::sleep(short * 2).await;
    answers("expired, not taken over").await;
    let Acquire::Acquired(t2) = acquired(short).await.unwrap() else {
        panic!()
    };
    assert!(t2.token > t.token);
    store
        .release(&billing(), t2.token, Release::Failed, Duration::from_secs(60))
        .await
        .unwrap();
    answers("cooling down").await;
    store.run_now(&billing()).await.unwrap();
    let Acquire::Acquired(t3) = acquired(short).await.unwrap() else {
        panic!()
    };
    store
        .release(&billing(), t3.token, Release::Completed, Duration::from_millis(1))
        .await
        .unwrap();
    answers("completed").await;
    store.pause(&billing(), "ops", "\u{1b}]0;x\u{7}").await.unwrap();
    answers("paused").await;
    // The largest finite timestamps the table accepts.
    owner
        .batch_execute(
            "UPDATE leader_leases SET paused_at = NULL, paused_by = NULL, pause_reason = NULL,
                    holder_id = 'x', acquired_at = '4713-01-01 BC', expires_at = '294276-12-31',
                    not_before = '294276-12-31', last_tick_ended_at = '4713-01-01 BC'",
        )
        .await
        .unwrap();
    answers("extreme but finite").await;
}

/// A connection that finds itself on a read-only server (a standby, a demoted
/// primary) leaves the pool at once: the next statement connects afresh.
#[tokio::test]
async fn a_connection_on_a_read_only_server_leaves_the_pool_at_once() {
    let db = migrated_db(PgCluster::shared()).await;
    let owner = connect(&direct(&db)).await.unwrap();
    let name = db.get_dbname().unwrap().to_string();
    owner
        .batch_execute(&format!(
            "ALTER DATABASE {name} SET default_transaction_read_only = on"
        ))
        .await
        .unwrap();
    let store = PgStore::connect(
        db.clone(),
        PgStoreOptions {
            pool_size: 1,
            statement_timeout: Duration::from_secs(5),
        },
    )
    .await
    .unwrap();
    let ttl = Duration::from_secs(30);
    let err = store
        .acquire(&billing(), "a", ttl, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(ticklease::error::chain(&err).contains("read-only"), "{err:?}");
    owner
        .batch_execute(&format!(
            "ALTER DATABASE {name} RESET default_transaction_read_only"
        ))
        .await
        .unwrap();
    let acquired = store
        .acquire(&billing(), "a", ttl, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(matches!(acquired, Acquire::Acquired(_)), "{acquired:?}");
}

/// Item 9 of issue 22: every text is bounded where it enters. Who paused
/// and why are cut (as the history keeps them); a holder id over 200
/// characters is refused, and nothing is written.
#[tokio::test]
async fn texts_are_bounded_at_every_entry_point() {
    let config = test_config();
    let (store, db) = pg_store(&config).await;
    let owner = connect(&ticklease_testkit::direct(&db)).await.unwrap();
    let role = Role::new("billing").unwrap();
    store.seed(std::slice::from_ref(&role)).await.unwrap();
    let reason = "r".repeat(100_000);
    let by = "b".repeat(10_000);
    assert!(store.pause(&role, &by, &reason).await.unwrap());
    let (by_len, reason_len): (i32, i32) = {
        let row = owner
            .query_one(
                "SELECT length(paused_by), length(pause_reason) FROM leader_leases WHERE role = 'billing'",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((by_len, reason_len), (200, 500), "cut as the history keeps them");
    store.unpause(&role).await.unwrap();
    let dunning = Role::new("dunning").unwrap();
    let err = store
        .acquire(
            &dunning,
            &"h".repeat(1_000_000),
            config.lease_ttl(),
            Duration::from_millis(1),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err:?}");
    let rows: i64 = ticklease_testkit::scalar(
        &owner,
        "SELECT count(*) FROM leader_leases WHERE role = 'dunning'",
    )
    .await;
    assert_eq!(rows, 0, "nothing written");
}

/// Every connection of the store is ticklease's in `pg_stat_activity`
/// (`ticklease store <host>:<pid>`), unless the URL names it itself.
#[tokio::test]
async fn the_stores_connections_are_named_in_pg_stat_activity() {
    let db = ticklease_testkit::migrated_db(ticklease_testkit::PgCluster::shared()).await;
    let dbname = db.get_dbname().unwrap().to_string();
    let config = ticklease::Config::default();
    // The test kit names its connections: the same database without a name.
    let mut bare = tokio_postgres::Config::new();
    for host in db.get_hosts() {
        match host {
            tokio_postgres::config::Host::Tcp(h) => bare.host(h),
            tokio_postgres::config::Host::Unix(p) => bare.host_path(p),
        };
    }
    bare.port(db.get_ports()[0])
        .user(db.get_user().unwrap())
        .dbname(&dbname);
    let store = ticklease::PgStore::connect(bare, ticklease::PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let observer = ticklease_testkit::connect(&ticklease_testkit::direct(&db))
        .await
        .unwrap();
    let sql = format!(
        "SELECT coalesce(string_agg(application_name, ','), '') FROM pg_stat_activity
          WHERE datname = '{dbname}' AND pid <> pg_backend_pid()"
    );
    let expected = format!(
        "ticklease store {}:{}",
        gethostname::gethostname().to_string_lossy(),
        std::process::id()
    );
    let seen: String = observer.query_one(&sql, &[]).await.unwrap().get(0);
    assert!(
        seen.split(',').any(|n| n == expected),
        "{seen:?}, expected {expected:?}"
    );
    drop(store);

    let mut own = db.clone();
    own.application_name("billing-svc");
    let _kept = ticklease::PgStore::connect(own, ticklease::PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let seen: String = observer.query_one(&sql, &[]).await.unwrap().get(0);
    assert!(seen.split(',').any(|n| n == "billing-svc"), "{seen:?}");
}

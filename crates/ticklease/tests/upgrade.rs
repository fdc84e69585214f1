//! Migrations upgrade a database in place, with live terms whose holders
//! keep renewing through the upgrade; the definitions are applied when they
//! change and never over newer ones.

use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_util::sync::CancellationToken;

use ticklease::migrate::{
    MigrationSet, DEFINITIONS, DEFINITIONS_GENERATION, DEFINITIONS_TABLE, LIBRARY, MIGRATIONS,
};
use ticklease::{LeaseStore, PgStore, PgStoreOptions, Renew, Role, Token};
use ticklease_testkit::{connect, scalar, test_config, PgCluster};

/// RENEW as the 0002 library sent it: a direct UPDATE by the app role.
const RENEW_0002: &str = "UPDATE leader_leases SET expires_at = now() + $3::int8 * interval '1 millisecond'
                           WHERE role = $1 AND holder_token = $2 AND holder_id IS NOT NULL";

/// A database migrated as the release of migration `at` left it, the
/// owner's client, and a login of the app role with its own client.
struct OldRelease {
    client: tokio_postgres::Client,
    app: tokio_postgres::Config,
    app_client: tokio_postgres::Client,
}

async fn database_at(at: usize, login: &str) -> OldRelease {
    let cluster = PgCluster::shared();
    let name = cluster.create_database().await.unwrap();
    let owner = cluster.config(&name);
    let mut client = connect(&owner).await.unwrap();
    let release = MigrationSet {
        migrations: &MIGRATIONS[..at],
        ..LIBRARY
    };
    release.apply(&mut client, "").await.unwrap();
    client
        .batch_execute(&format!("CREATE ROLE {login} LOGIN IN ROLE ticklease_app"))
        .await
        .unwrap();
    let mut app = owner.clone();
    app.user(login);
    let app_client = connect(&app).await.unwrap();
    OldRelease {
        client,
        app,
        app_client,
    }
}

/// Runs `renewals` (each answers true while its term holds) every 50 ms
/// until `stop`; panics on a lost term; returns the rounds.
fn renew_until(
    stop: &CancellationToken,
    client: tokio_postgres::Client,
    renewals: Vec<String>,
) -> tokio::task::JoinHandle<usize> {
    let stop = stop.clone();
    tokio::spawn(async move {
        let mut rounds = 0;
        while !stop.is_cancelled() {
            for sql in &renewals {
                let held: bool = scalar(&client, sql).await;
                assert!(held, "a live term was lost during the upgrade: {sql}");
            }
            rounds += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        rounds
    })
}

#[tokio::test]
async fn migration_0003_keeps_a_live_term_whose_holder_renews_through_it() {
    let OldRelease {
        mut client,
        app,
        app_client,
    } = database_at(2, "upgrade_app").await;
    let token: i64 = scalar(
        &app_client,
        "SELECT holder_token FROM leader_acquire('billing', 'old-holder', 2000, 1000)",
    )
    .await;
    // A term forged through 0002's UPDATE grant: never expires, breaks leader_status.
    app_client
        .batch_execute(
            "SELECT leader_acquire('email_outbox', 'forger', 2000, 1000);
             UPDATE leader_leases SET expires_at = 'infinity' WHERE role = 'email_outbox'",
        )
        .await
        .unwrap();

    let stop = CancellationToken::new();
    let holder = tokio::spawn({
        let stop = stop.clone();
        async move {
            let (mut renewed, mut refused) = (0, None);
            while !stop.is_cancelled() && refused.is_none() {
                match app_client
                    .execute_typed(
                        RENEW_0002,
                        &[
                            (&"billing", Type::TEXT),
                            (&token, Type::INT8),
                            (&2000i64, Type::INT8),
                        ],
                    )
                    .await
                {
                    Ok(1) => renewed += 1,
                    Ok(n) => panic!("the live term was lost ({n} rows)"),
                    Err(e) => refused = e.code().cloned(),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (renewed, refused)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let report = ticklease::migrate(&mut client).await.unwrap();
    assert_eq!(report.applied, [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "migration took {:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();
    let (renewed, refused) = holder.await.unwrap();
    assert!(renewed >= 3, "the holder renewed before the upgrade: {renewed}");
    assert_eq!(
        refused,
        Some(SqlState::INSUFFICIENT_PRIVILEGE),
        "after 0003 the app role writes the table only through functions"
    );

    // The term is intact and the new library renews it and fences with it.
    let config = test_config();
    let store = PgStore::connect(app.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let billing = Role::new("billing").unwrap();
    let row = ticklease_testkit::lease_row(&store, "billing").await;
    assert_eq!(
        (row.token, row.holder_id.as_deref(), row.held),
        (Token(token), Some("old-holder"), true)
    );
    assert!(matches!(
        store
            .renew(&billing, Token(token), config.lease_ttl())
            .await
            .unwrap(),
        Renew::Renewed { .. }
    ));
    let passed: bool = scalar(
        &connect(&app).await.unwrap(),
        &format!("SELECT leader_fence('billing', {token})"),
    )
    .await;
    assert!(passed, "the upgraded term passes the fence");
    // The forged term was ended by the upgrade; leader_status answers.
    let forged = ticklease_testkit::lease_row(&store, "email_outbox").await;
    assert!(!forged.held && forged.expires_at.is_none(), "{forged:?}");
}

/// 0004 (coordination) on a database at 0003: a replica of 0003 keeps
/// renewing its term through the upgrade with 0003's statements, which then
/// record no key; a new replica with a coordination session is refused the
/// role, then renews the term it acquires with its key.
#[tokio::test]
async fn migration_0004_keeps_a_live_term_and_0003_statements_keep_working() {
    let OldRelease {
        mut client,
        app,
        app_client,
    } = database_at(3, "upgrade_app4").await;
    let token: i64 = scalar(
        &app_client,
        "SELECT holder_token FROM leader_acquire('billing', 'old-holder', 2000, 1)",
    )
    .await;

    let stop = CancellationToken::new();
    let renewal = format!("SELECT renewed FROM leader_renew('billing', {token}, 2000)");
    let holder = renew_until(&stop, app_client, vec![renewal]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let report = ticklease::migrate(&mut client).await.unwrap();
    assert_eq!(report.applied, [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "migration took {:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();
    assert!(
        holder.await.unwrap() >= 6,
        "the 0003 holder renewed before and after the upgrade"
    );

    let config = test_config();
    let store = PgStore::connect(app.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap()
        .with_direct(app.clone())
        .await
        .unwrap();
    let billing = Role::new("billing").unwrap();
    let row = ticklease_testkit::lease_row(&store, "billing").await;
    assert_eq!(
        (row.token, row.holder_id.as_deref(), row.held),
        (Token(token), Some("old-holder"), true)
    );
    let key: Option<i64> = scalar(
        &client,
        "SELECT holder_key FROM leader_leases WHERE role = 'billing'",
    )
    .await;
    assert_eq!(key, None, "a 0003 RENEW records no key");
    assert!(matches!(
        store
            .acquire(&billing, "new", config.lease_ttl(), Duration::from_millis(1))
            .await
            .unwrap(),
        ticklease::Acquire::Refused(ticklease::Refusal::Held { holder_key: None, .. })
    ));
    assert!(matches!(
        store
            .renew(&billing, Token(token), config.lease_ttl())
            .await
            .unwrap(),
        Renew::Renewed { .. }
    ));
    let key: Option<i64> = scalar(
        &client,
        "SELECT holder_key FROM leader_leases WHERE role = 'billing'",
    )
    .await;
    assert_eq!(key, store.holder_key(), "a new RENEW records the replica's key");
}

/// A database at 0006 (the families release) moves to 0007 and the
/// definitions in place: a single term and a family's batched term keep
/// renewing with 0006's statements throughout, and keep their tokens.
#[tokio::test]
async fn a_database_at_0006_moves_to_the_definitions_with_its_holders_renewing() {
    let OldRelease {
        mut client,
        app,
        app_client,
    } = database_at(6, "upgrade_app6").await;
    let single: i64 = scalar(
        &app_client,
        "SELECT holder_token FROM leader_acquire('billing', 'old-holder', 2000, 1, NULL)",
    )
    .await;
    let batched: i64 = scalar(
        &app_client,
        "SELECT holder_token FROM leader_acquire_many(ARRAY['shard:a'], 'old-holder', 2000, 1, NULL, 10)",
    )
    .await;

    let stop = CancellationToken::new();
    let renewals = vec![
        format!("SELECT renewed FROM leader_renew('billing', {single}, 2000, NULL)"),
        format!(
            "SELECT count(*) = 1 FROM leader_renew_many(ARRAY['shard:a'], ARRAY[{batched}::int8], 2000, NULL)
              WHERE renewed"
        ),
    ];
    let holder = renew_until(&stop, app_client, renewals);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let report = ticklease::migrate(&mut client).await.unwrap();
    assert_eq!(report.applied, [7, 8, 9, 10, 11, 12, 13]);
    let all: Vec<&str> = DEFINITIONS.iter().map(|d| d.name).collect();
    assert_eq!(report.definitions, all);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();
    assert!(holder.await.unwrap() >= 6, "renewed before and after the upgrade");

    let store = PgStore::connect(app.clone(), PgStoreOptions::from_config(&test_config()))
        .await
        .unwrap();
    for (role, token) in [("billing", single), ("shard:a", batched)] {
        let row = ticklease_testkit::lease_row(&store, role).await;
        assert_eq!((row.token, row.held), (Token(token), true), "{role}");
    }
}

/// A second run applies nothing; a changed file is applied alone, and the
/// SECURITY DEFINER functions it replaced are pinned again.
#[tokio::test]
async fn a_definition_is_applied_again_only_when_its_checksum_changes() {
    let cluster = PgCluster::shared();
    let name = cluster.create_database().await.unwrap();
    let mut client = connect(&cluster.config(&name)).await.unwrap();
    let first = ticklease::migrate(&mut client).await.unwrap();
    assert_eq!(first.definitions.len(), DEFINITIONS.len());
    assert_eq!(
        first.applied,
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13],
        "recorded from the tables file (1-7) and applied on top (8 to 13)"
    );
    let again = ticklease::migrate(&mut client).await.unwrap();
    assert!(
        again.definitions.is_empty() && again.applied.is_empty(),
        "{again:?}"
    );

    client
        .batch_execute(&format!(
            "UPDATE {DEFINITIONS_TABLE} SET checksum = 'edited' WHERE name = '60_operator';
             ALTER FUNCTION leader_pause(text, text, text) RESET search_path"
        ))
        .await
        .unwrap();
    let changed = ticklease::migrate(&mut client).await.unwrap();
    assert_eq!(changed.definitions, ["60_operator"]);
    let pinned: String = scalar(
        &client,
        "SELECT coalesce(array_to_string(proconfig, ','), 'unpinned') FROM pg_proc WHERE oid = 'leader_pause(text, text, text)'::regprocedure",
    )
    .await;
    assert!(pinned.ends_with("pg_temp"), "{pinned}");
}

/// During a rolling deploy a replica of an older release migrates after a
/// newer one: it leaves the newer definitions in place, and a store of a
/// newer release refuses a database whose definitions are older.
#[tokio::test]
async fn a_run_never_applies_definitions_older_than_the_databases() {
    let cluster = PgCluster::shared();
    let name = cluster.create_database().await.unwrap();
    let owner = cluster.config(&name);
    let mut client = connect(&owner).await.unwrap();
    ticklease::migrate(&mut client).await.unwrap();
    let newer = DEFINITIONS_GENERATION + 1;
    // A newer generation may name its functions otherwise: the older run
    // reads none of them (review 9, L2: the owner's rights were read
    // through the drain's name, and such a run failed).
    client
        .batch_execute(&format!(
            "UPDATE {DEFINITIONS_TABLE} SET checksum = 'newer', generation = {newer};
             ALTER FUNCTION leader_fence_drain(text[], bigint[], boolean) RENAME TO leader_fence_drain_newer"
        ))
        .await
        .unwrap();
    let report = ticklease::migrate(&mut client).await.unwrap();
    assert!(report.definitions.is_empty(), "{report:?}");
    assert_eq!(report.definitions_newer, Some(newer), "the run says it left them");
    let kept: i64 = scalar(
        &client,
        &format!("SELECT count(*) FROM {DEFINITIONS_TABLE} WHERE checksum = 'newer'"),
    )
    .await;
    assert_eq!(kept, DEFINITIONS.len() as i64);

    client
        .batch_execute(&format!("UPDATE {DEFINITIONS_TABLE} SET generation = 0"))
        .await
        .unwrap();
    let app = ticklease_testkit::app_config(cluster, &name);
    let err = PgStore::connect(app, PgStoreOptions::from_config(&test_config()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ticklease::StoreError::NotMigrated { .. }) && err.to_string().contains("generation 0"),
        "{err}"
    );
}

/// RENEWs `token` of billing (a 2 s lease) every 50 ms until `stop`;
/// panics on a lost term; returns the slowest RENEW.
fn renew_timed(
    stop: &CancellationToken,
    app_client: tokio_postgres::Client,
    token: i64,
) -> tokio::task::JoinHandle<Duration> {
    let stop = stop.clone();
    tokio::spawn(async move {
        let mut slowest = Duration::ZERO;
        while !stop.is_cancelled() {
            let sent = Instant::now();
            let renewed: bool = scalar(
                &app_client,
                &format!("SELECT renewed FROM leader_renew('billing', {token}, 2000, NULL)"),
            )
            .await;
            assert!(renewed, "the term holds");
            slowest = slowest.max(sent.elapsed());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        slowest
    })
}

/// A login with CONNECT alone holds the status view's lock (a PREPARE of a
/// read of it, in an open transaction: it may not run it, but the lock is
/// taken as the statement is parsed, and kept until COMMIT): a run
/// with 0012 pending waits for that lock before it builds 0012's index, so
/// it fails having held nothing a RENEW needs, and runs once the lock is gone.
#[tokio::test]
async fn a_run_waiting_for_the_status_view_holds_up_no_renew() {
    let OldRelease {
        mut client,
        app_client,
        app,
    } = database_at(11, "upgrade_app11").await;
    let token: i64 = scalar(
        &app_client,
        "SELECT holder_token FROM leader_acquire('billing', 'old-holder', 2000, 1, NULL)",
    )
    .await;
    client
        .batch_execute("CREATE ROLE upgrade_outsider11 LOGIN")
        .await
        .unwrap();
    let mut outsider = app.clone();
    outsider.user("upgrade_outsider11");
    let outsider = connect(&outsider).await.unwrap();
    // A PREPARE parses and locks; privileges are checked only when it runs.
    outsider
        .batch_execute("BEGIN; PREPARE p AS SELECT * FROM leader_status")
        .await
        .unwrap();
    let held: i64 = scalar(
        &client,
        "SELECT count(*) FROM pg_locks WHERE relation = 'leader_status'::regclass AND granted",
    )
    .await;
    assert_eq!(held, 1, "the outsider holds the view's lock");
    let stop = CancellationToken::new();
    let renewing = renew_timed(&stop, app_client, token);
    // A reader queued behind the run's wait (an exporter's refresh) gets the
    // view once the run gives up: it is not named as the holder.
    let queued = {
        let app = app.clone();
        tokio::spawn(async move {
            // Well inside the run's 10 s wait, and well after its start.
            tokio::time::sleep(Duration::from_secs(4)).await;
            let reader = connect(&app).await.unwrap();
            reader
                .batch_execute("BEGIN; SELECT count(*) FROM leader_status")
                .await
                .unwrap();
            reader
        })
    };
    let waited = ticklease::migrate(&mut client).await.unwrap_err().to_string();
    assert!(
        waited.contains("leader_status is locked by")
            && waited.contains("upgrade_outsider11")
            && !waited.contains("upgrade_app11"),
        "{waited}"
    );
    queued.await.unwrap().batch_execute("COMMIT").await.unwrap();
    // The same login holding leader_leases itself (a prepared UPDATE): 0012
    // waits 500 ms for its lock, and the error names who held it.
    outsider
        .batch_execute("ROLLBACK; BEGIN; PREPARE q AS UPDATE leader_leases SET role = role")
        .await
        .unwrap();
    let waited = ticklease::migrate(&mut client).await.unwrap_err().to_string();
    assert!(
        waited.contains("0012") && waited.contains("locked by pid") && waited.contains("upgrade_outsider11"),
        "{waited}"
    );
    stop.cancel();
    let slowest = renewing.await.unwrap();
    assert!(
        slowest < Duration::from_millis(1500),
        "a RENEW waited {slowest:?}"
    );
    outsider.batch_execute("ROLLBACK").await.unwrap();
    let report = ticklease::migrate(&mut client).await.unwrap();
    assert_eq!(report.applied, [12, 13]);
}

/// Migration 0008 waits at most 500 ms for each table it alters: a login
/// idle in a transaction that read the history makes the run fail fast
/// (nothing written; run it again) while holders keep renewing within a
/// fraction of a heartbeat, and the run after the reader is gone succeeds.
#[tokio::test]
async fn migration_0008_waits_briefly_for_a_history_reader_while_holders_renew() {
    let OldRelease {
        mut client,
        app,
        app_client,
    } = database_at(7, "upgrade_app7").await;
    let token: i64 = scalar(
        &app_client,
        "SELECT holder_token FROM leader_acquire('billing', 'old-holder', 2000, 1, NULL)",
    )
    .await;
    let stop = CancellationToken::new();
    let renewing = renew_timed(&stop, app_client, token);
    let reader = connect(&app).await.unwrap();
    reader
        .batch_execute("BEGIN; SELECT count(*) FROM leader_history;")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let refused = ticklease::migrate(&mut client).await;
    assert!(refused.is_err(), "the history's reader holds the migration off");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    let applied: i64 = scalar(
        &client,
        "SELECT count(*) FROM ticklease_schema_migrations WHERE version = 8",
    )
    .await;
    assert_eq!(applied, 0, "nothing written");
    reader.batch_execute("COMMIT").await.unwrap();
    let report = ticklease::migrate(&mut client).await.unwrap();
    assert_eq!(report.applied, [8, 9, 10, 11, 12, 13]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.cancel();
    let slowest = renewing.await.unwrap();
    assert!(
        slowest < Duration::from_millis(1500),
        "a RENEW waited {slowest:?}"
    );
}

/// 0008's short lock wait is its own: the run's wait is restored after it,
/// for the definitions and grants that follow in the same transaction.
#[tokio::test]
async fn migration_0008_restores_the_runs_lock_wait() {
    let OldRelease { client, .. } = database_at(7, "upgrade_app7b").await;
    client
        .batch_execute(&format!(
            "BEGIN; SET LOCAL lock_timeout = '7s'; {}",
            MIGRATIONS[7].sql
        ))
        .await
        .unwrap();
    let after: String = scalar(&client, "SELECT current_setting('lock_timeout')").await;
    client.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(after, "7s");
}

/// Issue 43, item 4: 0013 and generation 7 arrive with claims in flight.
/// A generation-6 claim open when 0013 is pending holds the lease table's
/// read lock: the run waits 500 ms for it, fails naming the holder, and has
/// written nothing; the claim commits inside its term, and the next run
/// applies 0013. A generation-7 claim open while the definitions are
/// applied again (every function replaced) keeps its row lock: the
/// takeover after it still drains it.
#[tokio::test]
async fn claims_of_either_fence_in_flight_across_migrate_commit_only_inside_their_terms() {
    let OldRelease {
        mut client,
        app,
        app_client,
    } = database_at(12, "upgrade_app12").await;
    client
        .batch_execute(
            "CREATE TABLE jobs (id int PRIMARY KEY, claimed_by bigint);
             INSERT INTO jobs VALUES (1, NULL), (2, NULL);
             GRANT SELECT, UPDATE ON jobs TO ticklease_app",
        )
        .await
        .unwrap();
    let token: i64 = scalar(
        &app_client,
        "SELECT holder_token FROM leader_acquire('billing', 'old-holder', 60000, 1, NULL)",
    )
    .await;
    let claim = |fence: &str, id: i32| {
        format!("BEGIN; UPDATE jobs SET claimed_by = {token} WHERE id = {id} AND (SELECT {fence}('billing', {token}))")
    };
    app_client.batch_execute(&claim("leader_fence", 1)).await.unwrap();
    let waited = ticklease::migrate(&mut client).await.unwrap_err().to_string();
    assert!(
        waited.contains("0013") && waited.contains("upgrade_app12"),
        "{waited}"
    );
    app_client
        .batch_execute("COMMIT")
        .await
        .expect("the old claim commits in its live term");
    let report = ticklease::migrate(&mut client).await.unwrap();
    assert_eq!(report.applied, [13]);
    let salted: bool = scalar(
        &client,
        "SELECT fence_salt IS NOT NULL FROM leader_leases WHERE role = 'billing'",
    )
    .await;
    assert!(salted, "the term live at 0013 got its salt");

    app_client
        .batch_execute(&claim("leader_fence_v2", 2))
        .await
        .unwrap();
    client
        .batch_execute(&format!("UPDATE {DEFINITIONS_TABLE} SET checksum = 'older'"))
        .await
        .unwrap();
    let again = ticklease::migrate(&mut client).await.unwrap();
    assert_eq!(
        again.definitions.len(),
        DEFINITIONS.len(),
        "every definition applied again"
    );
    client
        .batch_execute("UPDATE leader_leases SET expires_at = now() WHERE role = 'billing'")
        .await
        .unwrap();
    let taker = connect(&app).await.unwrap();
    let taken: Option<i64> = scalar(
        &taker,
        "SELECT holder_token FROM leader_acquire_v2('billing', 'new-holder', 60000, 1, NULL, false)",
    )
    .await;
    assert!(taken.is_some_and(|t| t > token), "the takeover drained the claim");
    assert!(
        app_client.batch_execute("COMMIT").await.is_err(),
        "its backend was ended"
    );
    let claimed: Vec<Option<i64>> = client
        .query("SELECT claimed_by FROM jobs ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(claimed, [Some(token), None]);
}

//! Least privilege, proven by connecting as each role.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use ticklease::{Lead, LeaseStore, Manager, MigrateOptions, PgStore, PgStoreOptions, Role, StoreError};
use ticklease_testkit::{connect, test_config, PgCluster};

/// A fresh database migrated with `options`, and a login user that is a member of `group`.
async fn db_with_user(
    options: &MigrateOptions,
    group: Option<&str>,
) -> (tokio_postgres::Config, tokio_postgres::Config) {
    static USERS: AtomicU32 = AtomicU32::new(0);
    let cluster = PgCluster::shared();
    let name = cluster.create_database().await.unwrap();
    let owner = cluster.config(&name);
    let mut client = connect(&owner).await.unwrap();
    ticklease::migrate_with(&mut client, options).await.unwrap();
    let user = format!(
        "login_{}_{}",
        std::process::id(),
        USERS.fetch_add(1, Ordering::Relaxed)
    );
    let member = group.map(|g| format!(" IN ROLE {g}")).unwrap_or_default();
    client
        .batch_execute(&format!("CREATE ROLE {user} LOGIN{member}"))
        .await
        .unwrap();
    let mut as_user = owner.clone();
    as_user.user(&user);
    (owner, as_user)
}

async fn denied(client: &Client, sql: &str) {
    let err = client.batch_execute(sql).await.expect_err(sql);
    assert_eq!(
        err.code(),
        Some(&SqlState::INSUFFICIENT_PRIVILEGE),
        "{sql}: {err:?}"
    );
}

async fn allowed(client: &Client, sql: &str) {
    client
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
}

#[tokio::test]
async fn the_app_role_leads_but_cannot_insert_delete_truncate_alter_pause_or_take_ownership() {
    let (_, app) = db_with_user(&MigrateOptions::default(), Some("ticklease_app")).await;
    let config = test_config();
    let store = PgStore::connect(app.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let billing = Role::new("billing").unwrap();
    let m = Manager::start(store, config, [billing.clone()]).await.unwrap();
    let lead = m
        .lead(&billing, Duration::from_secs(60), |tick| async move {
            tokio::time::sleep(config.heartbeat_every() * 2).await; // at least one RENEW
            Ok::<_, Infallible>(tick.token())
        })
        .await
        .unwrap();
    assert!(
        matches!(lead, Lead::Completed { .. }),
        "acquire, renew and release as the app: {lead:?}"
    );
    // ACQUIRE recreates a missing row through leader_acquire, without INSERT.
    let keyed = Role::new("billing:shard-3").unwrap();
    let store = PgStore::connect(app.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    assert!(matches!(
        store
            .acquire(&keyed, "x", Duration::from_secs(5), Duration::from_secs(1))
            .await
            .unwrap(),
        ticklease::Acquire::Acquired(_)
    ));

    let client = connect(&app).await.unwrap();
    allowed(&client, "SELECT * FROM leader_status").await;
    allowed(&client, "SELECT leader_fence('billing', 1)").await;
    denied(&client, "INSERT INTO leader_leases (role) VALUES ('sneaky')").await;
    denied(&client, "DELETE FROM leader_leases").await;
    denied(&client, "TRUNCATE leader_leases").await;
    denied(
        &client,
        "UPDATE leader_leases SET paused_at = NULL, paused_by = NULL",
    )
    .await;
    denied(
        &client,
        "UPDATE leader_leases SET holder_token = holder_token + 1",
    )
    .await;
    denied(&client, "SELECT leader_pause('billing', 'app', 'x')").await;
    denied(&client, "SELECT leader_unpause('billing')").await;
    denied(&client, "SELECT leader_run_now('billing')").await;
    denied(&client, "SELECT leader_grant('a', 'b')").await;
    denied(&client, "CREATE TABLE t (x int)").await;
    for sql in [
        "ALTER TABLE leader_leases ADD COLUMN x int",
        "DROP TABLE leader_leases",
    ] {
        let err = client.batch_execute(sql).await.expect_err(sql);
        assert_eq!(
            err.code(),
            Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            "{sql}: must be owner, {err:?}"
        );
    }
    let err = client
        .batch_execute("ALTER TABLE leader_leases OWNER TO CURRENT_USER")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{err:?}");
}

#[tokio::test]
async fn the_operator_pauses_unpauses_and_reads_status_but_writes_nothing_else() {
    let (owner, operator) = db_with_user(&MigrateOptions::default(), Some("ticklease_operator")).await;
    allowed(
        &connect(&owner).await.unwrap(),
        "SELECT leader_seed(ARRAY['email_outbox'])",
    )
    .await;
    let client = connect(&operator).await.unwrap();
    allowed(
        &client,
        "SELECT leader_pause('email_outbox', 'alice', 'smtp key rotation')",
    )
    .await;
    let row = client
        .query_one(
            "SELECT paused_by FROM leader_status WHERE role = 'email_outbox'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "alice");
    allowed(&client, "SELECT leader_unpause('email_outbox')").await;
    allowed(&client, "SELECT leader_run_now('email_outbox')").await;
    denied(&client, "SELECT * FROM leader_leases").await;
    denied(&client, "UPDATE leader_leases SET not_before = NULL").await;
    denied(&client, "SELECT leader_acquire('email_outbox', 'op', 1000, 1000)").await;
    denied(&client, "SELECT leader_seed(ARRAY['x'])").await;
}

#[tokio::test]
async fn a_role_without_the_grants_gets_permission_denied() {
    let (_, nobody) = db_with_user(&MigrateOptions::default(), None).await;
    let client = connect(&nobody).await.unwrap();
    denied(&client, "SELECT * FROM leader_status").await;
    denied(&client, "SELECT leader_pause('billing', 'x', 'y')").await;
    denied(&client, "SELECT leader_acquire('billing', 'x', 1000, 1000)").await;
    let err = PgStore::connect(nobody, PgStoreOptions::from_config(&test_config()))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::PermissionDenied { .. }), "{err:?}");
    assert_eq!(err.to_string(), "schema check was refused: permission denied");
}

#[tokio::test]
async fn role_names_are_configurable_and_validated() {
    let options = MigrateOptions {
        app_role: "billing_svc".into(),
        operator_role: "oncall".into(),
    };
    let (_, app) = db_with_user(&options, Some("billing_svc")).await;
    let store = PgStore::connect(app, PgStoreOptions::from_config(&test_config()))
        .await
        .unwrap();
    store.seed(&[Role::new("billing").unwrap()]).await.unwrap();
    let cluster = PgCluster::shared();
    let mut client = connect(&cluster.config(&cluster.create_database().await.unwrap()))
        .await
        .unwrap();
    let bad = MigrateOptions {
        app_role: "app; DROP TABLE x".into(),
        ..MigrateOptions::default()
    };
    let err = ticklease::migrate_with(&mut client, &bad).await.unwrap_err();
    assert!(
        err.to_string()
            .starts_with("invalid database role name \"app; DROP TABLE x\""),
        "{err}"
    );
    let n: i64 = client
        .query_one("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "nothing written");
}

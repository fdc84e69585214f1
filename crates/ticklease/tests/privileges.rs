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
    allowed(
        &client,
        "SELECT * FROM leader_replica_beat('fam', 'app', 1000, NULL)",
    )
    .await;
    denied(
        &client,
        "INSERT INTO leader_replicas (family, holder_id, expires_at) VALUES ('fam', 'ghost', 'infinity')",
    )
    .await;
    denied(&client, "UPDATE leader_replicas SET expires_at = 'infinity'").await;
    denied(&client, "DELETE FROM leader_replicas").await;
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
    // The reads `ticklease status`, `ticklease metrics` and the page make as an operator login.
    let store = PgStore::connect(operator.clone(), PgStoreOptions::from_config(&test_config()))
        .await
        .unwrap();
    let (rows, total) = store.status_bounded(10).await.expect("a bounded status");
    assert_eq!((rows.len(), total), (1, 1));
    let named = [Role::new("email_outbox").unwrap()];
    assert_eq!(store.status_of(&named).await.expect("a status by name").len(), 1);
    denied(&client, "SELECT * FROM leader_leases").await;
    denied(&client, "UPDATE leader_leases SET not_before = NULL").await;
    denied(&client, "SELECT leader_acquire('email_outbox', 'op', 1000, 1000)").await;
    denied(&client, "SELECT leader_seed(ARRAY['x'])").await;
}

/// From the review of issue 32 (item 8): the status page's timeline read
/// leader_leases with the reader's rights, which the operator role may not
/// read: the page was 503 for an operator login. It reads role names only.
#[tokio::test]
async fn the_operator_reads_the_timeline_the_status_page_shows_but_no_lease_column_beyond_the_role() {
    let (owner, operator) = db_with_user(&MigrateOptions::default(), Some("ticklease_operator")).await;
    let owner = connect(&owner).await.unwrap();
    allowed(&owner, "SELECT leader_seed(ARRAY['billing'])").await;
    allowed(&owner, "SELECT leader_acquire('billing', 'h', 60000, 1000)").await;
    let client = connect(&operator).await.unwrap();
    allowed(&client, "SELECT * FROM leader_timeline(3600000, 24, 50, 100)").await;
    denied(&client, "SELECT holder_token, holder_key FROM leader_leases").await;
    allowed(&client, "SELECT role FROM leader_leases").await;
}

/// Issue 43: the generation-7 fence is the app role's; its internals, the
/// salts and the secret the PREPARE guard's keys come from are no other
/// login's. FOR KEY SHARE needs UPDATE on the lease table, which no login
/// but the owner has: only the fence locks the row for a claim.
#[tokio::test]
async fn the_fence_of_generation_7_is_the_app_roles_and_its_salts_and_secret_are_no_one_elses() {
    for (group, fence_allowed) in [
        (Some("ticklease_app"), true),
        (Some("ticklease_operator"), false),
        (None, false),
    ] {
        let (owner, login) = db_with_user(&MigrateOptions::default(), group).await;
        allowed(
            &connect(&owner).await.unwrap(),
            "SELECT leader_seed(ARRAY['billing'])",
        )
        .await;
        let client = connect(&login).await.unwrap();
        if fence_allowed {
            allowed(&client, "SELECT leader_fence_v2('billing', 1)").await;
            allowed(&client, "SELECT fence_salt FROM leader_leases").await;
        } else {
            denied(&client, "SELECT leader_fence_v2('billing', 1)").await;
            denied(&client, "SELECT fence_salt FROM leader_leases").await;
        }
        denied(&client, "SELECT * FROM leader_fence_secret").await;
        denied(&client, "SELECT 1 FROM leader_leases FOR KEY SHARE").await;
        for internal in [
            "leader_fence_drain(ARRAY['billing'], ARRAY[1::int8], true)",
            "leader_fence_claimers(ARRAY['billing'], ARRAY[1::int8])",
            "leader_fence_guard()",
            "leader_fence_lock_within('billing', 1)",
            "leader_drain_for_takeover('billing')",
            "leader_fence_marker(1, 1, 1)",
        ] {
            denied(&client, &format!("SELECT {internal}")).await;
        }
    }
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

async fn is_superuser(owner: &tokio_postgres::Config, user: &str) -> bool {
    let client = connect(owner).await.unwrap();
    client
        .query_one("SELECT rolsuper FROM pg_roles WHERE rolname = $1", &[&user])
        .await
        .unwrap()
        .get(0)
}

/// A temporary `leader_leases` whose trigger makes the caller superuser, as an
/// attacker would plant it before calling a SECURITY DEFINER function.
fn shadow_table(user: &str, event: &str) -> String {
    format!(
        "CREATE FUNCTION pg_temp.evil() RETURNS trigger LANGUAGE plpgsql AS $f$
           BEGIN EXECUTE 'ALTER ROLE {user} SUPERUSER'; RETURN NEW; END $f$;
         CREATE TEMP TABLE leader_leases (
             role text PRIMARY KEY, holder_token bigint NOT NULL DEFAULT 1, holder_id text,
             acquired_at timestamptz, expires_at timestamptz, last_tick_ended_at timestamptz,
             last_tick_holder text, paused_at timestamptz, paused_by text, pause_reason text,
             not_before timestamptz);
         INSERT INTO pg_temp.leader_leases (role, holder_token) VALUES ('billing', 1);
         CREATE TRIGGER t BEFORE {event} ON pg_temp.leader_leases
           FOR EACH ROW EXECUTE FUNCTION pg_temp.evil();"
    )
}

#[tokio::test]
async fn a_temporary_table_cannot_hijack_acquire_for_the_app_role() {
    let (owner, app) = db_with_user(&MigrateOptions::default(), Some("ticklease_app")).await;
    let user = app.get_user().unwrap().to_string();
    let client = connect(&app).await.unwrap();
    client
        .batch_execute(&shadow_table(&user, "INSERT OR UPDATE"))
        .await
        .unwrap();
    for sql in [
        "SELECT * FROM leader_acquire('billing', 'x', 10000, 5000)",
        "SELECT leader_seed(ARRAY['dunning'])",
        "SELECT * FROM leader_renew('billing', 1, 10000)",
        "SELECT leader_release('billing', 1, true, NULL)",
        "SELECT leader_fence('billing', 1)",
    ] {
        client
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }
    assert!(!is_superuser(&owner, &user).await, "the app role escalated");
    let owner_client = connect(&owner).await.unwrap();
    let rows: i64 = ticklease_testkit::scalar(&owner_client, "SELECT count(*) FROM leader_leases").await;
    assert_eq!(rows, 2, "acquire and seed wrote the real table");
}

#[tokio::test]
async fn a_temporary_table_cannot_hijack_pause_for_the_operator_role() {
    let (owner, operator) = db_with_user(&MigrateOptions::default(), Some("ticklease_operator")).await;
    let user = operator.get_user().unwrap().to_string();
    allowed(
        &connect(&owner).await.unwrap(),
        "SELECT leader_seed(ARRAY['billing'])",
    )
    .await;
    let client = connect(&operator).await.unwrap();
    client
        .batch_execute(&shadow_table(&user, "UPDATE"))
        .await
        .unwrap();
    for sql in [
        "SELECT leader_pause('billing', 'mallory', 'x')",
        "SELECT leader_unpause('billing')",
        "SELECT leader_run_now('billing')",
    ] {
        client
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }
    assert!(!is_superuser(&owner, &user).await, "the operator role escalated");
}

/// Every SECURITY DEFINER function of the schema pins `search_path` with
/// `pg_temp` last, and no function of ours is executable by PUBLIC: a future
/// function that forgets either fails here.
#[tokio::test]
async fn every_definer_function_pins_pg_temp_last_and_none_is_public() {
    let db = ticklease_testkit::migrated_db(PgCluster::shared()).await;
    let client = connect(&ticklease_testkit::direct(&db)).await.unwrap();
    let rows = client
        .query(
            "SELECT p.oid::regprocedure::text, p.prosecdef, coalesce(p.proconfig, '{}'),
                    p.proacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a
                                                 WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE')
               FROM pg_proc p
              WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'leader\\_%'",
            &[],
        )
        .await
        .unwrap();
    let mut definers = 0;
    for r in &rows {
        let (name, definer, config, public): (String, bool, Vec<String>, bool) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        assert!(!public, "{name} is executable by PUBLIC");
        if definer {
            definers += 1;
            assert!(
                config.contains(&"search_path=pg_catalog, public, pg_temp".to_string()),
                "{name} must pin search_path with pg_temp last: {config:?}"
            );
        }
    }
    assert!(
        definers >= 9,
        "acquire, renew, release, fence, commit check, seed, pause, unpause, run now"
    );
}

#[tokio::test]
async fn the_app_role_cannot_forge_a_term_or_write_the_table() {
    let (owner, app) = db_with_user(&MigrateOptions::default(), Some("ticklease_app")).await;
    allowed(
        &connect(&owner).await.unwrap(),
        "SELECT leader_seed(ARRAY['email_outbox'])",
    )
    .await;
    let client = connect(&app).await.unwrap();
    for sql in [
        "UPDATE leader_leases SET holder_id = 'x', acquired_at = now(), expires_at = 'infinity' WHERE role = 'email_outbox'",
        "UPDATE leader_leases SET not_before = NULL",
        "UPDATE leader_leases SET last_tick_ended_at = now()",
        "UPDATE leader_leases SET expires_at = now()",
    ] {
        denied(&client, sql).await;
    }
    // Not even the owner can store an infinite expiry: leader_status must
    // answer for every row the table allows.
    let err = connect(&owner)
        .await
        .unwrap()
        .batch_execute(
            "UPDATE leader_leases SET holder_id = 'x', acquired_at = now(), expires_at = 'infinity'",
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::CHECK_VIOLATION), "{err:?}");
    allowed(&client, "SELECT * FROM leader_status").await;
}

#[tokio::test]
async fn lease_functions_refuse_out_of_range_durations_and_outcomes() {
    let (owner, app) = db_with_user(&MigrateOptions::default(), Some("ticklease_app")).await;
    allowed(
        &connect(&owner).await.unwrap(),
        "SELECT leader_seed(ARRAY['billing'])",
    )
    .await;
    let client = connect(&app).await.unwrap();
    for sql in [
        "SELECT * FROM leader_acquire('billing', 'x', 0, 1000)",
        "SELECT * FROM leader_acquire('billing', 'x', 1000, -1)",
        "SELECT * FROM leader_acquire('billing', 'x', 86400001, 1000)",
        "SELECT * FROM leader_renew('billing', 1, 9223372036854775807)",
        "SELECT leader_release('billing', 1, false, -1)",
        "SELECT leader_release('billing', 1, NULL, 1000)",
        "SELECT * FROM leader_acquire_many(ARRAY['billing'], 'x', 1000, 1000, NULL, -1)",
        "SELECT * FROM leader_acquire_many(ARRAY['billing'], 'x', 1000, 1000, NULL, NULL)",
        "SELECT * FROM leader_acquire_many(ARRAY['billing', NULL], 'x', 1000, 1000, NULL, 5)",
        "SELECT * FROM leader_acquire_many(array_fill('billing'::text, ARRAY[10001]), 'x', 1000, 1000, NULL, 5)",
        "SELECT * FROM leader_acquire_many(ARRAY['billing'], 'x', 0, 1000, NULL, 5)",
        "SELECT * FROM leader_renew_many(ARRAY['billing', 'other'], ARRAY[1]::bigint[], 1000, NULL)",
        "SELECT * FROM leader_renew_many(ARRAY['billing'], ARRAY[NULL]::bigint[], 1000, NULL)",
        "SELECT * FROM leader_renew_many(ARRAY[['billing']], ARRAY[[1]]::bigint[], 1000, NULL)",
        "SELECT * FROM leader_release_many(ARRAY['billing'], ARRAY[1]::bigint[], ARRAY[true], \
         ARRAY[]::bigint[], ARRAY['completed'], ARRAY[NULL]::text[], ARRAY[NULL]::text[])",
        "SELECT * FROM leader_replica_beat('fam', 'x', 0, NULL)",
    ] {
        let err = client.batch_execute(sql).await.expect_err(sql);
        assert_eq!(
            err.code(),
            Some(&SqlState::INVALID_PARAMETER_VALUE),
            "{sql}: {err:?}"
        );
    }
    let row = client
        .query_one(
            "SELECT held, holder_id FROM leader_status WHERE role = 'billing'",
            &[],
        )
        .await
        .unwrap();
    assert!(!row.get::<_, bool>(0), "nothing acquired");
}

/// Naming the schema owner (here a superuser) as the application role would
/// revoke the owner's own writes and break every definer function: refused.
#[tokio::test]
async fn the_owner_cannot_be_granted_as_the_application_role() {
    let db = ticklease_testkit::migrated_db(PgCluster::shared()).await;
    let owner = connect(&ticklease_testkit::direct(&db)).await.unwrap();
    let err = ticklease::migrate::grant(
        &owner,
        &MigrateOptions {
            app_role: "postgres".into(),
            ..MigrateOptions::default()
        },
    )
    .await
    .unwrap_err();
    assert!(
        ticklease::error::chain(&err).contains("cannot be the application role"),
        "{err:?}"
    );
    allowed(&owner, "SELECT * FROM leader_acquire('billing', 'x', 1000, 1000)").await;
}

/// REPEATABLE READ and SERIALIZABLE read a snapshot that may predate a pause:
/// the fence refuses them rather than pass a paused term.
#[tokio::test]
async fn the_fence_refuses_snapshot_isolation() {
    let (owner, app) = db_with_user(&MigrateOptions::default(), Some("ticklease_app")).await;
    allowed(
        &connect(&owner).await.unwrap(),
        "SELECT leader_seed(ARRAY['billing'])",
    )
    .await;
    let token: i64 = ticklease_testkit::scalar(
        &connect(&app).await.unwrap(),
        "SELECT holder_token FROM leader_acquire('billing', 'x', 60000, 1000)",
    )
    .await;
    let client = connect(&app).await.unwrap();
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        let err = client
            .batch_execute(&format!(
                "BEGIN ISOLATION LEVEL {level}; SELECT leader_fence('billing', {token}); COMMIT"
            ))
            .await
            .expect_err(level);
        assert_eq!(
            err.code(),
            Some(&SqlState::FEATURE_NOT_SUPPORTED),
            "{level}: {err:?}"
        );
        client.batch_execute("ROLLBACK").await.unwrap();
    }
    allowed(&client, &format!("SELECT leader_fence('billing', {token})")).await;
}

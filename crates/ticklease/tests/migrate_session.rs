//! A caller's own connection, passed to `migrate`, comes back as it was:
//! every setting a migration touches is transaction-local, the role and
//! the search path are the caller's, and no transaction is left open.

use ticklease::MigrateOptions;
use ticklease_testkit::{connect, PgCluster};

/// Everything about the session a caller could notice. Not the settings of
/// a loaded extension (`plpgsql.*`: the first function call loads it), and
/// the migrations' own transaction-local `ticklease.*` as empty or unset
/// alike: Postgres keeps a placeholder, empty, once a transaction set one.
async fn session(client: &tokio_postgres::Client) -> Vec<(String, String)> {
    let mut seen: Vec<(String, String)> = client
        .query(
            "SELECT name, setting FROM pg_settings WHERE name NOT LIKE '%.%' ORDER BY name",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let who = client
        .query_one(
            "SELECT current_user::text, session_user::text, current_schema()::text,
                    coalesce(nullif(current_setting('ticklease.app_role', true), ''), '<unset>'),
                    coalesce(nullif(current_setting('ticklease.operator_role', true), ''), '<unset>'),
                    (SELECT state FROM pg_stat_activity WHERE pid = pg_backend_pid())",
            &[],
        )
        .await
        .unwrap();
    for (i, name) in [
        "current_user",
        "session_user",
        "current_schema",
        "app_role",
        "operator_role",
        "state",
    ]
    .into_iter()
    .enumerate()
    {
        seen.push((name.to_string(), who.get(i)));
    }
    seen
}

#[tokio::test]
async fn a_callers_connection_is_as_it_was_after_migrate_and_grant() {
    let cluster = PgCluster::shared();
    let db = cluster.config(&cluster.create_database().await.unwrap());
    let mut client = connect(&db).await.unwrap();
    // Settings a migration sets for itself, set otherwise by the caller.
    client
        .batch_execute(
            "SET search_path = public, pg_catalog; SET lock_timeout = '7s'; SET statement_timeout = '9min';
             SET client_min_messages = notice; SET idle_in_transaction_session_timeout = '3min'",
        )
        .await
        .unwrap();
    let before = session(&client).await;
    let fresh = ticklease::migrate(&mut client).await.unwrap();
    assert!(!fresh.applied.is_empty(), "{fresh:?}");
    assert_eq!(session(&client).await, before, "after a first migration");
    ticklease::migrate(&mut client).await.unwrap();
    assert_eq!(
        session(&client).await,
        before,
        "after a migration with nothing to apply"
    );
    ticklease::migrate::grant(&client, &MigrateOptions::default())
        .await
        .unwrap();
    assert_eq!(session(&client).await, before, "after a grant");
    // What the fence benchmark's setup does next on the same connection.
    client
        .batch_execute("CREATE TABLE jobs (id bigint); INSERT INTO jobs VALUES (1)")
        .await
        .unwrap();
    let n: i64 = client
        .query_one("SELECT count(*) FROM jobs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

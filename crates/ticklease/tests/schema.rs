//! The migration runner and the schema's own rules, on real Postgres.

use std::convert::Infallible;
use std::time::Duration;

use ticklease::migrate::{MIGRATIONS, MIGRATIONS_TABLE};
use ticklease::{Lead, LeaseStore, Manager, MigrateError, PgStore, PgStoreOptions, Role, StoreError};
use ticklease_testkit::{connect, migrated_db, test_config, PgCluster};

#[tokio::test]
async fn four_concurrent_runners_apply_each_migration_once() {
    let cluster = PgCluster::shared();
    let db = cluster.config(&cluster.create_database().await.unwrap());
    let runs = (0..4).map(|_| {
        let db = db.clone();
        tokio::spawn(async move {
            let mut client = connect(&db).await.unwrap();
            ticklease::migrate(&mut client).await
        })
    });
    let reports: Vec<_> = futures::future::join_all(runs)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    let applied: usize = reports.iter().map(|r| r.applied.len()).sum();
    assert_eq!(
        applied,
        MIGRATIONS.len(),
        "each migration applied by exactly one runner: {reports:?}"
    );
    let client = connect(&db).await.unwrap();
    let n: i64 = client
        .query_one(&format!("SELECT count(*) FROM {MIGRATIONS_TABLE}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n as usize, MIGRATIONS.len());
}

#[tokio::test]
async fn a_modified_applied_migration_is_refused() {
    let db = migrated_db(PgCluster::shared()).await;
    let mut client = connect(&db).await.unwrap();
    client
        .batch_execute(&format!(
            "UPDATE {MIGRATIONS_TABLE} SET checksum = 'edited' WHERE version = 1"
        ))
        .await
        .unwrap();
    let err = ticklease::migrate(&mut client).await.unwrap_err();
    assert!(
        matches!(err, MigrateError::Modified { version: 1, .. }),
        "{err:?}"
    );
    let err = PgStore::connect(db, PgStoreOptions::from_config(&test_config()))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotMigrated { .. }), "{err:?}");
}

#[tokio::test]
async fn an_unmigrated_database_is_refused_before_anything_is_written() {
    let cluster = PgCluster::shared();
    let db = cluster.config(&cluster.create_database().await.unwrap());
    let err = PgStore::connect(db.clone(), PgStoreOptions::from_config(&test_config()))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotMigrated { .. }), "{err:?}");
    assert!(err.to_string().contains("ticklease migrate"), "{err}");
    let client = connect(&db).await.unwrap();
    let tables: i64 = client
        .query_one("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 0);
}

#[tokio::test]
async fn dropped_and_remigrated_schema_reseeds_tokens_above_every_earlier_one() {
    let db = migrated_db(PgCluster::shared()).await;
    let config = test_config();
    let role = Role::new("billing").unwrap();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let m = Manager::start(store, config, [role.clone()]).await.unwrap();
    let mut earlier = Vec::new();
    for _ in 0..5 {
        match m
            .lead(&role, Duration::from_millis(1), |t| async move {
                Ok::<_, Infallible>(t.token())
            })
            .await
        {
            Ok(Lead::Completed { value, .. }) => earlier.push(value),
            other => panic!("{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut client = connect(&db).await.unwrap();
    client
        .batch_execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        .await
        .unwrap();
    ticklease::migrate(&mut client).await.unwrap();
    let store = PgStore::connect(db, PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let m = Manager::start(store, config, [role.clone()]).await.unwrap();
    let next = match m
        .lead(&role, Duration::from_millis(1), |t| async move {
            Ok::<_, Infallible>(t.token())
        })
        .await
    {
        Ok(Lead::Completed { value, .. }) => value,
        other => panic!("{other:?}"),
    };
    assert!(
        earlier.iter().all(|t| next > *t),
        "{next} must exceed {earlier:?}"
    );
}

#[tokio::test]
async fn role_name_rule_matches_the_tables_check() {
    let db = migrated_db(PgCluster::shared()).await;
    let client = connect(&db).await.unwrap();
    let long = "a".repeat(64);
    let names = [
        "billing",
        "webhook_delivery",
        "billing:shard-3",
        "a1:0.x_y-z",
        "b",
        &long[..63],
        &long,
        "",
        "Billing",
        "1billing",
        "billing-run",
        "billing:",
        "billing:-x",
        "billing:Shard",
        "a:b:c",
        "bill ing",
        "_x",
        "é",
    ];
    for name in names {
        let rust = Role::new(name).is_ok();
        let sql = client
            .execute(
                "INSERT INTO leader_leases (role) VALUES ($1) ON CONFLICT DO NOTHING",
                &[&name],
            )
            .await
            .is_ok();
        assert_eq!(rust, sql, "Role::new and the CHECK disagree on {name:?}");
    }
    let err = Role::new("Billing").unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid role name \"Billing\": must start with a lowercase ASCII letter"
    );
}

#[tokio::test]
async fn startup_reports_undeclared_rows_and_seeds_declared_ones() {
    let (store, db) = ticklease_testkit::pg_store(&test_config()).await;
    let client = connect(&db).await.unwrap();
    client
        .batch_execute("INSERT INTO leader_leases (role) VALUES ('retired_job')")
        .await
        .unwrap();
    let m = Manager::start(store, test_config(), [Role::new("billing").unwrap()])
        .await
        .unwrap();
    let report = m.check_roles().await.unwrap();
    assert_eq!(report.undeclared, vec!["retired_job".to_string()]);
    assert!(report.missing.is_empty());
    let roles: Vec<String> = m
        .store()
        .status()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.role)
        .collect();
    assert_eq!(roles, ["billing", "retired_job"]);
}

#[tokio::test]
async fn held_and_paused_rows_obey_the_tables_checks() {
    let db = migrated_db(PgCluster::shared()).await;
    let client = connect(&db).await.unwrap();
    client
        .batch_execute("INSERT INTO leader_leases (role) VALUES ('billing')")
        .await
        .unwrap();
    for bad in [
        "UPDATE leader_leases SET holder_id = 'x'",
        "UPDATE leader_leases SET holder_id = 'x', acquired_at = now(), expires_at = now(), paused_at = now(), paused_by = 'ops'",
        "UPDATE leader_leases SET paused_at = now()",
    ] {
        let err = client.batch_execute(bad).await.unwrap_err();
        assert_eq!(err.code(), Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION), "{bad}");
    }
}

#[tokio::test]
async fn out_of_range_store_options_are_refused_by_name() {
    let db = migrated_db(PgCluster::shared()).await;
    for (pool_size, statement_timeout, problem) in [
        (0, Duration::from_secs(1), "pool_size"),
        (65, Duration::from_secs(1), "pool_size"),
        (4, Duration::ZERO, "statement_timeout"),
    ] {
        let err = PgStore::connect(
            db.clone(),
            PgStoreOptions {
                pool_size,
                statement_timeout,
            },
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, StoreError::Rejected { .. }) && err.to_string().contains(problem),
            "{err}"
        );
    }
}

/// The store's statement files and the schema agree: each file names the
/// functions it calls (`-- Calls: name(argument types)`), exactly those it
/// calls, each exists with that signature and the app (or, for pause,
/// unpause and run-now, the operator) role may execute it,
/// and the statement itself is accepted by the server (its arity and types).
#[tokio::test]
async fn every_store_statement_names_the_functions_it_calls_and_the_schema_has_them() {
    let db = migrated_db(PgCluster::shared()).await;
    let client = connect(&db).await.unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .collect();
    files.sort();
    assert!(files.len() >= 13, "{files:?}");
    for file in files {
        let sql = std::fs::read_to_string(&file).unwrap();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let (named, called) = functions_of(&sql);
        assert!(
            sql.lines().any(|l| l.starts_with("-- Calls: ")),
            "{name} names the functions it calls"
        );
        let named_names: Vec<&str> = named.iter().map(|s| s.split('(').next().unwrap()).collect();
        let called_names: Vec<&str> = called.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            named_names, called_names,
            "{name}: the functions named are the ones called"
        );
        for (signature, (_, arguments)) in named.iter().zip(&called) {
            let declared = signature.split('(').nth(1).unwrap().trim_end_matches(')');
            let declared = declared.split(',').filter(|a| !a.trim().is_empty()).count();
            assert_eq!(
                declared, *arguments,
                "{name}: {signature} is called with {arguments} arguments"
            );
        }
        for signature in &named {
            let row = client
                .query_one(
                    "SELECT to_regprocedure($1) IS NOT NULL,
                            to_regprocedure($1) IS NOT NULL
                            AND (has_function_privilege('ticklease_app', to_regprocedure($1), 'EXECUTE')
                                 OR has_function_privilege('ticklease_operator', to_regprocedure($1), 'EXECUTE'))",
                    &[signature],
                )
                .await
                .unwrap();
            assert!(row.get::<_, bool>(0), "{name}: the schema has no {signature}");
            assert!(
                row.get::<_, bool>(1),
                "{name}: neither the app nor the operator role may execute {signature}"
            );
        }
        client
            .prepare(&sql)
            .await
            .unwrap_or_else(|e| panic!("{name} is not accepted by the schema: {e:?}"));
    }
}

/// The signatures a statement file names, and the `leader_*` functions its
/// statement calls with their number of arguments, in order of first appearance.
fn functions_of(sql: &str) -> (Vec<String>, Vec<(String, usize)>) {
    let named = sql
        .lines()
        .filter_map(|l| l.strip_prefix("-- Calls: "))
        .filter(|l| l.starts_with("leader_"))
        .map(str::to_string)
        .collect();
    let body = sql
        .lines()
        .filter(|l| !l.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut called: Vec<(String, usize)> = Vec::new();
    let mut rest = body.as_str();
    while let Some(at) = rest.find("leader_") {
        let word: &str = rest[at..]
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .next()
            .unwrap();
        rest = &rest[at + word.len()..];
        let Some(arguments) = rest.trim_start().strip_prefix('(') else {
            continue;
        };
        if !called.iter().any(|(f, _)| f == word) {
            called.push((word.to_string(), arguments_of(arguments)));
        }
    }
    (named, called)
}

/// How many arguments a call has, from just after its opening parenthesis.
fn arguments_of(text: &str) -> usize {
    let (mut depth, mut commas, mut any) = (0, 0, false);
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => break,
            ')' => depth -= 1,
            ',' if depth == 0 => commas += 1,
            c if !c.is_whitespace() => any = true,
            _ => {}
        }
    }
    if any {
        commas + 1
    } else {
        0
    }
}

/// A fresh database on the shared cluster, its owner's config and client.
async fn fresh_database() -> (String, tokio_postgres::Config, tokio_postgres::Client) {
    let cluster = PgCluster::shared();
    let name = cluster.create_database().await.unwrap();
    let owner = cluster.config(&name);
    let client = connect(&owner).await.unwrap();
    (name, owner, client)
}

/// A login role of the cluster named for the test's database (roles are cluster-wide).
async fn login(owner: &tokio_postgres::Client, db: &str, what: &str, attributes: &str) -> String {
    let name = format!("{what}_{db}");
    owner
        .batch_execute(&format!("CREATE ROLE {name} LOGIN {attributes}"))
        .await
        .unwrap();
    name
}

fn as_login(config: &tokio_postgres::Config, user: &str) -> tokio_postgres::Config {
    let mut config = config.clone();
    config.user(user);
    config
}

#[tokio::test]
async fn migrate_refuses_a_schema_where_anyone_may_create_and_writes_nothing() {
    let (_, _, mut client) = fresh_database().await;
    client
        .batch_execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        .await
        .unwrap();
    let err = ticklease::migrate(&mut client).await.unwrap_err();
    assert!(
        matches!(&err, MigrateError::UnsafeSchema { detail, .. } if detail.starts_with("PUBLIC") && detail.contains("may create objects")),
        "{err}"
    );
    let written: bool = client
        .query_one("SELECT to_regclass('leader_leases') IS NOT NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!written);
}

/// A login that could create in the schema once planted an overload of a
/// built-in our privileges function calls: the owner's next migrate would
/// have run it with the owner's rights (it granted the planter the lease table).
#[tokio::test]
async fn migrate_refuses_a_function_another_login_planted_in_the_schema() {
    let (name, owner, mut client) = fresh_database().await;
    ticklease::migrate(&mut client).await.unwrap();
    let planter = login(&client, &name, "planter", "").await;
    client
        .batch_execute(&format!("GRANT CREATE ON SCHEMA public TO {planter}"))
        .await
        .unwrap();
    connect(&as_login(&owner, &planter))
        .await
        .unwrap()
        .batch_execute(&format!(
            "CREATE FUNCTION public.format(text, regprocedure, name) RETURNS text LANGUAGE plpgsql AS $$
             BEGIN
                 EXECUTE 'GRANT UPDATE ON public.leader_leases TO {planter}';
                 RETURN pg_catalog.format($1, $2, $3);
             END $$"
        ))
        .await
        .unwrap();
    client
        .batch_execute(&format!(
            "REVOKE CREATE ON SCHEMA public FROM {planter};
             UPDATE ticklease_schema_definitions SET checksum = 'edited' WHERE name = '80_privileges'"
        ))
        .await
        .unwrap();
    let err = ticklease::migrate(&mut client).await.unwrap_err();
    assert!(
        matches!(&err, MigrateError::UnsafeSchema { detail, .. }
                 if detail.contains("format(text,regprocedure,name)") && detail.contains(&planter)),
        "{err}"
    );
    let granted: bool = client
        .query_one(
            &format!("SELECT has_table_privilege('{planter}', 'leader_leases', 'UPDATE')"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!granted, "the planted function ran as the owner");
}

#[tokio::test]
async fn migrate_refuses_a_login_that_does_not_own_the_tables() {
    let (name, owner, mut client) = fresh_database().await;
    ticklease::migrate(&mut client).await.unwrap();
    let other = login(&client, &name, "other", "SUPERUSER").await;
    let mut other_client = connect(&as_login(&owner, &other)).await.unwrap();
    let err = ticklease::migrate(&mut other_client).await.unwrap_err();
    assert!(
        matches!(&err, MigrateError::NotOwner { user, .. } if *user == other),
        "{err}"
    );
}

/// Default privileges that give the app role every table it gains do not
/// let it write ours: the grant takes writes away from all of them.
#[tokio::test]
async fn the_app_role_writes_none_of_our_tables_even_with_default_privileges() {
    let (name, owner, mut client) = fresh_database().await;
    client
        .batch_execute(
            "DO $$ BEGIN CREATE ROLE ticklease_app NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             ALTER DEFAULT PRIVILEGES GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO ticklease_app",
        )
        .await
        .unwrap();
    ticklease::migrate(&mut client).await.unwrap();
    let app = login(&client, &name, "app", "IN ROLE ticklease_app").await;
    let app_client = connect(&as_login(&owner, &app)).await.unwrap();
    for table in [
        "ticklease_schema_definitions",
        "ticklease_schema_migrations",
        "leader_history_settings",
        "leader_fence_claims",
    ] {
        let err = app_client
            .batch_execute(&format!("DELETE FROM {table}"))
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
            "{table}: {err}"
        );
    }
}

/// Replacing the view waits for every lock on it, and any login can hold
/// one: the run fails after its lock wait, naming the holder, and writes
/// nothing; it succeeds once the holder is gone.
#[tokio::test]
async fn a_migration_kept_from_the_status_view_names_who_holds_it() {
    let (name, owner, mut client) = fresh_database().await;
    ticklease::migrate(&mut client).await.unwrap();
    client
        .batch_execute(&format!(
            "UPDATE {} SET checksum = 'edited' WHERE name = '65_status_view'",
            ticklease::migrate::DEFINITIONS_TABLE
        ))
        .await
        .unwrap();
    let nobody = login(&client, &name, "nobody", "").await;
    let holder = connect(&as_login(&owner, &nobody)).await.unwrap();
    holder
        .batch_execute("BEGIN; PREPARE peek AS SELECT * FROM leader_status")
        .await
        .unwrap();
    let err = ticklease::migrate(&mut client).await.unwrap_err();
    let text = format!("{err}");
    assert!(
        text.contains("65_status_view") && text.contains(&format!("user {nobody}")),
        "{text}"
    );
    holder.batch_execute("ROLLBACK").await.unwrap();
    let report = ticklease::migrate(&mut client).await.unwrap();
    assert_eq!(report.definitions, ["65_status_view"]);
}

/// The schema's name is quoted wherever the definitions use it.
#[tokio::test]
async fn a_schema_with_a_mixed_case_quoted_name_migrates_and_pins_its_functions() {
    let (_, mut owner, client) = fresh_database().await;
    client
        .batch_execute(r#"CREATE SCHEMA "Tick""Lease""#)
        .await
        .unwrap();
    owner.options(r#"-c search_path="Tick""Lease""#);
    let mut client = connect(&owner).await.unwrap();
    ticklease::migrate(&mut client).await.unwrap();
    let unpinned: i64 = client
        .query_one(
            r#"SELECT count(*) FROM pg_proc WHERE pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = 'Tick"Lease')
                 AND prosecdef AND NOT coalesce(array_to_string(proconfig, ',') LIKE '%pg_temp', false)"#,
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(unpinned, 0);
}

/// One call from a URL: connect, migrate, close; then nothing is pending.
#[tokio::test]
async fn migrate_at_takes_a_url_and_applies_everything_once() {
    let (name, owner, _) = fresh_database().await;
    let host = owner.get_hosts().first().cloned().unwrap();
    let port = owner.get_ports().first().copied().unwrap();
    let user = owner.get_user().unwrap();
    let host = match host {
        tokio_postgres::config::Host::Tcp(h) => h,
        tokio_postgres::config::Host::Unix(p) => p.to_string_lossy().into_owned(),
    };
    let url = format!("postgres://{user}@localhost/{name}?host={host}&port={port}&sslmode=disable");
    let target: ticklease::tls::PgConnect = url.parse().unwrap();
    let options = ticklease::MigrateOptions::default();
    let first = ticklease::migrate_at(&target, &options).await.unwrap();
    assert_eq!(first.applied.len(), MIGRATIONS.len());
    let again = ticklease::migrate_at(&target, &options).await.unwrap();
    assert!(
        again.applied.is_empty() && again.definitions.is_empty(),
        "{again:?}"
    );

    let closed: ticklease::tls::PgConnect = format!("postgres://{user}@127.0.0.1:1/{name}?sslmode=disable")
        .parse()
        .unwrap();
    let err = ticklease::migrate_at(&closed, &options).await.unwrap_err();
    assert!(
        matches!(&err, MigrateError::Db { step, .. } if step == "connect"),
        "{err:?}"
    );
}

/// A second run on a migrated database sends the client no notice
/// (`CREATE TABLE IF NOT EXISTS … skipping`), which drivers log at INFO.
#[tokio::test]
async fn a_second_migrate_sends_no_notice() {
    use futures::StreamExt;
    let (_, owner, _) = fresh_database().await;
    let (mut client, mut connection) = owner.connect(tokio_postgres::NoTls).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notice(notice) = message {
                let _ = tx.send(notice.message().to_string());
            }
        }
    });
    ticklease::migrate(&mut client).await.unwrap();
    ticklease::migrate(&mut client).await.unwrap();
    drop(client);
    let mut notices = Vec::new();
    while let Some(n) = rx.recv().await {
        notices.push(n);
    }
    assert!(notices.is_empty(), "{notices:?}");
}

/// A first host that accepts TCP and never answers costs its own connect
/// share, then the next host migrates.
#[tokio::test]
async fn migrate_at_passes_a_silent_first_host() {
    let (name, _, _) = fresh_database().await;
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            sockets.push(socket); // accepted, never answered
        }
    });
    let port = PgCluster::shared().port();
    let url = format!(
        "host=127.0.0.1,127.0.0.1 port={silent_port},{port} user=postgres dbname={name} sslmode=disable connect_timeout=1"
    );
    let started = std::time::Instant::now();
    let report = ticklease::migrate_at(&url.parse().unwrap(), &ticklease::MigrateOptions::default())
        .await
        .unwrap();
    assert_eq!(report.applied.len(), MIGRATIONS.len());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    held.abort();
}

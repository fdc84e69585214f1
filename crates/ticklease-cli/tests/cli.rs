//! The `ticklease` binary against the test kit's Postgres.

use std::process::{Command, Output};

use ticklease_testkit::PgCluster;

mod common;
use common::{exporter, http_get, migrated_url, ticklease};

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[tokio::test]
async fn migrate_applies_once_then_reports_already_applied() {
    let cluster = PgCluster::shared();
    let url = cluster.url(&cluster.create_database().await.unwrap());
    let first = ticklease(&["migrate", "--database-url", &url]);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    let versions: Vec<i32> = ticklease::migrate::MIGRATIONS.iter().map(|m| m.version).collect();
    assert!(
        text(&first).contains(&format!("migrations applied: {versions:?}")),
        "{}",
        text(&first)
    );
    let again = Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .arg("migrate")
        .env("DATABASE_URL", &url)
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(0));
    assert!(
        text(&again).contains(&format!("migrations applied: []; already applied: {versions:?}")),
        "{}",
        text(&again)
    );
}

#[test]
fn unreachable_database_is_an_operational_error() {
    let o = ticklease(&["migrate", "--database-url", "postgres://postgres@127.0.0.1:1/x"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("could not connect to the database"),
        "{}",
        text(&o)
    );
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(ticklease(&["migrate"]).status.code(), Some(2), "missing URL");
    assert_eq!(ticklease(&["frobnicate"]).status.code(), Some(2));
    let help = ticklease(&["migrate", "--help"]);
    assert!(text(&help).contains("Examples:"));
}

#[tokio::test]
async fn metrics_serves_cluster_facts_and_healthz() {
    let (url, client) = migrated_url().await;
    client
        .batch_execute(
            "INSERT INTO leader_leases (role, last_tick_ended_at) VALUES ('billing', now() - interval '90 seconds');
             INSERT INTO leader_leases (role) VALUES ('dunning');
             SELECT leader_pause('dunning', 'ops', 'drill');",
        )
        .await
        .unwrap();
    let (mut child, addr) = exporter(&url, &[]);
    let health = http_get(&addr, "/healthz");
    let metrics = http_get(&addr, "/metrics");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        health.starts_with("HTTP/1.0 200") && health.ends_with("ok\n"),
        "{health}"
    );
    assert!(metrics.contains("application/openmetrics-text"), "{metrics}");
    let age_line = metrics
        .lines()
        .find(|l| l.starts_with(r#"ticklease_leader_last_tick_age_seconds{role="billing"}"#))
        .unwrap();
    let age: f64 = age_line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((89.0..120.0).contains(&age), "{age_line}");
    assert!(
        metrics.contains(r#"ticklease_leader_last_tick_state{role="dunning",state="never_ran"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"ticklease_leader_paused{role="dunning"} 1"#),
        "{metrics}"
    );
    // A replica's own counters are not its to export: it leads no role.
    assert!(
        !metrics.contains("ticklease_leader_lease_lost_total{"),
        "{metrics}"
    );
}

/// `ticklease metrics` follows the rows (issue 33's reviews): a role created
/// after it started is exported from the next scrape, a forgotten one
/// drops out, and rows any app login creates beyond its 1,000 roles push no
/// exported role out (a stalled one would silence its alert): they are
/// counted as left out instead.
#[tokio::test]
async fn metrics_follows_the_roles_created_and_forgotten_after_it_started() {
    let (url, client) = migrated_url().await;
    client
        .batch_execute("SELECT leader_seed(ARRAY['stalled'])")
        .await
        .unwrap();
    let (mut child, addr) = exporter(&url, &[]);
    let fact = r#"ticklease_leader_last_tick_state{role="late",state="never_ran"} 1"#;
    assert!(!http_get(&addr, "/metrics").contains(fact));
    // Scrapes read the table at most once a second (SCRAPE_REFRESH_MIN).
    let scraped_until = |done: &dyn Fn(&str) -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let body = http_get(&addr, "/metrics");
            if done(&body) || std::time::Instant::now() > deadline {
                return body;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    client
        .batch_execute("SELECT leader_seed(ARRAY['late'])")
        .await
        .unwrap();
    let created = scraped_until(&|m| m.contains(fact));
    client
        .batch_execute("SELECT leader_seed(ARRAY(SELECT 'spam' || g FROM generate_series(1, 1000) AS g))")
        .await
        .unwrap();
    let spammed = scraped_until(&|m| m.contains("ticklease_leader_status_rows_left_out 2"));
    client
        .batch_execute("SELECT leader_forget('late')")
        .await
        .unwrap();
    let forgotten = scraped_until(&|m| !m.contains(r#"role="late""#));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(created.contains(fact), "{created}");
    let stalled = r#"ticklease_leader_last_tick_state{role="stalled",state="never_ran"} 1"#;
    assert!(
        spammed.contains("ticklease_leader_status_rows_left_out 2")
            && spammed.contains(stalled)
            && spammed.contains(fact),
        "1,002 rows: the two roles exported first stay, two spam rows are left out"
    );
    assert!(!forgotten.contains(r#"role="late""#), "{forgotten}");
    assert!(forgotten.contains(stalled));
}

/// `ticklease pause ROLE` alone pauses: who defaults to `$USER@host`, the reason to none.
#[tokio::test]
async fn pause_needs_only_the_role() {
    let (url, client) = migrated_url().await;
    client
        .batch_execute("SELECT leader_seed(ARRAY['dunning'])")
        .await
        .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(["pause", "dunning", "--database-url", &url])
        .env_remove("DATABASE_URL")
        .env("USER", "carol")
        .output()
        .unwrap();
    assert_eq!(
        (o.status.code(), text(&o).trim()),
        (Some(0), "dunning: paused"),
        "{}",
        text(&o)
    );
    let row = client
        .query_one(
            "SELECT paused_by, pause_reason FROM leader_leases WHERE role = 'dunning'",
            &[],
        )
        .await
        .unwrap();
    let (by, reason): (String, String) = (row.get(0), row.get(1));
    assert!(by.starts_with("carol@") && by.len() > "carol@".len(), "{by}");
    assert_eq!(reason, "");
    let table = text(&ticklease(&["status", "--database-url", &url]));
    let line = table.lines().find(|l| l.starts_with("dunning")).unwrap();
    assert!(line.contains(&by) && !line.contains(&format!("{by}:")), "{table}");
}

#[tokio::test]
async fn pause_unpause_and_run_now_steer_a_role() {
    let (url, client) = migrated_url().await;
    client
        .batch_execute(
            "INSERT INTO leader_leases (role, holder_id, acquired_at, expires_at, not_before)
             VALUES ('email_outbox', 'host:1:abcd', now(), now() + interval '1 minute', now() + interval '1 hour')",
        )
        .await
        .unwrap();
    let o = ticklease(&[
        "pause",
        "email_outbox",
        "--by",
        "alice",
        "--reason",
        "SMTP key rotation",
        "--database-url",
        &url,
    ]);
    assert_eq!(
        (o.status.code(), text(&o).trim()),
        (Some(0), "email_outbox: paused"),
        "{}",
        text(&o)
    );
    let row = client
        .query_one(
            "SELECT holder_id, paused_by, pause_reason FROM leader_leases",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<String>>(0), None, "pause ends the term");
    assert_eq!(
        (row.get::<_, String>(1), row.get::<_, String>(2)),
        ("alice".into(), "SMTP key rotation".into())
    );

    let table = text(&ticklease(&["status", "--database-url", &url]));
    let line = table.lines().find(|l| l.starts_with("email_outbox")).unwrap();
    assert!(
        line.contains("alice: SMTP key rotation") && line.contains("never") && line.contains("in 59m"),
        "{table}"
    );

    let o = ticklease(&["unpause", "email_outbox", "--database-url", &url]);
    assert_eq!(text(&o).trim(), "email_outbox: unpaused");
    let o = ticklease(&["run-now", "email_outbox", "--database-url", &url]);
    assert_eq!(
        text(&o).trim(),
        "email_outbox: a manual run starts at the next poll once no term is live (its cooldown stays for the ticks after)"
    );
    // A manual run is asked for, by the login that asked; the hour's cooldown
    // stays for the ticks after it, and the wait for the paused term's lease
    // (a minute) stays, unless its holder releases it.
    let row = client
        .query_one(
            "SELECT paused_at IS NULL, not_before > now() AND run_now_by = session_user, pause_wait_until > now()
               FROM leader_leases",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, bool>(0),
            row.get::<_, bool>(1),
            row.get::<_, bool>(2)
        ),
        (true, true, true)
    );
    // While a term is live, the manual run waits for it to end, and says so.
    client
        .batch_execute(
            "UPDATE leader_leases SET holder_id = 'h', holder_token = holder_token + 1,
                    acquired_at = now(), expires_at = now() + interval '1 minute'
              WHERE role = 'email_outbox'",
        )
        .await
        .unwrap();
    let o = ticklease(&["run-now", "email_outbox", "--database-url", &url]);
    assert!(
        text(&o).contains("a manual run starts once its current term ends"),
        "{}",
        text(&o)
    );
}

#[tokio::test]
async fn status_json_and_roles_report_what_is_present() {
    let (url, client) = migrated_url().await;
    client
        .batch_execute(
            "SELECT leader_seed(ARRAY['billing', 'retired']);
             UPDATE leader_leases SET last_tick_ended_at = now() - interval '5 minutes', last_tick_holder = 'h'
              WHERE role = 'billing'",
        )
        .await
        .unwrap();
    let o = ticklease(&["status", "--json", "--database-url", &url]);
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let billing = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == "billing")
        .unwrap();
    let age = billing["last_tick_age_seconds"].as_f64().unwrap();
    assert!((299.0..330.0).contains(&age), "{billing}");
    assert_eq!(billing["held"], false);
    assert!(billing["db_now"].as_str().unwrap().ends_with('Z'));

    let o = ticklease(&["roles", "--declared", "billing,dunning", "--database-url", &url]);
    assert_eq!(o.status.code(), Some(0));
    let out = text(&o);
    assert!(out.contains("retired  (undeclared)"), "{out}");
    assert!(out.contains("dunning  (declared, no row yet"), "{out}");
    assert!(out.lines().any(|l| l == "billing"), "{out}");

    // The row the status page points to when it leaves roles out.
    let o = ticklease(&["status", "--json", "--role", "retired", "--database-url", &url]);
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let roles: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["retired"]);
}

#[tokio::test]
async fn status_watch_redraws_until_interrupted() {
    use std::io::Read;
    let (url, _client) = migrated_url().await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(["status", "--watch", "--database-url", &url])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while seen.matches("ROLE").count() < 2 {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "watch exited: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    assert_eq!(
        child.wait().unwrap().code(),
        Some(0),
        "Ctrl-C ends --watch cleanly"
    );
}

#[tokio::test]
async fn every_error_names_the_role_or_value_at_fault() {
    let (url, client) = migrated_url().await;
    let o = ticklease(&[
        "pause",
        "nope",
        "--by",
        "a",
        "--reason",
        "b",
        "--database-url",
        &url,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("unknown role \"nope\""), "{}", text(&o));
    let o = ticklease(&["unpause", "Bad-Name", "--database-url", &url]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("invalid role name \"Bad-Name\""),
        "{}",
        text(&o)
    );
    let o = ticklease(&[
        "pause",
        "billing",
        "--by",
        " ",
        "--reason",
        "x",
        "--database-url",
        &url,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("who paused the role must be named"),
        "{}",
        text(&o)
    );

    client
        .batch_execute("CREATE ROLE cli_nobody_role LOGIN")
        .await
        .ok();
    let nobody = url.replace("postgres://postgres@", "postgres://cli_nobody_role@");
    let o = ticklease(&["status", "--database-url", &nobody]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("permission denied"), "{}", text(&o));

    let cluster = PgCluster::shared();
    let empty = cluster.url(&cluster.create_database().await.unwrap());
    let o = ticklease(&["status", "--database-url", &empty]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("not migrated") && text(&o).contains("ticklease migrate"),
        "{}",
        text(&o)
    );

    let o = ticklease(&["status", "--database-url", "postgres://postgres@127.0.0.1:1/x"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("could not connect to the database at 127.0.0.1:1/x"),
        "{}",
        text(&o)
    );
}

#[test]
fn every_subcommand_has_help_with_examples() {
    for sub in [
        "migrate", "grant", "status", "pause", "unpause", "run-now", "roles", "metrics", "run",
    ] {
        let o = ticklease(&[sub, "--help"]);
        assert_eq!(o.status.code(), Some(0), "{sub}");
        assert!(
            text(&o).contains("Examples:\n  ticklease"),
            "{sub} --help has no examples"
        );
    }
}

#[test]
fn worker_help_documents_every_flag() {
    let o = ticklease(&["worker", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    let help = text(&o);
    for flag in [
        "--database-url",
        "--roles",
        "--metrics-addr",
        "--payments-url",
        "--smtp-url",
        "--webhook-secret",
        "--lease-ttl",
        "--heartbeat-every",
        "--statement-timeout",
        "--abandon-after",
        "--max-poll",
        "--tick-interval",
        "--batch-size",
        "--decline-backoff",
        "--mail-from",
    ] {
        assert!(help.contains(flag), "worker --help lacks {flag}");
    }
    let seed = text(&ticklease(&["worker", "seed", "--help"]));
    for flag in ["--subscriptions", "--emails", "--events", "--endpoint"] {
        assert!(seed.contains(flag), "worker seed --help lacks {flag}");
    }
}

#[test]
fn worker_refuses_bad_timings_and_roles_as_usage_errors() {
    let url = "postgres://postgres@127.0.0.1:1/x";
    let o = ticklease(&[
        "worker",
        "--database-url",
        url,
        "--webhook-secret",
        "s",
        "--lease-ttl",
        "5s",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("abandon_after (6s) + statement_timeout (2s) must be less than lease_ttl (5s)"),
        "{}",
        text(&o)
    );
    let o = ticklease(&[
        "worker",
        "--database-url",
        url,
        "--webhook-secret",
        "s",
        "--roles",
        "billing,payroll",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("\"payroll\" is not one of"), "{}", text(&o));
    let o = ticklease(&["worker", "--database-url", url]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("--webhook-secret"), "{}", text(&o));
}

async fn scalar_at(url: &str, sql: &str) -> i64 {
    let config: tokio_postgres::Config = url.parse().unwrap();
    let client = ticklease_testkit::connect(&config).await.unwrap();
    ticklease_testkit::scalar(&client, sql).await
}

#[tokio::test]
async fn migrate_naming_new_roles_on_a_migrated_database_grants_them() {
    let cluster = PgCluster::shared();
    let url = cluster.url(&cluster.create_database().await.unwrap());
    assert_eq!(
        ticklease(&["migrate", "--database-url", &url]).status.code(),
        Some(0)
    );
    let (app, operator) = (
        format!("svc_{}", std::process::id()),
        format!("oncall_{}", std::process::id()),
    );
    let o = ticklease(&[
        "migrate",
        "--database-url",
        &url,
        "--app-role",
        &app,
        "--operator-role",
        &operator,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let granted = format!(
        "SELECT count(*) FROM (VALUES
           (has_function_privilege('{app}', 'leader_renew(text, bigint, bigint)', 'EXECUTE')),
           (has_function_privilege('{operator}', 'leader_pause(text, text, text)', 'EXECUTE'))) g(ok)
         WHERE ok"
    );
    assert_eq!(scalar_at(&url, &granted).await, 2, "both roles granted");
}

/// The drain ends a frozen claimer's backend with the schema owner's
/// rights: a migrate by an owner that may end none says so, with the GRANT
/// that fixes it, and says nothing once the owner may.
#[tokio::test]
async fn migrate_by_an_owner_who_may_end_no_claimer_warns_with_the_grant_that_fixes_it() {
    let cluster = PgCluster::shared();
    let name = cluster.create_database().await.unwrap();
    let admin: tokio_postgres::Config = cluster.url(&name).parse().unwrap();
    let admin = ticklease_testkit::connect(&admin).await.unwrap();
    // Roles are the cluster's: a name of this database's own.
    let owner = format!("{name}_owner");
    admin
        .batch_execute(&format!(
            "CREATE ROLE {owner} LOGIN CREATEROLE;
             ALTER DATABASE \"{name}\" OWNER TO {owner};
             ALTER SCHEMA public OWNER TO {owner}"
        ))
        .await
        .unwrap();
    let url = format!("postgres://{owner}@127.0.0.1:{}/{name}", cluster.port());
    let warned = ticklease(&["migrate", "--database-url", &url]);
    assert_eq!(warned.status.code(), Some(0), "{}", text(&warned));
    let grant = format!("GRANT pg_signal_backend TO \"{owner}\";");
    assert!(
        String::from_utf8_lossy(&warned.stderr).contains(&grant),
        "{}",
        text(&warned)
    );
    // A member that does not inherit the role's rights has none of them
    // (pg_terminate_backend asks for the rights; review 9, L1).
    admin
        .batch_execute(&format!(
            "GRANT pg_signal_backend TO {owner}; ALTER ROLE {owner} NOINHERIT"
        ))
        .await
        .unwrap();
    let noinherit = ticklease(&["migrate", "--database-url", &url]);
    let inherit = format!("ALTER ROLE \"{owner}\" INHERIT;");
    assert!(
        String::from_utf8_lossy(&noinherit.stderr).contains(&inherit),
        "{}",
        text(&noinherit)
    );
    admin
        .batch_execute(&format!("ALTER ROLE {owner} INHERIT"))
        .await
        .unwrap();
    let quiet = ticklease(&["migrate", "--database-url", &url]);
    assert_eq!(quiet.status.code(), Some(0), "{}", text(&quiet));
    assert!(!text(&quiet).contains("warning"), "{}", text(&quiet));
    let superuser = ticklease(&["migrate", "--database-url", &cluster.url(&name)]);
    assert!(!text(&superuser).contains("warning"), "{}", text(&superuser));
}

#[tokio::test]
async fn an_invalid_database_role_name_is_a_usage_error_and_writes_nothing() {
    let cluster = PgCluster::shared();
    let url = cluster.url(&cluster.create_database().await.unwrap());
    for args in [
        ["migrate", "--app-role", "app; DROP TABLE x"],
        ["grant", "--operator-role", "Ops"],
    ] {
        let o = ticklease(&[&args[..], &["--database-url", &url]].concat());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains("invalid database role name"), "{}", text(&o));
    }
    let tables = "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'";
    assert_eq!(scalar_at(&url, tables).await, 0, "nothing written");
}

#[tokio::test]
async fn worker_refuses_an_out_of_range_tick_interval_or_batch_before_touching_the_database() {
    let cluster = PgCluster::shared();
    let url = cluster.url(&cluster.create_database().await.unwrap());
    assert_eq!(
        ticklease(&["migrate", "--database-url", &url]).status.code(),
        Some(0)
    );
    for bad in [
        ["--tick-interval", "billing=0s"],
        ["--tick-interval", "billing=48h"],
        ["--tick-interval", "billing=5 0 32 * *"],
        ["--tick-interval", "billing=CRON_TZ=Mars/Olympus 5 0 * * *"],
        ["--tick-interval", "billing=* * * * * *"],
        ["--batch-size", "0"],
        ["--batch-size", "1001"],
    ] {
        let o = ticklease(
            &[
                &["worker", "--database-url", &url, "--webhook-secret", "s"][..],
                &bad[..],
            ]
            .concat(),
        );
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", text(&o));
        assert!(!text(&o).contains("running"), "{}", text(&o));
        let named = match bad[1] {
            "billing=5 0 32 * *" => "day of month",
            "billing=CRON_TZ=Mars/Olympus 5 0 * * *" => "unknown time zone",
            "billing=* * * * * *" => "faster than the lease's heartbeat",
            _ => "",
        };
        assert!(text(&o).contains(named), "{bad:?}: {}", text(&o));
    }
    assert_eq!(
        scalar_at(&url, "SELECT count(*) FROM leader_leases").await,
        0,
        "no role seeded"
    );
}

#[tokio::test]
async fn worker_without_its_schema_names_the_command_that_applies_it() {
    let cluster = PgCluster::shared();
    let url = cluster.url(&cluster.create_database().await.unwrap());
    assert_eq!(
        ticklease(&["migrate", "--database-url", &url]).status.code(),
        Some(0)
    );
    let o = ticklease(&["worker", "--database-url", &url, "--webhook-secret", "s"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("(run `ticklease worker migrate`)"),
        "{}",
        text(&o)
    );
}

#[tokio::test]
async fn status_shows_control_characters_from_the_database_escaped() {
    let cluster = PgCluster::shared();
    let url = cluster.url(&cluster.create_database().await.unwrap());
    assert_eq!(
        ticklease(&["migrate", "--database-url", &url]).status.code(),
        Some(0)
    );
    let config: tokio_postgres::Config = url.parse().unwrap();
    ticklease_testkit::connect(&config)
        .await
        .unwrap()
        .batch_execute(
            "SELECT leader_seed(ARRAY['billing']);
             SELECT leader_pause('billing', E'eve\\u202e', E'\\x1b]0;pwned\\x07\\x1b[2J')",
        )
        .await
        .unwrap();
    let o = ticklease(&["status", "--database-url", &url]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(!out.contains(['\u{1b}', '\u{7}', '\u{202e}']), "{out:?}");
    assert!(
        out.contains(r"eve\u{202e}: \u{1b}]0;pwned\u{7}\u{1b}[2J"),
        "{out}"
    );
}

/// `--json` is escaped by the same rule (issue 41: `history --json` kept raw
/// bidi and zero-width characters): the bytes hold none of them, and a JSON
/// reader gets the stored text exactly.
#[tokio::test]
async fn json_output_holds_no_hidden_character_and_reads_back_the_stored_text() {
    let (url, owner) = migrated_url().await;
    let reason = "eve\u{202e}gnp.exe\u{200b}\u{2066}\u{feff}\u{1b}[2J";
    owner
        .batch_execute("SELECT leader_seed(ARRAY['billing'])")
        .await
        .unwrap();
    owner
        .execute("SELECT leader_pause('billing', 'ops', $1)", &[&reason])
        .await
        .unwrap();
    for args in [&["history", "--json"][..], &["status", "--json"][..]] {
        let o = ticklease(&[args, &["--database-url", &url]].concat());
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let out = String::from_utf8(o.stdout).unwrap();
        assert!(
            !out.contains(['\u{1b}', '\u{202e}', '\u{200b}', '\u{2066}', '\u{feff}']),
            "{args:?}: {out:?}"
        );
        let read: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        let field = if args[0] == "history" {
            "reason"
        } else {
            "pause_reason"
        };
        assert_eq!(read[0][field], reason, "{args:?}: {out}");
    }
}

#[test]
fn a_connection_error_names_each_cause_once() {
    let o = ticklease(&["status", "--database-url", "postgres://postgres@127.0.0.1:1/x"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o);
    assert_eq!(err.matches("error connecting to server").count(), 1, "{err}");
    assert_eq!(err.matches("Connection refused").count(), 1, "{err}");
}

#[tokio::test]
async fn status_cuts_a_100000_character_holder_and_pause_reason_with_an_ellipsis_instead_of_panicking() {
    let (url, owner) = migrated_url().await;
    // Written as the schema owner past the bounds the schema keeps on texts
    // (an older schema, or a reader of another database): the CLI must not
    // rely on them.
    owner
        .batch_execute(
            "DO $$ DECLARE c record; BEGIN
               FOR c IN SELECT conrelid::regclass AS t, conname FROM pg_constraint
                         WHERE conrelid IN ('leader_leases'::regclass, 'leader_history'::regclass)
                           AND contype = 'c' AND pg_get_constraintdef(oid) ~ 'length'
               LOOP EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', c.t, c.conname); END LOOP;
             END $$;
             SELECT leader_seed(ARRAY['billing', 'dunning']);
             UPDATE leader_leases SET holder_id = repeat('h', 100000), acquired_at = now(),
                    expires_at = now() + interval '1 hour' WHERE role = 'billing';
             UPDATE leader_leases SET paused_at = now(), paused_by = repeat('b', 100000),
                    pause_reason = repeat(E'r\\u202e', 50000) WHERE role = 'dunning';
             INSERT INTO leader_history (role, kind, token, holder_id, acquired_at, outcome)
             VALUES ('billing', 'term', 1, repeat('h', 100000), now(), 'completed');",
        )
        .await
        .unwrap();
    for args in [vec!["status"], vec!["history", "--since", "1h"]] {
        let o = ticklease(&[&args[..], &["--database-url", &url]].concat());
        assert_eq!(o.status.code(), Some(0), "{args:?}: {:.2000}", text(&o));
    }
    let o = ticklease(&["status", "--database-url", &url]);
    let out = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out:.2000}");
    for line in &lines {
        assert!(
            line.chars().count() < 2_000,
            "a line of {} characters",
            line.chars().count()
        );
    }
    assert!(
        lines[1].contains("hhhh…"),
        "the holder is cut, and says so: {out:.2000}"
    );
    assert!(
        lines[2].contains("bbbb…"),
        "the pause is cut, and says so: {out:.2000}"
    );
    assert!(!out.contains('\u{202e}'), "{out:.2000}");
    // JSON keeps the values whole.
    let o = ticklease(&["status", "--json", "--database-url", &url]);
    assert_eq!(o.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json[0]["holder_id"].as_str().unwrap().len(), 100_000);
}

/// Runs `ticklease args…` and waits for it at most `bound`: `None` when it
/// was still running then (it is killed).
async fn ticklease_within(
    args: &[&str],
    bound: std::time::Duration,
) -> Option<(Output, std::time::Duration)> {
    let started = std::time::Instant::now();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(args)
        .env_remove("DATABASE_URL")
        .kill_on_drop(true)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let output = tokio::time::timeout(bound, child.wait_with_output())
        .await
        .ok()?
        .unwrap();
    Some((output, started.elapsed()))
}

/// `ticklease args… --database-url url` on a task, waited for at most [`GENEROUS`].
fn spawn_within(
    args: Vec<&'static str>,
    url: &str,
) -> tokio::task::JoinHandle<(String, Option<(Output, std::time::Duration)>)> {
    let url = url.to_string();
    tokio::spawn(async move {
        let all = [&args[..], &["--database-url", &url]].concat();
        (args.join(" "), ticklease_within(&all, GENEROUS).await)
    })
}

/// The one-shot commands' stated bounds: a connection within 10 s (or the
/// URL's `connect_timeout`), the migration lock within 10 s.
const GENEROUS: std::time::Duration = std::time::Duration::from_secs(40);

#[tokio::test]
async fn migrate_grant_and_the_worker_s_migrate_and_seed_give_up_on_a_server_that_accepts_and_never_answers()
{
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    let upstream = format!("127.0.0.1:{}", cluster.port()).parse().unwrap();
    let proxy = ticklease_testkit::proxy::FaultProxy::start(upstream)
        .await
        .unwrap();
    proxy.set(ticklease_testkit::proxy::Fault::Blackhole);
    let url = format!("postgres://postgres@127.0.0.1:{}/{db}", proxy.port());
    let runs = [
        vec!["migrate"],
        vec!["grant"],
        vec!["worker", "migrate"],
        vec!["worker", "seed", "--subscriptions", "1"],
    ]
    .map(|args| spawn_within(args, &url));
    for run in runs {
        let (command, run) = run.await.unwrap();
        let Some((o, took)) = run else {
            panic!("`ticklease {command}` still waited after {GENEROUS:?}");
        };
        assert_eq!(o.status.code(), Some(1), "{command}: {}", text(&o));
        assert!(
            text(&o).contains("could not connect to the database")
                && text(&o).contains("no answer within 10s"),
            "{command} says what it waited for: {}",
            text(&o)
        );
        println!("ticklease {command}: gave up after {took:?}");
    }
}

#[tokio::test]
async fn migrate_gives_up_within_its_bound_when_another_login_holds_the_migration_lock() {
    let (url, holder) = migrated_url().await;
    let library = ticklease::migrate::LIBRARY.lock_key;
    let worker = ticklease_worker::SCHEMA.lock_key;
    // Any login may take an advisory lock; this one keeps both keys.
    holder
        .batch_execute(&format!(
            "SELECT pg_advisory_lock({library}); SELECT pg_advisory_lock({worker})"
        ))
        .await
        .unwrap();
    let pid: i64 = ticklease_testkit::scalar(&holder, "SELECT pg_backend_pid()::int8").await;
    let runs = [vec!["migrate"], vec!["worker", "migrate"]].map(|args| spawn_within(args, &url));
    for run in runs {
        let (command, run) = run.await.unwrap();
        let Some((o, took)) = run else {
            panic!("`ticklease {command}` still waited after {GENEROUS:?}");
        };
        assert_eq!(o.status.code(), Some(1), "{command}: {}", text(&o));
        assert!(
            text(&o).contains("the migration lock") && text(&o).contains(&format!("pid {pid}")),
            "{command} names the lock and who holds it: {}",
            text(&o)
        );
        println!("ticklease {command}: gave up after {took:?}: {}", text(&o));
    }
    holder
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .await
        .unwrap();
    let o = ticklease(&["migrate", "--database-url", &url]);
    assert_eq!(o.status.code(), Some(0), "free again: {}", text(&o));
}

/// The rules and their promtool tests for two prefixes pass promtool, and
/// name only the prefixed series.
#[test]
fn alert_rules_for_any_prefix_pass_promtool() {
    for prefix in ["ticklease", "shop_v2"] {
        let dir = tempfile::tempdir().unwrap();
        for (file, extra) in [
            ("ticklease-alerts.yml", None),
            ("ticklease-alerts.test.yml", Some("--tests")),
        ] {
            let mut args = vec!["alerts", "--prefix", prefix];
            args.extend(extra);
            let o = ticklease(&args);
            assert_eq!(o.status.code(), Some(0), "{}", text(&o));
            let body = String::from_utf8(o.stdout).unwrap();
            assert!(body.contains(&format!("{prefix}_leader_")), "{body}");
            if prefix != "ticklease" {
                assert!(!body.contains("ticklease_leader_"), "{body}");
            }
            std::fs::write(dir.path().join(file), body).unwrap();
        }
        for check in [
            vec!["check", "rules", "ticklease-alerts.yml"],
            vec!["test", "rules", "ticklease-alerts.test.yml"],
        ] {
            let o = Command::new("promtool")
                .args(&check)
                .current_dir(dir.path())
                .output()
                .expect("promtool runs (scripts/test installs it)");
            assert!(o.status.success(), "{prefix}: promtool {check:?}: {}", text(&o));
        }
    }
    let o = ticklease(&["alerts", "--prefix", "my-app"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("invalid metric prefix \"my-app\""),
        "{}",
        text(&o)
    );
}

//! The `ticklease` binary against the test kit's Postgres.

use std::process::{Command, Output};

use ticklease_testkit::PgCluster;

fn ticklease(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(args)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap()
}

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
    assert!(
        text(&first).contains("migrations applied: [1]"),
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
        text(&again).contains("migrations applied: []; already applied: [1]"),
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

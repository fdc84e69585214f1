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

fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[tokio::test]
async fn metrics_serves_cluster_facts_and_healthz() {
    use std::io::{BufRead, BufReader};
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    let url = cluster.url(&db);
    assert_eq!(
        ticklease(&["migrate", "--database-url", &url]).status.code(),
        Some(0)
    );
    let client = ticklease_testkit::connect(&cluster.config(&db)).await.unwrap();
    client
        .batch_execute(
            "INSERT INTO leader_leases (role, last_tick_ended_at) VALUES ('billing', now() - interval '90 seconds');
             INSERT INTO leader_leases (role) VALUES ('dunning');
             SELECT leader_pause('dunning', 'ops', 'drill');",
        )
        .await
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(["metrics", "--database-url", &url, "--metrics-addr", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line.trim().rsplit("http://").next().unwrap().to_string();
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
    assert!(
        metrics.contains(r#"ticklease_leader_lease_lost_total{role="billing",reason="panicked"} 0"#),
        "{metrics}"
    );
}

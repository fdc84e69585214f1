//! Runs every command of docs/runbook.md against the test kit's Postgres, and
//! checks that every alert's runbook link names a section of it.

use std::process::Command;

use ticklease_testkit::{connect, PgCluster};

const RUNBOOK: &str = include_str!("../../../docs/runbook.md");
const ALERTS: &str = include_str!("../../ticklease/src/ops/alerts/ticklease-alerts.yml");

/// `(info string, body)` of every fenced block.
fn blocks(markdown: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in markdown.lines() {
        match (&mut current, line.strip_prefix("```")) {
            (None, Some(info)) => current = Some((info.trim().to_string(), String::new())),
            (Some(_), Some(_)) => out.push(current.take().expect("open block")),
            (Some((_, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// Splits a command line on spaces, keeping 'single-quoted' words whole.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '\'' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

#[tokio::test]
async fn every_runbook_command_runs() {
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    let owner_config = cluster.config(&db);
    let mut owner = connect(&owner_config).await.unwrap();
    ticklease::migrate(&mut owner).await.unwrap();
    owner
        .batch_execute(
            "SELECT leader_seed(ARRAY['billing', 'email_outbox', 'tenant_sync:acme']);
             CREATE ROLE runbook_operator LOGIN IN ROLE ticklease_operator;",
        )
        .await
        .unwrap();
    let mut operator_config = owner_config.clone();
    operator_config.user("runbook_operator");
    let operator = connect(&operator_config).await.unwrap();
    let url = cluster.url(&db);

    let mut ran = 0;
    for (info, body) in blocks(RUNBOOK) {
        match info.as_str() {
            "sql" => operator
                .batch_execute(&body)
                .await
                .unwrap_or_else(|e| panic!("as operator: {body}: {e:?}")),
            "sql owner" => owner
                .batch_execute(&body)
                .await
                .unwrap_or_else(|e| panic!("as owner: {body}: {e:?}")),
            "sh" => {
                for line in body.lines().filter(|l| !l.trim().is_empty()) {
                    let args = words(line);
                    assert_eq!(
                        args[0], "ticklease",
                        "runbook shell lines run the ticklease binary: {line}"
                    );
                    let o = Command::new(env!("CARGO_BIN_EXE_ticklease"))
                        .args(&args[1..])
                        .env("DATABASE_URL", &url)
                        .output()
                        .unwrap();
                    assert!(
                        o.status.success(),
                        "{line}: {}",
                        String::from_utf8_lossy(&o.stderr)
                    );
                }
            }
            // A file shown whole (the systemd unit, the Deployment): the copy is the file, so
            // what CI checks (systemd-analyze verify) is what the runbook shows.
            shown if shown.starts_with("ini deploy/") || shown.starts_with("yaml deploy/") => {
                let path = shown.split_once(' ').map(|(_, path)| path).unwrap_or_default();
                let file = std::fs::read_to_string(format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR")))
                    .unwrap_or_else(|e| panic!("the runbook shows {path}: {e}"));
                assert_eq!(body, file, "the runbook's copy of {path} differs from the file");
            }
            // PgBouncer settings: crates/ticklease/tests/pooler_restart.rs runs PgBouncer with them.
            "ini pgbouncer" => {}
            other => panic!("runbook block with an unknown info string {other:?}"),
        }
        ran += 1;
    }
    assert!(ran >= 8, "only {ran} blocks ran");
    let row = owner
        .query_one(
            "SELECT paused_at IS NULL, not_before IS NULL FROM leader_leases WHERE role = 'email_outbox'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, bool>(0), row.get::<_, bool>(1)),
        (true, true),
        "the runbook leaves the role unpaused"
    );
}

#[test]
fn every_alert_links_a_runbook_section() {
    let sections: Vec<String> = RUNBOOK
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(|h| h.trim().to_lowercase())
        .collect();
    let links: Vec<&str> = ALERTS
        .lines()
        .filter_map(|l| l.split("runbook.md#").nth(1))
        .collect();
    assert_eq!(
        links.len(),
        ALERTS.matches("- alert:").count(),
        "one runbook link per alert"
    );
    for link in links {
        assert!(
            sections.iter().any(|s| s == link.trim()),
            "alert links #{link}, which the runbook lacks"
        );
    }
}

/// The runbook's connection figures are the library's constants: every
/// "up to N" / "at most N" next to "waiter" is `KEY_WAITERS_MAX`.
#[test]
fn the_runbooks_waiter_figures_are_the_librarys_constant() {
    let mut figures = Vec::new();
    for (at, _) in RUNBOOK.match_indices("waiter") {
        let near = &RUNBOOK[at.saturating_sub(30)..(at + 40).min(RUNBOOK.len())];
        for phrase in ["up to ", "at most "] {
            for (i, _) in near.match_indices(phrase) {
                let digits: String = near[i + phrase.len()..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                if let Ok(n) = digits.parse::<usize>() {
                    figures.push(n);
                }
            }
        }
    }
    assert!(!figures.is_empty(), "the runbook states the waiter bound");
    assert!(
        figures.iter().all(|n| *n == ticklease::KEY_WAITERS_MAX),
        "waiter figures {figures:?}, KEY_WAITERS_MAX = {}",
        ticklease::KEY_WAITERS_MAX
    );
}

//! Alerts no login can blind (issue 41, the review's F4–F6): the rows any app
//! login creates (`leader_seed`, ACQUIRE of any name) neither time out the
//! exporter's read, `ticklease status` nor the page, nor push an operator's
//! stalled role out of `ticklease metrics --roles`; a read that cannot
//! finish pages through a series that exists from the start.

use std::time::{Duration, Instant};

mod common;
use common::{exporter, http_get, migrated_url, ticklease};

/// The response to `GET path` and how long it took.
fn timed_get(addr: &str, path: &str) -> (String, Duration) {
    let started = Instant::now();
    let response = http_get(addr, path);
    (response, started.elapsed())
}

/// The operator's role: ticked 10 minutes ago on a 1-minute interval, so stalled.
const STALLED: &str = "INSERT INTO leader_leases (role, last_tick_ended_at, tick_interval_ms)
                       VALUES ('billing', now() - interval '10 minutes', 60000)";

/// Rows named to sort before the operator's, as an app login makes them
/// (10,000 a `leader_seed` call), up to `upto` in all.
async fn seed_spam(client: &tokio_postgres::Client, from: usize, upto: usize) {
    for start in (from..upto).step_by(10_000) {
        client
            .batch_execute(&format!(
                "SELECT leader_seed(array(SELECT 'a_spam_' || g FROM generate_series({start}, {}) AS g))",
                (start + 10_000).min(upto) - 1
            ))
            .await
            .unwrap();
    }
}

fn has(body: &str, line: &str) -> bool {
    body.lines().any(|l| l == line)
}

fn series(body: &str, prefix: &str) -> bool {
    body.lines().any(|l| l.starts_with(prefix))
}

/// 400,000 then 700,000 rows from one app login (the review's figures): a
/// freshly started exporter following the rows exports its bounded part and
/// says how many it left out; one naming its roles exports the operator's
/// stalled role; `ticklease status` answers, saying what it left out; the
/// page answers 200. Each within the statement timeout (2 s).
#[tokio::test]
async fn rows_an_app_login_seeds_time_out_no_read_and_hide_no_named_role() {
    let (url, client) = migrated_url().await;
    client.batch_execute(STALLED).await.unwrap();
    let mut seeded = 0;
    for upto in [400_000, 700_000] {
        seed_spam(&client, seeded, upto).await;
        seeded = upto;
        client.batch_execute("ANALYZE leader_leases").await.unwrap();

        let (mut following, addr) = exporter(&url, &[]);
        let (body, took) = timed_get(&addr, "/metrics");
        let (page, page_took) = timed_get(&addr, "/");
        following.kill().unwrap();
        following.wait().unwrap();
        assert!(
            has(&body, "ticklease_leader_status_unreadable 0"),
            "{upto}: {body:.2000}"
        );
        // 1,000 exported of the 100,000 counted.
        assert!(
            has(&body, "ticklease_leader_status_rows_left_out 99000"),
            "{upto}: {body:.2000}"
        );
        assert!(
            took < Duration::from_secs(2),
            "{upto} rows: a scrape took {took:?}"
        );
        assert!(page.starts_with("HTTP/1.0 200"), "{upto}: {page:.300}");
        assert!(
            page_took < Duration::from_secs(2),
            "{upto} rows: the page took {page_took:?}"
        );

        let (mut named, addr) = exporter(&url, &["--roles", "billing"]);
        let (body, took) = timed_get(&addr, "/metrics");
        named.kill().unwrap();
        named.wait().unwrap();
        assert!(
            series(
                &body,
                r#"ticklease_leader_last_tick_age_seconds{role="billing"} "#
            ) && has(&body, "ticklease_leader_status_rows_left_out 0"),
            "{upto}: {body:.3000}"
        );
        assert!(
            took < Duration::from_secs(2),
            "{upto} rows: a scrape took {took:?}"
        );

        let started = Instant::now();
        let status = ticklease(&["status", "--database-url", &url]);
        let said = String::from_utf8_lossy(&status.stderr);
        assert_eq!(status.status.code(), Some(0), "{upto}: {said}");
        assert!(said.contains("99000 or more roles not shown"), "{upto}: {said}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{upto}: status took {:?}",
            started.elapsed()
        );
        let one = ticklease(&["status", "--role", "billing", "--database-url", &url]);
        assert!(String::from_utf8_lossy(&one.stdout).contains("billing"));
        replicas_and_listings_start(&url, upto);
    }
}

/// A replica's start (its declared roles compared with the table's rows),
/// `ticklease roles` and `ticklease history` read a bounded part too: none
/// of them times out on the rows an app login created.
fn replicas_and_listings_start(url: &str, upto: usize) {
    for args in [
        &["run", "--database-url", url, "billing", "--once", "--", "true"][..],
        &["roles", "--declared", "billing,dunning", "--database-url", url],
        &["history", "--database-url", url],
    ] {
        let started = Instant::now();
        let out = ticklease(args);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{upto}: {args:?}: {said:.2000}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{upto}: {args:?} took {:?}",
            started.elapsed()
        );
        if args[0] == "roles" {
            let listed = String::from_utf8_lossy(&out.stdout);
            assert!(
                listed.contains("billing\n") && listed.contains("dunning  (declared, no row yet"),
                "{listed:.2000}"
            );
            assert!(said.contains("more roles not shown"), "{said}");
        }
    }
}

/// 10,000 roles an app login holds when `ticklease metrics` starts: named,
/// the operator's stalled role is exported (its stall alert can fire);
/// following the rows, it is left out and counted.
#[tokio::test]
async fn a_named_stalled_role_is_exported_whatever_roles_an_app_login_holds() {
    let (url, client) = migrated_url().await;
    client.batch_execute(STALLED).await.unwrap();
    client
        .batch_execute(
            "SELECT count(*) FROM generate_series(1, 10000) AS g,
                    LATERAL leader_acquire_v2('a_held_' || g, 'app', 600000, 1000, NULL, false) AS a
              WHERE a.acquired",
        )
        .await
        .unwrap();
    let (mut named, addr) = exporter(&url, &["--roles", "billing"]);
    let (body, _) = timed_get(&addr, "/metrics");
    named.kill().unwrap();
    named.wait().unwrap();
    let (mut following, addr) = exporter(&url, &[]);
    let (followed, _) = timed_get(&addr, "/metrics");
    following.kill().unwrap();
    following.wait().unwrap();
    let age = body
        .lines()
        .find(|l| l.starts_with(r#"ticklease_leader_last_tick_age_seconds{role="billing"} "#))
        .unwrap_or_else(|| panic!("{body:.3000}"));
    let age: f64 = age.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(age >= 600.0, "{age}");
    assert!(
        has(&body, r#"ticklease_leader_held{role="billing"} 0"#),
        "{body:.3000}"
    );
    assert!(!body.contains("a_held_"), "only the named roles");
    assert!(
        !followed.contains(r#"role="billing""#)
            && has(&followed, "ticklease_leader_status_rows_left_out 9001"),
        "following the rows, the named role is the one left out: {followed:.3000}"
    );
}

/// A read that cannot finish (the table locked past the statement timeout, 2 s):
/// a fresh exporter has no role series, and `leader_status_unreadable` says so.
#[tokio::test]
async fn an_exporter_that_cannot_read_says_so_in_a_series_that_exists_from_the_start() {
    let (url, mut client) = migrated_url().await;
    client.batch_execute(STALLED).await.unwrap();
    let (mut child, addr) = exporter(&url, &[]);
    let locker = client.transaction().await.unwrap();
    locker
        .batch_execute("LOCK TABLE leader_leases IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let (blind, _) = timed_get(&addr, "/metrics");
    locker.rollback().await.unwrap();
    // A refresh a second after the last began reads again.
    let deadline = Instant::now() + Duration::from_secs(20);
    let seen = loop {
        let (seen, _) = timed_get(&addr, "/metrics");
        if has(&seen, "ticklease_leader_status_unreadable 0") || Instant::now() > deadline {
            break seen;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        has(&blind, "ticklease_leader_status_unreadable 1"),
        "{blind:.3000}"
    );
    assert!(!blind.contains(r#"role="billing""#), "{blind:.3000}");
    assert!(has(&seen, "ticklease_leader_status_unreadable 0"), "{seen:.3000}");
    assert!(seen.contains(r#"role="billing""#), "{seen:.3000}");
}

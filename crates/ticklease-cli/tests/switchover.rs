//! A clean Postgres switchover under live replicas: three `ticklease worker`
//! processes on a multi-host URL (primary, standby) work a seeded load; the
//! standby catches up, the primary stops, the standby is promoted. Without a
//! restart, the workers reach the new primary and lead every role again
//! within TTL + MaxPoll (plus slack), work off a second load seeded after the
//! switchover, and the effects audit finds no stale claim, no duplicate effect
//! past its idempotency key and nothing lost.

use std::process::Command;
use std::time::{Duration, Instant};

use tokio::process::Child;
use tokio_postgres::Client;

use ticklease_sandbox::WorkerProcess;
use ticklease_testkit::{
    connect, scalar, test_config, url_for_hosts, HttpPeer, PgCluster, SmtpSink, Standby,
};
use ticklease_worker::ROLES;

const SECRET: &str = "whsec_dGlja2xlYXNlLXN3aXRjaG92ZXI=";
/// Per seeding; the test seeds twice (before and after the switchover).
const SUBSCRIPTIONS: i64 = 8;
const EMAILS: i64 = 8;
const EVENTS: i64 = 8;
/// On top of TTL + MaxPoll: reconnecting through the multi-host URL, and a
/// loaded 2-core machine running three workers and two servers.
const SLACK: Duration = Duration::from_secs(6);

fn ticklease(args: &[&str], url: &str) {
    let o = Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(args)
        .env("DATABASE_URL", url)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn seed(url: &str, endpoints: &[String; 2]) {
    let (s, e, v) = (SUBSCRIPTIONS.to_string(), EMAILS.to_string(), EVENTS.to_string());
    ticklease(
        &[
            "worker",
            "seed",
            "--subscriptions",
            &s,
            "--emails",
            &e,
            "--events",
            &v,
            "--endpoint",
            &endpoints[0],
            "--endpoint",
            &endpoints[1],
        ],
        url,
    );
}

fn spawn_worker(url: &str, http: &HttpPeer, smtp: &SmtpSink, log: &std::path::Path) -> Child {
    WorkerProcess::new(env!("CARGO_BIN_EXE_ticklease"), url, SECRET)
        .payments_url(http.url())
        .smtp_url(smtp.url())
        .lease(test_config())
        .batch_size(4)
        .tick_interval(Duration::from_millis(150))
        .log(log)
        .spawn()
        .unwrap()
}

/// Issue 42 item 4: a failover is one line at the default level per process
/// (the host it left, the one it reached, how long it was without one); what
/// ticklease said besides (lost connections, missed beats, failed polls,
/// the coordination session's reconnects) is at debug.
fn one_line_per_worker(log: &std::path::Path, before: usize) {
    let text = std::fs::read_to_string(log).unwrap();
    let after = &text[before..];
    let ours: Vec<&str> = after
        .lines()
        .filter(|l| (l.contains(" WARN ") || l.contains(" ERROR ")) && l.contains(" ticklease::"))
        .collect();
    let changed = ours
        .iter()
        .filter(|l| l.contains("database host changed"))
        .count();
    assert!(
        changed == 3 && ours.len() == 3 && ours.iter().all(|l| l.contains("down_ms")),
        "one line per worker, saying how long: {ours:#?}"
    );
}

/// Polls until every role has a term acquired (or a tick ended) after `since`
/// on the server `observer` talks to; returns when each role was first seen
/// led again, measured from `from`.
async fn wait_all_led_since(
    observer: &Client,
    since: &str,
    from: Instant,
    within: Duration,
) -> Vec<(&'static str, Duration)> {
    let mut led: Vec<(&'static str, Duration)> = Vec::new();
    while led.len() < ROLES.len() {
        for role in ROLES {
            if led.iter().any(|(r, _)| *r == role) {
                continue;
            }
            let again: bool = observer
                .query_one(
                    "SELECT coalesce(bool_or((held AND acquired_at > $2::text::timestamptz) \
                            OR last_tick_ended_at > $2::text::timestamptz), false) \
                       FROM leader_status WHERE role = $1",
                    &[&role, &since],
                )
                .await
                .unwrap()
                .get(0);
            if again {
                led.push((role, from.elapsed()));
            }
        }
        assert!(
            from.elapsed() < within,
            "not every role led again within {within:?} of the promotion: only {led:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    led
}

/// Polls until both seedings are worked off, for at most 90 s.
async fn wait_drained(observer: &Client, log: &std::path::Path) {
    let (subs, emails, events) = (SUBSCRIPTIONS * 2, EMAILS * 2, EVENTS * 2);
    let expected = (subs, subs, (events + subs) * 2, emails + subs);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let progress: (i64, i64, i64, i64) = (
            scalar(observer, "SELECT count(*) FROM invoices").await,
            scalar(observer, "SELECT count(*) FROM dunning_runs WHERE state = 'paid'").await,
            scalar(
                observer,
                "SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'",
            )
            .await,
            scalar(
                observer,
                "SELECT count(*) FROM email_outbox WHERE status = 'sent'",
            )
            .await,
        );
        if progress == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "load not worked off: (invoices, paid, delivered, sent) = {progress:?}, \
             want {expected:?}; log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The claim journal and the peers' records, read on the new primary.
async fn audit_effects(observer: &Client, http: &HttpPeer, smtp: &SmtpSink) {
    let violations = ticklease_worker::journal::violations(observer).await.unwrap();
    assert!(violations.is_empty(), "stale claims: {violations:#?}");
    let received = ticklease_testkit::peers::received(http, smtp);
    let audit = ticklease_sandbox::audit::audit(observer, &received, &["/hooks/a".into(), "/hooks/b".into()])
        .await
        .unwrap();
    println!("{audit:#?}");
    assert!(audit.violations.is_empty(), "{:#?}", audit.violations);
    assert_eq!(audit.invoices, SUBSCRIPTIONS * 2);
    assert_eq!(audit.events, (EVENTS + SUBSCRIPTIONS) * 2);
    assert_eq!(audit.emails_unique as i64, (EMAILS + SUBSCRIPTIONS) * 2);
    assert_eq!(
        audit.charged_invoices as i64,
        SUBSCRIPTIONS * 2,
        "every invoice charged (under one key: the audit counts keys per invoice)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_on_a_multi_host_url_lead_every_role_again_after_a_switchover_without_a_restart() {
    let primary = PgCluster::start_primary().unwrap();
    let db = primary.create_database().await.unwrap();
    let standby = Standby::start(&primary).unwrap();
    let url = url_for_hosts(&[&primary, standby.cluster()], &db);
    let http = HttpPeer::start(7).await.unwrap(); // every 7th webhook POST fails: retries happen
    let smtp = SmtpSink::start().await.unwrap();
    let endpoints = [
        format!("{}/hooks/a", http.url()),
        format!("{}/hooks/b", http.url()),
    ];
    ticklease(&["migrate"], &url);
    ticklease(&["worker", "migrate"], &url);
    seed(&url, &endpoints);
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("workers.log");
    let mut workers: Vec<Child> = (0..3).map(|_| spawn_worker(&url, &http, &smtp, &log)).collect();

    // Let them work: every role led at least once on the old primary.
    let old = connect(&primary.config(&db)).await.unwrap();
    let epoch = "-infinity";
    wait_all_led_since(&old, epoch, Instant::now(), Duration::from_secs(30)).await;
    drop(old);

    // The switchover: nothing committed is lost (caught up, then a fast
    // shutdown streams the rest), so only the leases' continuity is at stake.
    standby.wait_caught_up(&primary).await.unwrap();
    let before = std::fs::metadata(&log).unwrap().len() as usize;
    primary.stop_fast();
    standby.promote().await.unwrap();
    let promoted = Instant::now();
    let observer = connect(&standby.cluster().config(&db)).await.unwrap();
    let since: String = scalar(&observer, "SELECT clock_timestamp()::text").await;

    let config = test_config();
    let within = config.lease_ttl() + config.max_poll() + SLACK;
    let led = wait_all_led_since(&observer, &since, promoted, within).await;
    println!("led again after the promotion: {led:?}");
    for w in &mut workers {
        assert!(
            w.try_wait().unwrap().is_none(),
            "a worker exited at the switchover; log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    // More load after the switchover, through the same multi-host URL.
    seed(&url, &endpoints);
    wait_drained(&observer, &log).await;
    one_line_per_worker(&log, before);

    for w in &workers {
        let pid = nix::unistd::Pid::from_raw(w.id().unwrap() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    }
    for mut w in workers {
        assert_eq!(w.wait().await.unwrap().code(), Some(0), "graceful SIGTERM");
    }
    audit_effects(&observer, &http, &smtp).await;
}

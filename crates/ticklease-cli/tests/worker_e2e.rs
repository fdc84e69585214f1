//! End to end: three `ticklease worker` processes with scaled timings work a
//! seeded load against real peers (payment provider, two webhook receivers,
//! an SMTP sink) while the test SIGKILLs the leader of each role once. At the
//! end every invoice exists once, every event reached every endpoint
//! (duplicates only under the same webhook-id), every email arrived, and
//! every invoice was charged under one idempotency key.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use ticklease::HolderId;
use ticklease_sandbox::WorkerProcess;
use ticklease_testkit::{connect, scalar, test_config, HttpPeer, PgCluster, SmtpSink};
use ticklease_worker::ROLES;

const SECRET: &str = "whsec_dGlja2xlYXNlLWUyZS1zZWNyZXQ=";
const SUBSCRIPTIONS: i64 = 12;
const EMAILS: i64 = 12;
const EVENTS: i64 = 12;

fn ticklease(args: &[&str], url: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(args)
        .env("DATABASE_URL", url)
        .output()
        .unwrap()
}

fn spawn_worker(url: &str, payments: &str, smtp: &str, log: &std::path::Path) -> Child {
    WorkerProcess::new(env!("CARGO_BIN_EXE_ticklease"), url, SECRET)
        .payments_url(payments)
        .smtp_url(smtp)
        .lease(test_config())
        .batch_size(4)
        .tick_interval(Duration::from_millis(150))
        .log(log)
        .command()
        .unwrap()
        .spawn()
        .unwrap()
}

fn verify_signature(id: &str, timestamp: &str, body: &str, signature: &str) -> bool {
    let key = base64::engine::general_purpose::STANDARD
        .decode(SECRET.trim_start_matches("whsec_"))
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    let expected = format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    );
    signature.split(' ').any(|s| s == expected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_survive_a_sigkill_of_each_roles_leader_without_double_effects() {
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    let url = cluster.url(&db);
    let http = HttpPeer::start(7).await.unwrap(); // every 7th webhook POST fails: retries happen
    let smtp = SmtpSink::start().await.unwrap();
    let endpoints = [
        format!("{}/hooks/a", http.url()),
        format!("{}/hooks/b", http.url()),
    ];
    for args in [
        vec!["migrate"],
        vec!["worker", "migrate"],
        vec![
            "worker",
            "seed",
            "--subscriptions",
            "12",
            "--emails",
            "12",
            "--events",
            "12",
            "--endpoint",
            &endpoints[0],
            "--endpoint",
            &endpoints[1],
        ],
    ] {
        let o = ticklease(&args, &url);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("workers.log");
    let mut workers: Vec<Child> = (0..3)
        .map(|_| spawn_worker(&url, &http.url(), &smtp.url(), &log))
        .collect();
    let observer = connect(&cluster.config(&db)).await.unwrap();

    // SIGKILL the leader of each role once, while it holds the role.
    let mut killed = Vec::new();
    for role in ROLES {
        let deadline = Instant::now() + Duration::from_secs(8);
        while Instant::now() < deadline {
            let holder: Option<String> = observer
                .query_opt(
                    "SELECT holder_id FROM leader_status WHERE role = $1 AND held",
                    &[&role],
                )
                .await
                .unwrap()
                .map(|r| r.get(0));
            let pid = holder
                .as_deref()
                .and_then(|h| h.parse::<HolderId>().ok())
                .map(|h| h.pid());
            if let Some(i) = pid.and_then(|pid| workers.iter().position(|w| w.id() == pid)) {
                let mut victim = workers.swap_remove(i);
                victim.kill().unwrap();
                victim.wait().unwrap();
                killed.push((role, victim.id()));
                workers.push(spawn_worker(&url, &http.url(), &smtp.url(), &log));
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    println!("killed leaders: {killed:?}");
    assert!(
        killed.len() >= 3,
        "too few leaders caught holding a role to kill: {killed:?}"
    );

    // Wait for the whole load to be worked off.
    let expected_deliveries = (EVENTS + SUBSCRIPTIONS) * 2;
    let expected_emails = EMAILS + SUBSCRIPTIONS;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let progress: (i64, i64, i64, i64) = (
            scalar(&observer, "SELECT count(*) FROM invoices").await,
            scalar(
                &observer,
                "SELECT count(*) FROM dunning_runs WHERE state = 'paid'",
            )
            .await,
            scalar(
                &observer,
                "SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'",
            )
            .await,
            scalar(
                &observer,
                "SELECT count(*) FROM email_outbox WHERE status = 'sent'",
            )
            .await,
        );
        if progress == (SUBSCRIPTIONS, SUBSCRIPTIONS, expected_deliveries, expected_emails) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "load not worked off: (invoices, paid, delivered, sent) = {progress:?}; log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A clean SIGTERM: every worker exits 0 after releasing.
    for w in &workers {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(w.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
    }
    for mut w in workers {
        assert_eq!(w.wait().unwrap().code(), Some(0), "graceful SIGTERM");
    }
    let held: i64 = scalar(&observer, "SELECT count(*) FROM leader_status WHERE held").await;
    assert_eq!(held, 0, "SIGTERM released every term");

    // The claim journal: no claim under a superseded token after a newer term's first claim.
    let violations = ticklease_worker::journal::violations(&observer).await.unwrap();
    assert!(violations.is_empty(), "{violations:#?}");
    let terms = ticklease_worker::journal::terms_per_role(&observer)
        .await
        .unwrap();
    println!("journal (role, claims, terms): {terms:?}");
    assert!(
        terms.iter().all(|(_, _, t)| *t >= 2),
        "each role was claimed under several terms: {terms:?}"
    );

    // Signatures: every webhook carries a valid Standard Webhooks signature.
    for r in http
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/hooks/"))
    {
        let (id, ts, sig) = (
            &r.headers["webhook-id"],
            &r.headers["webhook-timestamp"],
            &r.headers["webhook-signature"],
        );
        assert!(verify_signature(id, ts, &r.body, sig), "bad signature on {id}");
    }

    // Effects against the stores: one invoice per subscription and period, every event at every
    // endpoint under one webhook-id and body, one idempotency key per invoice, every email arrived.
    let received = ticklease_testkit::peers::received(&http, &smtp);
    let audit =
        ticklease_sandbox::audit::audit(&observer, &received, &["/hooks/a".into(), "/hooks/b".into()])
            .await
            .unwrap();
    println!("{audit:#?}");
    assert!(audit.violations.is_empty(), "{:#?}", audit.violations);
    assert_eq!(audit.invoices, SUBSCRIPTIONS);
    assert_eq!(audit.events, EVENTS + SUBSCRIPTIONS);
    assert_eq!(
        audit.emails_unique as i64,
        EMAILS + SUBSCRIPTIONS,
        "a Message-ID that is no outbox row"
    );
    assert_eq!(
        audit.charged_invoices as i64, SUBSCRIPTIONS,
        "every invoice charged (under one key: the audit counts keys per invoice)"
    );
    let paid: i64 = scalar(
        &observer,
        "SELECT count(*) FROM dunning_runs WHERE state = 'paid'",
    )
    .await;
    assert_eq!(paid, SUBSCRIPTIONS);
}

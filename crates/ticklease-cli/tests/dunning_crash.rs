//! Money across a crash: the dunning leader is SIGKILLed after the payment
//! provider has taken its charge but before the answer arrives. The next
//! leader does not know whether the card was charged, so it must ask again
//! under the same idempotency key: the provider then sees one key per invoice
//! and every run settles paid on its first attempt.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use ticklease::HolderId;
use ticklease_sandbox::audit::Kind;
use ticklease_sandbox::WorkerProcess;
use ticklease_testkit::{connect, scalar, test_config, HttpPeer, PgCluster, SmtpSink};

const SUBSCRIPTIONS: i64 = 3;

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

fn spawn_worker(url: &str, payments: &str, log: &std::path::Path) -> Child {
    WorkerProcess::new(env!("CARGO_BIN_EXE_ticklease"), url, "whsec_ZHVubmluZy1jcmFzaA==")
        .roles(&["billing", "dunning"])
        .payments_url(payments)
        .lease(test_config())
        .tick_interval(Duration::from_millis(150))
        .log(log)
        .command()
        .unwrap()
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dunning_leader_killed_mid_charge_leaves_one_idempotency_key_per_invoice_and_the_run_paid() {
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    let url = cluster.url(&db);
    let http = HttpPeer::start(0).await.unwrap();
    // No email role runs here; the sink only completes what the audit reads.
    let smtp = SmtpSink::start().await.unwrap();
    let mut held = http.hold_next_charge();
    ticklease(&["migrate"], &url);
    ticklease(&["worker", "migrate"], &url);
    ticklease(
        &["worker", "seed", "--subscriptions", &SUBSCRIPTIONS.to_string()],
        &url,
    );
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("workers.log");
    let mut workers: Vec<Child> = (0..2).map(|_| spawn_worker(&url, &http.url(), &log)).collect();
    let observer = connect(&cluster.config(&db)).await.unwrap();
    let worker_log = || std::fs::read_to_string(&log).unwrap_or_default();

    // The provider has taken the first charge; its answer is held, so the
    // dunning tick that sent it is still in flight on its leader.
    let key = tokio::time::timeout(Duration::from_secs(60), held.received())
        .await
        .unwrap_or_else(|_| panic!("no charge arrived; log:\n{}", worker_log()));
    let holder: String = scalar(
        &observer,
        "SELECT holder_id FROM leader_status WHERE role = 'dunning' AND held",
    )
    .await;
    let pid = holder.parse::<HolderId>().unwrap().pid();
    let i = workers.iter().position(|w| w.id() == pid).unwrap();
    let mut leader = workers.swap_remove(i);
    leader.kill().unwrap();
    leader.wait().unwrap();
    held.release();

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let paid: i64 = scalar(
            &observer,
            "SELECT count(*) FROM dunning_runs WHERE state = 'paid'",
        )
        .await;
        if paid == SUBSCRIPTIONS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{paid} of {SUBSCRIPTIONS} runs paid; log:\n{}",
            worker_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut keys: BTreeMap<i64, BTreeSet<String>> = BTreeMap::new();
    for r in http.requests().iter().filter(|r| r.path == "/charges") {
        let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        keys.entry(body["invoice_id"].as_i64().unwrap())
            .or_default()
            .insert(r.headers["idempotency-key"].clone());
    }
    assert_eq!(keys.len() as i64, SUBSCRIPTIONS, "{keys:?}");
    assert!(
        keys.values().all(|k| k.len() == 1),
        "an invoice charged under more than one idempotency key: {keys:?}"
    );
    assert_eq!(
        http.charge_requests()[&key],
        2,
        "the next leader asked again under the killed leader's key"
    );
    let attempts: i64 = scalar(
        &observer,
        "SELECT count(*) FROM dunning_runs WHERE attempt_count = 1",
    )
    .await;
    assert_eq!(attempts, SUBSCRIPTIONS, "the crash spent no attempt");

    // The effects audit counts the same: one charge per invoice, no duplicate.
    let received = ticklease_testkit::peers::received(&http, &smtp);
    let audit = ticklease_sandbox::audit::audit(&observer, &received, &[])
        .await
        .unwrap();
    assert_eq!(audit.charged_invoices as i64, SUBSCRIPTIONS);
    assert_eq!(audit.count(Kind::Duplicate), 0, "{:#?}", audit.violations);

    for w in &mut workers {
        w.kill().unwrap();
        w.wait().unwrap();
    }
}

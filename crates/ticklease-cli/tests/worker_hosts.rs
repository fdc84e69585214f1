//! `ticklease worker` on a multi-host URL whose first host black-holes
//! (accepts TCP, never answers): every connection of the worker, its claim
//! funnels' pool included, follows the library's host rules and reaches the
//! second host, so billing keeps completing ticks.

use std::process::Command;
use std::time::{Duration, Instant};

use ticklease_sandbox::WorkerProcess;
use ticklease_testkit::{connect, test_config, Fault, FaultProxy, PgCluster};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_completes_billing_ticks_while_the_first_host_of_its_url_black_holes() {
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    let url = cluster.url(&db);
    ticklease(&["migrate"], &url);
    ticklease(&["worker", "migrate"], &url);
    let proxy = FaultProxy::start(([127, 0, 0, 1], cluster.port()).into())
        .await
        .unwrap();
    proxy.set(Fault::Blackhole);
    let hosts = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{db}?target_session_attrs=read-write",
        proxy.port(),
        cluster.port()
    );
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut worker = WorkerProcess::new(env!("CARGO_BIN_EXE_ticklease"), &hosts, "whsec_dGVzdA==")
        .payments_url("http://127.0.0.1:9")
        .smtp_url("smtp://127.0.0.1:9")
        .roles(&["billing"])
        .lease(test_config())
        .tick_interval(Duration::from_millis(150))
        .log(log.path())
        .command()
        .unwrap()
        .spawn()
        .unwrap();
    let client = connect(&cluster.config(&db)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let completed = loop {
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM leader_history WHERE role = 'billing' AND outcome = 'completed'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n >= 5 || Instant::now() > deadline {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = worker.kill();
    let _ = worker.wait();
    assert!(
        completed >= 5,
        "{completed} billing ticks completed in 30 s; worker log:\n{}",
        std::fs::read_to_string(log.path()).unwrap_or_default()
    );
}

/// The one-shot commands' plain client (`migrate`, `worker migrate`,
/// `worker seed`) connects by the same rules: the silent first host costs
/// its share of the wait, then the second host answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_reaches_the_second_host_while_the_first_black_holes() {
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    let proxy = FaultProxy::start(([127, 0, 0, 1], cluster.port()).into())
        .await
        .unwrap();
    proxy.set(Fault::Blackhole);
    let hosts = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{db}?target_session_attrs=read-write&connect_timeout=2",
        proxy.port(),
        cluster.port()
    );
    ticklease(&["migrate"], &hosts);
    ticklease(&["worker", "migrate"], &hosts);
}

//! A Postgres restart behind PgBouncer with the runbook's settings (issue 41:
//! with PgBouncer's defaults, recovery took 14.7-18.4 s, `server_login_retry`).

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use ticklease::{Manager, PgStore, PgStoreOptions, Role, Scheduler};
use ticklease_testkit::{connect, test_config, PgBouncer, PgCluster};

const RUNBOOK: &str = include_str!("../../../docs/runbook.md");

/// The body of the runbook's `ini pgbouncer` block.
fn runbook_settings() -> String {
    let start = RUNBOOK
        .find("```ini pgbouncer\n")
        .expect("the runbook shows PgBouncer's settings");
    let body = &RUNBOOK[start + "```ini pgbouncer\n".len()..];
    body[..body.find("```").expect("the block ends")].to_string()
}

/// Ticks every 100 ms through PgBouncer; Postgres stops (a fast shutdown) and starts 2 s later;
/// ticks resume within 10 s of the server accepting connections again (a
/// TTL and a poll at these timings, plus PgBouncer's one-second retry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_runbook_s_pgbouncer_settings_a_postgres_restart_costs_seconds() {
    let cluster = tokio::task::spawn_blocking(PgCluster::start)
        .await
        .unwrap()
        .unwrap();
    let name = cluster.create_database().await.unwrap();
    ticklease::migrate(&mut connect(&cluster.config(&name)).await.unwrap())
        .await
        .unwrap();
    let bouncer = PgBouncer::start_with(&cluster, 2, &runbook_settings()).unwrap();
    let config = test_config();
    let store = PgStore::connect(bouncer.config(&name), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let role = Role::new("billing").unwrap();
    let manager = Manager::start(store, config, [role.clone()]).await.unwrap();
    let (ticked, mut ticks) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let scheduler = Scheduler::new(manager)
        .job(&role, Duration::from_millis(100), move |_| {
            let _ = ticked.send(tokio::time::Instant::now());
            async { Ok::<_, std::io::Error>(()) }
        })
        .unwrap();
    let run = tokio::spawn(scheduler.run(stop.clone()));
    tokio::time::timeout(Duration::from_secs(10), ticks.recv())
        .await
        .expect("it ticks before the restart");
    // Down for 2 s while the replica's statements ask PgBouncer for servers:
    // its logins fail, and it waits `server_login_retry` before the next.
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.stop_fast();
        std::thread::sleep(Duration::from_secs(2));
        cluster.restart_fast().unwrap();
        cluster
    })
    .await
    .unwrap();
    let back = tokio::time::Instant::now();
    // Ticks that ran before the restart finished are not the recovery.
    while ticks.try_recv().is_ok() {}
    let next = tokio::time::timeout(Duration::from_secs(10), ticks.recv())
        .await
        .expect("a tick within 10 s of the server's start (PgBouncer's default retry waits 15 s)")
        .unwrap();
    assert!(next >= back);
    stop.cancel();
    run.await.unwrap();
    drop(bouncer);
    drop(cluster);
}

//! Losing stdout/stderr: a replica whose log reader went away keeps working
//! and shuts down on SIGTERM; a one-shot command piped into a closed reader
//! ends quietly, as Unix tools do.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use ticklease_testkit::{connect, scalar, PgCluster};
use tokio::time::Instant;

/// The write end of a pipe whose reader has already gone.
fn closed_pipe() -> Stdio {
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    Stdio::from(write)
}

fn ticklease(args: &[&str], url: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(args)
        .env("DATABASE_URL", url)
        .output()
        .unwrap()
}

#[tokio::test]
async fn a_worker_whose_log_pipes_are_closed_shuts_down_on_sigterm_and_releases() {
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    let url = cluster.url(&db);
    for args in [&["migrate"][..], &["worker", "migrate"]] {
        assert!(ticklease(args, &url).status.success());
    }
    let mut worker = tokio::process::Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args([
            "worker",
            "--webhook-secret",
            "whsec_c2VjcmV0",
            "--smtp-url",
            "smtp://127.0.0.1:1",
            "--roles",
            "email_outbox,webhook_delivery",
            "--lease-ttl",
            "2s",
            "--heartbeat-every",
            "300ms",
            "--statement-timeout",
            "500ms",
            "--abandon-after",
            "1200ms",
            "--max-poll",
            "200ms",
            "--tick-interval",
            "email_outbox=100ms",
            "--tick-interval",
            "webhook_delivery=100ms",
        ])
        .env("DATABASE_URL", &url)
        .env("RUST_LOG", "debug")
        .stdout(closed_pipe())
        .stderr(closed_pipe())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = worker.id().unwrap();
    let client = connect(&cluster.config(&db)).await.unwrap();
    let mine = format!("'%:{pid}:%'");
    // It works with nowhere to log: ticks complete (and log) while we wait.
    let deadline = Instant::now() + Duration::from_secs(20);
    let ticked = format!("SELECT count(*) FROM leader_leases WHERE last_tick_holder LIKE {mine}");
    while scalar::<i64>(&client, &ticked).await < 2 {
        assert!(
            worker.try_wait().unwrap().is_none(),
            "the worker died with its log pipes"
        );
        assert!(Instant::now() < deadline, "no tick completed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ticklease_testkit::signal(&worker, nix::sys::signal::Signal::SIGTERM);
    let status = tokio::time::timeout(Duration::from_secs(10), worker.wait())
        .await
        .expect("SIGTERM did not stop the worker within the shutdown bound")
        .unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    let held = format!("SELECT count(*) FROM leader_status WHERE held AND holder_id LIKE {mine}");
    assert_eq!(scalar::<i64>(&client, &held).await, 0, "a term stayed held");
}

#[tokio::test]
async fn a_one_shot_command_into_a_closed_pipe_ends_quietly() {
    let cluster = PgCluster::shared();
    let url = cluster.url(&cluster.create_database().await.unwrap());
    assert!(ticklease(&["migrate"], &url).status.success());
    let config: tokio_postgres::Config = url.parse().unwrap();
    connect(&config)
        .await
        .unwrap()
        .batch_execute("SELECT leader_seed(ARRAY['billing', 'dunning'])")
        .await
        .unwrap();
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["status", "--watch"],
        &["roles"],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_ticklease"))
            .args(args)
            .env("DATABASE_URL", &url)
            .stdout(closed_pipe())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(
            o.status.code() == Some(0) || o.status.signal() == Some(libc_sigpipe()),
            "{args:?}: {:?} {stderr}",
            o.status
        );
    }
}

fn libc_sigpipe() -> i32 {
    nix::sys::signal::Signal::SIGPIPE as i32
}

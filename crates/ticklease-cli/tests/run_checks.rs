//! `ticklease run` checks what the run will use before anything is
//! written: the interval as the database counts it, and the program as the
//! child will look for it (the job's PATH and dir). A refusal that repeats
//! at every poll shows at the default log level.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::AsyncBufReadExt;
use tokio::process::Command;

use ticklease_testkit::PgCluster;

use ticklease_testkit::TEST_TIMING_FLAGS as TIMINGS;

async fn migrated_url() -> String {
    let cluster = PgCluster::shared();
    let url = cluster.url(&cluster.create_database().await.unwrap());
    let migrated = std::process::Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(["migrate", "--database-url", &url])
        .output()
        .unwrap();
    assert_eq!(migrated.status.code(), Some(0));
    url
}

fn run(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ticklease"));
    cmd.args(["run", "--database-url", url])
        .args(TIMINGS)
        .args(args)
        .env_remove("RUST_LOG")
        .kill_on_drop(true);
    cmd
}

/// The output of a run that must be refused up front (one that started
/// instead would run until killed).
async fn refused(mut cmd: Command) -> std::process::Output {
    tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("not refused: it ran")
        .unwrap()
}

async fn rows(url: &str) -> i64 {
    let client = ticklease_testkit::connect(&url.parse().unwrap()).await.unwrap();
    client
        .query_one("SELECT count(*) FROM leader_leases", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_sub_millisecond_interval_or_a_program_missing_from_the_jobs_path_is_refused_before_anything_is_written(
) {
    let url = migrated_url().await;
    let dir = tempfile::tempdir().unwrap();
    let o = refused(run(&url, &["nothing", "--every", "900us", "--", "true"])).await;
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("whole milliseconds"), "{err}");
    let file = dir.path().join("jobs.toml");
    let jobs = file.to_str().unwrap();
    for (body, says) in [
        (
            "[job.a]\ncommand = [\"true\"]\nevery = \"500us\"\n",
            "job \"a\": every: an interval must be whole milliseconds",
        ),
        (
            "[job.a]\ncommand = [\"true\"]\nenv = { PATH = \"/nonexistent\" }\n",
            "job \"a\": command: \"true\" is not found in PATH \"/nonexistent\"",
        ),
        (
            "[job.a]\ncommand = [\"./tool\"]\ndir = \"/tmp\"\n",
            "job \"a\": command: \"./tool\" is not an executable file",
        ),
    ] {
        std::fs::write(&file, body).unwrap();
        let o = refused(run(&url, &["--jobs", jobs])).await;
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{body}: {err}");
        assert!(err.contains(says), "{body}: {err}");
    }
    assert_eq!(rows(&url).await, 0, "nothing written");
}

#[tokio::test]
async fn a_jobs_program_is_found_in_its_own_relative_path_from_its_dir() {
    let url = migrated_url().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("bin")).unwrap();
    let tool = dir.path().join("bin/tool");
    std::fs::write(&tool, "#!/bin/sh\necho ran > \"$PWD/ran\"\n").unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let file = dir.path().join("jobs.toml");
    std::fs::write(
        &file,
        format!(
            "[job.tool]\ncommand = [\"tool\"]\nevery = \"1h\"\ndir = {:?}\nenv = {{ PATH = \"bin\" }}\n",
            dir.path().display().to_string()
        ),
    )
    .unwrap();
    let mut runner = run(&url, &["--jobs", file.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !dir.path().join("ran").exists() {
        assert!(Instant::now() < deadline, "the tool never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = runner.start_kill();
}

/// The runner's login loses the application role while it runs: every
/// ACQUIRE is refused by the database from then on, and the refusal is on
/// stderr without RUST_LOG.
#[tokio::test]
async fn a_refusal_repeated_at_every_poll_is_shown_at_the_default_log_level() {
    let url = migrated_url().await;
    let login = format!("run_checks_{}", std::process::id());
    let owner = ticklease_testkit::connect(&url.parse().unwrap()).await.unwrap();
    owner
        .batch_execute(&format!("CREATE ROLE {login} LOGIN IN ROLE ticklease_app"))
        .await
        .unwrap();
    let as_app = url.replacen("postgres@", &format!("{login}@"), 1);
    let mut runner = run(&as_app, &["refused", "--every", "100ms", "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ran: i64 = owner
            .query_one("SELECT count(*) FROM leader_history WHERE role = 'refused'", &[])
            .await
            .unwrap()
            .get(0);
        if ran > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no tick ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    owner
        .batch_execute(&format!("REVOKE ticklease_app FROM {login}"))
        .await
        .unwrap();
    let mut lines = tokio::io::BufReader::new(runner.stderr.take().unwrap()).lines();
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("permission denied") {
                return line;
            }
        }
        String::new()
    })
    .await
    .unwrap_or_default();
    let _ = runner.start_kill();
    let _ = runner.wait().await;
    owner
        .batch_execute(&format!("DROP OWNED BY {login}; DROP ROLE {login}"))
        .await
        .ok();
    assert!(seen.contains("permission denied"), "stderr said: {seen:?}");
}

/// Issue 42 item 4: an outage is one line when it ends, and a line every 30
/// statement timeouts while it lasts (15 s at the tests' 500 ms); what
/// happens meanwhile (connections refused, polls that could not reach the
/// server) is at debug, not a line per poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_told_while_it_lasts_and_once_when_it_ends_not_at_every_poll() {
    let cluster = tokio::task::spawn_blocking(PgCluster::start)
        .await
        .unwrap()
        .unwrap();
    let url = cluster.url("postgres");
    let migrated = std::process::Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(["migrate", "--database-url", &url])
        .output()
        .unwrap();
    assert_eq!(migrated.status.code(), Some(0));
    let mut runner = run(&url, &["outage", "--every", "100ms", "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (said, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let mut lines = tokio::io::BufReader::new(runner.stderr.take().unwrap()).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = said.send(line);
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    while heard.try_recv().is_ok() {}

    let cluster = tokio::task::spawn_blocking(move || {
        cluster.stop_fast();
        // Past one "still trying" line (15 s), short of a second (30 s).
        std::thread::sleep(Duration::from_secs(20));
        cluster.restart().unwrap();
        cluster
    })
    .await
    .unwrap();
    // The runner may reconnect before this task is scheduled again, so the
    // outage is what came before the "restored" line, not what has arrived
    // by now.
    let mut during = Vec::new();
    let restored = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = heard.recv().await {
            if line.contains("database connection restored") {
                return line;
            }
            during.push(line);
        }
        String::new()
    })
    .await
    .unwrap_or_default();
    let _ = runner.start_kill();
    let _ = runner.wait().await;
    drop(cluster);
    let still = during.iter().filter(|l| l.contains("still trying")).count();
    assert_eq!(still, 1, "one 'still trying' line in 20 s: {during:#?}");
    assert!(
        during.len() <= 3,
        "at most a line besides (a tick cut short): {during:#?}"
    );
    assert!(restored.contains("down_ms"), "the outage's end: {restored:?}");
}

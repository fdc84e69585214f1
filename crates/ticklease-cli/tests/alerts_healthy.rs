//! Issue 33 (bug 1, item 5): every shipped alert stays silent for a healthy
//! job of each schedule kind. A real `ticklease run` leads an interval job,
//! a cron job and a long-lived one on a real Postgres (scaled timings);
//! once each runs as it should, what the runner and `ticklease metrics`
//! export is fed to promtool, held for three hours, and no alert may fire.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ticklease_testkit::PgCluster;

use ticklease_testkit::TEST_TIMING_FLAGS as TIMINGS;

const JOBS: &str = r#"
[job.report]
command = ["true"]
every = "2s"

[job.dump]
command = ["true"]
cron = "* * * * * *"

[job.relay]
command = ["sleep", "600"]
"#;

/// Starts `ticklease ARGS` serving metrics on a free port; its address.
fn serving(args: &[&str]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(args)
        .args(["--metrics-addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (told, told_rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    // Read to its end: a closed pipe would fail the runner's later writes.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(addr) = line.split("http://").nth(1) {
                let _ = told.send(addr.trim().to_string());
            }
        }
    });
    let addr = told_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("it says where it serves");
    (child, addr)
}

fn scrape(addr: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response.split("\r\n\r\n").nth(1).unwrap_or_default().to_string()
}

/// Each sample of an exposition as a promtool input series held for
/// `samples` minutes, labelled with `instance`.
fn held_series(exposition: &str, instance: &str, samples: usize) -> String {
    let mut out = String::new();
    for line in exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let series = match series.strip_suffix('}') {
            Some(open) => format!("{open},instance=\"{instance}\"}}"),
            None => format!("{series}{{instance=\"{instance}\"}}"),
        };
        let series = series.replace('\'', "''");
        out.push_str(&format!(
            "      - series: '{series}'\n        values: '{value}x{samples}'\n"
        ));
    }
    out
}

async fn until(what: &str, within: Duration, check: impl AsyncFn() -> bool) {
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < within, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_shipped_alerts_stay_silent_for_a_healthy_job_of_each_schedule_kind() {
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    let url = cluster.url(&db);
    let ticklease = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ticklease"))
            .args(args)
            .output()
            .unwrap()
    };
    assert_eq!(
        ticklease(&["migrate", "--database-url", &url]).status.code(),
        Some(0)
    );
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs.toml");
    std::fs::write(&jobs, JOBS).unwrap();
    let mut args = vec!["run", "--database-url", &url, "--jobs", jobs.to_str().unwrap()];
    args.extend(TIMINGS);
    let (mut runner, runner_addr) = serving(&args);
    let client = ticklease_testkit::connect(&cluster.config(&db)).await.unwrap();
    // Healthy: the scheduled jobs completed twice, the relay holds its term.
    until("each job runs", Duration::from_secs(30), async || {
        let row = client
            .query_one(
                "SELECT (SELECT count(*) FROM leader_history WHERE role = 'report' AND outcome = 'completed'),
                        (SELECT count(*) FROM leader_history WHERE role = 'dump' AND outcome = 'completed'),
                        (SELECT held FROM leader_status WHERE role = 'relay')",
                &[],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0) >= 2 && row.get::<_, i64>(1) >= 2 && row.get::<_, Option<bool>>(2) == Some(true)
    })
    .await;
    let (mut metrics, metrics_addr) = serving(&["metrics", "--database-url", &url]);
    let (from_runner, from_metrics) = (scrape(&runner_addr), scrape(&metrics_addr));
    for child in [&mut runner, &mut metrics] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    for exposition in [&from_runner, &from_metrics] {
        for fact in [
            r#"ticklease_leader_long_lived{role="relay"} 1"#,
            r#"ticklease_leader_held{role="relay"} 1"#,
            r#"ticklease_leader_last_tick_state{role="relay",state="never_ran"} 1"#,
            r#"ticklease_leader_last_term_failed{role="report"} 0"#,
            r#"ticklease_leader_tick_interval_seconds{role="report"} 2.0"#,
        ] {
            assert!(exposition.contains(fact), "{fact} in {exposition}");
        }
        // A cron role has no interval (the stall alert is for intervals).
        assert!(
            !exposition.contains(r#"ticklease_leader_tick_interval_seconds{role="dump"}"#),
            "{exposition}"
        );
    }
    every_shipped_alert_stays_silent(
        dir.path(),
        &[(&from_runner, "runner"), (&from_metrics, "metrics")],
    );
}

/// Feeds promtool the expositions' samples, held for three hours (one a
/// minute, each labelled with its exporter), and expects no shipped alert
/// (`ticklease alerts`) to fire.
fn every_shipped_alert_stays_silent(dir: &std::path::Path, expositions: &[(&str, &str)]) {
    let rules = Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .arg("alerts")
        .output()
        .unwrap();
    assert_eq!(rules.status.code(), Some(0));
    std::fs::write(dir.join("ticklease-alerts.yml"), &rules.stdout).unwrap();
    let names: Vec<String> = String::from_utf8(rules.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| Some(l.trim().strip_prefix("- alert: ")?.to_string()))
        .collect();
    assert!(names.len() >= 12, "{names:?}");
    let mut test = String::from("rule_files:\n  - ticklease-alerts.yml\nevaluation_interval: 1m\ntests:\n");
    test.push_str("  - interval: 1m\n    input_series:\n");
    for (exposition, instance) in expositions {
        test.push_str(&held_series(exposition, instance, 180));
    }
    test.push_str("    alert_rule_test:\n");
    for name in &names {
        test.push_str(&format!(
            "      - eval_time: 3h\n        alertname: {name}\n        exp_alerts: []\n"
        ));
    }
    std::fs::write(dir.join("healthy.test.yml"), test).unwrap();
    let o = Command::new("promtool")
        .args(["test", "rules", "healthy.test.yml"])
        .current_dir(dir)
        .output()
        .expect("promtool runs (scripts/test installs it)");
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

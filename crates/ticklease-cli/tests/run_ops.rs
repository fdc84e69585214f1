//! `ticklease run` as operations people meet it (issue 33): `--once` says
//! why it did not run; retries, timeouts and a long-lived command's restart
//! backoff are flags as they are jobs-file keys; the log has a start and an
//! end line per job and no colour codes off a terminal; the jobs file is
//! documented, key for key, where users look. Real processes on a real
//! Postgres, scaled timings (TTL 2 s, heartbeat 300 ms, poll 200 ms).

use std::path::Path;
use std::process::{Output, Stdio};
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

/// `ticklease run --database-url URL` with the scaled timings, then `args`.
fn run(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ticklease"));
    cmd.args(["run", "--database-url", url])
        .args(TIMINGS)
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// The output of a command that must end by itself.
async fn output(mut cmd: Command) -> Output {
    tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("it did not end within 30 s")
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

async fn sql(url: &str, statement: &str) {
    let client = ticklease_testkit::connect(&url.parse().unwrap()).await.unwrap();
    client.batch_execute(statement).await.unwrap();
}

/// Item 4: every `--once` that does not exit 0 writes one line saying why;
/// a success writes nothing (a crontab mails any output).
#[tokio::test]
async fn once_says_in_one_line_why_it_did_not_run_and_nothing_on_success() {
    let url = migrated_url().await;
    let once = |role: &str, flags: &[&str], cmd: &[&str]| {
        let mut c = run(&url, &[role, "--once"]);
        c.args(flags).arg("--").args(cmd);
        output(c)
    };
    let ok = once("job", &["--every", "1h"], &["true"]).await;
    assert_eq!((ok.status.code(), stderr(&ok)), (Some(0), String::new()));
    let line = |o: &Output, code: i32, says: &str| {
        let err = stderr(o);
        assert_eq!(o.status.code(), Some(code), "{err}");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("ticklease run: ")).collect();
        assert_eq!(lines.len(), 1, "one line saying why: {err}");
        assert!(lines[0].contains(says), "{err}");
    };
    line(
        &once("job", &["--every", "1h"], &["true"]).await,
        77,
        "job: not run: not due until",
    );
    let mut info = run(&url, &["job", "--once", "--every", "1h", "--", "true"]);
    info.env("RUST_LOG", "info");
    line(&output(info).await, 77, "(in 59m");
    sql(&url, "SELECT leader_pause('job', 'ops', 'INC-42 \u{1b}[31m')").await;
    let paused = once("job", &["--every", "1h"], &["true"]).await;
    line(&paused, 76, "not run: paused by ops: INC-42 \\u{1b}[31m");
    let failed = once(
        "broken",
        &["--every", "1h"],
        &["sh", "-c", "echo oops >&2; exit 3"],
    )
    .await;
    line(&failed, 3, "broken: the command failed in term ");
    line(&failed, 3, ": exit 3: oops");
    let mut holder = run(&url, &["held", "--", "sleep", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(holder.stderr.take().unwrap()).lines();
    let started = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(l)) = lines.next_line().await {
            if l.contains("job started") {
                return true;
            }
        }
        false
    });
    assert!(started.await.unwrap_or(false), "the holder's job did not start");
    line(&once("held", &[], &["true"]).await, 75, "not run: held by ");
    let _ = holder.start_kill();
}

/// Item 7: `--timeout`, `--attempts` and `--backoff` are flags as they are
/// jobs-file keys, with the library's retries behind them.
#[tokio::test]
async fn timeout_attempts_and_backoff_are_flags_too() {
    let url = migrated_url().await;
    let from = Instant::now();
    let slow = output(run(
        &url,
        &[
            "slow",
            "--once",
            "--every",
            "1h",
            "--timeout",
            "300ms",
            "--",
            "sleep",
            "30",
        ],
    ))
    .await;
    assert_eq!(slow.status.code(), Some(1), "{}", stderr(&slow));
    assert!(
        stderr(&slow).contains("stopped after its timeout"),
        "{}",
        stderr(&slow)
    );
    assert!(
        from.elapsed() < Duration::from_secs(15),
        "stopped only after {:?}",
        from.elapsed()
    );

    // Two attempts per interval, 300 ms apart: the second runs soon after the
    // first failed, then the role waits its interval (1 h).
    let flags = [
        "flaky",
        "--once",
        "--every",
        "1h",
        "--attempts",
        "2",
        "--backoff",
        "300ms",
        "--",
    ];
    let attempt = || output(run(&url, &[&flags[..], &["sh", "-c", "exit 1"]].concat()));
    assert_eq!(attempt().await.status.code(), Some(1));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let o = attempt().await;
        match o.status.code() {
            Some(1) => break,
            Some(77) => assert!(Instant::now() < deadline, "no second attempt: {}", stderr(&o)),
            other => panic!("{other:?}: {}", stderr(&o)),
        }
    }
    let spent = attempt().await;
    assert_eq!(spent.status.code(), Some(77), "{}", stderr(&spent));
    assert!(
        stderr(&spent).contains("(in 59m"),
        "after the attempts, the interval: {}",
        stderr(&spent)
    );
}

/// The uptime (seconds) of each start a long-lived test command logged.
fn starts(log: &Path) -> Vec<f64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect()
}

/// Runs `role` long-lived with `flags`, its command exiting `code` at once,
/// until it started `n` times (within `within`); the start instants.
async fn long_lived_starts(
    url: &str,
    role: &str,
    flags: &[&str],
    code: u8,
    n: usize,
    within: Duration,
) -> Vec<f64> {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("starts");
    let script = format!("cut -d' ' -f1 /proc/uptime >> {}; exit {code}", log.display());
    let mut runner = run(url, &[&[role, "--shell"], flags, &["--", &script]].concat())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + within;
    while starts(&log).len() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = runner.start_kill();
    let _ = runner.wait().await;
    let seen = starts(&log);
    assert!(
        seen.len() >= n,
        "{} starts within {within:?}: {seen:?}",
        seen.len()
    );
    seen
}

fn gaps(starts: &[f64]) -> Vec<f64> {
    starts.windows(2).map(|w| w[1] - w[0]).collect()
}

/// Item 7: a long-lived command that keeps failing is restarted after a
/// wait doubling from --restart-backoff to --restart-backoff-max, and no
/// longer than the cap; one that exits 0 is restarted after the first wait
/// each time (its runs complete: the backoff starts over).
#[tokio::test]
async fn a_long_lived_command_is_restarted_after_a_capped_backoff_and_exit_0_starts_it_over() {
    let url = migrated_url().await;
    let failing = ["--restart-backoff", "200ms", "--restart-backoff-max", "800ms"];
    let seen = long_lived_starts(&url, "crashing", &failing, 1, 6, Duration::from_secs(40)).await;
    let gaps = gaps(&seen[..6]);
    // The database holds each restart back until its backoff has passed
    // (from the RELEASE, after the start): lower bounds are exact.
    for (gap, least) in gaps.iter().zip([0.2, 0.4, 0.8, 0.8, 0.8]) {
        assert!(*gap >= least - 0.01, "gaps {gaps:?}: one below its backoff");
    }
    // The cap: no wait grows past it (generous room for a loaded machine).
    assert!(
        gaps[3..].iter().all(|g| *g < 0.8 + 2.5),
        "gaps {gaps:?}: past the cap"
    );

    // Exit 0: were it counted as a failure, 8 starts would take 0.2 + 0.4 + … + 12.8 s.
    let clean = ["--restart-backoff", "200ms", "--restart-backoff-max", "1m"];
    let seen = long_lived_starts(&url, "recycling", &clean, 0, 8, Duration::from_secs(20)).await;
    let gaps = self::gaps(&seen[..8]);
    assert!(gaps.iter().all(|g| *g >= 0.2 - 0.01), "gaps {gaps:?}");
    assert!(gaps[6] < 6.0, "exit 0 grew the backoff: gaps {gaps:?}");
}

/// Item 7: a knob of another kind of job is refused naming the flag or
/// the key, before anything is written.
#[tokio::test]
async fn a_knob_for_another_kind_of_job_is_refused_naming_the_flag_or_the_key() {
    let url = migrated_url().await;
    for (args, says) in [
        (
            &["x", "--every", "1m", "--starting-deadline", "5s", "--", "true"][..],
            "--starting-deadline belongs to a cron schedule",
        ),
        (
            &["x", "--every", "1m", "--restart-backoff", "5s", "--", "true"][..],
            "--restart-backoff belongs to a long-lived command",
        ),
        (
            &["x", "--attempts", "3", "--", "true"][..],
            "--attempts belongs to a schedule",
        ),
        (
            &["x", "--cron", "0 * * * *", "--attempts", "101", "--", "true"][..],
            "--attempts: 101: from 1 to 100",
        ),
        (
            &[
                "x",
                "--restart-backoff",
                "10s",
                "--restart-backoff-max",
                "5s",
                "--",
                "true",
            ][..],
            "--restart-backoff-max: 5s",
        ),
        (&["x", "--timeout", "0s", "--", "true"][..], "--timeout"),
    ] {
        let o = output(run(&url, args)).await;
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.toml");
    for (body, says) in [
        (
            "every = \"1m\"\nrestart_backoff = \"5s\"\n",
            "job \"x\": restart_backoff belongs to a long-lived command",
        ),
        (
            "cron = \"0 * * * *\"\nattempts = 0\n",
            "job \"x\": attempts: 0: from 1 to 100",
        ),
        ("cron = \"0 * * * *\"\nattempts = -1\n", "job \"x\": attempts -1"),
        (
            "starting_deadline = \"5s\"\n",
            "job \"x\": starting_deadline belongs to a cron schedule",
        ),
        (
            "backoff = \"soon\"\nevery = \"1m\"\n",
            "job \"x\": backoff \"soon\"",
        ),
    ] {
        std::fs::write(&file, format!("[job.x]\ncommand = [\"true\"]\n{body}")).unwrap();
        let o = output(run(&url, &["--jobs", file.to_str().unwrap()])).await;
        assert_eq!(o.status.code(), Some(2), "{body}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{body}: {}", stderr(&o));
    }
    let client = ticklease_testkit::connect(&url.parse().unwrap()).await.unwrap();
    let rows: i64 = client
        .query_one("SELECT count(*) FROM leader_leases", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "nothing written");
}

/// Item 8: a long-running runner logs one line when a job starts and one
/// when it ends, by default, with no escape codes on a pipe.
#[tokio::test]
async fn a_job_logs_one_line_at_its_start_and_one_at_its_end_without_colour_on_a_pipe() {
    let url = migrated_url().await;
    let mut runner = run(&url, &["logged", "--every", "1h", "--", "sh", "-c", "exit 4"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(runner.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(l)) = lines.next_line().await {
            let end = l.contains("job ended");
            seen.push(l);
            if end {
                return;
            }
        }
    })
    .await;
    let _ = runner.start_kill();
    assert!(ended.is_ok(), "no end line: {seen:?}");
    let text = seen.join("\n");
    assert!(!text.contains('\u{1b}'), "escape codes on a pipe: {text:?}");
    let start = seen
        .iter()
        .find(|l| l.contains("job started"))
        .expect("a start line");
    let end = seen.last().unwrap();
    for field in ["role=logged", "token=", "occurrence=none"] {
        assert!(start.contains(field) && end.contains(field), "{field}: {text}");
    }
    for field in ["exit=4", "outcome=\"failed\"", "duration_ms="] {
        assert!(end.contains(field), "{field}: {end}");
    }
    assert!(start.contains(" INFO ") && end.contains(" INFO "), "{text}");
}

/// The stderr of `ticklease run ROLE … --once` run on a terminal (script(1)'s
/// pseudo-terminal), with `env` set.
async fn on_a_terminal(url: &str, role: &str, env: &[(&str, &str)]) -> String {
    let line = format!(
        "'{}' run --database-url '{url}' {} {role} --once --every 1h -- true",
        env!("CARGO_BIN_EXE_ticklease"),
        TIMINGS.join(" ")
    );
    let mut cmd = Command::new("script");
    cmd.args(["-q", "-e", "-c", &line, "/dev/null"])
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    let o = output(cmd).await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Item 8: colour on a terminal, none with NO_COLOR set (no-color.org).
#[tokio::test]
async fn colour_only_on_a_terminal_and_never_with_no_color() {
    let url = migrated_url().await;
    let coloured = on_a_terminal(&url, "coloured", &[]).await;
    assert!(coloured.contains("job started"), "{coloured:?}");
    assert!(
        coloured.contains('\u{1b}'),
        "a terminal gets colour: {coloured:?}"
    );
    let plain = on_a_terminal(&url, "plain", &[("NO_COLOR", "1")]).await;
    assert!(plain.contains("job started"), "{plain:?}");
    assert!(!plain.contains('\u{1b}'), "NO_COLOR: {plain:?}");
}

/// Item 10: the jobs file's keys, as `ticklease run --help` and the
/// README show them, are the keys the parser takes.
#[test]
fn every_jobs_file_key_is_in_the_help_and_the_readme() {
    let readme = include_str!("../../../README.md");
    let table = ticklease_run::jobs::keys_markdown();
    assert!(
        readme.contains(&table),
        "README's jobs table differs from KEYS:\n{table}"
    );
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for key in ticklease_run::jobs::KEYS {
        let shown = format!("  {}: {}, default {};", key.key, key.kind, key.default);
        assert!(help.contains(&shown), "run --help lacks {shown:?}");
    }
    // serde lists the keys it takes when it meets one it does not.
    let guard = [std::ffi::OsString::from("true")];
    let config = ticklease::Config::default();
    let e =
        ticklease_run::jobs::parse("[job.a]\ncommand = [\"true\"]\nzzz = 1\n", &config, &guard).unwrap_err();
    let mut taken: Vec<&str> = e.problem.split('`').skip(3).step_by(2).collect();
    let mut documented: Vec<&str> = ticklease_run::jobs::KEYS.iter().map(|k| k.key).collect();
    taken.sort_unstable();
    documented.sort_unstable();
    assert_eq!(taken, documented, "{}", e.problem);
}

/// Item 6: each run's exit status and last output lines (both streams, the
/// last 40, in the order read: the pause orders them here) are kept with
/// its history row, so `ticklease history` on any host answers "why did it
/// fail" after the runner is gone, escaped.
#[tokio::test]
async fn a_runs_exit_status_and_last_output_lines_are_kept_in_its_history_and_shown_escaped() {
    let url = migrated_url().await;
    let script =
        "for i in $(seq 1 60); do echo \"out $i\"; done; sleep 0.2; printf 'err \\033[31mred\\n' >&2; exit 3";
    let mut once = run(
        &url,
        &["dump", "--once", "--every", "1h", "--", "sh", "-c", script],
    );
    once.stdout(Stdio::null());
    let o = output(once).await;
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let mut history = Command::new(env!("CARGO_BIN_EXE_ticklease"));
    history.args(["history", "dump", "--database-url", &url]);
    let shown = String::from_utf8_lossy(&output(history).await.stdout).into_owned();
    assert!(shown.contains("dump token "), "{shown}");
    let block = &shown[shown.find("  exit 3\n").expect("the exit status, first")..];
    assert!(
        block.contains("\n  out: out 60\n  err: err \\u{1b}[31mred\n"),
        "{shown}"
    );
    assert!(block.contains("\n  out: out 22\n"), "the last 40 lines: {shown}");
    assert!(
        !block.contains("\n  out: out 21\n"),
        "no more than the last 40 lines: {shown}"
    );
}

/// Bug 3: a crontab line that starts `--once` just after its own
/// occurrence, on a role that never ran, runs that occurrence (exit 0),
/// where it used to exit 77 (not due) on every host, the first night lost.
#[tokio::test]
async fn once_from_a_crontab_just_after_the_occurrence_runs_it_on_a_new_role() {
    let url = migrated_url().await;
    // Every second: the latest occurrence is under a second old, as a
    // crontab's own minute is when it starts the line.
    let o = output(run(
        &url,
        &["dump", "--once", "--cron", "* * * * * *", "--", "true"],
    ))
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

//! `ticklease run` (issue 26) with real processes on a real Postgres, scaled
//! timings (TTL 2 s, heartbeat 300 ms, statement timeout 500 ms, abandon
//! 1.2 s, poll 200 ms): each tick's child runs on one runner at a time, and
//! its whole process group is stopped before the lease can expire, whatever
//! happens to its runner.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use ticklease_testkit::PgCluster;

use ticklease_testkit::TEST_TIMING_FLAGS as TIMINGS;
const TTL: Duration = Duration::from_secs(2);

/// A child that records its start and end (the wall clock in ns, token, runner) and keeps
/// a grandchild `sleep` in its group: `child.sh DIR HOLD_SECONDS`.
const CHILD: &str = r#"#!/bin/sh
dir=$1
echo "start $(date +%s.%N) $TICKLEASE_TOKEN $RUNNER" >> "$dir/log"
sleep 300 &
echo "$! $$" > "$dir/pids.$TICKLEASE_TOKEN"
sleep "$2"
echo "end $(date +%s.%N) $TICKLEASE_TOKEN $RUNNER" >> "$dir/log"
"#;

struct Fixture {
    url: String,
    dir: tempfile::TempDir,
    child: PathBuf,
}

async fn fixture() -> Fixture {
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    let url = cluster.url(&db);
    let migrated = std::process::Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(["migrate", "--database-url", &url])
        .output()
        .unwrap();
    assert_eq!(migrated.status.code(), Some(0));
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture {
        url,
        dir,
        child: PathBuf::new(),
    };
    f.child = f.script("child.sh", CHILD);
    f
}

impl Fixture {
    /// `ticklease run --database-url URL` with the scaled timings, then
    /// `args`; its children named runner 0; killed when dropped.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ticklease"));
        cmd.args(["run", "--database-url", &self.url])
            .args(TIMINGS)
            .args(args)
            .env("RUNNER", "0")
            .kill_on_drop(true);
        cmd
    }

    /// An executable script in the test's directory.
    fn script(&self, name: &str, body: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        path
    }

    /// The recording child, ignoring SIGTERM (and so its `sleep`s too).
    fn stubborn(&self) -> PathBuf {
        let body = format!("#!/bin/sh\ntrap '' TERM\nexec {} \"$@\"\n", self.child.display());
        self.script("stubborn.sh", &body)
    }

    /// A runner of `role` (named `n` to its children) with `flags`, running the child holding `hold` seconds.
    fn runner(&self, n: usize, role: &str, flags: &[&str], hold: &str) -> Child {
        quiet(&mut self.runner_command(n, role, flags, hold))
    }

    /// The command of [`Fixture::runner`], not yet started.
    fn runner_command(&self, n: usize, role: &str, flags: &[&str], hold: &str) -> Command {
        let mut cmd = self.command(&[role]);
        cmd.args(flags)
            .arg("--")
            .arg(&self.child)
            .arg(self.dir.path())
            .arg(hold)
            .env("RUNNER", n.to_string());
        cmd
    }

    fn log(&self) -> Vec<Vec<String>> {
        std::fs::read_to_string(self.dir.path().join("log"))
            .unwrap_or_default()
            .lines()
            .map(|l| l.split(' ').map(String::from).collect())
            .collect()
    }

    /// Waits for the `n`th start line (1-based): (token, runner).
    async fn started(&self, n: usize, within: Duration) -> (i64, usize) {
        let deadline = Instant::now() + within;
        loop {
            let starts: Vec<Vec<String>> = self.log().into_iter().filter(|l| l[0] == "start").collect();
            if let Some(s) = starts.get(n - 1) {
                return (s[2].parse().unwrap(), s[3].parse().unwrap());
            }
            assert!(
                Instant::now() < deadline,
                "start {n} not within {within:?}: {:?}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The child's and the grandchild's pids of the term `token`.
    async fn pids(&self, token: i64) -> [Pid; 2] {
        let path = self.dir.path().join(format!("pids.{token}"));
        for _ in 0..200 {
            if let Some((grandchild, child)) = std::fs::read_to_string(&path).ok().and_then(|t| {
                t.trim()
                    .split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
            }) {
                return [child, grandchild].map(|p| Pid::from_raw(p.parse().unwrap()));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no pids of term {token}");
    }
}

/// Spawns `cmd` with its output discarded.
fn quiet(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()
}

fn alive(pid: Pid) -> bool {
    // A zombie is dead for this purpose: its group's signals no longer matter.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    kill(pid, None).is_ok() && stat.split(' ').nth(2).is_none_or(|s| s != "Z")
}

/// Waits until every pid is gone; how long that took.
async fn gone(pids: &[Pid], within: Duration) -> Option<Duration> {
    let from = Instant::now();
    while from.elapsed() < within {
        if pids.iter().all(|p| !alive(*p)) {
            return Some(from.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

fn signal(child: &Child, signal: Signal) {
    kill(Pid::from_raw(child.id().unwrap() as i32), signal).unwrap();
}

async fn sql(url: &str, statement: &str) {
    let client = ticklease_testkit::connect(&url.parse().unwrap()).await.unwrap();
    client.batch_execute(statement).await.unwrap();
}

/// Three runners, one role: the children never overlap and their tokens increase.
#[tokio::test]
async fn three_runners_never_run_two_children_at_once() {
    let f = fixture().await;
    let mut runners: Vec<Child> = (1..=3)
        .map(|n| f.runner(n, "report", &["--every", "100ms"], "0.3"))
        .collect();
    f.started(6, Duration::from_secs(20)).await;
    for r in &runners {
        signal(r, Signal::SIGTERM);
    }
    for r in &mut runners {
        let _ = tokio::time::timeout(Duration::from_secs(10), r.wait()).await;
    }
    let log = f.log();
    let mut open: Option<(f64, i64)> = None;
    let mut last_token = 0;
    for line in &log {
        let (at, token): (f64, i64) = (line[1].parse().unwrap(), line[2].parse().unwrap());
        match line[0].as_str() {
            "start" => {
                assert!(open.is_none(), "a child started while {open:?} ran: {log:?}");
                assert!(token > last_token, "tokens increase: {log:?}");
                (open, last_token) = (Some((at, token)), token);
            }
            _ => {
                assert_eq!(open.map(|o| o.1), Some(token), "{log:?}");
                open = None;
            }
        }
    }
    let runners_seen: std::collections::BTreeSet<&str> = log.iter().map(|l| l[3].as_str()).collect();
    assert!(
        runners_seen.len() >= 2,
        "the role moved between runners at least once: {log:?}"
    );
}

/// SIGKILL of the runner whose child runs: the child and its grandchild are
/// gone at once (the guard's pipe closed), and the next child starts on
/// another runner within a second (coordination sessions, opted in to a
/// takeover when a session ends).
#[tokio::test]
async fn a_killed_runners_child_group_dies_and_the_next_child_starts_elsewhere() {
    let f = fixture().await;
    let direct = ["--direct-url", f.url.as_str(), "--takeover-on-session-end"];
    let mut runners: Vec<Child> = (1..=2).map(|n| f.runner(n, "relay", &direct, "30")).collect();
    let (token, runner) = f.started(1, Duration::from_secs(20)).await;
    let pids = f.pids(token).await;
    let killed_at = Instant::now();
    signal(&runners[runner - 1], Signal::SIGKILL);
    let took = gone(&pids, Duration::from_secs(3)).await;
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(1)),
        "the group outlived its runner: {took:?}"
    );
    let (next, by) = f.started(2, Duration::from_secs(5)).await;
    let next_after = killed_at.elapsed();
    assert!(
        next > token && by != runner,
        "the next term elsewhere: {:?}",
        f.log()
    );
    assert!(
        next_after < Duration::from_secs(2),
        "next child after {next_after:?}"
    );
    for r in &mut runners {
        let _ = r.start_kill();
    }
}

/// SIGSTOP of the runner whose child runs: the guard stops the group at the
/// abandon deadline it was last given, before the lease can expire; the next
/// child starts on another runner once the lease expired.
#[tokio::test]
async fn a_frozen_runners_child_group_is_stopped_before_its_lease_can_expire() {
    let f = fixture().await;
    let mut runners: Vec<Child> = (1..=2).map(|n| f.runner(n, "relay", &[], "30")).collect();
    let (token, runner) = f.started(1, Duration::from_secs(20)).await;
    let pids = f.pids(token).await;
    signal(&runners[runner - 1], Signal::SIGSTOP);
    let took = gone(&pids, Duration::from_secs(5))
        .await
        .expect("the group is stopped");
    // TERM at last_ack + abandon_after (1.2 s), KILL a grace (0.4 s) later:
    // at most 1.6 s after the last acknowledged RENEW, before the freeze.
    assert!(
        took < Duration::from_millis(1650),
        "stopped {took:?} after the freeze"
    );
    let (next, by) = f.started(2, Duration::from_secs(10)).await;
    assert!(next > token && by != runner);
    signal(&runners[runner - 1], Signal::SIGCONT);
    for r in &mut runners {
        let _ = r.start_kill();
    }
}

/// Pauses the role while its child runs; how long until the group is gone.
async fn pause_stops_the_group(coordinated: bool) -> Option<Duration> {
    let f = fixture().await;
    let direct = ["--direct-url", f.url.as_str()];
    let flags: &[&str] = if coordinated { &direct } else { &[] };
    let mut runner = f.runner(1, "relay", flags, "30");
    let (token, _) = f.started(1, Duration::from_secs(20)).await;
    let pids = f.pids(token).await;
    sql(&f.url, "SELECT leader_pause('relay', 'ops', 'maintenance')").await;
    let took = gone(&pids, Duration::from_secs(3)).await;
    let _ = runner.start_kill();
    took
}

/// Without a coordination session a pause stops the group within a
/// heartbeat (300 ms), at its next RENEW.
#[tokio::test]
async fn a_pause_stops_the_child_group_within_a_heartbeat() {
    let took = pause_stops_the_group(false).await;
    assert!(
        took.is_some_and(|t| t < Duration::from_millis(700)),
        "stopped after {took:?}"
    );
}

/// A pause stops the group at once with a coordination session.
#[tokio::test]
async fn a_pause_stops_the_child_group_at_once_with_a_coordination_session() {
    let took = pause_stops_the_group(true).await;
    assert!(
        took.is_some_and(|t| t < Duration::from_millis(600)),
        "stopped after {took:?}"
    );
}

/// A child that ignores SIGTERM is killed a grace later, still before the
/// lease can expire (its runner frozen).
#[tokio::test]
async fn a_child_ignoring_sigterm_is_killed_after_the_grace_inside_the_term() {
    let f = fixture().await;
    let stubborn = f.stubborn();
    let mut runner = quiet(
        f.command(&["relay", "--grace", "400ms", "--"])
            .arg(&stubborn)
            .arg(f.dir.path())
            .arg("30"),
    );
    let (token, _) = f.started(1, Duration::from_secs(20)).await;
    let pids = f.pids(token).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    signal(&runner, Signal::SIGSTOP);
    let took = gone(&pids, Duration::from_secs(5)).await.expect("killed");
    // TERM no earlier than abandon_after - a heartbeat after the freeze, then the grace.
    assert!(
        took >= Duration::from_millis(1200 - 300 + 400),
        "killed after {took:?}: not after the grace"
    );
    assert!(
        took < TTL - Duration::from_millis(300),
        "killed after {took:?}: past the lease"
    );
    signal(&runner, Signal::SIGCONT);
    let _ = runner.start_kill();
}

async fn once(f: &Fixture, role: &str, flags: &[&str], command: &[&str]) -> std::process::Output {
    f.command(&[role, "--once"])
        .args(flags)
        .arg("--")
        .args(command)
        .output()
        .await
        .unwrap()
}

/// `--once` exits with the child's code, or says why it did not run.
#[tokio::test]
async fn once_exits_with_the_childs_code_or_why_it_did_not_run() {
    let f = fixture().await;
    let failed = once(
        &f,
        "job",
        &["--every", "1h"],
        &["sh", "-c", "echo broken >&2; exit 3"],
    )
    .await;
    assert_eq!(failed.status.code(), Some(3), "{failed:?}");
    sql(
        &f.url,
        "UPDATE leader_leases SET not_before = NULL WHERE role = 'job'",
    )
    .await;
    assert_eq!(
        once(&f, "job", &["--every", "1h"], &["true"]).await.status.code(),
        Some(0)
    );
    assert_eq!(
        once(&f, "job", &["--every", "1h"], &["true"]).await.status.code(),
        Some(ticklease_run::exit::NOT_DUE)
    );
    let error: String = {
        let client = ticklease_testkit::connect(&f.url.parse().unwrap()).await.unwrap();
        client
            .query_one(
                "SELECT error FROM leader_history WHERE role = 'job' AND outcome = 'failed'",
                &[],
            )
            .await
            .unwrap()
            .get(0)
    };
    assert!(error.contains("exit 3") && error.contains("broken"), "{error}");
    sql(&f.url, "SELECT leader_pause('job', 'ops', '')").await;
    assert_eq!(
        once(&f, "job", &["--every", "1h"], &["true"]).await.status.code(),
        Some(ticklease_run::exit::PAUSED)
    );
    let mut holder = f.runner(1, "held", &[], "30");
    f.started(1, Duration::from_secs(20)).await;
    assert_eq!(
        once(&f, "held", &[], &["true"]).await.status.code(),
        Some(ticklease_run::exit::HELD)
    );
    let _ = holder.start_kill();
    // Lost mid-run: paused while its child runs.
    let url = f.url.clone();
    let pause = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        sql(&url, "SELECT leader_pause('long', 'ops', '')").await;
    });
    let lost = once(&f, "long", &[], &["sleep", "30"]).await;
    pause.await.unwrap();
    assert_eq!(lost.status.code(), Some(ticklease_run::exit::LOST), "{lost:?}");
}

/// The child's fenced claim with its environment's token passes in its
/// term and writes nothing once another term took over; the child is told
/// the server its term started on (`TICKLEASE_DB_HOST`, `TICKLEASE_DB_PORT`).
#[tokio::test]
async fn a_psql_childs_fenced_claim_passes_in_its_term_and_not_after_a_takeover() {
    let f = fixture().await;
    sql(
        &f.url,
        "CREATE TABLE claims (token bigint); GRANT INSERT ON claims TO PUBLIC",
    )
    .await;
    let claim = "INSERT INTO claims SELECT :token WHERE (SELECT leader_fence_v2(:'role', :token))";
    // As `ticklease run --help` writes it: the connection to the term's server.
    let config: tokio_postgres::Config = f.url.parse().unwrap();
    let script = format!(
        "echo \"{claim}\" | psql -X -q -v ON_ERROR_STOP=1 \
         \"host=$TICKLEASE_DB_HOST port=$TICKLEASE_DB_PORT ${{TICKLEASE_DB_HOSTADDR:+hostaddr=$TICKLEASE_DB_HOSTADDR}} \
           dbname={db} user={user}\" -v role=\"$TICKLEASE_ROLE\" -v token=\"$TICKLEASE_TOKEN\" \
         && echo $TICKLEASE_TOKEN > {dir}/token && echo \"$TICKLEASE_DB_HOST:$TICKLEASE_DB_PORT\" > {dir}/server",
        db = config.get_dbname().unwrap(),
        user = config.get_user().unwrap(),
        dir = f.dir.path().display()
    );
    let ran = once(&f, "ledger", &["--shell", "--every", "10ms"], &[&script]).await;
    assert_eq!(ran.status.code(), Some(0), "{ran:?}");
    let token = std::fs::read_to_string(f.dir.path().join("token")).unwrap();
    // The child is told the server its term started on.
    let server = std::fs::read_to_string(f.dir.path().join("server")).unwrap();
    let port = PgCluster::shared().port();
    assert_eq!(server.trim(), format!("127.0.0.1:{port}"));
    let client = ticklease_testkit::connect(&f.url.parse().unwrap()).await.unwrap();
    let claimed: i64 = client
        .query_one("SELECT count(*) FROM claims", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(claimed, 1, "the claim passed in its term");
    // A later term (another run), then the old token's claim, as a frozen host would send it.
    assert_eq!(
        once(&f, "ledger", &["--shell", "--every", "10ms"], &["true"])
            .await
            .status
            .code(),
        Some(0)
    );
    let mut late = Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", "role=ledger", "-v"])
        .arg(format!("token={}", token.trim()))
        .arg(&f.url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use tokio::io::AsyncWriteExt;
    let mut stdin = late.stdin.take().unwrap();
    stdin.write_all(claim.as_bytes()).await.unwrap();
    drop(stdin);
    let late = late.wait_with_output().await.unwrap();
    assert_eq!(late.status.code(), Some(0), "{late:?}");
    let claimed: i64 = client
        .query_one("SELECT count(*) FROM claims", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(claimed, 1, "the old term's claim wrote nothing");
}

/// Usage errors exit 2 before anything is written.
#[tokio::test]
async fn usage_errors_exit_2_and_write_nothing() {
    let f = fixture().await;
    let run = |args: &[&str]| {
        let mut cmd = f.command(&["nothing"]);
        cmd.args(args);
        async move { cmd.output().await.unwrap() }
    };
    for (args, says) in [
        (&["true"][..], "unexpected argument"),
        (&["--", "no-such-command-here"][..], "not found in PATH"),
        (&["--cron", "61 * * * *", "--", "true"][..], "--cron"),
        (
            &["--cron", "0 * * * *", "--zone", "Mars/Olympus", "--", "true"][..],
            "--zone",
        ),
        (&["--grace", "900ms", "--", "true"][..], "--grace"),
        (&["--grace", "0s", "--", "true"][..], "--grace"),
        (&["--every", "0s", "--", "true"][..], "interval"),
    ] {
        let o = run(args).await;
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let client = ticklease_testkit::connect(&f.url.parse().unwrap()).await.unwrap();
    let rows: i64 = client
        .query_one("SELECT count(*) FROM leader_leases WHERE role = 'nothing'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "nothing written");
}

/// A jobs file runs each of its roles' commands in one process; a bad file
/// is refused whole (exit 2), naming the job and the key, before anything
/// is written.
#[tokio::test]
async fn a_jobs_file_runs_each_role_and_a_bad_one_is_refused_naming_the_job_and_key() {
    let f = fixture().await;
    let file = f.dir.path().join("jobs.toml");
    let out = f.dir.path().display().to_string();
    std::fs::write(
        &file,
        format!(
            "[job.sweep]\ncommand = [\"sh\", \"-c\", \"echo sweep $TICKLEASE_TOKEN >> {out}/jobs.log\"]\nevery = \"100ms\"\n\n\
             [job.report]\nshell = \"echo report $GREETING $(pwd) >> {out}/jobs.log\"\nevery = \"100ms\"\n\
             dir = \"/tmp\"\nenv = {{ GREETING = \"hello\" }}\n"
        ),
    )
    .unwrap();
    let jobs = file.to_str().unwrap();
    let mut runner = quiet(&mut f.command(&["--jobs", jobs]));
    let log = f.dir.path().join("jobs.log");
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if (text.contains("sweep ") && text.contains("report hello /tmp")) || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    signal(&runner, Signal::SIGTERM);
    let _ = tokio::time::timeout(Duration::from_secs(10), runner.wait()).await;
    assert!(
        text.contains("sweep ") && text.contains("report hello /tmp"),
        "{text}"
    );

    // A job past its timeout is stopped, and its tick recorded as failed by it.
    std::fs::write(
        &file,
        "[job.slow]\ncommand = [\"sleep\", \"30\"]\ntimeout = \"300ms\"\nevery = \"1h\"\n",
    )
    .unwrap();
    let mut slow = quiet(&mut f.command(&["--jobs", jobs]));
    let client = ticklease_testkit::connect(&f.url.parse().unwrap()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let error: String = loop {
        let rows = client
            .query(
                "SELECT error FROM leader_history WHERE role = 'slow' AND outcome = 'failed'",
                &[],
            )
            .await
            .unwrap();
        if let Some(row) = rows.first() {
            break row.get(0);
        }
        assert!(Instant::now() < deadline, "no failed tick of the slow job");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = slow.start_kill();
    assert!(error.contains("timeout"), "{error}");

    for (body, says) in [
        (
            "[job.a]\ncommand = [\"true\"]\nevry = \"1s\"\n",
            "job \"a\": unknown field `evry`",
        ),
        ("[job.a]\nevery = \"1s\"\n", "job \"a\": exactly one of command"),
        (
            "[job.a]\ncommand = [\"true\"]\ncron = \"99 * * * *\"\n",
            "job \"a\": cron",
        ),
        (
            "[job.a]\ncommand = [\"true\"]\n[job.b]\ncommand = [\"no-such-command-here\"]\n",
            "job \"b\": command",
        ),
        (
            "[job.a]\ncommand = [\"true\"]\ngrace = \"5s\"\n",
            "job \"a\": grace",
        ),
        (
            "[job.a]\ncommand = [\"true\"]\ndir = \"/no/such/dir\"\n",
            "job \"a\": dir",
        ),
        ("[jobs.a]\ncommand = [\"true\"]\n", "unknown key \"jobs\""),
    ] {
        std::fs::write(&file, body).unwrap();
        let o = f.command(&["--jobs", jobs]).output().await.unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{body}: {err}");
        assert!(err.contains(says), "{body}: {err}");
    }
    let client = ticklease_testkit::connect(&f.url.parse().unwrap()).await.unwrap();
    let rows: i64 = client
        .query_one("SELECT count(*) FROM leader_leases WHERE role IN ('a', 'b')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "nothing written");
}

fn spawn_once(f: &Fixture, role: &str, command: &[&str]) -> Child {
    quiet(f.command(&[role, "--once", "--"]).args(command))
}

async fn exit_within(child: &mut Child, within: Duration) -> Option<i32> {
    let status = tokio::time::timeout(within, child.wait()).await;
    status.ok().and_then(|s| s.ok()).and_then(|s| s.code())
}

/// Output that is not UTF-8, and more of it than a pipe holds, passes
/// through (review finding: one invalid byte stopped the reading, and the
/// child then blocked on a full pipe with its term held for ever).
#[tokio::test]
async fn a_child_writing_bytes_that_are_not_utf8_is_read_to_its_end() {
    let f = fixture().await;
    let script = r"printf 'caf\351\n' >&2; head -c 300000 /dev/zero | tr '\0' x >&2; exit 4";
    let mut run = spawn_once(&f, "bytes", &["sh", "-c", script]);
    assert_eq!(exit_within(&mut run, Duration::from_secs(20)).await, Some(4));
}

/// A descendant that leaves the child's group (setsid) neither hangs the
/// runner on the pipes it holds nor outlives the tick (review finding).
#[tokio::test]
async fn a_descendant_that_left_the_group_is_killed_and_does_not_hang_the_runner() {
    let f = fixture().await;
    let pidfile = f.dir.path().join("escaped");
    let script = format!(
        "setsid sleep 60 & echo $! > {}; sleep 0.2; exit 0",
        pidfile.display()
    );
    let mut run = spawn_once(&f, "escape", &["sh", "-c", &script]);
    assert_eq!(exit_within(&mut run, Duration::from_secs(10)).await, Some(0));
    let escaped: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    let dead = gone(&[Pid::from_raw(escaped)], Duration::from_secs(2)).await;
    assert!(dead.is_some(), "the escaped sleep outlived the tick");
}

/// `--once` on SIGTERM stops its child and releases the term as
/// interrupted, exiting 130 (review finding: it died holding the lease).
#[tokio::test]
async fn once_on_sigterm_stops_its_child_releases_and_exits_130() {
    let f = fixture().await;
    let (child, dir) = (f.child.to_str().unwrap(), f.dir.path().to_str().unwrap());
    let mut run = spawn_once(&f, "long", &[child, dir, "30"]);
    let (token, _) = f.started(1, Duration::from_secs(20)).await;
    let pids = f.pids(token).await;
    signal(&run, Signal::SIGTERM);
    let code = exit_within(&mut run, Duration::from_secs(5)).await;
    assert_eq!(code, Some(ticklease_run::exit::INTERRUPTED));
    assert!(gone(&pids, Duration::from_secs(1)).await.is_some());
    let client = ticklease_testkit::connect(&f.url.parse().unwrap()).await.unwrap();
    let row = client
        .query_one("SELECT held FROM leader_status WHERE role = 'long'", &[])
        .await
        .unwrap();
    assert!(!row.get::<_, bool>(0), "released");
}

/// Ctrl-Z (SIGTSTP to the runner's process group) stops the runner, not the
/// guard: the child's group is stopped before the lease can expire (review
/// finding: the guard stopped too and the child ran on unwatched).
#[tokio::test]
async fn a_runner_stopped_by_ctrl_z_still_has_its_child_stopped_before_the_lease_expires() {
    let f = fixture().await;
    let mut runner = quiet(
        f.command(&["relay", "--"])
            .arg(&f.child)
            .arg(f.dir.path())
            .arg("30")
            .process_group(0),
    );
    let (token, _) = f.started(1, Duration::from_secs(20)).await;
    let pids = f.pids(token).await;
    let group = Pid::from_raw(runner.id().unwrap() as i32);
    nix::sys::signal::killpg(group, Signal::SIGTSTP).unwrap();
    let took = gone(&pids, Duration::from_secs(5)).await;
    assert!(
        took.is_some_and(|t| t < Duration::from_millis(1650)),
        "stopped after {took:?}"
    );
    let _ = nix::sys::signal::killpg(group, Signal::SIGCONT);
    let _ = runner.start_kill();
}

/// A lost term is released only once its child's group is gone: the next
/// child never starts while the last one still runs its grace (review
/// finding: RELEASE freed the row at once, and a child that ignored SIGTERM
/// ran beside the next one).
#[tokio::test]
async fn a_lost_terms_group_is_gone_before_the_next_child_starts() {
    let f = fixture().await;
    let log = f.dir.path().join("alive");
    let body = format!(
        "#!/bin/sh\ntrap '' TERM\nwhile true; do echo \"$(date +%s.%N) $TICKLEASE_TOKEN\" >> {}; sleep 0.05; done\n",
        log.display()
    );
    let stubborn = f.script("alive.sh", &body);
    let mut runner = quiet(
        f.command(&["ovl", "--every", "100ms", "--grace", "700ms", "--"])
            .arg(&stubborn),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&log).unwrap_or_default().is_empty() {
        assert!(Instant::now() < deadline, "no child");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // RENEWs wait behind a row lock past abandon_after: the term is lost.
    let client = ticklease_testkit::connect(&f.url.parse().unwrap()).await.unwrap();
    client
        .batch_execute(
            "BEGIN; SELECT 1 FROM leader_leases WHERE role = 'ovl' FOR UPDATE; SELECT pg_sleep(1.4); COMMIT",
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _ = runner.start_kill();
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<(f64, &str)> = text
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(t, k)| (t.parse().unwrap(), k)))
        .collect();
    let first = lines[0].1;
    let last_of_first = lines
        .iter()
        .filter(|l| l.1 == first)
        .map(|l| l.0)
        .fold(0.0, f64::max);
    let next = lines.iter().find(|l| l.1 != first).map(|l| l.0);
    let next = next.expect("a next child after the loss");
    assert!(
        next >= last_of_first,
        "the next child started at {next} while the lost one ran until {last_of_first}"
    );
}

/// The child's last words reach the history even without a newline
/// (review finding: a partial line read when another branch of the
/// runner's select won was dropped with its future).
#[tokio::test]
async fn a_childs_last_words_without_a_newline_reach_the_history() {
    let f = fixture().await;
    let client = ticklease_testkit::connect(&f.url.parse().unwrap()).await.unwrap();
    for n in 0..5 {
        let role = format!("words{n}");
        let mut run = spawn_once(&f, &role, &["sh", "-c", "printf 'fatal: bad config' >&2; exit 1"]);
        assert_eq!(exit_within(&mut run, Duration::from_secs(10)).await, Some(1));
        let error: String = client
            .query_one(
                "SELECT error FROM leader_history WHERE role = $1 AND outcome = 'failed'",
                &[&role],
            )
            .await
            .unwrap()
            .get(0);
        assert!(error.contains("fatal: bad config"), "run {n}: {error}");
    }
}

/// A dead runner's child gets SIGKILL at once, whatever its grace (review
/// finding: with a coordination session the next child starts within
/// milliseconds, so a child handling SIGTERM slowly ran beside it).
#[tokio::test]
async fn a_dead_runners_child_is_killed_at_once_without_its_grace() {
    let f = fixture().await;
    let stubborn = f.stubborn();
    let runner = quiet(
        f.command(&["relay", "--grace", "700ms", "--"])
            .arg(&stubborn)
            .arg(f.dir.path())
            .arg("30"),
    );
    let (token, _) = f.started(1, Duration::from_secs(20)).await;
    let pids = f.pids(token).await;
    signal(&runner, Signal::SIGKILL);
    let took = gone(&pids, Duration::from_secs(3)).await;
    assert!(
        took.is_some_and(|t| t < Duration::from_millis(300)),
        "gone after {took:?}"
    );
}

/// Orphans of the child's tree that come back to the guard are reaped while
/// the child runs (review finding: they piled up as zombies until it ended).
#[tokio::test]
async fn orphans_that_come_back_to_the_guard_are_reaped_while_the_child_runs() {
    let f = fixture().await;
    let ppid = f.dir.path().join("guard");
    let script = format!(
        "echo $PPID > {}; for i in 1 2 3 4 5 6 7 8 9 10; do ( sleep 0.01 & ); done; sleep 30",
        ppid.display()
    );
    let mut run = spawn_once(&f, "orphans", &["sh", "-c", &script]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ppid.exists() {
        assert!(Instant::now() < deadline, "the child never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let guard = std::fs::read_to_string(&ppid).unwrap().trim().to_owned();
    let zombies = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            let rest: Vec<&str> = stat
                .rsplit(')')
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .collect();
            rest.first() == Some(&"Z") && rest.get(1) == Some(&guard.as_str())
        })
        .count();
    let _ = run.start_kill();
    assert_eq!(zombies, 0, "zombies under the guard {guard}");
}

/// The clock the recording child logs with: the wall clock to the
/// nanosecond (`date +%s.%N`). `/proc/uptime` counts in 10 ms, too coarse
/// to order a group's death and the next start in one slot (CI once saw
/// both at the same 10 ms).
fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The instant of the `n`th start line.
fn start_at(f: &Fixture, n: usize) -> f64 {
    let starts: Vec<Vec<String>> = f.log().into_iter().filter(|l| l[0] == "start").collect();
    starts[n - 1][1].parse().unwrap()
}

/// The first child's group dies before the second child starts: waits for
/// the group to be gone, then for the next start, and compares the two on
/// one clock. The group's death is seen up to a poll (5 ms) late, never early.
async fn gone_before_the_next_starts(f: &Fixture, pids: &[Pid], within: Duration) {
    gone(pids, within)
        .await
        .unwrap_or_else(|| panic!("the first group outlived {within:?}: {:?}", f.log()));
    let seen_gone = now_s();
    f.started(2, Duration::from_secs(10)).await;
    let next = start_at(f, 2);
    assert!(
        next > seen_gone,
        "the next child started at {next} while the last one's group ran until {seen_gone}: {:?}",
        f.log()
    );
}

/// Issue 32, item 2: a link cut on one side. Postgres ends runner A's
/// sessions (as a server-side keepalive would) while A's own sockets stay
/// open and silent (the proxy forwards nothing). With `--direct-url` (no
/// opt-in) B waits for A's lease: A's group is gone before B's child starts.
#[tokio::test]
async fn a_runner_cut_off_on_the_servers_side_runs_no_child_beside_the_next_one() {
    let f = fixture().await;
    let upstream = f
        .url
        .split('@')
        .nth(1)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let proxy = ticklease_testkit::FaultProxy::start(upstream).await.unwrap();
    let proxied = f
        .url
        .replace(&upstream.to_string(), &format!("127.0.0.1:{}", proxy.port()));
    // A reaches Postgres through the proxy only.
    let mut a = Command::new(env!("CARGO_BIN_EXE_ticklease"));
    a.args(["run", "--database-url", &proxied])
        .args(TIMINGS)
        .args(["relay", "--direct-url", &proxied, "--"])
        .arg(&f.child)
        .arg(f.dir.path())
        .arg("30")
        .env("RUNNER", "1")
        .kill_on_drop(true);
    let mut a = quiet(&mut a);
    let (token, runner) = f.started(1, Duration::from_secs(20)).await;
    assert_eq!(runner, 1);
    let pids = f.pids(token).await;
    let mut b = f.runner(2, "relay", &["--direct-url", f.url.as_str()], "30");
    proxy.set(ticklease_testkit::Fault::Blackhole);
    let a_pid = a.id().unwrap();
    sql(
        &f.url,
        &format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE application_name LIKE 'ticklease %:{a_pid}' AND datname = current_database()"
        ),
    )
    .await;
    gone_before_the_next_starts(&f, &pids, Duration::from_secs(5)).await;
    let _ = (a.start_kill(), b.start_kill());
}

/// Issue 32, item 2: every session of both runners ended at once (a
/// Postgres restart, as far as they can tell, or pg_terminate_backend):
/// the holder, still running, renews on, and no second child starts.
#[tokio::test]
async fn sessions_ended_by_the_server_start_no_second_child_while_the_first_runs() {
    let f = fixture().await;
    let direct = ["--direct-url", f.url.as_str()];
    let mut runners: Vec<Child> = (1..=2).map(|n| f.runner(n, "relay", &direct, "30")).collect();
    let (token, _) = f.started(1, Duration::from_secs(20)).await;
    let pids = f.pids(token).await;
    let db = f.url.rsplit('/').next().unwrap();
    let ended = PgCluster::shared().terminate_backends(db).await.unwrap();
    assert!(ended >= 4, "both runners' sessions ended ({ended})");
    tokio::time::sleep(TTL * 2).await;
    let starts = f.log().iter().filter(|l| l[0] == "start").count();
    assert_eq!(
        starts,
        1,
        "a second child started beside the first: {:?}",
        f.log()
    );
    assert!(pids.iter().all(|p| alive(*p)), "the holder's child runs on");
    for r in &mut runners {
        let _ = r.start_kill();
    }
}

/// Issue 32, item 4: SIGSTOP to the runner's whole process group (`kill
/// -STOP -PGID`, a shell's `kill -STOP %1`). The guard leads a group of its
/// own, so it still stops the child by the abandon deadline, and the next
/// child starts only after that.
#[tokio::test]
async fn a_stopped_process_group_of_the_runner_still_has_its_child_stopped_before_the_next_starts() {
    let f = fixture().await;
    let mut a = f.runner_command(1, "relay", &[], "30");
    let mut a = quiet(a.process_group(0));
    let (token, _) = f.started(1, Duration::from_secs(20)).await;
    let pids = f.pids(token).await;
    let mut b = f.runner(2, "relay", &[], "30");
    let group = Pid::from_raw(-(a.id().unwrap() as i32));
    kill(group, Signal::SIGSTOP).unwrap();
    gone_before_the_next_starts(&f, &pids, TTL).await;
    kill(group, Signal::SIGCONT).unwrap();
    let _ = (a.start_kill(), b.start_kill());
}

/// The guard of the child whose pids were recorded for `token`.
fn guard_of(child: Pid) -> Pid {
    let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap();
    let ppid = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap();
    Pid::from_raw(ppid.parse().unwrap())
}

/// Issue 32, item 4: SIGSTOP of the guard alone, then a pause and an
/// unpause half a second later. The runner kills the group the stopped
/// guard cannot (by its deadline plus the grace, plus a margin before the
/// lease), and the next term waits for the paused term's lease or its
/// release: the next child starts only once the group is gone.
#[tokio::test]
async fn a_stopped_guard_paused_and_unpaused_runs_no_child_beside_the_next_one() {
    let f = fixture().await;
    let mut a = f.runner(1, "relay", &[], "30");
    let (token, _) = f.started(1, Duration::from_secs(20)).await;
    let pids = f.pids(token).await;
    let mut b = f.runner(2, "relay", &[], "30");
    let guard = guard_of(pids[0]);
    kill(guard, Signal::SIGSTOP).unwrap();
    sql(&f.url, "SELECT leader_pause('relay', 'ops', 'drill')").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    sql(&f.url, "SELECT leader_unpause('relay')").await;
    gone_before_the_next_starts(&f, &pids, TTL * 2).await;
    let _ = kill(guard, Signal::SIGCONT);
    let _ = (a.start_kill(), b.start_kill());
}

/// Issue 32, item 5: a child that builds a chain of 120 `setsid`'d
/// descendants, each the parent of the next, then exits 0. The guard kills
/// the whole tree it finds each round: none outlives the tick.
#[tokio::test]
async fn a_deep_chain_of_setsid_descendants_does_not_outlive_the_tick() {
    let f = fixture().await;
    let out = f.dir.path().join("chain");
    let link = f.script(
        "link.sh",
        "#!/bin/sh\necho $$ >> \"$2\"\n[ \"$1\" -gt 0 ] && setsid \"$0\" $(($1 - 1)) \"$2\" &\nexec sleep 300\n",
    );
    let top = format!(
        "setsid {} 119 {out} >/dev/null 2>&1 & while [ \"$(wc -l < {out} 2>/dev/null || echo 0)\" -lt 120 ]; do sleep 0.05; done",
        link.display(),
        out = out.display()
    );
    let ran = once(&f, "chain", &["--shell"], &[&top]).await;
    assert_eq!(ran.status.code(), Some(0), "{ran:?}");
    let chain: Vec<Pid> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|p| Pid::from_raw(p.parse().unwrap()))
        .collect();
    assert_eq!(chain.len(), 120);
    let left = gone(&chain, Duration::from_secs(2)).await;
    let alive_after: Vec<&Pid> = chain.iter().filter(|p| alive(**p)).collect();
    assert!(
        left.is_some(),
        "{} of 120 outlived the tick: {alive_after:?}",
        alive_after.len()
    );
    for p in alive_after {
        let _ = kill(*p, Signal::SIGKILL);
    }
}

/// Issue 32, item 7: the runner's stderr is a pipe no one reads (a stalled
/// log shipper) and the child writes a megabyte to it: the runner renews
/// on, its term live for three leases' time.
#[tokio::test]
async fn a_full_stderr_pipe_delays_no_renewal() {
    let f = fixture().await;
    let flood = format!(
        "echo start >> {dir}/flood; head -c 1000000 /dev/zero | tr '\\0' 'x' >&2; echo >&2; \
         for i in $(seq 2000); do echo more output line $i >&2; done; sleep 30",
        dir = f.dir.path().display()
    );
    let mut runner = f
        .command(&["flood", "--shell", "--", &flood])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut unread = runner.stderr.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f.dir.path().join("flood").exists() {
        assert!(Instant::now() < deadline, "the child never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let client = ticklease_testkit::connect(&f.url.parse().unwrap()).await.unwrap();
    let token: i64 = client
        .query_one("SELECT holder_token FROM leader_leases WHERE role = 'flood'", &[])
        .await
        .unwrap()
        .get(0);
    let watched = Instant::now();
    while watched.elapsed() < TTL * 3 {
        let live: bool = client
            .query_one(
                "SELECT holder_token = $1 AND expires_at > now() FROM leader_leases WHERE role = 'flood'",
                &[&token],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            live,
            "the term expired {:?} after the flood began",
            watched.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Read at last: what was dropped is said, once the pipe drains.
    let said = tokio::time::timeout(Duration::from_secs(10), async {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(&mut unread).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("pieces of output dropped: this stream was not read") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(said, Ok(true), "the drops were reported");
    let _ = runner.start_kill();
}

/// The runner's own lines escape what a child wrote (issue 41: a child's raw
/// escape sequences reached the runner's `WARN … tick failed … error=` line):
/// the failed tick's line shows them escaped by the one rule.
#[tokio::test]
async fn the_runner_s_tick_failed_line_shows_the_child_s_escape_sequences_escaped() {
    let f = fixture().await;
    let script = r"printf 'bad \033]0;pwned\007\033[2J\342\200\256done\n' >&2; exit 3";
    let run = f
        .command(&["escaping", "--once", "--", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(30), run.wait_with_output())
        .await
        .expect("the run ends")
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    let line = said
        .lines()
        .find(|l| l.contains("tick failed"))
        .unwrap_or_else(|| panic!("no tick failed line: {said:?}"));
    assert!(!line.contains(['\u{1b}', '\u{7}', '\u{202e}']), "{line:?}");
    assert!(
        line.contains(r"\u{1b}]0;pwned\u{7}\u{1b}[2J\u{202e}done"),
        "{line}"
    );
}

/// libpq's host list in a URL's query (`?host=a,b&hostaddr=…&port=p,q`) is
/// read as libpq reads it (issue 41: it was one host named `a,b`, and a child
/// was told `TICKLEASE_DB_HOST=a,b`): the first host refuses, the second
/// answers, and the child is told the second.
#[tokio::test]
async fn a_url_s_host_list_in_its_query_reaches_the_host_that_answers_and_the_child_is_told_it() {
    let f = fixture().await;
    let port = PgCluster::shared().port();
    let db = f.url.rsplit('/').next().unwrap().split('?').next().unwrap();
    let url = format!("postgres://postgres@/{db}?host=db-a,db-b&hostaddr=127.0.0.1,127.0.0.1&port=1,{port}");
    let out = Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(["run", "--database-url", &url])
        .args(TIMINGS)
        .args(["hosts", "--once", "--shell", "--every", "1h", "--"])
        .arg("echo \"$TICKLEASE_DB_HOST $TICKLEASE_DB_HOSTADDR $TICKLEASE_DB_PORT\"")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(said.trim(), format!("db-b 127.0.0.1 {port}"), "{out:?}");
}

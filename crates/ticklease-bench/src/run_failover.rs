//! `ticklease run` under its runner's failure (issue 26): two runners of
//! one role on one machine, the child a long `sleep`; the runner whose child
//! runs is SIGKILLed or SIGSTOPped, or the server ends its sessions
//! (`pg_terminate_backend`), each with `--direct-url` alone (the default:
//! takeover at the lease's expiry) and with `--takeover-on-session-end`
//! (issue 32: the opt-in whose overlap is measured here). Per trial: the
//! failure → the child's process gone, → the next child started by the
//! other runner, and how long both ran at once. Beside
//! it, what the usual tools do to the same child on SIGKILL of their
//! process: `flock` (a lock file) and a session advisory lock (the bench's
//! own `advisory-holder`, as sqlx's advisory lock or `pg_try_advisory_lock`
//! scripts do). Default timings; a baseline outcome not seen within its
//! wait is reported as never.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use ticklease_testkit::PgCluster;

use crate::stats::summarize;

/// How long a baseline's outcome is waited for before it counts as never.
const BASELINE_WAIT: Duration = Duration::from_secs(3);

/// What failed, and under which tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    TickleaseKill,
    TickleaseStop,
    TickleaseSessionsEnded,
    FastKill,
    FastSessionsEnded,
    FlockKill,
    AdvisoryKill,
}

impl Case {
    pub const ALL: [Case; 7] = [
        Case::TickleaseKill,
        Case::TickleaseStop,
        Case::TickleaseSessionsEnded,
        Case::FastKill,
        Case::FastSessionsEnded,
        Case::FlockKill,
        Case::AdvisoryKill,
    ];

    fn label(self) -> &'static str {
        match self {
            Case::TickleaseKill => "ticklease run, runner SIGKILL",
            Case::TickleaseStop => "ticklease run, runner SIGSTOP",
            Case::TickleaseSessionsEnded => "ticklease run, runner's sessions ended",
            Case::FastKill => "--takeover-on-session-end, runner SIGKILL",
            Case::FastSessionsEnded => "--takeover-on-session-end, runner's sessions ended",
            Case::FlockKill => "flock, holder SIGKILL",
            Case::AdvisoryKill => "session advisory lock, holder SIGKILL",
        }
    }

    fn ticklease(self) -> bool {
        !matches!(self, Case::FlockKill | Case::AdvisoryKill)
    }

    fn fast(self) -> bool {
        matches!(self, Case::FastKill | Case::FastSessionsEnded)
    }

    /// How long the outcomes are waited for: a baseline's briefly; a
    /// runner whose sessions alone ended renews on, so its role is not
    /// taken over by default (never, within a lease and a half).
    fn wait(self) -> Duration {
        match self {
            Case::FlockKill | Case::AdvisoryKill => BASELINE_WAIT,
            Case::TickleaseSessionsEnded | Case::FastSessionsEnded => Duration::from_secs(15),
            _ => Duration::from_secs(30),
        }
    }
}

/// One trial: ms to the child's death and to the next child (`None`: not within the wait).
#[derive(Debug, Clone, Copy)]
pub struct Trial {
    pub case: Case,
    pub child_dead_ms: Option<f64>,
    pub next_started_ms: Option<f64>,
}

impl Trial {
    /// How long both children ran at once (to the end of the wait if the
    /// first never died); 0 when the next started after the first was gone.
    fn overlap_ms(&self) -> Option<f64> {
        let next = self.next_started_ms?;
        let gone = self.child_dead_ms.unwrap_or(ms(self.case.wait()));
        Some((gone - next).max(0.0))
    }
}

/// Runs `trials` of each case with the `ticklease` binary at `exe`; `me` is this bench's binary.
pub async fn run(exe: &Path, me: &Path, trials: usize) -> anyhow::Result<Vec<Trial>> {
    let cluster = PgCluster::start_with(&ticklease_sandbox::ClusterOptions::default())?;
    let db = cluster.create_database().await?;
    let url = cluster.url(&db);
    let migrated = Command::new(exe)
        .args(["migrate", "--database-url", &url])
        .output()
        .await?;
    anyhow::ensure!(migrated.status.success(), "migrate: {migrated:?}");
    let dir = tempfile::tempdir()?;
    let mut out = Vec::new();
    for case in Case::ALL {
        for i in 0..trials {
            let log = dir.path().join(format!("{case:?}-{i}.log"));
            let child = format!("echo start $$ >> {}; exec sleep 300", log.display());
            let spawn = |n: usize| -> anyhow::Result<Child> {
                let mut cmd = holder_command(case, exe, me, &url, dir.path(), i, &child);
                cmd.env("N", n.to_string())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .kill_on_drop(true);
                Ok(cmd.spawn()?)
            };
            let first = spawn(1)?;
            let pid = wait_start(&log, 1, Duration::from_secs(30))
                .await
                .context("first child")?;
            let second = spawn(2)?;
            // Which holder runs it: the first runner, unless the second won the race.
            let holder = holder_of(pid, &[&first, &second]);
            let mut runners = [first, second];
            let victim = runners[holder].id().unwrap_or_default();
            let at = Instant::now();
            fail(case, victim, &url).await?;
            let (dead, next) = watch(pid, &log, at, case.wait()).await;
            out.push(Trial {
                case,
                child_dead_ms: dead,
                next_started_ms: next,
            });
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            for r in &mut runners {
                if let Some(id) = r.id() {
                    let _ = kill(Pid::from_raw(id as i32), Signal::SIGCONT);
                }
                let _ = r.start_kill();
                let _ = r.wait().await;
            }
            let _ = Command::new("pkill")
                .args(["-f", &log.display().to_string()])
                .status()
                .await;
        }
    }
    Ok(out)
}

/// The command that holds trial `i`'s job and runs `child` under `case`'s tool.
fn holder_command(
    case: Case,
    exe: &Path,
    me: &Path,
    url: &str,
    dir: &Path,
    i: usize,
    child: &str,
) -> Command {
    match case {
        _ if case.ticklease() => {
            let mut c = Command::new(exe);
            c.args([
                "run",
                &format!("job{i}"),
                "--database-url",
                url,
                "--direct-url",
                url,
            ]);
            if case.fast() {
                c.arg("--takeover-on-session-end");
            }
            c.args(["--", "sh", "-c", child]);
            c
        }
        Case::FlockKill => {
            let mut c = Command::new("flock");
            c.arg(dir.join(format!("lock{i}"))).args(["sh", "-c", child]);
            c
        }
        _ => {
            let mut c = Command::new(me);
            c.args(["advisory-holder", url, &i.to_string(), "--", "sh", "-c", child]);
            c
        }
    }
}

/// The failure of `case` to the runner (or holder) `victim`.
async fn fail(case: Case, victim: u32, url: &str) -> anyhow::Result<()> {
    match case {
        Case::TickleaseSessionsEnded | Case::FastSessionsEnded => {
            let client = ticklease_testkit::connect(&url.parse()?).await?;
            let pattern = format!("ticklease %:{victim}");
            let ended: i64 = client
                .query_one(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE $1",
                    &[&pattern],
                )
                .await?
                .get(0);
            anyhow::ensure!(ended > 0, "no session of runner {victim} to end");
        }
        Case::TickleaseStop => kill(Pid::from_raw(victim as i32), Signal::SIGSTOP)?,
        _ => kill(Pid::from_raw(victim as i32), Signal::SIGKILL)?,
    }
    Ok(())
}

fn holder_of(child: i32, runners: &[&Child; 2]) -> usize {
    // The child's parent is the guard (ticklease) or the holder itself.
    let parent = |pid: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
    };
    let mut at = Some(child);
    for _ in 0..4 {
        let Some(pid) = at else { break };
        if let Some(i) = runners.iter().position(|r| r.id() == Some(pid as u32)) {
            return i;
        }
        at = parent(pid);
    }
    0
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Waits for the `n`th start line of `log`; the child's pid.
async fn wait_start(log: &Path, n: usize, within: Duration) -> Option<i32> {
    let from = Instant::now();
    while from.elapsed() < within {
        if let Some(pid) = start_line(log, n) {
            return Some(pid);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    None
}

fn start_line(log: &Path, n: usize) -> Option<i32> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().nth(n - 1)?.split(' ').nth(1)?.parse().ok()
}

fn dead(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.is_empty() || stat.rsplit(')').next().and_then(|s| s.split_whitespace().next()) == Some("Z")
}

/// From `at`, ms until the child `pid` is gone and until the next child
/// started, each watched at once (`None`: not within `within`).
async fn watch(pid: i32, log: &Path, at: Instant, within: Duration) -> (Option<f64>, Option<f64>) {
    let (mut gone, mut next) = (None, None);
    while at.elapsed() < within && (gone.is_none() || next.is_none()) {
        if gone.is_none() && dead(pid) {
            gone = Some(ms(at.elapsed()));
        }
        if next.is_none() && start_line(log, 2).is_some() {
            next = Some(ms(at.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (gone, next)
}

/// The bench's advisory-lock holder: takes `pg_advisory_lock(key)` on a
/// session, runs the command (no process group, no guard), waits for it.
pub async fn advisory_holder(url: &str, key: i64, command: &[String]) -> anyhow::Result<()> {
    let client = ticklease_testkit::connect(&url.parse()?).await?;
    client.execute("SELECT pg_advisory_lock($1)", &[&key]).await?;
    let (program, args) = command.split_first().context("a command")?;
    let _ = Command::new(program).args(args).status().await?;
    Ok(())
}

/// The table (p50/p99/max per case) as markdown, and the raw trials as CSV.
pub fn write(out: &Path, trials: &[Trial]) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(out)?;
    let mut csv = String::from("case,child_dead_ms,next_started_ms,overlap_ms\n");
    let cell = |v: Option<f64>| v.map_or("never".to_owned(), |v| format!("{v:.1}"));
    for t in trials {
        let _ = writeln!(
            csv,
            "{},{},{},{}",
            t.case.label(),
            cell(t.child_dead_ms),
            cell(t.next_started_ms),
            cell(t.overlap_ms())
        );
    }
    std::fs::write(out.join("run-failover.csv"), csv)?;
    let mut md = String::from(
        "| case | trials | child gone p50 / p99 / max ms | never gone | next child p50 / p99 / max ms | never started | both ran p50 / p99 / max ms |\n|---|---|---|---|---|---|---|\n",
    );
    for case in Case::ALL {
        let of: Vec<&Trial> = trials.iter().filter(|t| t.case == case).collect();
        let stats = |get: &dyn Fn(&Trial) -> Option<f64>| {
            let seen: Vec<f64> = of.iter().filter_map(|t| get(t)).collect();
            let never = of.len() - seen.len();
            let s = summarize(&seen).map_or("–".to_owned(), |s| {
                format!("{:.0} / {:.0} / {:.0}", s.p50, s.p99, s.max)
            });
            (s, never)
        };
        let (dead, dead_never) = stats(&|t| t.child_dead_ms);
        let (next, next_never) = stats(&|t| t.next_started_ms);
        let (both, _) = stats(&Trial::overlap_ms);
        let _ = writeln!(
            md,
            "| {} | {} | {dead} | {dead_never} | {next} | {next_never} | {both} |",
            case.label(),
            of.len()
        );
    }
    let path = out.join("run-failover.md");
    std::fs::write(&path, md)?;
    Ok(path)
}

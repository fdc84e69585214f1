//! The runner: leads a role on its schedule and runs the command once per
//! term, under a guard; `--once` runs at most one tick and says how it went.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use ticklease::{Config, Lead, LeaseStore, Manager, Refusal, Role, Schedule, Scheduler, Stopped, Tick};

use crate::child::{run_child, ChildEnd, CommandSpec, GuardSpec};
use crate::error::RunError;

/// `--once`'s exit codes when the command did not run to its end (else the
/// child's own code, 128 + a signal).
pub mod exit {
    /// The runner failed (the database, the guard).
    pub const ERROR: i32 = 1;
    /// A usage error: nothing was written.
    pub const USAGE: i32 = 2;
    /// Another host holds the role's term.
    pub const HELD: i32 = 75;
    /// The role is paused.
    pub const PAUSED: i32 = 76;
    /// The role is not due (its interval or cooldown, its next occurrence).
    pub const NOT_DUE: i32 = 77;
    /// The term was lost while the command ran (it was stopped).
    pub const LOST: i32 = 78;
    /// The runner was told to shut down before or while the command ran.
    pub const INTERRUPTED: i32 = 130;
}

/// One role's command and how it runs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub role: Role,
    pub schedule: Schedule,
    pub command: CommandSpec,
    /// SIGTERM to SIGKILL ([`check_grace`]).
    pub grace: Duration,
    /// The command line that starts a guard (`[ticklease, __guard]`).
    pub guard: Vec<OsString>,
}

/// The grace between SIGTERM and SIGKILL must end before the lease can
/// expire: `abandon_after + grace < lease_ttl`, and above zero.
pub fn check_grace(config: &Config, grace: Duration) -> Result<(), RunError> {
    match grace_problem(config, grace) {
        Some(problem) => Err(RunError::Usage {
            problem: format!("--grace {problem}"),
        }),
        None => Ok(()),
    }
}

/// What is wrong with `grace` ([`check_grace`]), if anything.
pub(crate) fn grace_problem(config: &Config, grace: Duration) -> Option<String> {
    let room = config.lease_ttl().saturating_sub(config.abandon_after());
    (grace.is_zero() || grace >= room).then(|| {
        format!(
            "{grace:?}: must be above zero and below lease_ttl - abandon_after ({room:?}), \
             so the child is killed before its lease can expire"
        )
    })
}

/// The program a command names, found as `execvp` would (an unknown one is
/// refused before anything is written).
pub fn find_program(program: &std::ffi::OsStr) -> Result<std::path::PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let path = std::path::Path::new(program);
    if path.components().count() > 1 {
        return runnable(path)
            .then(|| path.to_path_buf())
            .ok_or_else(|| format!("the command {program:?} is not an executable file"));
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|p| runnable(p))
        .ok_or_else(|| format!("the command {program:?} is not found in PATH"))
}

/// How long after the guard's SIGKILL was due the runner kills the group
/// itself if the guard has not ([`crate::backstop`]): half the room that
/// `abandon_after + grace` leaves before `lease_ttl`, so it too comes
/// before the lease can expire.
fn backstop_margin(config: &Config, grace: Duration) -> Duration {
    config
        .lease_ttl()
        .saturating_sub(config.abandon_after())
        .saturating_sub(grace)
        / 2
}

/// The default grace: half the room between the abandon instant and the lease's expiry.
pub fn default_grace(config: &Config) -> Duration {
    config.lease_ttl().saturating_sub(config.abandon_after()) / 2
}

/// Runs `jobs` on their schedules until `shutdown`; a stopped child's term
/// is released as interrupted.
pub async fn run_until<S: LeaseStore>(
    manager: Manager<S>,
    jobs: Vec<RunOptions>,
    shutdown: CancellationToken,
) -> Result<Stopped, RunError> {
    let holder: Arc<str> = manager.holder_id().into();
    let config = *manager.config();
    drain_lost_terms(&manager);
    crate::backstop::adopt_orphans();
    let mut scheduler = Scheduler::new(manager);
    for job in jobs {
        check_grace(&config, job.grace)?;
        let margin = backstop_margin(&config, job.grace);
        let (holder, job) = (holder.clone(), Arc::new(job));
        scheduler = scheduler
            .job(&job.role.clone(), job.schedule.clone(), move |tick| {
                let (holder, job) = (holder.clone(), job.clone());
                async move { tick_work(tick, &holder, &job, margin).await }
            })
            .map_err(|source| RunError::Lease { source })?;
    }
    Ok(scheduler.run(shutdown).await)
}

/// How `--once` ended: the process's exit code ([`exit`]) and, unless the
/// command ran and exited 0, one line saying why (a crontab's success
/// stays silent; every other end says what happened).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnceEnd {
    pub code: i32,
    pub why: Option<String>,
}

/// At most one tick of `job` ([`OnceEnd`]). `shutdown` (a signal) stops
/// the child and releases the term as interrupted.
pub async fn run_once<S: LeaseStore>(
    manager: &Manager<S>,
    job: &RunOptions,
    shutdown: CancellationToken,
) -> Result<OnceEnd, RunError> {
    check_grace(manager.config(), job.grace)?;
    drain_lost_terms(manager);
    crate::backstop::adopt_orphans();
    let margin = backstop_margin(manager.config(), job.grace);
    let holder = manager.holder_id().to_string();
    let stopper = {
        let manager = manager.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            manager.shutdown();
        })
    };
    let lead = manager
        .lead(&job.role, job.schedule.clone(), |tick| async move {
            tick_work(tick, &holder, job, margin).await
        })
        .await;
    stopper.abort();
    let lead = lead.map_err(|source| RunError::Lease { source })?;
    let why = why_once(&lead).map(|why| format!("ticklease run: {}: {why}", job.role));
    Ok(OnceEnd {
        code: exit_code_of(&lead),
        why,
    })
}

/// Why `--once` ended as it did, in words; `None` for a command that ran
/// and exited 0. Database text (a holder, who paused and why) and the
/// command's stderr are escaped.
pub fn why_once(lead: &Lead<()>) -> Option<String> {
    let esc = ticklease::HistoryEntry::escape;
    let at = |t: std::time::SystemTime| {
        chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    let within = |d: Duration| humantime::format_duration(Duration::from_millis(millis(d)));
    Some(match lead {
        Lead::Completed { .. } => return None,
        Lead::Failed { token, error } => {
            let error = esc(&ticklease::error::chain(&**error));
            format!("the command failed in term {token}: {error}")
        }
        Lead::Lost { token, reason } => {
            format!("term {token} was lost while the command ran ({reason}): the command was stopped")
        }
        Lead::Interrupted { token } => format!("interrupted: the command of term {token} was stopped"),
        Lead::ShuttingDown => "interrupted before the command started".to_owned(),
        Lead::Refused(Refusal::Held {
            holder,
            expires_at,
            remaining,
            ..
        }) => format!(
            "not run: held by {} until {} (in {})",
            esc(holder),
            at(*expires_at),
            within(*remaining)
        ),
        Lead::Refused(Refusal::Paused { by, reason }) if reason.is_empty() => {
            format!("not run: paused by {}", esc(by))
        }
        Lead::Refused(Refusal::Paused { by, reason }) => {
            format!("not run: paused by {}: {}", esc(by), esc(reason))
        }
        Lead::Refused(Refusal::NotDue { due_at, remaining }) => {
            format!(
                "not run: not due until {} (in {})",
                at(*due_at),
                within(*remaining)
            )
        }
        Lead::Refused(Refusal::Contended) => {
            "not run: another host acquired the role at the same moment".to_owned()
        }
        Lead::Refused(refusal) => format!("not run: refused ({refusal:?})"),
        other => format!("ended as {other:?}"),
    })
}

/// A lost term is released only once its child's group is gone (the
/// guard stops it within the grace), not while the group still runs: the
/// role cannot be acquired again, here or elsewhere, before the group is
/// dead or the lease expired.
fn drain_lost_terms<S: LeaseStore>(manager: &Manager<S>) {
    let config = manager.config();
    manager.set_lost_drain(config.lease_ttl().saturating_sub(config.abandon_after()));
}

/// Cancels `token` on SIGTERM or SIGINT: the runner then stops its
/// children and releases their terms as interrupted. SIGHUP keeps its
/// disposition (`nohup` works): a runner it ends is a runner gone, whose
/// children its guards kill at once.
pub fn stop_on_signals(token: CancellationToken) -> std::io::Result<()> {
    ticklease::cancel_on_signals(token)
}

/// The exit code `--once` gives for how its tick went ([`exit`]).
pub fn exit_code_of(lead: &Lead<()>) -> i32 {
    match lead {
        Lead::Completed { .. } => 0,
        Lead::Failed { error, .. } => match error.downcast_ref::<RunError>() {
            Some(RunError::Exit { code, .. }) => *code,
            _ => exit::ERROR,
        },
        Lead::Lost { .. } => exit::LOST,
        Lead::Interrupted { .. } | Lead::ShuttingDown => exit::INTERRUPTED,
        Lead::Refused(Refusal::Held { .. }) => exit::HELD,
        Lead::Refused(Refusal::Paused { .. }) => exit::PAUSED,
        Lead::Refused(_) => exit::NOT_DUE,
        _ => exit::ERROR,
    }
}

/// One tick: the command under a guard; exit 0 completes it. One INFO
/// line when the command starts and one when it ends, for people and log
/// shippers alike.
async fn tick_work(tick: Tick, holder: &str, job: &RunOptions, margin: Duration) -> Result<(), RunError> {
    let guard = GuardSpec {
        command: &job.guard,
        grace: job.grace,
        margin,
    };
    let occurrence = tick.occurrence().map_or_else(
        || "none".to_owned(),
        |t| chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
    );
    let (role, token) = (tick.role().clone(), tick.token());
    tracing::info!(%role, %token, %occurrence, "job started");
    let started = std::time::Instant::now();
    let ended = run_child(&tick, holder, &job.command, &guard).await;
    if let Ok(end) = &ended {
        tick.keep_output(kept_output(end));
    }
    let ended = ended.map(outcome);
    let duration_ms = millis(started.elapsed());
    match &ended {
        Ok(Ok(())) => {
            tracing::info!(%role, %token, %occurrence, exit = 0, outcome = "completed", duration_ms, "job ended")
        }
        Ok(Err(error)) => {
            let (exit, outcome) = match error {
                RunError::TimedOut { code, .. } => (*code, "timed_out"),
                RunError::Stopped { code } => (*code, "stopped"),
                RunError::Exit { code, .. } => (*code, "failed"),
                _ => (exit::ERROR, "failed"),
            };
            tracing::info!(%role, %token, %occurrence, exit, outcome, duration_ms, "job ended");
        }
        Err(error) => {
            tracing::info!(%role, %token, %occurrence, outcome = "not_started", %error, duration_ms, "job ended")
        }
    }
    ended?
}

/// What a run's history row keeps: how it ended, then as many of its last
/// output lines as fit with it in [`ticklease::OUTPUT_KEPT_MAX`] characters
/// (the history keeps the end of what it is given: the status must not be
/// what a long line pushes out).
fn kept_output(end: &ChildEnd) -> String {
    let how = match end {
        ChildEnd { timed_out: true, .. } => ", stopped after its timeout",
        ChildEnd { stopped: true, .. } => ", stopped",
        _ => "",
    };
    let status = format!("exit {}{how}", end.code);
    let mut room = ticklease::OUTPUT_KEPT_MAX.saturating_sub(status.chars().count());
    let mut lines: Vec<&str> = Vec::new();
    for line in end.output_tail.iter().rev() {
        let size = line.chars().count() + 1;
        if size > room {
            break;
        }
        room -= size;
        lines.push(line);
    }
    lines.iter().rev().fold(status, |kept, line| kept + "\n" + line)
}

/// How a child's end counts: exit 0 completes the tick; a timeout, a stop
/// by the runner or a non-zero exit fails it.
fn outcome(end: ChildEnd) -> Result<(), RunError> {
    match end {
        ChildEnd {
            timed_out: true,
            code,
            stderr_tail,
            ..
        } => Err(RunError::TimedOut { code, stderr_tail }),
        ChildEnd {
            stopped: true, code, ..
        } => Err(RunError::Stopped { code }),
        ChildEnd { code: 0, .. } => Ok(()),
        ChildEnd {
            code, stderr_tail, ..
        } => Err(RunError::Exit { code, stderr_tail }),
    }
}

/// Whole milliseconds, saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review of issue 33: long lines (a flood without newlines, passed on
    /// in pieces) must not push the exit status out of what the history
    /// keeps, which is the end of what it is given.
    #[test]
    fn the_kept_output_starts_with_the_exit_status_and_fits_the_history() {
        let end = ChildEnd {
            code: 4,
            stopped: true,
            timed_out: true,
            stderr_tail: Vec::new(),
            output_tail: (0..40)
                .map(|i| format!("out: {i:03} {}", "y".repeat(395)))
                .collect(),
        };
        let kept = kept_output(&end);
        assert!(
            kept.starts_with("exit 4, stopped after its timeout\nout: "),
            "{kept}"
        );
        assert!(
            kept.chars().count() <= ticklease::OUTPUT_KEPT_MAX,
            "{}",
            kept.len()
        );
        assert!(kept.ends_with(&end.output_tail[39]), "the last line is kept");
        assert_eq!(kept.lines().count(), 1 + 9, "as many last lines as fit");
    }
}

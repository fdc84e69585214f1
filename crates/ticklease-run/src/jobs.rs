//! The jobs file (`ticklease run --jobs jobs.toml`): several roles, each
//! with its command, schedule, environment, working directory, grace and
//! timeout, run by one process per host. A bad file is refused whole,
//! naming the job and the key, before anything is written.
//!
//! ```toml
//! [job.nightly_dump]
//! command = ["pg_dump", "-f", "/backup/app.sql", "app"]
//! cron = "5 0 * * *"
//! zone = "Europe/Berlin"
//! timeout = "1h"
//!
//! [job.outbox_relay]            # no schedule: a long-lived singleton
//! shell = "exec ./relay --listen :9000 2>&1 | logger"
//! dir = "/srv/relay"
//! env = { RELAY_MODE = "primary" }
//! grace = "1s"
//! ```

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use ticklease::{Config, Role, Schedule};

use crate::child::CommandSpec;
use crate::runner::{check_grace, default_grace, RunOptions, DAEMON_RESTART};

/// The most jobs one file may hold.
pub const JOBS_MAX: usize = 100;

/// The largest jobs file read, in bytes.
pub const JOBS_FILE_MAX: u64 = 1024 * 1024;

/// Reads a jobs file of at most [`JOBS_FILE_MAX`] bytes.
pub fn read(path: &std::path::Path) -> Result<String, JobsError> {
    use std::io::Read;
    let whole = |problem: String| JobsError { job: None, problem };
    let file = std::fs::File::open(path).map_err(|e| whole(e.to_string()))?;
    let mut text = String::new();
    file.take(JOBS_FILE_MAX + 1)
        .read_to_string(&mut text)
        .map_err(|e| whole(e.to_string()))?;
    if text.len() as u64 > JOBS_FILE_MAX {
        return Err(whole(format!("larger than {JOBS_FILE_MAX} bytes")));
    }
    Ok(text)
}

/// A jobs file's error: the job and the key at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{problem}", job.as_ref().map(|j| format!("job {j:?}: ")).unwrap_or_default())]
pub struct JobsError {
    /// The job (its role), when the problem is in one.
    pub job: Option<String>,
    /// What is wrong, naming the key.
    pub problem: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    command: Option<Vec<String>>,
    shell: Option<String>,
    every: Option<String>,
    cron: Option<String>,
    zone: Option<String>,
    catch_up: Option<String>,
    grace: Option<String>,
    timeout: Option<String>,
    dir: Option<PathBuf>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    prefix: bool,
}

/// Parses and checks a whole jobs file against the lease's timings.
pub fn parse(text: &str, config: &Config, guard: &[OsString]) -> Result<Vec<RunOptions>, JobsError> {
    let whole = |problem: String| JobsError { job: None, problem };
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| whole(e.to_string()))?;
    if let Some(key) = table.keys().find(|k| *k != "job") {
        return Err(whole(format!(
            "unknown key {key:?} (jobs go in [job.ROLE] tables)"
        )));
    }
    let jobs = match table.get("job") {
        Some(toml::Value::Table(jobs)) if !jobs.is_empty() => jobs,
        _ => return Err(whole("no [job.ROLE] table".into())),
    };
    if jobs.len() > JOBS_MAX {
        return Err(whole(format!("{} jobs: at most {JOBS_MAX}", jobs.len())));
    }
    jobs.iter()
        .map(|(name, value)| {
            let at = |problem: String| JobsError {
                job: Some(name.clone()),
                problem,
            };
            let entry = Entry::deserialize(value.clone()).map_err(|e| at(e.to_string()))?;
            job(name, entry, config, guard).map_err(at)
        })
        .collect()
}

fn duration(key: &str, text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{key} {text:?}: {e}"))
}

fn job(name: &str, e: Entry, config: &Config, guard: &[OsString]) -> Result<RunOptions, String> {
    let role = Role::new(name).map_err(|e| format!("the role name: {e}"))?;
    if let Some(dir) = e.dir.as_ref().filter(|d| !d.is_dir()) {
        return Err(format!("dir {dir:?}: not a directory"));
    }
    let (argv, shell) = match (e.command, e.shell) {
        (Some(argv), None) if !argv.is_empty() => {
            let path = e.env.get("PATH").map(std::ffi::OsStr::new);
            find_program_as_child(&argv[0], path, e.dir.as_deref()).map_err(|p| format!("command: {p}"))?;
            (argv, false)
        }
        (None, Some(line)) => (vec![line], true),
        _ => return Err("exactly one of command (a non-empty array) or shell (a line)".into()),
    };
    if e.cron.is_none() && (e.zone.is_some() || e.catch_up.is_some()) {
        return Err("zone and catch_up belong to a cron schedule".into());
    }
    let schedule = match (e.every, e.cron) {
        (Some(_), Some(_)) => return Err("every and cron: at most one".into()),
        (Some(every), None) => Schedule::every(duration("every", &every)?),
        (None, Some(cron)) => cron_schedule(&cron, e.zone.as_deref(), e.catch_up.as_deref())?,
        (None, None) => Schedule::every(DAEMON_RESTART),
    };
    schedule.check(config).map_err(|e| format!("the schedule: {e}"))?;
    let grace = match e.grace {
        Some(grace) => duration("grace", &grace)?,
        None => default_grace(config),
    };
    check_grace(config, grace).map_err(|e| e.to_string().replacen("--grace", "grace", 1))?;
    let timeout = e.timeout.map(|t| duration("timeout", &t)).transpose()?;
    if timeout.is_some_and(|t| t.is_zero()) {
        return Err("timeout: must be above zero".into());
    }
    let nul = |t: &str| t.contains('\0');
    if argv.iter().any(|a| nul(a)) {
        return Err("command: a NUL byte".into());
    }
    if let Some((key, _)) = e
        .env
        .iter()
        .find(|(k, v)| k.is_empty() || k.contains('=') || nul(k) || nul(v))
    {
        return Err(format!("env {key:?}: a name needs no '=' or NUL, a value no NUL"));
    }
    Ok(RunOptions {
        role,
        schedule,
        command: CommandSpec {
            argv: argv.into_iter().map(OsString::from).collect(),
            shell,
            env: e.env.into_iter().collect(),
            dir: e.dir,
            prefix: e.prefix,
            timeout,
        },
        grace,
        guard: guard.to_vec(),
    })
}

/// The program a job's command names, found as `execvp` in its child will
/// find it: the child runs in `dir` with `path` as its PATH (the job's
/// `env` PATH, else the runner's). A name with a slash is taken from `dir`;
/// a bare name is looked for in each PATH entry, a relative entry (an empty
/// one is `.`) taken from `dir` too.
pub fn find_program_as_child(
    program: &str,
    path: Option<&std::ffi::OsStr>,
    dir: Option<&std::path::Path>,
) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let runnable =
        |p: &PathBuf| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    let from_dir = |p: PathBuf| match dir {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p,
    };
    if program.contains('/') {
        let full = from_dir(PathBuf::from(program));
        return runnable(&full)
            .then_some(full)
            .ok_or_else(|| format!("{program:?} is not an executable file"));
    }
    let runner_path = std::env::var_os("PATH");
    let path = path.or(runner_path.as_deref()).unwrap_or_default();
    std::env::split_paths(path)
        .map(|entry| from_dir(entry).join(program))
        .find(runnable)
        .ok_or_else(|| format!("{program:?} is not found in PATH {:?}", path.to_string_lossy()))
}

/// A cron schedule from its expression, zone and catch-up policy (`latest`, `skip`, `all:N`).
pub fn cron_schedule(
    expression: &str,
    zone: Option<&str>,
    catch_up: Option<&str>,
) -> Result<Schedule, String> {
    let mut cron = Schedule::cron(expression).map_err(|e| format!("cron: {e}"))?;
    if let Some(zone) = zone {
        cron = cron.zone(zone).map_err(|e| format!("zone: {e}"))?;
    }
    if let Some(policy) = catch_up {
        let policy = match policy {
            "latest" => ticklease::CatchUp::Latest,
            "skip" => ticklease::CatchUp::Skip,
            other => match other.strip_prefix("all:").map(str::parse::<u32>) {
                Some(Ok(max)) => ticklease::CatchUp::All { max },
                _ => return Err(format!("catch_up {other:?}: expected latest, skip or all:N")),
            },
        };
        cron = cron.catch_up(policy).map_err(|e| format!("catch_up: {e}"))?;
    }
    Ok(cron)
}

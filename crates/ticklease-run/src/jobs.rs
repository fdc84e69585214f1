//! The jobs file (`ticklease run --jobs jobs.toml`): several roles, each
//! with its command, schedule, retries, environment, working directory,
//! grace and timeout, run by one process per host. A bad file is refused
//! whole, naming the job and the key, before anything is written. Every
//! key is in [`KEYS`] (what `ticklease run --help` and the README show);
//! the knobs a flag also sets mean the same in both ([`crate::knobs`]).
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

use ticklease::{Config, Role};

use crate::child::CommandSpec;
use crate::knobs::{Key, KnobError, Knobs};
use crate::runner::RunOptions;

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
    starting_deadline: Option<String>,
    attempts: Option<i64>,
    backoff: Option<String>,
    backoff_max: Option<String>,
    restart_backoff: Option<String>,
    restart_backoff_max: Option<String>,
    grace: Option<String>,
    timeout: Option<String>,
    dir: Option<PathBuf>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    prefix: bool,
}

/// One key of a `[job.ROLE]` table, as the help and the README show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDoc {
    pub key: &'static str,
    /// Its TOML type.
    pub kind: &'static str,
    pub default: &'static str,
    pub example: &'static str,
    /// The same knob on the command line (`ticklease run ROLE …`).
    pub flag: &'static str,
    pub meaning: &'static str,
}

/// Every key of a `[job.ROLE]` table (durations as `90s`, `15m`, `1h 30m`).
pub const KEYS: &[KeyDoc] = &[
    KeyDoc {
        key: "command",
        kind: "array of strings",
        default: "-",
        example: r#"["pg_dump", "-f", "/backup/app.sql", "app"]"#,
        flag: "-- CMD ARGS",
        meaning: "the program and its arguments; exactly one of command and shell",
    },
    KeyDoc {
        key: "shell",
        kind: "string",
        default: "-",
        example: r#""exec ./relay 2>&1 | logger""#,
        flag: "--shell",
        meaning: "one command line for /bin/sh -c",
    },
    KeyDoc {
        key: "every",
        kind: "duration",
        default: "-",
        example: r#""15m""#,
        flag: "--every",
        meaning:
            "once per interval since the last completed run; without every and cron the command is long-lived",
    },
    KeyDoc {
        key: "cron",
        kind: "string",
        default: "-",
        example: r#""5 0 * * *""#,
        flag: "--cron",
        meaning: "once per occurrence (5 or 6 fields, @daily ...)",
    },
    KeyDoc {
        key: "zone",
        kind: "string",
        default: r#""UTC""#,
        example: r#""Europe/Berlin""#,
        flag: "--zone",
        meaning: "the cron expression's IANA time zone (cron only)",
    },
    KeyDoc {
        key: "catch_up",
        kind: "string",
        default: r#""latest""#,
        example: r#""all:3""#,
        flag: "--catch-up",
        meaning: "missed occurrences: latest, skip or all:N (cron only)",
    },
    KeyDoc {
        key: "starting_deadline",
        kind: "duration",
        default: "none (skip: the lease TTL)",
        example: r#""30m""#,
        flag: "--starting-deadline",
        meaning: "an occurrence not started this long after its time is skipped (cron only)",
    },
    KeyDoc {
        key: "attempts",
        kind: "integer 1..=100",
        default: "cron 3, every 1",
        example: "5",
        flag: "--attempts",
        meaning: "attempts of one occurrence (of one interval's run), the first included",
    },
    KeyDoc {
        key: "backoff",
        kind: "duration",
        default: r#""10s""#,
        example: r#""30s""#,
        flag: "--backoff",
        meaning: "the wait before the first retry, doubling per retry",
    },
    KeyDoc {
        key: "backoff_max",
        kind: "duration",
        default: r#""5m" (at least backoff)"#,
        example: r#""1h""#,
        flag: "--backoff-max",
        meaning: "the longest wait between two attempts",
    },
    KeyDoc {
        key: "restart_backoff",
        kind: "duration",
        default: r#""1s""#,
        example: r#""5s""#,
        flag: "--restart-backoff",
        meaning: "long-lived only: the wait before a restart after exit 0, and the first after a failure",
    },
    KeyDoc {
        key: "restart_backoff_max",
        kind: "duration",
        default: r#""1m""#,
        example: r#""10m""#,
        flag: "--restart-backoff-max",
        meaning: "long-lived only: the cap of the wait, which doubles per consecutive failure",
    },
    KeyDoc {
        key: "timeout",
        kind: "duration",
        default: "none",
        example: r#""1h""#,
        flag: "--timeout",
        meaning: "stop the command after this long (the run fails); at most 24h",
    },
    KeyDoc {
        key: "grace",
        kind: "duration",
        default: "(lease_ttl - abandon_after) / 2: 2s",
        example: r#""1s""#,
        flag: "--grace",
        meaning: "SIGTERM to SIGKILL; below lease_ttl - abandon_after",
    },
    KeyDoc {
        key: "dir",
        kind: "string",
        default: "the runner's",
        example: r#""/srv/relay""#,
        flag: "(cd first)",
        meaning: "the working directory; a relative command or PATH entry is found from it",
    },
    KeyDoc {
        key: "env",
        kind: "table of strings",
        default: "{}",
        example: r#"{ RELAY_MODE = "primary" }"#,
        flag: "(env K=V ticklease ...)",
        meaning: "added to the runner's environment",
    },
    KeyDoc {
        key: "prefix",
        kind: "boolean",
        default: "false",
        example: "true",
        flag: "--prefix",
        meaning: "prefix each line the command writes with [role token]",
    },
];

/// [`KEYS`] as the text of `ticklease run --help`.
pub fn keys_help() -> String {
    let mut text = String::from("Jobs file keys ([job.ROLE] tables; key: type, default; example; flag):\n");
    for k in KEYS {
        text.push_str(&format!(
            "  {}: {}, default {}; {} = {}; {}\n      {}\n",
            k.key, k.kind, k.default, k.key, k.example, k.flag, k.meaning
        ));
    }
    text
}

/// [`KEYS`] as the README's table.
pub fn keys_markdown() -> String {
    let mut text =
        String::from("| key | type | default | example | flag | meaning |\n|---|---|---|---|---|---|\n");
    for k in KEYS {
        let flag = match k.flag.starts_with('-') {
            true => format!("`{}`", k.flag),
            false => k.flag.to_owned(),
        };
        let example = format!("`{} = {}`", k.key, k.example);
        let row = [k.kind, k.default, example.as_str(), flag.as_str(), k.meaning];
        let row: Vec<String> = row.iter().map(|cell| cell.replace('|', "\\|")).collect();
        text.push_str(&format!("| `{}` | {} |\n", k.key, row.join(" | ")));
    }
    text
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
    let (argv, shell) = match (e.command.clone(), e.shell.clone()) {
        (Some(argv), None) if !argv.is_empty() => {
            let path = e.env.get("PATH").map(std::ffi::OsStr::new);
            find_program_as_child(&argv[0], path, e.dir.as_deref()).map_err(|p| format!("command: {p}"))?;
            (argv, false)
        }
        (None, Some(line)) => (vec![line], true),
        _ => return Err("exactly one of command (a non-empty array) or shell (a line)".into()),
    };
    let knobs = knobs(&e)?;
    let fault = |e: KnobError| e.to_string();
    let schedule = knobs.schedule(config).map_err(fault)?;
    let grace = knobs.grace(config).map_err(fault)?;
    let timeout = knobs.timeout().map_err(fault)?;
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

/// The entry's knobs, each duration parsed naming its key.
fn knobs(e: &Entry) -> Result<Knobs, String> {
    let parse =
        |key: Key, text: &Option<String>| text.as_deref().map(|t| duration(key.as_str(), t)).transpose();
    let attempts = e
        .attempts
        .map(|n| {
            u32::try_from(n)
                .map_err(|_| format!("attempts {n}: from 1 to {}", ticklease::Retry::ATTEMPTS_MAX))
        })
        .transpose()?;
    Ok(Knobs {
        every: parse(Key::Every, &e.every)?,
        cron: e.cron.clone(),
        zone: e.zone.clone(),
        catch_up: e.catch_up.clone(),
        starting_deadline: parse(Key::StartingDeadline, &e.starting_deadline)?,
        attempts,
        backoff: parse(Key::Backoff, &e.backoff)?,
        backoff_max: parse(Key::BackoffMax, &e.backoff_max)?,
        restart_backoff: parse(Key::RestartBackoff, &e.restart_backoff)?,
        restart_backoff_max: parse(Key::RestartBackoffMax, &e.restart_backoff_max)?,
        timeout: parse(Key::Timeout, &e.timeout)?,
        grace: parse(Key::Grace, &e.grace)?,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each key's documented example, in a job of the kind it belongs to, is accepted.
    #[test]
    fn every_documented_example_parses() {
        let guard = [OsString::from("true")];
        let dir = std::env::temp_dir();
        for k in KEYS {
            // The cron-only and retry keys need a schedule; the others fit a long-lived job.
            let base = match k.key {
                "zone" | "catch_up" | "starting_deadline" | "attempts" | "backoff" | "backoff_max" => {
                    "cron = \"5 0 * * *\"\n"
                }
                _ => "",
            };
            let command = match k.key {
                "command" | "shell" => String::new(),
                _ => "command = [\"true\"]\n".to_owned(),
            };
            let example = match k.key {
                "dir" => format!("dir = {:?}", dir.display().to_string()),
                _ => format!("{} = {}", k.key, k.example),
            };
            let text = format!("[job.a]\n{command}{base}{example}\n");
            match (parse(&text, &Config::default(), &guard), k.key) {
                (Ok(_), _) => {}
                // The example names a program this machine may lack (pg_dump): only that is refused.
                (Err(e), "command") if e.problem.starts_with("command:") => {}
                (Err(e), key) => panic!("{key}: {e}\n{text}"),
            }
        }
    }
}

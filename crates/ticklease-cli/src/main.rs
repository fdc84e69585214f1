//! `ticklease`: the operator's command. Thin: the logic lives in the library.
//!
//! Exit codes: 0 ok, 1 operational error (unknown role, database unreachable,
//! schema not migrated, permission denied), 2 usage error; `run --once`
//! exits with its command's code or [`ticklease_run::exit`]'s.

mod args;
mod commands;
mod demo;
mod history;
mod status;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command, WorkerCmd};

/// Ctrl-C, SIGTERM or SIGHUP (a closed terminal): the demo then cleans up.
async fn interrupted() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut hup)) = (signal(SignalKind::terminate()), signal(SignalKind::hangup())) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        _ = hup.recv() => {}
    }
}

/// Bad input found after parsing (exit code 2, like clap's own usage errors).
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// `run --once`'s exit code: the command's, or why it did not run.
#[derive(Debug)]
struct ExitWith(i32);

impl std::fmt::Display for ExitWith {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}", self.0)
    }
}

impl std::error::Error for ExitWith {}

/// Stderr that never waits and drops what it cannot write: a closed log
/// pipe (a crashed log shipper, a terminal closed under ssh) or a full one
/// (a stalled shipper) must not change what a replica does. Written by a
/// thread of its own from a bounded queue ([`ticklease_run::output`]),
/// shared with `run`'s children, and flushed (for a bounded time) at exit.
type LossyStderr = ticklease_run::output::LogWriter;

/// How long the last lines of output may take at exit (a reader that
/// does not read is not waited for longer).
const OUTPUT_FLUSH_MAX: std::time::Duration = std::time::Duration::from_millis(500);

/// A line on stdout that may be lost, for the long-running commands.
fn say(line: impl std::fmt::Display) {
    let _ = writeln!(std::io::stdout(), "{line}");
}

fn main() -> ExitCode {
    // The guard of `run`'s child: no runtime, no logging, nothing else.
    if std::env::args_os().nth(1).is_some_and(|a| a == "__guard") {
        return guard();
    }
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => {
            let code = runtime.block_on(service());
            ticklease_run::output::flush(OUTPUT_FLUSH_MAX);
            code
        }
        Err(e) => {
            eprintln!("ticklease: could not start the runtime: {e}");
            ExitCode::from(1)
        }
    }
}

fn guard() -> ExitCode {
    let Command::Guard(g) = Cli::parse().command else {
        unreachable!("__guard parses as the guard command");
    };
    ticklease_run::guard::ignore_stop_signals();
    let code = ticklease_run::guard::run(
        &g.command,
        std::time::Duration::from_millis(g.grace_ms),
        g.deadline_ns,
    );
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// The log, on stderr through the never-waiting queue: warnings by
/// default, and for a long-running `ticklease run` its INFO lines too (one
/// when a job starts, one when it ends: what a log shipper keeps). Colour
/// only on a terminal, and not with `NO_COLOR` set (no-color.org): a log
/// file or a journal gets no escape codes.
fn init_logging(command: &Command) {
    // Warnings by default: a refusal repeated at every poll (a revoked
    // privilege, a schema the database refuses) is otherwise silent.
    let default = match command {
        // `--once` from a crontab stays silent on success (cron mails any output).
        // deadpool's "could not be recycled" repeats what the one line per failover says.
        Command::Run(run) if !run.once => "warn,ticklease_run=info,deadpool.postgres=error",
        _ => "warn,deadpool.postgres=error",
    };
    let directives = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_owned());
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
        .parse_lossy(directives);
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ))
        .with_writer(LossyStderr::default)
        .log_internal_errors(false)
        .init();
}

/// Colour on stderr: a terminal, and `NO_COLOR` unset or empty.
fn colour(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

async fn service() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.command);
    let service = matches!(
        cli.command,
        Command::Demo { .. }
            | Command::Metrics { .. }
            | Command::Run(_)
            | Command::Worker(WorkerCmd { action: None, .. })
    );
    if !service {
        // A one-shot command piped into `head` ends quietly, as Unix tools do
        // (exit 141), instead of panicking on a closed stdout. Rust ignores
        // SIGPIPE by default; services keep that, and write with `say`.
        // SAFETY: no other thread exists yet that could race on the disposition.
        let _ = unsafe {
            nix::sys::signal::signal(
                nix::sys::signal::Signal::SIGPIPE,
                nix::sys::signal::SigHandler::SigDfl,
            )
        };
    }
    if let Command::Demo {
        replicas,
        duration,
        keep,
    } = cli.command
    {
        let opts = demo::DemoOptions {
            replicas,
            duration,
            database_url: cli.database_url,
            keep,
        };
        return cmd_demo(opts).await;
    }
    if let Command::Alerts { prefix, tests } = &cli.command {
        let text = if *tests {
            ticklease::metrics::alert_rule_tests(prefix)
        } else {
            ticklease::metrics::alert_rules(prefix)
        };
        return match text {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                let _ = writeln!(LossyStderr::default(), "ticklease: {e}");
                ExitCode::from(2)
            }
        };
    }
    let Some(url) = cli.database_url else {
        eprintln!("ticklease: --database-url (or DATABASE_URL) is required");
        return ExitCode::from(2);
    };
    match commands::run(&url, cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<ExitWith>() => {
            let code = e.downcast_ref::<ExitWith>().map_or(1, |c| c.0);
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
        Err(e) => {
            let _ = writeln!(
                LossyStderr::default(),
                "ticklease: {}",
                ticklease::error::chain(e.as_ref())
            );
            ExitCode::from(if e.is::<Usage>() { 2 } else { 1 })
        }
    }
}

/// The demo needs no database URL, and cleans up when interrupted.
async fn cmd_demo(opts: demo::DemoOptions) -> ExitCode {
    tokio::select! {
        outcome = demo::run(opts) => match outcome {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                let _ = writeln!(LossyStderr::default(), "ticklease demo: {}", ticklease::error::chain(e.as_ref()));
                ExitCode::from(1)
            }
        },
        _ = interrupted() => {
            let _ = writeln!(LossyStderr::default(), "ticklease demo: interrupted; stopping the workers and removing the cluster");
            ExitCode::from(130)
        }
    }
}

//! One tick's child, seen from the runner: the guard started with the
//! command and the term's environment, told each new abandon deadline, asked
//! to stop when the tick is cancelled; the child's stderr passed through and
//! its last lines kept for the history.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, Command};
use tokio::time::Instant;

use ticklease::Tick;

use crate::error::RunError;
use crate::guard::{monotonic_ns, SPAWN_FAILED};
use crate::output::Stream;

/// Lines of the child's stderr kept for the history's error summary.
pub const STDERR_TAIL_LINES: usize = 5;

/// Lines of the child's output (both streams) kept for its history row
/// ([`Tick::keep_output`], which keeps the last 4,000 characters of them).
pub const OUTPUT_TAIL_LINES: usize = 40;

/// Longest output line kept (in characters); longer ones are cut.
const LINE_MAX: usize = 400;

/// What a tick runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSpec {
    /// The program and its arguments (with `shell`, one command line for `sh -c`).
    pub argv: Vec<OsString>,
    /// Run `argv`'s one line through `/bin/sh -c`.
    pub shell: bool,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// The working directory (default: the runner's).
    pub dir: Option<PathBuf>,
    /// Prefix each line the child writes with `[role token]`.
    pub prefix: bool,
    /// Stop the child after this long (the tick fails).
    pub timeout: Option<Duration>,
}

/// How a child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildEnd {
    /// The child's exit code, or 128 + the signal that ended it.
    pub code: i32,
    /// Whether the runner asked the guard to stop it (a cancelled tick).
    pub stopped: bool,
    /// Whether that was for its timeout.
    pub timed_out: bool,
    /// Its last stderr lines.
    pub stderr_tail: Vec<String>,
    /// Its last [`OUTPUT_TAIL_LINES`] lines of output, both streams in the
    /// order they were read, each marked with its stream (`out: `, `err: `).
    pub output_tail: Vec<String>,
}

impl CommandSpec {
    fn argv(&self) -> Vec<OsString> {
        match self.shell {
            true => ["/bin/sh".into(), "-c".into()]
                .into_iter()
                .chain(self.argv.iter().cloned())
                .collect(),
            false => self.argv.clone(),
        }
    }
}

/// How a guard is started and held to its deadlines: its command line
/// (before its own arguments), the grace, and the runner's backstop margin.
#[derive(Debug, Clone)]
pub(crate) struct GuardSpec<'a> {
    pub(crate) command: &'a [OsString],
    pub(crate) grace: Duration,
    /// How long after the guard's SIGKILL was due the runner kills the group
    /// itself ([`crate::backstop`]): half the room left before the lease
    /// can expire, so even that kill comes before it.
    pub(crate) margin: Duration,
}

/// Runs `spec` for `tick` under a guard until the child exits.
pub(crate) async fn run_child(
    tick: &Tick,
    holder: &str,
    spec: &CommandSpec,
    guard: &GuardSpec<'_>,
) -> Result<ChildEnd, RunError> {
    if tick.is_cancelled() {
        // Cancelled before the child started (a signal during ACQUIRE): none starts.
        return Ok(ChildEnd {
            code: 0,
            stopped: true,
            timed_out: false,
            stderr_tail: Vec::new(),
            output_tail: Vec::new(),
        });
    }
    let mut abandon_at = tick.abandon_at();
    let first_deadline = *abandon_at.borrow_and_update();
    let mut cmd = guard_command(tick, holder, spec, guard, first_deadline)?;
    let (mut guarded, registered) =
        crate::backstop::spawn_guard(&mut cmd).map_err(|source| RunError::Spawn { source })?;
    let pid = registered.pid();
    let label = format!("[{} {}] ", tick.role(), tick.token().get());
    let mut watch = Watch {
        control: guarded.stdin.take().ok_or(RunError::NoGuard)?,
        err: Lines::new(guarded.stderr.take().ok_or(RunError::NoGuard)?),
        out: Lines::new(guarded.stdout.take().ok_or(RunError::NoGuard)?),
        prefix: if spec.prefix { label } else { String::new() },
        tail: VecDeque::with_capacity(STDERR_TAIL_LINES),
        output: VecDeque::with_capacity(OUTPUT_TAIL_LINES),
        stopped: false,
        timed_out: false,
        backstopped: false,
    };
    let status = watch
        .until_exit(tick, &mut guarded, &mut abandon_at, spec.timeout, guard, pid)
        .await?;
    watch.drain().await;
    use std::os::unix::process::ExitStatusExt;
    if status.signal().is_some() && !watch.backstopped {
        // The guard itself was killed: its child came back to the runner.
        let orphans = tokio::task::spawn_blocking(crate::backstop::kill_orphans)
            .await
            .unwrap_or_default();
        tracing::warn!(role = %tick.role(), orphans, "the guard was killed: the runner killed what it left");
    }
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or_default());
    if code == SPAWN_FAILED && watch.tail.iter().any(|l| l.starts_with("ticklease: cannot run")) {
        return Err(RunError::Command {
            message: watch.tail.back().cloned().unwrap_or_default(),
        });
    }
    Ok(ChildEnd {
        code,
        stopped: watch.stopped,
        timed_out: watch.timed_out,
        stderr_tail: watch.tail.into(),
        output_tail: watch.output.into(),
    })
}

/// The guard's command line, in a process group of its own: a signal to
/// the runner's group (job control, `kill -STOP -PGID`) does not reach it,
/// and it stops the child by its deadline whatever became of the runner.
fn guard_command(
    tick: &Tick,
    holder: &str,
    spec: &CommandSpec,
    guard: &GuardSpec<'_>,
    deadline: Instant,
) -> Result<Command, RunError> {
    let (program, before) = guard.command.split_first().ok_or(RunError::NoGuard)?;
    let mut cmd = Command::new(program);
    cmd.args(before)
        .arg("--grace-ms")
        .arg(guard.grace.as_millis().to_string())
        .arg("--deadline-ns")
        .arg(deadline_ns(deadline).to_string())
        .arg("--")
        .args(spec.argv())
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .env("TICKLEASE_ROLE", tick.role().as_str())
        .env("TICKLEASE_TOKEN", tick.token().get().to_string())
        .env("TICKLEASE_HOLDER", holder)
        .env_remove("TICKLEASE_OCCURRENCE")
        .process_group(0)
        .stdin(Stdio::piped())
        // Both streams pass through the runner, which keeps their last lines
        // for the term's history row (a child sees pipes, not a terminal).
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(at) = tick.occurrence() {
        let at = DateTime::<Utc>::from(at).to_rfc3339_opts(SecondsFormat::AutoSi, true);
        cmd.env("TICKLEASE_OCCURRENCE", at);
    }
    // The server the term started on: a child's own connection goes there.
    for name in ["TICKLEASE_DB_HOST", "TICKLEASE_DB_HOSTADDR", "TICKLEASE_DB_PORT"] {
        cmd.env_remove(name);
    }
    if let Some(server) = tick.server() {
        cmd.env("TICKLEASE_DB_HOST", &server.host)
            .env("TICKLEASE_DB_PORT", server.port.to_string());
        if let Some(addr) = server.hostaddr {
            cmd.env("TICKLEASE_DB_HOSTADDR", addr.to_string());
        }
    }
    if let Some(dir) = &spec.dir {
        cmd.current_dir(dir);
    }
    Ok(cmd)
}

/// One guard watched by the runner: its control pipe, the child's output,
/// and what the runner asked of it.
struct Watch {
    control: ChildStdin,
    err: Lines<tokio::process::ChildStderr>,
    out: Lines<tokio::process::ChildStdout>,
    prefix: String,
    tail: VecDeque<String>,
    output: VecDeque<String>,
    stopped: bool,
    timed_out: bool,
    /// The runner killed the group itself (the guard missed its deadline).
    backstopped: bool,
}

impl Watch {
    /// Passes deadlines and stops to the guard, and the child's output on,
    /// until the guard exits; kills the group itself if the guard has not
    /// by a margin after its SIGKILL was due.
    async fn until_exit(
        &mut self,
        tick: &Tick,
        guarded: &mut tokio::process::Child,
        abandon_at: &mut tokio::sync::watch::Receiver<Instant>,
        timeout: Option<Duration>,
        guard: &GuardSpec<'_>,
        pid: Pid,
    ) -> Result<std::process::ExitStatus, RunError> {
        let limited = timeout.is_some();
        let timeout = tokio::time::sleep(timeout.unwrap_or(Duration::from_secs(86_400)));
        tokio::pin!(timeout);
        let mut deadline = *abandon_at.borrow();
        let backstop = tokio::time::sleep_until(deadline + guard.grace + guard.margin);
        tokio::pin!(backstop);
        loop {
            tokio::select! {
                _ = &mut timeout, if !self.stopped && limited => {
                    self.timed_out = true;
                    self.stop(&mut deadline).await;
                    backstop.as_mut().reset(deadline + guard.grace + guard.margin);
                }
                status = guarded.wait() => return status.map_err(|source| RunError::Spawn { source }),
                Ok(()) = abandon_at.changed(), if !self.stopped => {
                    deadline = *abandon_at.borrow_and_update();
                    tell(&mut self.control, &format!("d {}\n", deadline_ns(deadline))).await;
                    backstop.as_mut().reset(deadline + guard.grace + guard.margin);
                }
                _ = tick.cancelled(), if !self.stopped => {
                    self.stop(&mut deadline).await;
                    backstop.as_mut().reset(deadline + guard.grace + guard.margin);
                }
                () = &mut backstop, if !self.backstopped => {
                    self.backstopped = true;
                    let killed = crate::backstop::stop_stuck_guard(pid);
                    tracing::warn!(role = %tick.role(), token = %tick.token(), killed,
                        "the guard did not stop the command by its deadline: the runner killed it and its group");
                }
                Some(line) = self.err.next(), if self.err.open => self.err_line(&line),
                Some(line) = self.out.next(), if self.out.open => {
                    self.out_line(&line);
                }
            }
        }
    }

    /// A stderr line: passed on, kept for the error summary and the output.
    fn err_line(&mut self, line: &[u8]) {
        let line = pass_on(Stream::Err, &self.prefix, line);
        keep(&mut self.output, format!("err: {line}"), OUTPUT_TAIL_LINES);
        keep(&mut self.tail, line, STDERR_TAIL_LINES);
    }

    /// A stdout line: passed on, kept for the output.
    fn out_line(&mut self, line: &[u8]) {
        let line = pass_on(Stream::Out, &self.prefix, line);
        keep(&mut self.output, format!("out: {line}"), OUTPUT_TAIL_LINES);
    }

    /// Asks the guard to stop the group: from now (or the deadline, if
    /// that came first) it has the grace.
    async fn stop(&mut self, deadline: &mut Instant) {
        self.stopped = true;
        *deadline = (*deadline).min(Instant::now());
        tell(&mut self.control, "stop\n").await;
    }

    /// What the child wrote before it exited; bounded, for a descendant that
    /// left its group may hold the pipes open.
    async fn drain(&mut self) {
        let _ = tokio::time::timeout(DRAIN_MAX, async {
            while let Some(line) = self.err.next().await {
                self.err_line(&line);
            }
            while let Some(line) = self.out.next().await {
                self.out_line(&line);
            }
        })
        .await;
    }
}

/// How long the child's output is read after the guard exited.
const DRAIN_MAX: Duration = Duration::from_millis(200);

/// The longest line passed on whole, in bytes; longer ones are passed on in pieces.
const CHUNK_MAX: usize = 16 * 1024;

/// The lines of a pipe as bytes (any encoding), each at most [`CHUNK_MAX`].
struct Lines<R> {
    reader: BufReader<R>,
    open: bool,
    /// The line read so far: kept here, not in the future, so a `select!`
    /// that drops [`Lines::next`] mid-line loses nothing.
    line: Vec<u8>,
}

impl<R: tokio::io::AsyncRead + Unpin> Lines<R> {
    fn new(pipe: R) -> Self {
        Lines {
            reader: BufReader::new(pipe),
            open: true,
            line: Vec::new(),
        }
    }

    /// The next line without its newline; `None` at the end (or an error).
    /// Cancel-safe: what was read of a line waits in `self.line`.
    async fn next(&mut self) -> Option<Vec<u8>> {
        while self.line.len() < CHUNK_MAX {
            let buf = match self.reader.fill_buf().await {
                Ok([]) | Err(_) => {
                    self.open = false;
                    break;
                }
                Ok(buf) => buf,
            };
            let room = CHUNK_MAX - self.line.len();
            match buf.iter().take(room).position(|b| *b == b'\n') {
                Some(at) => {
                    self.line.extend_from_slice(&buf[..at]);
                    self.reader.consume(at + 1);
                    return Some(std::mem::take(&mut self.line));
                }
                None => {
                    let n = buf.len().min(room);
                    self.line.extend_from_slice(&buf[..n]);
                    self.reader.consume(n);
                }
            }
        }
        (!self.line.is_empty()).then(|| std::mem::take(&mut self.line))
    }
}

/// Queues a line of the child's for the runner's own stream (never
/// waiting: a stream no one reads drops it, [`crate::output`]); the line as text.
fn pass_on(stream: Stream, prefix: &str, line: &[u8]) -> String {
    let mut text = Vec::with_capacity(prefix.len() + line.len() + 1);
    text.extend_from_slice(prefix.as_bytes());
    text.extend_from_slice(line);
    text.push(b'\n');
    crate::output::write(stream, text);
    String::from_utf8_lossy(line).into_owned()
}

/// Keeps the last `lines` lines, each cut to [`LINE_MAX`] characters.
fn keep(tail: &mut VecDeque<String>, line: String, lines: usize) {
    if tail.len() == lines {
        tail.pop_front();
    }
    tail.push_back(line.chars().take(LINE_MAX).collect());
}

/// A control line to the guard; a guard that is gone has stopped the group already.
async fn tell(control: &mut ChildStdin, line: &str) {
    let _ = control.write_all(line.as_bytes()).await;
    let _ = control.flush().await;
}

/// A monotonic instant as `CLOCK_MONOTONIC` nanoseconds (the guard's clock).
fn deadline_ns(at: Instant) -> u64 {
    let left = at.saturating_duration_since(Instant::now());
    monotonic_ns().saturating_add(u64::try_from(left.as_nanos()).unwrap_or(u64::MAX))
}

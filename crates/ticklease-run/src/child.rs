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
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, Command};
use tokio::time::Instant;

use ticklease::Tick;

use crate::error::RunError;
use crate::guard::{monotonic_ns, SPAWN_FAILED};

/// Lines of the child's stderr kept for the history's error summary.
pub const STDERR_TAIL_LINES: usize = 5;

/// Longest stderr line kept (in characters); longer ones are cut.
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

/// Runs `spec` for `tick` under a guard (`guard` is the command line that
/// starts one, before its own arguments) until the child exits.
pub(crate) async fn run_child(
    tick: &Tick,
    holder: &str,
    spec: &CommandSpec,
    guard: &[OsString],
    grace: Duration,
) -> Result<ChildEnd, RunError> {
    if tick.is_cancelled() {
        // Cancelled before the child started (a signal during ACQUIRE): none starts.
        return Ok(ChildEnd {
            code: 0,
            stopped: true,
            timed_out: false,
            stderr_tail: Vec::new(),
        });
    }
    let mut abandon_at = tick.abandon_at();
    let (program, before) = guard.split_first().ok_or(RunError::NoGuard)?;
    let mut cmd = Command::new(program);
    cmd.args(before)
        .arg("--grace-ms")
        .arg(grace.as_millis().to_string())
        .arg("--deadline-ns")
        .arg(deadline_ns(*abandon_at.borrow_and_update()).to_string())
        .arg("--")
        .args(spec.argv())
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .env("TICKLEASE_ROLE", tick.role().as_str())
        .env("TICKLEASE_TOKEN", tick.token().get().to_string())
        .env("TICKLEASE_HOLDER", holder)
        .env_remove("TICKLEASE_OCCURRENCE")
        .stdin(Stdio::piped())
        .stdout(if spec.prefix {
            Stdio::piped()
        } else {
            Stdio::inherit()
        })
        .stderr(Stdio::piped());
    if let Some(at) = tick.occurrence() {
        let at = DateTime::<Utc>::from(at).to_rfc3339_opts(SecondsFormat::AutoSi, true);
        cmd.env("TICKLEASE_OCCURRENCE", at);
    }
    if let Some(dir) = &spec.dir {
        cmd.current_dir(dir);
    }
    let mut guarded = cmd.spawn().map_err(|source| RunError::Spawn { source })?;
    let mut control = guarded.stdin.take().ok_or(RunError::NoGuard)?;
    let label = format!("[{} {}] ", tick.role(), tick.token().get());
    let prefix = if spec.prefix { label.as_str() } else { "" };
    let mut err = Lines::new(guarded.stderr.take().ok_or(RunError::NoGuard)?);
    let mut out = guarded.stdout.take().map(Lines::new);
    let mut tail: VecDeque<String> = VecDeque::with_capacity(STDERR_TAIL_LINES);
    let (mut stopped, mut timed_out) = (false, false);
    let timeout = tokio::time::sleep(spec.timeout.unwrap_or(Duration::from_secs(86_400)));
    tokio::pin!(timeout);
    let status = loop {
        tokio::select! {
            _ = &mut timeout, if !stopped && spec.timeout.is_some() => {
                (stopped, timed_out) = (true, true);
                tell(&mut control, "stop\n").await;
            }
            status = guarded.wait() => break status.map_err(|source| RunError::Spawn { source })?,
            Ok(()) = abandon_at.changed() => {
                let at = deadline_ns(*abandon_at.borrow_and_update());
                tell(&mut control, &format!("d {at}\n")).await;
            }
            _ = tick.cancelled(), if !stopped => {
                stopped = true;
                tell(&mut control, "stop\n").await;
            }
            Some(line) = err.next(), if err.open => keep(&mut tail, pass_on(Stream::Err, prefix, &line)),
            Some(line) = next_out(&mut out), if out.as_ref().is_some_and(|o| o.open) => {
                pass_on(Stream::Out, prefix, &line);
            }
        }
    };
    // What the child wrote before it exited; bounded, for a descendant that
    // left its group may hold the pipes open.
    let _ = tokio::time::timeout(DRAIN_MAX, async {
        while let Some(line) = err.next().await {
            keep(&mut tail, pass_on(Stream::Err, prefix, &line));
        }
        while let Some(line) = next_out(&mut out).await {
            pass_on(Stream::Out, prefix, &line);
        }
    })
    .await;
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or_default());
    if code == SPAWN_FAILED && tail.iter().any(|l| l.starts_with("ticklease: cannot run")) {
        return Err(RunError::Command {
            message: tail.back().cloned().unwrap_or_default(),
        });
    }
    Ok(ChildEnd {
        code,
        stopped,
        timed_out,
        stderr_tail: tail.into(),
    })
}

async fn next_out(out: &mut Option<Lines<tokio::process::ChildStdout>>) -> Option<Vec<u8>> {
    match out {
        Some(out) => out.next().await,
        None => None,
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

#[derive(Clone, Copy)]
enum Stream {
    Out,
    Err,
}

/// Writes a line of the child's to the runner's own stream (what cannot be
/// written is dropped: a closed log pipe changes nothing); the line as text.
fn pass_on(stream: Stream, prefix: &str, line: &[u8]) -> String {
    use std::io::Write;
    let mut text = Vec::with_capacity(prefix.len() + line.len() + 1);
    text.extend_from_slice(prefix.as_bytes());
    text.extend_from_slice(line);
    text.push(b'\n');
    let _ = match stream {
        Stream::Out => std::io::stdout().write_all(&text),
        Stream::Err => std::io::stderr().write_all(&text),
    };
    String::from_utf8_lossy(line).into_owned()
}

/// Keeps the last [`STDERR_TAIL_LINES`] lines, each cut to [`LINE_MAX`] characters.
fn keep(tail: &mut VecDeque<String>, line: String) {
    if tail.len() == STDERR_TAIL_LINES {
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

//! The guard process (`ticklease __guard`): runs the command as the leader
//! of a new process group and stops the whole group by the last deadline
//! the runner gave it, when the runner asks, or when the runner is gone.
//!
//! Control, on its stdin, one line each: `d <ns>` (the abandon deadline, in
//! nanoseconds of `CLOCK_MONOTONIC`) and `stop`. End of input means the
//! runner is gone. Stopping is SIGTERM to the group, then SIGKILL after the
//! grace; once the child exits, what remains of its group is killed. The
//! guard exits with the child's code (128 + the signal that ended it), or
//! [`SPAWN_FAILED`] when the command could not be started.

use std::ffi::OsString;
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::time::{clock_gettime, ClockId};
use nix::unistd::Pid;
use std::os::unix::process::{CommandExt, ExitStatusExt};

/// The guard's exit code when the command could not be started (as a shell's).
pub const SPAWN_FAILED: i32 = 127;

/// Nanoseconds of `CLOCK_MONOTONIC`, the clock runner and guard share.
pub fn monotonic_ns() -> u64 {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    let (secs, nanos) = (now.tv_sec(), now.tv_nsec());
    u64::try_from(secs).unwrap_or_default() * 1_000_000_000 + u64::try_from(nanos).unwrap_or_default()
}

/// The guard outlives Ctrl-C, SIGTERM and SIGHUP sent to the runner's
/// process group, and is not stopped by Ctrl-Z (SIGTSTP) or background
/// terminal I/O (SIGTTIN, SIGTTOU), which would leave the child running
/// unwatched: the runner decides, and tells it (or its pipe closes, or its
/// deadlines stop coming).
/// A handler that does nothing, not `SIG_IGN`: the command, after exec,
/// gets the default dispositions back.
pub fn ignore_stop_signals() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet};
    extern "C" fn nothing(_: i32) {}
    let action = SigAction::new(SigHandler::Handler(nothing), SaFlags::SA_RESTART, SigSet::empty());
    for signal in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
    ] {
        // SAFETY: the handler does nothing, so it is async-signal-safe.
        let _ = unsafe { sigaction(signal, &action) };
    }
}

enum Event {
    Deadline(u64),
    Stop,
    RunnerGone,
    Exited,
}

/// Runs `command` under the guard until it exits; the guard's exit code.
pub fn run(command: &[OsString], grace: Duration, deadline_ns: u64) -> i32 {
    // Descendants that leave the group (setsid, a daemon's double fork) come
    // back to the guard when their parent dies, and are killed with the rest.
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let Some((program, args)) = command.split_first() else {
        eprintln!("ticklease guard: no command");
        return SPAWN_FAILED;
    };
    let mut child = match Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()
    {
        Ok(child) => child,
        Err(error) => {
            eprintln!("ticklease: cannot run {program:?}: {error}");
            return SPAWN_FAILED;
        }
    };
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("a pid fits i32"));
    let (events, rx) = channel();
    read_control(events.clone());
    // Waits for the exit without reaping it: the group is killed while its
    // leader's pid cannot be reused.
    std::thread::spawn(move || {
        while let Err(nix::errno::Errno::EINTR) =
            waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT)
        {}
        let _ = events.send(Event::Exited);
    });
    let grace_ns = u64::try_from(grace.as_nanos()).unwrap_or(u64::MAX);
    let mut deadline = deadline_ns;
    // Once stopping: when SIGKILL goes out (None once it did).
    let mut kill_at: Option<Option<u64>> = None;
    loop {
        let wake = match kill_at {
            None => Some(deadline),
            Some(at) => at,
        };
        let wait = wake.map_or(Duration::from_secs(3600), |w| {
            Duration::from_nanos(w.saturating_sub(monotonic_ns()))
        });
        match rx.recv_timeout(wait) {
            Ok(Event::Exited) => break,
            Ok(Event::Deadline(ns)) if kill_at.is_none() => deadline = ns,
            Ok(Event::Deadline(_)) => {}
            Ok(Event::Stop | Event::RunnerGone) | Err(RecvTimeoutError::Timeout) if kill_at.is_none() => {
                let _ = killpg(pid, Signal::SIGTERM);
                // Never later than the grace after the deadline.
                let now = monotonic_ns().min(deadline);
                kill_at = Some(Some(now.saturating_add(grace_ns)));
            }
            Ok(Event::Stop | Event::RunnerGone) => {}
            Err(RecvTimeoutError::Timeout) => {
                let _ = killpg(pid, Signal::SIGKILL);
                kill_at = Some(None);
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    // The child exited: nothing of its group outlives it.
    let _ = killpg(pid, Signal::SIGKILL);
    let code = match child.wait() {
        Ok(status) => status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or_default()),
        Err(_) => SPAWN_FAILED,
    };
    kill_escaped();
    code
}

/// Rounds of looking for descendants that left the group.
const ESCAPED_ROUNDS: usize = 50;

/// Kills the guard's remaining children (descendants that left the child's
/// group and came back to this subreaper), round by round as their own
/// children come back, for at most [`ESCAPED_ROUNDS`] rounds of 10 ms.
fn kill_escaped() {
    let me = std::process::id().to_string();
    for _ in 0..ESCAPED_ROUNDS {
        let children: Vec<Pid> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                    stat.rsplit(')').next().and_then(|s| s.split_whitespace().nth(1)) == Some(me.as_str())
                })
            })
            .map(Pid::from_raw)
            .collect();
        if children.is_empty() {
            return;
        }
        for child in children {
            let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(child, None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads the runner's control lines on a thread of its own.
fn read_control(events: Sender<Event>) {
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            let event = match line.trim().split_once(' ') {
                Some(("d", ns)) => ns.parse().ok().map(Event::Deadline),
                None if line.trim() == "stop" => Some(Event::Stop),
                _ => None,
            };
            if let Some(event) = event {
                if events.send(event).is_err() {
                    return;
                }
            }
        }
        let _ = events.send(Event::RunnerGone);
    });
}

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
        reap_orphans(pid);
        let wake = match kill_at {
            None => Some(deadline),
            Some(at) => at,
        };
        // At least once a second: orphans that came back are reaped meanwhile.
        let wait = wake
            .map_or(REAP_EVERY, |w| {
                Duration::from_nanos(w.saturating_sub(monotonic_ns()))
            })
            .min(REAP_EVERY);
        let event = match rx.recv_timeout(wait) {
            Ok(event) => Some(event),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        let now = monotonic_ns();
        let due = wake.is_some_and(|w| w <= now);
        match (event, kill_at) {
            (Some(Event::Exited), _) => break,
            (Some(Event::Deadline(ns)), None) => deadline = ns,
            // The runner is gone: with a coordination session another host may
            // start the next child within milliseconds, so no grace.
            (Some(Event::RunnerGone), Some(None)) => {}
            (Some(Event::RunnerGone), _) => {
                let _ = killpg(pid, Signal::SIGKILL);
                kill_at = Some(None);
            }
            (Some(Event::Stop), None) => {
                let _ = killpg(pid, Signal::SIGTERM);
                kill_at = Some(Some(now.min(deadline).saturating_add(grace_ns)));
            }
            // The deadline passed with no newer one: never later than a grace after it.
            (None, None) if due => {
                let _ = killpg(pid, Signal::SIGTERM);
                kill_at = Some(Some(deadline.saturating_add(grace_ns)));
            }
            (None, Some(Some(_))) if due => {
                let _ = killpg(pid, Signal::SIGKILL);
                kill_at = Some(None);
            }
            _ => {}
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

/// How often, at least, the guard reaps descendants that came back to it.
const REAP_EVERY: Duration = Duration::from_secs(1);

/// Reaps the guard's exited children other than the child (`leader`), which
/// stays unreaped until its group is killed: orphans of the child's tree
/// come back to the guard and would pile up as zombies.
fn reap_orphans(leader: Pid) {
    use nix::sys::wait::WaitStatus;
    loop {
        let peek = waitid(
            Id::All,
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
        );
        let pid = match peek {
            Ok(WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _)) if pid != leader => pid,
            _ => return,
        };
        let _ = nix::sys::wait::waitpid(pid, Some(WaitPidFlag::WNOHANG));
    }
}

/// Rounds of killing what is left of the guard's tree.
const ESCAPED_ROUNDS: usize = 50;

/// Kills the guard's remaining descendants (those that left the child's
/// group and came back to this subreaper, and theirs, at any depth), round
/// by round until none is left, for at most [`ESCAPED_ROUNDS`] rounds of
/// 10 ms: each round kills the whole tree found in one read of `/proc`, so
/// only a process forked during that read outlives it, for a round.
fn kill_escaped() {
    let me = Pid::this();
    for _ in 0..ESCAPED_ROUNDS {
        if kill_tree(me) == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
        // Reaped without waiting: one that cannot be killed (another user's, in
        // uninterruptible sleep) must not hold the guard past its rounds.
        while let Ok(status) = nix::sys::wait::waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            if status == nix::sys::wait::WaitStatus::StillAlive {
                break;
            }
        }
    }
}

/// SIGKILLs every descendant of `root` (not `root` itself) found in one
/// read of `/proc`, children before their parents' reaping can free a pid:
/// how many it signalled. Zombies count: their parents have not reaped them.
pub fn kill_tree(root: Pid) -> usize {
    let tree = descendants(root);
    for pid in &tree {
        let _ = nix::sys::signal::kill(*pid, Signal::SIGKILL);
    }
    tree.len()
}

/// The descendants of `root`, at any depth, from one read of `/proc`.
pub fn descendants(root: Pid) -> Vec<Pid> {
    let parents: Vec<(Pid, Pid)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((Pid::from_raw(pid), parent_of(pid)?)))
        .collect();
    let mut tree = vec![root];
    let mut at = 0;
    while at < tree.len() {
        let parent = tree[at];
        tree.extend(parents.iter().filter(|(_, p)| *p == parent).map(|(c, _)| *c));
        at += 1;
    }
    tree.remove(0);
    tree
}

/// The parent pid in `/proc/PID/stat` (the field after the state, past the
/// command name, which may hold spaces and parentheses).
pub(crate) fn parent_of(pid: i32) -> Option<Pid> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ppid = stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()?;
    Some(Pid::from_raw(ppid))
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

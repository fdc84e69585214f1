//! The runner's backstop for a guard that cannot do its job: stopped
//! (SIGSTOP of the guard alone) past the instant its group had to be gone,
//! or killed (SIGKILL) while its child ran. The runner, still running,
//! kills what the guard would have killed.
//!
//! The runner is a child subreaper, so the processes of a dead guard's tree
//! come back to it instead of to init: any child of the runner that is not
//! one of its live guards is such an orphan, and is killed with its tree.

use std::collections::HashSet;
use std::sync::Mutex;

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use crate::guard::{descendants, kill_tree, parent_of};

/// The guards this runner started that have not exited.
static GUARDS: Mutex<Vec<Pid>> = Mutex::new(Vec::new());

/// Makes this process the subreaper of its guards' trees. Called once a
/// runner starts; without it (a kernel that refuses), a dead guard's child
/// goes to init and only the lease and the fence bound it.
pub(crate) fn adopt_orphans() {
    if let Err(error) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!(%error, "cannot become the subreaper of the guards' trees");
    }
}

/// A live guard, registered until dropped (after its exit was seen).
pub(crate) struct Registered(Pid);

/// Spawns a guard and registers it, under the registry's lock: an orphan
/// search running meanwhile cannot take a guard just started for an orphan.
pub(crate) fn spawn_guard(
    cmd: &mut tokio::process::Command,
) -> std::io::Result<(tokio::process::Child, Registered)> {
    let mut guards = GUARDS.lock().expect("guards");
    let child = cmd.spawn()?;
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .map(Pid::from_raw)
        .ok_or_else(|| std::io::Error::other("the guard has no pid"))?;
    guards.push(pid);
    Ok((child, Registered(pid)))
}

impl Registered {
    pub(crate) fn pid(&self) -> Pid {
        self.0
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        GUARDS.lock().expect("guards").retain(|g| *g != self.0);
    }
}

/// A guard that did not stop its group by its deadline (it is stopped, or
/// wedged): its whole tree, then the guard itself, are SIGKILLed. Its
/// children cannot be reaped meanwhile (the guard is their parent and is
/// not running), so no pid signalled here can have been reused.
pub(crate) fn stop_stuck_guard(guard: Pid) -> usize {
    let killed = kill_tree(guard);
    let _ = kill(guard, Signal::SIGKILL);
    killed
}

/// Kills the trees of this runner's children that are no live guard: what
/// a guard killed by a signal left behind (they came back to the runner, its
/// subreaper). Reaps them, for nothing else here waits for them.
pub(crate) fn kill_orphans() -> usize {
    let registry = GUARDS.lock().expect("guards");
    let guards: HashSet<Pid> = registry.iter().copied().collect();
    let me = Pid::this();
    let orphans: Vec<Pid> = descendants(me)
        .into_iter()
        .filter(|p| parent_of(p.as_raw()) == Some(me) && !guards.contains(p))
        .collect();
    for orphan in &orphans {
        kill_tree(*orphan);
        let _ = kill(*orphan, Signal::SIGKILL);
    }
    drop(registry);
    for orphan in &orphans {
        let _ = waitpid(*orphan, Some(WaitPidFlag::empty()));
    }
    orphans.len()
}

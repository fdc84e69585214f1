//! `ticklease run`: any command as a fenced singleton on N hosts, stopped
//! before its lease can expire.
//!
//! Every host runs the same runner for a role; each tick (or occurrence) of
//! the role runs the command on the one host that holds the term, as a child
//! of a small **guard** process (this binary again, `ticklease __guard`):
//!
//! ```text
//! runner (ticklease run) ── stdin pipe: "d <ns>" deadlines, "stop" ──► guard ──► child's process group
//!        ◄── the guard's exit status: the child's ───────────────────┘            (CMD, its children)
//! ```
//!
//! - **The child leads its own process group**; every signal goes to the
//!   whole group (grandchildren included), and when the child exits the
//!   rest of its group is killed: nothing of a tick outlives its term.
//! - **The guard enforces the abandon deadline it was last given**: the
//!   runner tells it, after each acknowledged RENEW, the instant
//!   `last_ack + abandon_after` on the machine's monotonic clock
//!   (`CLOCK_MONOTONIC`, the same in both processes). At that instant, or
//!   when the runner asks (a lost term, a pause, shutdown, a timeout), the
//!   guard sends SIGTERM to the group, then SIGKILL after the grace; when its
//!   control pipe closes (the runner died, even by SIGKILL) it sends SIGKILL
//!   at once (with a coordination session another host may start the next
//!   child within milliseconds). A runner that is frozen (SIGSTOP, Ctrl-Z)
//!   or cut from the database stops sending deadlines, so its child is
//!   stopped all the same.
//! - **The bound**: SIGTERM at the latest at `last_ack + abandon_after`,
//!   SIGKILL at the latest `grace` later; the grace is validated so that
//!   `abandon_after + grace < lease_ttl` ([`check_grace`]), so both fall
//!   before `last_ack + lease_ttl`, no later than the lease's expiry on the
//!   database (`last_ack` is when the acknowledged RENEW was *sent*). A lost
//!   term is RELEASEd only once its group is gone (or its lease expired:
//!   [`ticklease::Manager::set_lost_drain`]), so a RELEASE never lets the
//!   next child start while the last one's group still runs. Descendants
//!   that leave the group (`setsid`, a daemon's double fork) come back to the
//!   guard, a child subreaper, when their parent dies; they are reaped as
//!   they exit and SIGKILLed (no grace) once the child has exited.
//! - **With a coordination session** a role is acquirable the moment its
//!   holder's session ends. A dead runner's group gets SIGKILL at once
//!   (measured: gone in 8–17 ms, the next child 40–50 ms after the kill),
//!   but a runner whose coordination connection alone is cut (killed by an
//!   operator, a failed link to the direct endpoint) learns of the takeover
//!   at its next RENEW: its child may run beside the next one for up to a
//!   heartbeat plus the grace. Leases alone have no such window.
//! - **What no process can prevent**: a whole host frozen and resumed (a VM
//!   paused, a laptop lid) freezes the guard too; its child may run on after
//!   another host took over. The answer is the fence: the child's own
//!   statements claim with `AND (SELECT leader_fence(:'role', :token))`
//!   (its term's role and token are in its environment), which the database
//!   refuses once the term is over. SIGKILL of the guard itself leaves its
//!   group running until the child ends (the runner reports it); a process
//!   the child has another service start (systemd, at, a remote host) is no
//!   descendant and out of reach; a pause followed by an unpause within the
//!   grace may start the next child while the paused one's group is still
//!   stopping; the coordination-session case above. The fence answers all
//!   of them.
//!
//! The child learns its term from its environment: `TICKLEASE_ROLE`,
//! `TICKLEASE_TOKEN`, `TICKLEASE_HOLDER` and, on a cron schedule,
//! `TICKLEASE_OCCURRENCE` (RFC 3339, UTC). Its exit 0 completes the tick;
//! non-zero or a signal fails it (the role's cooldown as for any failed
//! tick), the last lines of its stderr becoming the history's error summary.
//! `--once` exits with the child's code, or with the codes of [`exit`] when it
//! did not run or its term was lost mid-run.

mod backstop;
mod child;
mod error;
pub mod guard;
pub mod jobs;
pub mod output;
mod runner;

pub use child::{ChildEnd, CommandSpec, STDERR_TAIL_LINES};
pub use error::RunError;
pub use jobs::{cron_schedule, JobsError};
pub use runner::{
    check_grace, default_grace, exit, exit_code_of, find_program, run_once, run_until, stop_on_signals,
    RunOptions, DAEMON_RESTART,
};

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
//!   rest of its tree is killed: nothing of a tick outlives its term.
//! - **The guard leads a process group of its own**, apart from the
//!   runner's and the child's: job control or `kill -STOP -PGID` aimed at
//!   the runner does not reach it.
//! - **The guard enforces the abandon deadline it was last given**: the
//!   runner tells it, after each acknowledged RENEW, the instant
//!   `last_ack + abandon_after` on the machine's monotonic clock
//!   (`CLOCK_MONOTONIC`, the same in both processes). At that instant, or
//!   when the runner asks (a lost term, a pause, shutdown, a timeout), the
//!   guard sends SIGTERM to the group, then SIGKILL after the grace; when its
//!   control pipe closes (the runner died, even by SIGKILL) it sends SIGKILL
//!   at once. A runner that is frozen (SIGSTOP, Ctrl-Z, its whole process
//!   group) or cut from the database stops sending deadlines, so its child
//!   is stopped all the same.
//! - **The runner backs the guard up**: if the guard has not exited by
//!   `margin` after its SIGKILL was due (`margin` = half of `lease_ttl −
//!   abandon_after − grace`), the runner SIGKILLs the guard's whole tree and
//!   the guard (a guard SIGSTOPped alone); and, a child subreaper itself, it
//!   kills what a guard killed by a signal left behind (its tree comes back
//!   to the runner).
//! - **The bound**: SIGTERM at the latest at `last_ack + abandon_after`,
//!   SIGKILL at the latest `grace` later, the runner's kill at the latest
//!   `margin` after that; the grace is validated so that `abandon_after +
//!   grace < lease_ttl` ([`check_grace`]), so all fall before `last_ack +
//!   lease_ttl`, no later than the lease's expiry on the database (`last_ack`
//!   is when the acknowledged RENEW was *sent*). A lost term is RELEASEd only
//!   once its group is gone (or its lease expired:
//!   [`ticklease::Manager::set_lost_drain`]), so a RELEASE never lets the
//!   next child start while the last one's group still runs; a pause makes
//!   the next term wait for the paused term's lease unless that RELEASE
//!   comes first, so an unpause does not either. Descendants that leave the
//!   group (`setsid`, a daemon's double fork, chains of them at any depth)
//!   come back to the guard, a child subreaper, when their parent dies; they
//!   are reaped as they exit and, once the child has exited, the guard's
//!   whole remaining tree is SIGKILLed each round (read from `/proc` in one
//!   pass) until none is left, for at most 50 rounds of 10 ms (only a
//!   process forked during a round's read survives it, for a round).
//! - **No two children of a role at once, by default.** Every takeover
//!   waits for the lease (or a RELEASE sent once the group is gone): a dead,
//!   frozen or cut-off runner's role is taken over when its lease expires,
//!   after its group was stopped. With `--direct-url` the coordination
//!   session only wakes the runner (releases, pauses and run-nows heard at
//!   once, [`ticklease::PgStore::with_direct_wakeups`]); its end (a link cut
//!   on the server's side, a Postgres restart, `pg_terminate_backend`) ends
//!   no term. Tested: a link cut on the server's side with the runner's own
//!   sockets silent, every session ended by the server, SIGKILL and SIGSTOP
//!   of the runner, of its process group and of the guard alone (with a
//!   pause and an unpause), a child ignoring SIGTERM.
//! - **`--takeover-on-session-end`** (opt-in, with `--direct-url`) trades
//!   that for speed: a role is acquirable the moment its holder's session
//!   ends. A dead runner's group gets SIGKILL at once (measured: gone in
//!   6–12 ms, the next child 49–56 ms after the kill,
//!   `docs/benchmarks/run-failover.md`), but when only the session ends the
//!   runner learns of the takeover at its next RENEW, or at its abandon
//!   deadline if its link is cut: its child may run beside the next one for
//!   up to `abandon_after` plus the grace (measured: 80–96 ms when the
//!   server ended the sessions and the runner saw it; 4.4 s with a silently
//!   cut link and a child that exits on SIGTERM, 6.45 s with one that takes
//!   a 2 s grace; 2.0 s after `pg_ctl restart -m immediate`).
//! - **What no process can prevent**: a whole host frozen and resumed (a VM
//!   paused, a laptop lid) freezes the guard and the runner too; so does
//!   SIGSTOP of both the runner and the guard: the child may run on after
//!   another host took over at the lease's expiry. The answer is the fence:
//!   the child's own statements claim with `AND (SELECT
//!   leader_fence_v2(:'role', :token))` (its term's role and token are in its
//!   environment), which the database refuses once the term is over. A
//!   process the child has another service start (systemd, at, a remote
//!   host) is no descendant and out of reach; a runner on a kernel that
//!   refuses the subreaper (it says so in its log) leaves a killed guard's
//!   group to the lease and the fence. The fence answers all of them.
//! - **Output never blocks**: the child's lines and the runner's log go to
//!   the runner's stdout/stderr through bounded queues ([`output`]): a pipe
//!   no one reads delays no renewal; what does not fit is dropped and
//!   counted.
//!
//! The child learns its term from its environment: `TICKLEASE_ROLE`,
//! `TICKLEASE_TOKEN`, `TICKLEASE_HOLDER`, on a cron schedule
//! `TICKLEASE_OCCURRENCE` (RFC 3339, UTC), and the server its term started
//! on, `TICKLEASE_DB_HOST` and `TICKLEASE_DB_PORT` (a host name or address,
//! or a socket directory), and `TICKLEASE_DB_HOSTADDR` when the URL gives
//! the address (`hostaddr`). **A child's own connection goes there** (`psql
//! "host=$TICKLEASE_DB_HOST port=$TICKLEASE_DB_PORT dbname=…"`, adding
//! `hostaddr=$TICKLEASE_DB_HOSTADDR` when it is set), not to a
//! multi-host URL of its own: while a promotion leaves two writable servers
//! (the old primary not demoted), a client trying hosts in list order can
//! reach the other one. When the runner sees that its server was superseded
//! by a promotion, the term ends (`superseded`) and the child is stopped;
//! the next term's child is told the promoted server. Its exit 0 completes the tick;
//! non-zero or a signal fails it (the role's cooldown as for any failed
//! tick), the last lines of its stderr becoming the history's error summary.
//! **What it said is kept**: both of its streams pass through the runner (it
//! sees pipes, not a terminal), and each term's history row keeps its exit
//! status and as many of its last [`OUTPUT_TAIL_LINES`] lines, in the order
//! read and each marked with its stream (`out: `, `err: `), as fit with the
//! status in 4,000 characters, retained
//! as the history is: `ticklease history ROLE` shows them, escaped, from any
//! host after the runner is gone. A job without a schedule is
//! [`Schedule::long_lived`](ticklease::Schedule::long_lived): each of its
//! terms records it, so the shipped alerts count it healthy while held and
//! page when it is held nowhere.
//! `--once` exits with the child's code, or with the codes of [`exit`] when it
//! did not run or its term was lost mid-run; whenever it does not exit 0 it
//! writes one line on stderr saying why ([`why_once`]: held by whom until
//! when, paused by whom, due when, lost, interrupted, the command's failure).
//!
//! **Retries and restarts** are the same knobs on the command line and in
//! the jobs file ([`knobs`]): `attempts`, `backoff`, `backoff_max` and, for
//! a cron schedule, `starting_deadline`, the library's own
//! ([`ticklease::Retry`], [`ticklease::Schedule::starting_deadline`]). A
//! long-lived command (no schedule) is started again after any exit: after
//! `restart_backoff` (1 s) when it exited 0, after a wait doubling per
//! consecutive failure up to `restart_backoff_max` (1 min) otherwise.
//!
//! **Logs**: one INFO line when a job starts (`job started`: role, token,
//! occurrence) and one when it ends (`job ended`: exit, outcome
//! `completed` / `failed` / `timed_out` / `stopped` / `not_started`,
//! `duration_ms`); the CLI shows them by default, except for `--once`
//! (silent on success, for crontabs).

mod backstop;
mod child;
mod error;
pub mod guard;
pub mod jobs;
pub mod knobs;
pub mod output;
mod runner;

pub use child::{ChildEnd, CommandSpec, OUTPUT_TAIL_LINES, STDERR_TAIL_LINES};
pub use error::RunError;
pub use jobs::JobsError;
pub use knobs::{KnobError, Knobs};
pub use runner::{
    check_grace, default_grace, exit, exit_code_of, find_program, run_once, run_until, stop_on_signals,
    why_once, OnceEnd, RunOptions,
};

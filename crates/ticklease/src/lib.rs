//! # ticklease: leader election is a row, not a session
//!
//! Singleton background jobs (billing, dunning, outbox dispatchers, …) on N
//! replicas of a service, with exactly one leader per job at a time. Each job
//! is a **role** the application declares; each role is **one row** of
//! `leader_leases`. A replica that wants to run a role's tick claims the row
//! for that one tick (a **term**) with a single SQL statement, renews it while
//! the tick runs, and releases it when the tick ends. Every term has a
//! **fencing token**; the job's claim statements prove it with
//! [`Fence::predicate`], so a replaced leader claims nothing.
//!
//! ## What Postgres is the source of truth for
//!
//! Everything that decides leadership: who holds a role, which token is
//! current, until when the term lasts, whether an operator paused the role,
//! when its last tick completed, and any cooldown (`not_before`). Every
//! decision is one autocommit statement evaluated on the **database clock**
//! (`now()`, and `statement_timestamp()` in the fence). No statement sets
//! session state, takes a session lock or listens, and every lease statement
//! is an unnamed `query_typed` statement, so the store runs through PgBouncer
//! in transaction mode. Migrations use the simple protocol and a
//! transaction-scoped advisory lock, so they run through such a pooler too;
//! run them as the schema owner, who then owns the SECURITY DEFINER functions.
//!
//! ## What the local clock is for
//!
//! Only for stepping down early, and for pacing. The heartbeat keeps
//! `last_ack`, the monotonic instant at which the last acknowledged RENEW (or
//! the ACQUIRE) was **sent**; the database set the expiry from its own clock at
//! or after that instant. Past `last_ack + abandon_after` the tick is abandoned
//! on the local clock alone. No decision compares a database timestamp with a
//! local one; the difference is only observed
//! ([`Manager::db_clock_drift_seconds`]).
//!
//! ## The four statements
//!
//! | statement | matches | writes |
//! |---|---|---|
//! | ACQUIRE | role unpaused, no live term, due (`last_tick_ended_at + interval` and `not_before` passed) | token + 1, holder, `expires_at = now() + lease_ttl`; a missing row is created with a token seeded from the epoch in ms |
//! | RENEW | `(role, token)` still holding | `expires_at = now() + lease_ttl`; 0 rows = the term is over ([`LossReason`]) |
//! | RELEASE | `(role, token)` still holding | clears the holder; by [`Release`] outcome: Completed stamps `last_tick_*`; Interrupted leaves the role due at once; Lost sets `not_before = now() + min(interval, 60 s)`; Failed (an `Err` or a panic) sets `not_before = now() + interval` |
//! | PAUSE / UNPAUSE | the role | `leader_pause` clears the holder and sets `paused_*` in one statement; `leader_unpause` clears `paused_*` and leaves `not_before` alone |
//!
//! The expiry predicate lives in one SQL function, `leader_lease_live`; ACQUIRE,
//! the fence and `leader_status` all ask it.
//!
//! ## States
//!
//! ```text
//!  database row                                   this process (Manager::lead)
//!
//!          ACQUIRE (due, unpaused,                 idle ──ACQUIRE──► refused (Held/Paused/NotDue/Contended)
//!          no live term): token+1                    │
//!   free ─────────────────────────► held(token)      │ Acquired
//!    ▲ ▲                            │  ▲  │          ▼
//!    │ │  RELEASE(role, token)      │  └──┘        leading ── work returns ──────────► RELEASE(outcome) ──► idle
//!    │ └────────────────────────────┤ RENEW          │  │
//!    │    expires (no RENEW for     │                │  └─ shutdown: tick cancelled ──► RELEASE(Interrupted)
//!    │    lease_ttl): acquirable ◄──┤                │
//!    │                              │ leader_pause   └─ RENEW 0 rows, or no ack within abandon_after:
//!    └── leader_unpause ── paused ◄─┘                   work cancelled and dropped ─► RELEASE(Lost)
//! ```
//!
//! ## Guarantees and their bounds
//!
//! With `lease_ttl` T, `heartbeat_every` H, `statement_timeout` S,
//! `abandon_after` A and `max_poll` P (defaults 10 s, 3 s, 2 s, 6 s, 5 s;
//! [`Config`] refuses any set where `A + S >= T` or `H >= A`):
//!
//! 1. **One live term per role.** ACQUIRE takes a row only when no term is
//!    live on the database clock; racing ACQUIREs serialize on the row lock and
//!    the loser re-evaluates against the winner's row. Tokens only grow.
//! 2. **A superseded leader claims nothing.** A claim statement carrying
//!    [`Fence::predicate`] returns 0 rows unless its term is live and unpaused
//!    at the claim's own `statement_timestamp()` (not `now()`, which is frozen
//!    at `BEGIN` and would accept an expired lease inside a long transaction).
//! 3. **A claim never commits after the next term starts.** The predicate is
//!    `(SELECT leader_fence_lock(role, token))`: a VOLATILE function (a STABLE
//!    one may not lock rows) that takes `FOR KEY SHARE` on the lease row, run
//!    once per statement because it is an uncorrelated scalar subquery (a
//!    VOLATILE call in a WHERE clause would otherwise run per row). A takeover
//!    (ACQUIRE's `ON CONFLICT DO UPDATE` names the key column, so it locks
//!    `FOR UPDATE`) and `leader_pause` (`SELECT … FOR UPDATE`) wait for that
//!    share lock, so the claim's transaction commits before the term ends;
//!    RENEW and RELEASE do not wait for it. Keep fenced transactions short: a
//!    long one delays a takeover or a pause by its own length.
//! 4. **A leader stops before its lease can expire.** The work is cancelled
//!    and dropped at most A after the last acknowledged beat was sent, and no
//!    RENEW starts after that instant (a RENEW in flight is cut there), while
//!    the database expiry is at least T after it: a margin of at least
//!    `T − A − S > 0`. After an abandon the only statement of the term is the
//!    term-scoped RELEASE.
//! 5. **A dead leader is replaced.** Its role is acquirable at most T after its
//!    last heartbeat, and a follower that polls every P leads it within
//!    T + P (+ one statement). A clean shutdown releases at once.
//! 6. **Pause is prompt.** From `leader_pause`'s commit the fence is false and
//!    ACQUIRE is refused on every replica; the holder's next RENEW (within H,
//!    or H/2 after a missed beat) returns 0 rows and its work is cancelled.
//! 7. **A statement that does not answer within S is a missed beat, not a
//!    loss.** Its connection leaves the pool, a cancel is sent (held open until
//!    the server or bouncer closes it, since PgBouncer drops a cancel whose
//!    socket closed first), and the connection is closed. A missed beat is
//!    retried after H/2.
//! 8. **A panicking or failing tick is not a completion.** It is released as
//!    Failed (`not_before = now + interval`); the panic then continues from
//!    [`Manager::lead`]. A tick cancelled by shutdown is released as
//!    Interrupted even if its work then panics.
//! 9. **RELEASE cannot be skipped.** It runs on a task of its own, bounded by
//!    S; if the `lead` future is dropped mid-tick, the term is released as
//!    Interrupted.
//!
//! ## Privileges
//!
//! Migration 0002 grants an application role (default `ticklease_app`) SELECT
//! and a column-scoped UPDATE on `leader_leases` (the term columns, not the
//! pause columns), and EXECUTE on `leader_acquire` and `leader_seed`. The
//! spec wants ACQUIRE to recreate a missing row and denies the app INSERT; the
//! two meet in `leader_acquire`, a SECURITY DEFINER function owned by the
//! migrating role with `search_path` pinned to `pg_catalog` and the schema,
//! so a caller can neither insert arbitrary rows nor shadow a table or
//! operator. An operator role (default `ticklease_operator`) can only call
//! `leader_pause`, `leader_unpause`, `leader_run_now` (all SECURITY DEFINER)
//! and read `leader_status`. Neither owns anything, nor can DELETE, TRUNCATE
//! or alter the table. A column-scoped INSERT grant was the alternative; it
//! would let the app insert rows for any role name and cannot express "only
//! through ACQUIRE".
//!
//! Not guaranteed: effects the work already started (an HTTP call, an email)
//! complete even after a takeover, so outbound effects are at-least-once;
//! completions must land through their own compare-and-set or idempotency key.
//!
//! ## Example
//!
//! ```no_run
//! use std::time::Duration;
//! use ticklease::{Config, Lead, Manager, PgStore, PgStoreOptions, Role};
//!
//! # async fn example() -> anyhow::Result<()> {
//! let pg: tokio_postgres::Config = "postgres://app@localhost/app".parse()?;
//! let config = Config::default();
//! let store = PgStore::connect(pg, PgStoreOptions::from_config(&config)).await?;
//! let billing = Role::new("billing")?;
//! let manager = Manager::start(store, config, [billing.clone()]).await?;
//! loop {
//!     let lead = manager
//!         .lead(&billing, Duration::from_secs(3600), |tick| async move {
//!             // A leader-only store method takes the fence; its claim statement
//!             // adds `AND {tick.fence().predicate(n)}` with `tick.fence().params()`.
//!             let _fence = tick.fence();
//!             Ok::<_, std::io::Error>(())
//!         })
//!         .await?;
//!     if let Lead::ShuttingDown = lead {
//!         break;
//!     }
//!     tokio::time::sleep(config.max_poll()).await;
//! }
//! # Ok(())
//! # }
//! ```

//!
//! ## Scheduler, steps and metrics
//!
//! A [`Scheduler`] runs one loop per job, polling at most every `max_poll`. A
//! tick's work is a list of named steps under one [`Steps`] guard: a step that
//! panics stops, is logged with its backtrace, and the rest run; the first
//! panic is raised again at the end, so the tick is released as failed and
//! counted as `panicked`. [`Steps::each`] guards each item of a batch the
//! same way. [`Metrics`] registers into the application's registry.
//!
//! ```no_run
//! use std::time::Duration;
//! use prometheus_client::registry::Registry;
//! use ticklease::{Config, Manager, Metrics, PgStore, PgStoreOptions, Role, Scheduler, Steps};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example(pg: tokio_postgres::Config) -> anyhow::Result<()> {
//! let config = Config::default();
//! let store = PgStore::connect(pg, PgStoreOptions::from_config(&config)).await?;
//! let billing = Role::new("billing")?;
//! let mut registry = Registry::with_prefix("myapp");
//! let metrics = Metrics::register(&mut registry, [billing.clone()]);
//! let manager = Manager::start_with_metrics(store, config, [billing.clone()], metrics).await?;
//! let scheduler = Scheduler::new(manager).job(&billing, Duration::from_secs(3600), |tick| async move {
//!     let mut steps = Steps::new(&tick);
//!     steps.run("reconcile", async { /* … */ }).await;
//!     steps.each("bill", ["sub-1", "sub-2"], |sub| async move { /* bill `sub` */ let _ = sub; }).await;
//!     steps.run("cleanup", async { /* … */ }).await;
//!     steps.finish(); // raises the first panic, if any
//!     Ok::<_, std::io::Error>(())
//! })?;
//! let shutdown = CancellationToken::new(); // cancel on SIGTERM
//! let stopped = scheduler.run(shutdown).await;
//! assert!(stopped.releases_done);
//! # Ok(())
//! # }
//! ```

pub mod config;
pub mod error;
pub mod fence;
mod heartbeat;
pub mod lead;
pub mod metrics;
pub mod migrate;
pub mod role;
pub mod scheduler;
pub mod step;
pub mod store;
pub mod token;

pub use config::{Config, ConfigBuilder};
pub use error::{ConfigError, Error, MigrateError, RoleError, StoreError};
pub use fence::Fence;
pub use lead::{holder_id, BoxError, Cancel, Lead, Manager, RoleReport, Tick};
pub use metrics::Metrics;
pub use migrate::{migrate, migrate_with, MigrateOptions, MigrateReport};
pub use role::Role;
pub use scheduler::{cancel_on_signals, Scheduler, Stopped};
pub use step::Steps;
pub use store::{
    Acquire, LeaseStatus, LeaseStore, LossReason, PgStore, PgStoreOptions, Release, Renew, Term,
};
pub use token::Token;

#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

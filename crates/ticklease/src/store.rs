//! The lease store: the four statements and the operator calls, as a trait so
//! the heartbeat state machine can run against a fake under paused time. The
//! Postgres store is the one that matters; a fake must pass the same
//! conformance suite (`ticklease-testkit`).

use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use crate::connect::coordination::Signals;
use crate::error::StoreError;
use crate::term::role::Role;
use crate::term::schedule::Skipped;
use crate::term::token::Token;

pub(crate) mod batch;
mod cancel;
mod definitions;
#[cfg(feature = "testing")]
pub(crate) mod memory;
pub mod migrate;
mod postgres;

pub use postgres::{PgStore, PgStoreOptions, POOL_SIZE_MAX};

/// A term that ACQUIRE started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Term {
    /// The term's fencing token.
    pub token: Token,
    /// The database clock when the term started (observability only).
    pub db_now: SystemTime,
    /// Attempts of the role that failed since its last completed tick (or
    /// occurrence), for the retry policy.
    pub failures: u32,
}

/// What one ACQUIRE did: a term, or why none started (a normal outcome).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// A term started.
    Acquired(Term),
    /// No term started.
    Refused(Refusal),
}

/// Why an ACQUIRE started no term.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// Another live term holds the role.
    Held {
        /// Who holds it.
        holder: String,
        /// When that term runs out unless renewed.
        expires_at: SystemTime,
        /// `expires_at` less the database clock at the statement: a
        /// follower wakes this long after the answer arrived.
        remaining: Duration,
        /// The holder's coordination key, when it has a coordination
        /// session: the term ends as soon as no session holds the key.
        holder_key: Option<i64>,
    },
    /// An operator paused the role.
    Paused {
        /// Who paused it.
        by: String,
        /// Why.
        reason: String,
    },
    /// The last completed tick is younger than the interval, or a cooldown runs.
    NotDue {
        /// When it is due.
        due_at: SystemTime,
        /// `due_at` less the database clock at the statement.
        remaining: Duration,
    },
    /// Another replica acquired the role during this statement.
    Contended,
    /// Acquirable, but a batched ACQUIRE ([`LeaseStore::acquire_many`])
    /// had started its limit of terms before reaching it.
    OverLimit,
}

/// What one RENEW did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Renew {
    /// The term lasts another `lease_ttl`.
    Renewed {
        /// The database clock at the RENEW.
        db_now: SystemTime,
    },
    /// Not renewed (`renewed = false`): the term is over, definitively.
    Lost(LossReason),
}

/// Why a term ended before its tick did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// A later term exists (our lease expired and another replica acquired it).
    TakenOver,
    /// An operator paused the role.
    Paused,
    /// The row no longer names us as holder with our token (cleared or deleted).
    Released,
    /// No RENEW was acknowledged within `abandon_after`; we stopped on our own clock.
    HeartbeatTimeout,
    /// The server the term started on was superseded by a promotion of
    /// another host of the store's URL (see [`crate::hosts`]): its work may
    /// have written to a server whose writes are to be rewound, so it stops,
    /// and the next term starts on the promoted server.
    Superseded,
}

impl LossReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            LossReason::TakenOver => "taken_over",
            LossReason::Paused => "paused",
            LossReason::Released => "released",
            LossReason::HeartbeatTimeout => "heartbeat_timeout",
            LossReason::Superseded => "superseded",
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a tick ended, which decides what RELEASE writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Release {
    /// Work returned `Ok`: stamps `last_tick_ended_at` / `last_tick_holder`.
    Completed,
    /// Shutdown cancelled the tick: due again at once, no cooldown.
    Interrupted,
    /// The term was lost while we still hold the row (abandon): `not_before = now + min(interval, 60 s)`.
    Lost,
    /// Work returned `Err` or panicked: `not_before = now + interval`, `last_tick_*` untouched.
    Failed,
}

impl Release {
    /// The outcome's label in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Release::Completed => "completed",
            Release::Interrupted => "interrupted",
            Release::Lost => "lost",
            Release::Failed => "failed",
        }
    }

    /// Whether RELEASE stamps `last_tick_ended_at` / `last_tick_holder`.
    pub fn stamps_last_tick(self) -> bool {
        self == Release::Completed
    }

    /// How long the role waits before its next term (`not_before`), for a
    /// tick of `interval`; `None` clears any cooldown. Every store applies
    /// this one policy.
    pub fn cooldown(self, interval: Duration) -> Option<Duration> {
        match self {
            Release::Lost => Some(interval.min(LOST_COOLDOWN_MAX)),
            Release::Failed => Some(interval),
            Release::Completed | Release::Interrupted => None,
        }
    }
}

/// How a term ended, as RELEASE records it in the role's history (beside
/// the [`Release`] policy, which decides what the row gets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    /// `completed`, `interrupted`, `lost`, `failed` or `panicked`.
    pub outcome: &'static str,
    /// Why a lost term was lost (a [`LossReason`] label).
    pub reason: Option<&'static str>,
    /// A short summary of the error or panic (at most [`ERROR_SUMMARY_MAX`] characters kept).
    pub error: Option<String>,
    /// What the work said ([`Tick::keep_output`](crate::Tick::keep_output)):
    /// its last [`OUTPUT_KEPT_MAX`] characters are kept.
    pub output: Option<String>,
}

/// The longest error summary the history keeps, in characters.
pub const ERROR_SUMMARY_MAX: usize = 500;

/// The most of a term's output the history keeps, in characters (the last ones).
pub const OUTPUT_KEPT_MAX: usize = 4_000;

/// Where a bounded STATUS stops counting rows ([`LeaseStore::status_bounded`]):
/// the count says "at least this many" beyond it, and costs no more.
pub const STATUS_COUNTED_MAX: u64 = 100_000;

impl Ending {
    /// What the outcome alone says (no reason, no error).
    pub fn of(outcome: Release) -> Self {
        Ending {
            outcome: outcome.as_str(),
            reason: None,
            error: None,
            output: None,
        }
    }
}

/// One term of a batched RELEASE ([`LeaseStore::release_many`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Releasing {
    /// The term's role.
    pub role: Role,
    /// The term's token.
    pub token: Token,
    /// How its tick ended, which decides what the row gets.
    pub outcome: Release,
    /// The role's tick interval (for the cooldown).
    pub interval: Duration,
    /// What the role's history records.
    pub ending: Ending,
}

/// What an ACQUIRE of an occurrence of a cron schedule asks
/// ([`LeaseStore::acquire_occurrence`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OccurrenceAsk {
    /// The occurrence to start a term for; `None` only asks (starts nothing).
    pub occurrence: Option<SystemTime>,
    /// The occurrence after it: the term starts only before the database
    /// clock reaches it (the asked one must still be the latest).
    pub before: Option<SystemTime>,
    /// The occurrences passed over, recorded in the history when the term starts.
    pub skipped: Vec<Skipped>,
    /// The schedule as text (at most 200 characters), recorded for operators
    /// on a role's first look and when a term starts.
    pub schedule: String,
    /// The occurrence after the asked one, recorded for operators when the term starts.
    pub next: Option<SystemTime>,
}

/// What a batched ACQUIRE of one occurrence for many keys of a family asks
/// ([`LeaseStore::acquire_many_occurrence`]), under the Latest catch-up policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyOccurrenceAsk {
    /// The occurrence to start terms for.
    pub occurrence: SystemTime,
    /// The occurrence after it: terms start only before the database clock
    /// reaches it, and it is recorded for operators.
    pub next: SystemTime,
    /// The schedule as text (at most 200 characters), recorded for operators.
    pub schedule: String,
    /// The latest occurrences before `occurrence`, newest last (at most
    /// [`SKIPPED_COUNTED_MAX`](crate::SKIPPED_COUNTED_MAX)): a started key
    /// records those after its last completed one as skipped.
    pub recent: Vec<SystemTime>,
}

/// What an ACQUIRE of an occurrence answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OccurrenceAnswer {
    /// The term, or why none started (`Refusal::Contended` when the asked
    /// occurrence is not one to run now: completed already, or no longer the latest).
    pub acquire: Acquire,
    /// Occurrences at or before this never run: the last completed one, or
    /// where the role's counting started.
    pub after: SystemTime,
    /// Failed attempts of the asked occurrence so far.
    pub failures: u32,
    /// The last occurrence a term started for before this statement (`None`
    /// before any): every occurrence at or before it was attempted or already
    /// recorded as skipped, so a later term's skipped ones are counted after it.
    pub started: Option<SystemTime>,
    /// The term started is a manual run an operator asked for (run-now),
    /// not the asked occurrence: who asked. Its RELEASE completes no
    /// occurrence and counts no failed attempt.
    pub manual_by: Option<String>,
    /// An operator's run-now waits for a manual run this ACQUIRE did not start
    /// (an occurrence ran first, or the role is paused or held).
    pub run_now_pending: bool,
    /// The database clock at the statement.
    pub db_now: SystemTime,
    /// The role's last pause, when it was paused and unpaused (the skipped
    /// occurrences that fell due within it are recorded as paused).
    pub last_pause: Option<(SystemTime, SystemTime)>,
}

/// Statements waiting for a synchronous standby to confirm their commit,
/// among the backends the store's login may see (its own; all of them with
/// `pg_read_all_stats`). Postgres applies no `statement_timeout` to that
/// wait: a standby that stops confirming holds every commit, and a
/// statement cancelled there is committed locally.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SynchronousWaits {
    /// How many wait now.
    pub waiting: u64,
    /// The longest wait so far (0 when none waits).
    pub longest: Duration,
}

/// Most roles in one batched statement; larger batches are split.
pub const BATCH_MAX: usize = 1000;

/// Longest a replica registration lives past its last beat (the database
/// caps it: a registration no one renews is gone within it).
pub const REGISTRATION_TTL_MAX: Duration = Duration::from_secs(60);

/// Longest cooldown after a lost tick.
pub(crate) const LOST_COOLDOWN_MAX: Duration = Duration::from_secs(60);

/// One row of `leader_status`.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseStatus {
    /// The role.
    pub role: String,
    /// A live term exists (holder set and not expired on the database clock).
    pub held: bool,
    /// Who holds (or last held) the term.
    pub holder_id: Option<String>,
    /// The term's fencing token.
    pub token: Token,
    /// When the live term started.
    pub acquired_at: Option<SystemTime>,
    /// When the term runs out unless renewed.
    pub expires_at: Option<SystemTime>,
    /// The database clock when read.
    pub db_now: SystemTime,
    /// Time left in the live term.
    pub remaining: Option<Duration>,
    /// When an operator paused the role.
    pub paused_at: Option<SystemTime>,
    /// Who paused it.
    pub paused_by: Option<String>,
    /// Why.
    pub pause_reason: Option<String>,
    /// When the last completed tick ended.
    pub last_tick_ended_at: Option<SystemTime>,
    /// Who ran it.
    pub last_tick_holder: Option<String>,
    /// A cooldown: no term before this instant.
    pub not_before: Option<SystemTime>,
    /// How the role's last recorded term ended (`completed`, `lost`, …).
    pub last_outcome: Option<String>,
    /// A cron schedule as the replica that started the last term declared it.
    pub schedule: Option<String>,
    /// The last occurrence that completed.
    pub last_occurrence: Option<SystemTime>,
    /// The next occurrence to run: the current one while it has not
    /// completed and no term runs it (after a failed attempt), else the one
    /// after the last term's.
    pub next_occurrence: Option<SystemTime>,
    /// The role is long-lived, as the replica that started its last term
    /// declared it: its work runs for the whole term, so it is healthy while
    /// held and never completes ticks the way a scheduled role does.
    pub long_lived: bool,
    /// The interval the replica that started its last term declared (none on
    /// a cron schedule, or before a term).
    pub tick_interval: Option<Duration>,
}

/// When a role on an interval is due again, and whether its work runs for
/// the whole term (a long-lived role: a relay, a consumer). A plain
/// [`Duration`] is a scheduled role's interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    /// The wait after a completed tick.
    pub every: Duration,
    /// The work runs for the whole term (recorded with the term, for readers).
    pub long_lived: bool,
}

impl From<Duration> for Interval {
    fn from(every: Duration) -> Self {
        Interval {
            every,
            long_lived: false,
        }
    }
}

/// The statements of the lease protocol. Every method is one statement, on the
/// store's clock; RENEW and RELEASE are term-scoped by `(role, token)`.
pub trait LeaseStore: Send + Sync + 'static {
    /// ACQUIRE: starts a term of `role` for `holder` if the role is free, unpaused and due.
    /// `interval` is a [`Duration`] or an [`Interval`] (a long-lived role's).
    fn acquire(
        &self,
        role: &Role,
        holder: &str,
        lease_ttl: Duration,
        interval: impl Into<Interval> + Send,
    ) -> impl Future<Output = Result<Acquire, StoreError>> + Send;

    /// ACQUIRE of one occurrence of a cron schedule: starts a term of
    /// `role` for `ask.occurrence` when the store's clock has reached it, it
    /// is later than the last completed occurrence, and the role is free,
    /// unpaused and out of its cooldown. The first ask of a role starts
    /// its counting (earlier occurrences never run).
    fn acquire_occurrence(
        &self,
        role: &Role,
        holder: &str,
        lease_ttl: Duration,
        ask: &OccurrenceAsk,
    ) -> impl Future<Output = Result<OccurrenceAnswer, StoreError>> + Send;

    /// RENEW: extends the term `(role, token)` by `lease_ttl`; `Lost` when it is over.
    fn renew(
        &self,
        role: &Role,
        token: Token,
        lease_ttl: Duration,
    ) -> impl Future<Output = Result<Renew, StoreError>> + Send;

    /// Ends the term `(role, token)`; `false` when it was already over.
    fn release(
        &self,
        role: &Role,
        token: Token,
        outcome: Release,
        interval: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// RELEASE, recording `ending` in the role's history where the store
    /// keeps one (the Postgres store; the default records nothing).
    fn release_ending(
        &self,
        role: &Role,
        token: Token,
        outcome: Release,
        interval: Duration,
        ending: &Ending,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = ending;
        self.release(role, token, outcome, interval)
    }

    /// ACQUIRE for many roles of one `interval` in one statement: starts
    /// terms for `holder` on at most `limit` of them, in the order given
    /// among those acquirable (the others are [`Refusal::OverLimit`]).
    /// One answer per distinct role, in no particular order. At most
    /// [`BATCH_MAX`] roles.
    fn acquire_many(
        &self,
        roles: &[Role],
        holder: &str,
        lease_ttl: Duration,
        interval: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(Role, Acquire)>, StoreError>> + Send;

    /// ACQUIRE of one occurrence for many keys of a family in one statement:
    /// starts terms for `holder` on at most `limit` of the keys for which
    /// `ask.occurrence` is runnable (as [`LeaseStore::acquire_occurrence`]
    /// decides it, the occurrence being the latest), or whose operator's
    /// run-now waits (a manual term), in the order given; the others are
    /// refused ([`Refusal::OverLimit`] past the limit). Each key counts from
    /// its first ask. One answer per distinct role, in no particular order.
    /// At most [`BATCH_MAX`] roles.
    fn acquire_many_occurrence(
        &self,
        roles: &[Role],
        holder: &str,
        lease_ttl: Duration,
        ask: &FamilyOccurrenceAsk,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(Role, OccurrenceAnswer)>, StoreError>> + Send;

    /// RENEW for many terms in one statement, each term-scoped by `(role,
    /// token)`; the answers in the order given. At most [`BATCH_MAX`] terms.
    fn renew_many(
        &self,
        terms: &[(Role, Token)],
        lease_ttl: Duration,
    ) -> impl Future<Output = Result<Vec<Renew>, StoreError>> + Send;

    /// RELEASE for many terms in one statement; per term, `false` when it
    /// was already over, in the order given. At most [`BATCH_MAX`] terms.
    fn release_many(&self, terms: &[Releasing])
        -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send;

    /// Registers `holder` as serving `family` for another `lease_ttl` and
    /// returns the replicas that do (this one included), sorted.
    fn beat(
        &self,
        family: &str,
        holder: &str,
        lease_ttl: Duration,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// Removes `holder` from `family`'s replicas; `false` if it was not there.
    fn leave(&self, family: &str, holder: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// `true` when this call paused the role; `StoreError::UnknownRole` when it has no row.
    fn pause(
        &self,
        role: &Role,
        by: &str,
        reason: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// `true` when this call unpaused the role. Leaves `not_before` alone.
    fn unpause(&self, role: &Role) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Asks for a manual run: the role's next term starts at its next ACQUIRE
    /// whatever its interval, cooldown or schedule (not before a pause's
    /// wait), and its history names who asked. `true` when the role had a
    /// cooldown (passed over, left in place); `StoreError::UnknownRole` when
    /// it has no row.
    fn run_now(&self, role: &Role) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Creates the rows of roles that have none; existing rows are untouched.
    fn seed(&self, roles: &[Role]) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Every row of `leader_status`, by role.
    fn status(&self) -> impl Future<Output = Result<Vec<LeaseStatus>, StoreError>> + Send;

    /// At most `limit` rows of `leader_status`, by role, and how many rows
    /// there are in all, counted up to [`STATUS_COUNTED_MAX`]: any app login
    /// may create rows (`leader_seed`), so what is rendered or exported reads
    /// a bounded part, and its work is bounded too (it never reads or sorts
    /// every row). The paused rows come first (an operator's doing), then
    /// the others by role.
    fn status_bounded(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<(Vec<LeaseStatus>, u64), StoreError>> + Send {
        async move {
            let mut rows = self.status().await?;
            let total = (rows.len() as u64).min(STATUS_COUNTED_MAX);
            rows.sort_by_key(|r| (r.paused_at.is_none(), r.role.clone()));
            rows.truncate(limit);
            rows.sort_by(|a, b| a.role.cmp(&b.role));
            Ok((rows, total))
        }
    }

    /// The rows of `leader_status` of `roles` (those that have one), by
    /// role: read by name, so its work is the roles asked whatever other
    /// rows any login created.
    fn status_of(&self, roles: &[Role]) -> impl Future<Output = Result<Vec<LeaseStatus>, StoreError>> + Send {
        async move {
            let mut rows = self.status().await?;
            rows.retain(|r| roles.iter().any(|role| role.as_str() == r.role));
            Ok(rows)
        }
    }

    /// The coordination session's signals, when the store has one
    /// ([`PgStore::with_direct`]); without, followers wake by the lease's
    /// times alone.
    fn signals(&self) -> Option<&Signals> {
        None
    }

    /// The database server the store's connections reach now; `None` for a
    /// store without any.
    fn server(&self) -> Option<crate::connect::hosts::Server> {
        None
    }

    /// What happened to the store's connections so far (host changes, lost
    /// connections); `None` for a store without any.
    fn connection_events(&self) -> Option<crate::connect::hosts::ConnectionEvents> {
        None
    }

    /// A receiver that moves when a statement that failed may now work: an
    /// outage ended, a connection reached another host, the failover
    /// manager confirmed the server. A role loop whose poll failed waits for
    /// it (or `max_poll`); `None` for a store that cannot tell.
    fn usable(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// A receiver that moves when the failover manager confirms the
    /// store's server after a check that did not
    /// ([`crate::PgStore::with_patroni`]). A role loop whose ACQUIRE waited
    /// for a confirmation waits for it, not for [`LeaseStore::usable`]:
    /// a connection that comes back confirms nothing. `None` without a check.
    fn confirmed_again(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// The statements of the store's login that wait now for a synchronous
    /// standby to confirm their commit (see [`SynchronousWaits`]); `None`
    /// for a store without a server.
    fn synchronous_waits(&self) -> impl Future<Output = Result<Option<SynchronousWaits>, StoreError>> + Send {
        async { Ok(None) }
    }

    /// What the failover manager last said of the store's server, when the
    /// store asks it ([`crate::PgStore::with_patroni`]); `None` when it does not.
    fn primary_confirmation(&self) -> Option<crate::patroni::Confirmation> {
        None
    }
}

/// Resolves when `usable` ([`LeaseStore::usable`]) moves, at once if it
/// moved unseen; never without one, or once its store is gone.
pub(crate) async fn usable_moved(usable: Option<&mut tokio::sync::watch::Receiver<u64>>) -> Option<()> {
    match usable {
        Some(usable) => usable.changed().await.ok(),
        None => None,
    }
}

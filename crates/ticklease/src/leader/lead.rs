//! `Manager::lead`: ACQUIRE → work under a heartbeat → RELEASE.

use std::collections::BTreeSet;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, DURATION_MAX};
use crate::error::{Error, StoreError};
use crate::leader::drift::Drift;
use crate::leader::heartbeat::Heartbeat;
use crate::ops::metrics::{LostReason, Metrics, TickOutcome};
use crate::ops::outcome::panic_message;
use crate::store::batch::Batcher;
use crate::store::{
    Acquire, Ending, FamilyOccurrenceAsk, Interval, LeaseStore, LossReason, OccurrenceAnswer, Refusal,
    Release, Releasing, Renew, Term,
};
use crate::term::fence::Fence;
use crate::term::holder::HolderId;
use crate::term::role::Role;
use crate::term::schedule::{Retry, Schedule};
use crate::term::token::Token;

pub(crate) mod occurrence;

/// The error type work may return.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The work of a scheduled job, run once per tick.
pub(crate) type Work =
    Arc<dyn Fn(Tick) -> futures::future::BoxFuture<'static, Result<(), BoxError>> + Send + Sync>;

/// Why a tick's cancellation fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cancel {
    /// The term is over; the work future is dropped right after this fires.
    LeaseLost(LossReason),
    /// The manager is shutting down; the work should return soon.
    Shutdown,
    /// The role's key was removed from its [`Family`](crate::Family); the
    /// work should return soon (released as interrupted).
    Removed,
}

/// What work receives: the fence of its term and a cancellation with a cause.
#[derive(Debug, Clone)]
pub struct Tick {
    fence: Fence,
    cancel: CancellationToken,
    lost: Arc<OnceLock<LossReason>>,
    /// Set when a family key is removed.
    removed: Option<Arc<AtomicBool>>,
    occurrence: Option<SystemTime>,
    abandon_at: tokio::sync::watch::Receiver<Instant>,
    /// What the work said, for the term's history row ([`Tick::keep_output`]).
    output: Arc<std::sync::Mutex<Option<String>>>,
    /// The server the store's connections reached when the term started.
    server: Option<Arc<crate::connect::hosts::Server>>,
}

impl Tick {
    /// Keeps `output` (what the work said: a command's last output, say)
    /// with this term's history row, replacing what was kept before: its
    /// last [`OUTPUT_KEPT_MAX`](crate::OUTPUT_KEPT_MAX) characters, escaped
    /// where shown (`ticklease history`, the status page). A family key's
    /// term keeps none (its batched RELEASE records no output).
    pub fn keep_output(&self, output: impl Into<String>) {
        let output = output.into();
        let skip = output.chars().count().saturating_sub(crate::OUTPUT_KEPT_MAX);
        let kept = output.chars().skip(skip).collect();
        *self.output.lock().expect("not poisoned") = Some(kept);
    }
    /// The fence of this tick's term, for its claim statements.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }
    /// The tick's role.
    pub fn role(&self) -> &Role {
        self.fence.role()
    }
    /// The term's token.
    pub fn token(&self) -> Token {
        self.fence.token()
    }
    /// The database server the term started on, when the store has one:
    /// work that connects on its own connects there (a `ticklease run`
    /// child finds it in `TICKLEASE_DB_HOST`, `TICKLEASE_DB_PORT` and, when
    /// the URL gives an address, `TICKLEASE_DB_HOSTADDR`). Of a multi-host URL,
    /// another host may be writable too for a while (a promotion whose old
    /// primary nothing demoted): the term ends as
    /// [`LossReason::Superseded`] once the store sees that, and the next
    /// term names the promoted server.
    pub fn server(&self) -> Option<&crate::connect::hosts::Server> {
        self.server.as_deref()
    }
    /// The scheduled instant this term runs, on a cron schedule: the same
    /// for every attempt of it, so work can key its effects on it (the
    /// billing period). `None` on an interval schedule.
    pub fn occurrence(&self) -> Option<SystemTime> {
        self.occurrence
    }
    /// The instant, on the local monotonic clock, at which the heartbeat
    /// abandons this term unless a RENEW is acknowledged first
    /// (`last_ack + abandon_after`, before the lease can expire); it moves
    /// on with each acknowledged RENEW. For work that must be stopped by
    /// then from outside this process (a child process's guard).
    pub fn abandon_at(&self) -> tokio::sync::watch::Receiver<Instant> {
        self.abandon_at.clone()
    }
    /// The cause, once cancelled. A loss wins over a shutdown.
    pub fn cause(&self) -> Option<Cancel> {
        if let Some(reason) = self.lost.get() {
            Some(Cancel::LeaseLost(*reason))
        } else if self.removed.as_ref().is_some_and(|r| r.load(Ordering::Relaxed)) {
            Some(Cancel::Removed)
        } else if self.cancel.is_cancelled() {
            Some(Cancel::Shutdown)
        } else {
            None
        }
    }
    /// Whether the tick was cancelled (term lost or shutdown).
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }
    /// Resolves when the tick is cancelled, with the cause.
    pub async fn cancelled(&self) -> Cancel {
        self.cancel.cancelled().await;
        self.cause().unwrap_or(Cancel::Shutdown)
    }
    fn lose(&self, reason: LossReason) {
        let _ = self.lost.set(reason);
        self.cancel.cancel();
    }
}

/// What one call of [`Manager::lead`] did.
#[derive(Debug)]
#[non_exhaustive]
pub enum Lead<T> {
    /// ACQUIRE started no term (held elsewhere, paused, not due, contended).
    Refused(Refusal),
    /// The manager is shutting down; nothing was attempted.
    ShuttingDown,
    /// Work returned `Ok`; released as completed.
    Completed {
        /// The term's token.
        token: Token,
        /// What the work returned.
        value: T,
    },
    /// Work returned `Err`; released as failed (cooldown of one interval).
    Failed {
        /// The term's token.
        token: Token,
        /// What the work returned.
        error: BoxError,
    },
    /// Shutdown cancelled the tick; released as interrupted (due again at once).
    Interrupted {
        /// The term's token.
        token: Token,
    },
    /// The term ended under the work; the work was cancelled and dropped
    /// (or it returned after the term was over: its RELEASE found a later
    /// term or none, whatever the work returned).
    Lost {
        /// The term's token.
        token: Token,
        /// Why the term ended.
        reason: LossReason,
    },
}

/// Declared roles compared with the rows present.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoleReport {
    /// Declared here, no row in the table.
    pub missing: Vec<Role>,
    /// Rows in the table not declared here (another release, or a
    /// leftover): those among the first [`ROLE_REPORT_ROWS_MAX`] rows.
    pub undeclared: Vec<String>,
    /// The table's rows, counted up to [`STATUS_COUNTED_MAX`](crate::STATUS_COUNTED_MAX).
    pub rows: u64,
}

/// Most rows [`Manager::check_roles`] reads to list undeclared ones: any
/// app login may create rows, and a replica's start must not wait on them.
pub const ROLE_REPORT_ROWS_MAX: usize = 100;

/// The first wait before a RELEASE that could not finish is sent again; it
/// doubles up to the statement timeout, within the lease's life.
const RELEASE_RETRY_MIN: Duration = Duration::from_millis(100);

struct Inner<S> {
    store: Arc<S>,
    config: Config,
    holder: HolderId,
    /// `holder` as text, as the store takes it.
    holder_id: String,
    roles: BTreeSet<Role>,
    shutdown: CancellationToken,
    drift: Arc<Drift>,
    metrics: Option<Metrics>,
    /// RELEASE tasks, so a shutdown can wait for them.
    releases: TaskTracker,
    /// RELEASEs that failed or did not answer after shutdown was requested:
    /// those terms stay held until their lease runs out.
    unreleased: AtomicUsize,
    /// How long a lost term's work may take to return before it is dropped
    /// and the term RELEASEd, in ms ([`Manager::set_lost_drain`]).
    lost_drain_ms: std::sync::atomic::AtomicU64,
    /// Carries the RENEWs and RELEASEs of family terms.
    batcher: Batcher,
    /// Per role on a cron schedule: what the database last said of its occurrences.
    occurrences: std::sync::Mutex<std::collections::HashMap<Role, occurrence::Known>>,
    /// Roles whose last ACQUIRE was sent and not answered (it timed out, or
    /// its connection failed): its term may have started all the same.
    unanswered: std::sync::Mutex<BTreeSet<Role>>,
    /// Per role: the ACQUIREs in flight and the terms whose RELEASE is not
    /// done, of this manager ([`Running`]).
    running: std::sync::Mutex<std::collections::HashMap<Role, usize>>,
    /// The origin of the heartbeat grid family terms beat on.
    epoch: Instant,
}

/// How a term is run: a declared role's, or a family key's.
#[derive(Clone, Default)]
pub(crate) struct TermScope {
    /// The family, for its aggregate metrics and its batched statements.
    pub(crate) family: Option<FamilyScope>,
    /// A family key's cancellation: on removal, or with the manager's shutdown.
    pub(crate) removed: Option<KeyCancel>,
    /// The occurrence a cron schedule's term runs, and its waits.
    pub(crate) occurrence: Option<occurrence::OccurrenceScope>,
    /// An interval's retry: the cooldown if this attempt's work returns `Err`.
    pub(crate) backoff: Option<Duration>,
    /// A long-lived role's restart after a healthy run: work that returned
    /// `Err` after running at least `.0` (the longest wait) waits only `.1`
    /// (the first), as a supervisor resets its backoff after a healthy run.
    pub(crate) healthy_run: Option<(Duration, Duration)>,
}

/// Cancels a family key's term, on its removal or with the manager's shutdown.
#[derive(Clone)]
pub(crate) struct KeyCancel {
    token: CancellationToken,
    removed: Arc<AtomicBool>,
}

impl KeyCancel {
    /// The key was removed: its work is cancelled with [`Cancel::Removed`].
    pub(crate) fn remove(&self) {
        self.removed.store(true, Ordering::Relaxed);
        self.token.cancel();
    }

    /// Whether [`KeyCancel::remove`] was called.
    pub(crate) fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Relaxed)
    }
}

#[derive(Clone)]
pub(crate) struct FamilyScope {
    pub(crate) name: Arc<str>,
    /// Per-role series too (opt-in: thousands of keys are thousands of series).
    pub(crate) per_role_metrics: bool,
}

impl TermScope {
    fn per_role_metrics(&self) -> bool {
        self.family.as_ref().is_none_or(|f| f.per_role_metrics)
    }
}

/// Leads the roles an application declares, one tick at a time.
pub struct Manager<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for Manager<S> {
    fn clone(&self) -> Self {
        Manager {
            inner: self.inner.clone(),
        }
    }
}

impl<S: LeaseStore> Manager<S> {
    /// Declares `roles`, creates their missing rows, and reports rows for
    /// roles not declared here (a warning, not an error: during a rolling
    /// upgrade other replicas may declare more).
    pub async fn start(
        store: S,
        config: Config,
        roles: impl IntoIterator<Item = Role>,
    ) -> Result<Self, Error> {
        Manager::start_inner(store, config, roles.into_iter().collect(), None).await
    }

    /// As [`Manager::start`], recording into `metrics` (registered for the same roles).
    #[cfg(feature = "prometheus")]
    pub async fn start_with_metrics(
        store: S,
        config: Config,
        roles: impl IntoIterator<Item = Role>,
        metrics: Metrics,
    ) -> Result<Self, Error> {
        Manager::start_inner(store, config, roles.into_iter().collect(), Some(metrics)).await
    }

    async fn start_inner(
        store: S,
        config: Config,
        roles: BTreeSet<Role>,
        metrics: Option<Metrics>,
    ) -> Result<Self, Error> {
        let declared: Vec<Role> = roles.iter().cloned().collect();
        store.seed(&declared).await?;
        let holder = HolderId::new();
        let store = Arc::new(store);
        let manager = Manager {
            inner: Arc::new(Inner {
                batcher: Batcher::start(store.clone(), config.lease_ttl(), config.statement_timeout()),
                epoch: Instant::now(),
                store,
                config,
                holder_id: holder.to_string(),
                holder,
                roles,
                shutdown: CancellationToken::new(),
                drift: Arc::new(Drift::new(metrics.clone())),
                metrics,
                releases: TaskTracker::new(),
                unreleased: AtomicUsize::new(0),
                lost_drain_ms: Default::default(),
                occurrences: Default::default(),
                unanswered: Default::default(),
                running: Default::default(),
            }),
        };
        let report = manager.check_roles().await?;
        for role in &report.missing {
            tracing::warn!(%role, "declared role has no row in leader_leases");
        }
        // One line, however many, and no warning: hosts running different
        // roles (job sets, families' keys) is the normal case; `ticklease
        // status` lists every row.
        if !report.undeclared.is_empty() {
            tracing::debug!(
                rows = report.rows,
                first = ?report.undeclared.iter().take(5).collect::<Vec<_>>(),
                "leader_leases has rows for roles this replica does not declare (family keys, or leftovers)"
            );
        }
        Ok(manager)
    }

    /// The lease store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }
    /// The lease timings.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }
    /// This manager's holder id as written to `leader_leases`.
    pub fn holder_id(&self) -> &str {
        &self.inner.holder_id
    }
    /// This manager's holder id.
    pub fn holder(&self) -> &HolderId {
        &self.inner.holder
    }
    /// The declared roles.
    pub fn roles(&self) -> impl Iterator<Item = &Role> {
        self.inner.roles.iter()
    }
    /// The last observed database-minus-local clock offset, in seconds.
    pub fn db_clock_drift_seconds(&self) -> Option<f64> {
        self.inner.drift.seconds()
    }

    /// Compares the declared roles with the table's rows. Bounded by its
    /// own work, whatever rows any login created: the declared roles are
    /// read by name, and the undeclared ones listed are among the first
    /// [`ROLE_REPORT_ROWS_MAX`] rows (paused first, then by name).
    pub async fn check_roles(&self) -> Result<RoleReport, Error> {
        let declared: Vec<Role> = self.inner.roles.iter().cloned().collect();
        let present = self.inner.store.status_of(&declared).await?;
        let (first, rows) = self.inner.store.status_bounded(ROLE_REPORT_ROWS_MAX).await?;
        let is_declared = |name: &str| self.inner.roles.iter().any(|r| r.as_str() == name);
        Ok(RoleReport {
            missing: declared
                .into_iter()
                .filter(|r| !present.iter().any(|p| p.role == r.as_str()))
                .collect(),
            undeclared: first
                .into_iter()
                .map(|s| s.role)
                .filter(|n| !is_declared(n))
                .collect(),
            rows,
        })
    }

    /// On a lost term, waits up to `bound` (at most [`DURATION_MAX`]) for
    /// the work to return (it sees [`Tick::cancelled`]) before dropping it
    /// and RELEASing the term; by default it is dropped at once. For work
    /// that stops something outside this process (a child process) and must
    /// see it stopped before the role can be acquired again: a lost term's
    /// lease is not extended meanwhile, so a bound past its expiry only
    /// makes the RELEASE a no-op.
    pub fn set_lost_drain(&self, bound: Duration) {
        let ms = u64::try_from(bound.min(DURATION_MAX).as_millis()).unwrap_or(u64::MAX);
        self.inner.lost_drain_ms.store(ms, Ordering::Relaxed);
    }

    /// Cancels in-flight ticks (they release as interrupted) and refuses new ones.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }
    /// Whether [`Manager::shutdown`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutdown.is_cancelled()
    }

    /// Cancelled by [`Manager::shutdown`].
    pub(crate) fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    /// Waits up to `bound` for every RELEASE started so far; `false` if some
    /// were still running.
    pub async fn wait_released(&self, bound: Duration) -> bool {
        self.inner.releases.close();
        let done = tokio::time::timeout(bound, self.inner.releases.wait())
            .await
            .is_ok();
        self.inner.releases.reopen();
        done
    }

    /// Terms whose RELEASE failed or did not answer after [`Manager::shutdown`]:
    /// they stay held until their lease runs out (at most `lease_ttl`).
    pub fn unreleased(&self) -> usize {
        self.inner.unreleased.load(Ordering::Relaxed)
    }

    /// The metrics this manager records into, if any.
    #[cfg(feature = "prometheus")]
    pub fn metrics(&self) -> Option<&Metrics> {
        self.inner.metrics.as_ref()
    }

    /// Refuses a role this manager does not declare and an interval out of range.
    /// Checks `role` is declared and `schedule` is one it can be led on.
    pub(crate) fn check_schedule(&self, role: &Role, schedule: &Schedule) -> Result<(), Error> {
        match schedule.interval() {
            Some(interval) => self.check_tick(role, interval),
            None => self.check_occurrence(role, schedule),
        }
    }

    pub(crate) fn check_tick(&self, role: &Role, interval: Duration) -> Result<(), Error> {
        self.check_declared(role)?;
        check_interval(role.as_str(), interval)
    }

    fn check_declared(&self, role: &Role) -> Result<(), Error> {
        match self.inner.roles.contains(role) {
            true => Ok(()),
            false => Err(Error::UnknownRole {
                role: role.to_string(),
            }),
        }
    }

    /// The metrics this manager records into, with or without the feature.
    pub(crate) fn metrics_handle(&self) -> Option<&Metrics> {
        self.inner.metrics.as_ref()
    }

    /// A family key's cancellation, fired by the manager's shutdown too.
    pub(crate) fn key_cancel(&self) -> KeyCancel {
        KeyCancel {
            token: self.inner.shutdown.child_token(),
            removed: Arc::default(),
        }
    }

    /// The shared store, for the scheduler's loops.
    pub(crate) fn store_arc(&self) -> &Arc<S> {
        &self.inner.store
    }

    /// ACQUIRE of many roles of one family in one statement; the instant it
    /// was sent is each new term's first heartbeat anchor.
    pub(crate) async fn acquire_many(
        &self,
        roles: &[Role],
        interval: Duration,
        limit: usize,
    ) -> Result<(Vec<(Role, Acquire)>, Instant), Error> {
        let inner = &self.inner;
        let ttl = inner.config.lease_ttl();
        self.batched(
            || {
                inner
                    .store
                    .acquire_many(roles, &inner.holder_id, ttl, interval, limit)
            },
            |a| a,
        )
        .await
    }

    /// The batched ACQUIRE of one occurrence for many keys of a family.
    pub(crate) async fn acquire_many_occurrence(
        &self,
        roles: &[Role],
        ask: &FamilyOccurrenceAsk,
        limit: usize,
    ) -> Result<(Vec<(Role, OccurrenceAnswer)>, Instant), Error> {
        let inner = &self.inner;
        let ttl = inner.config.lease_ttl();
        self.batched(
            || {
                inner
                    .store
                    .acquire_many_occurrence(roles, &inner.holder_id, ttl, ask, limit)
            },
            |a| &a.acquire,
        )
        .await
    }

    /// Sends a batched ACQUIRE: the coordination session's state for the
    /// metrics before, the clock drift from a started term after.
    async fn batched<A, Fut>(
        &self,
        send: impl FnOnce() -> Fut,
        acquire: impl Fn(&A) -> &Acquire,
    ) -> Result<(Vec<(Role, A)>, Instant), Error>
    where
        Fut: Future<Output = Result<Vec<(Role, A)>, crate::StoreError>>,
    {
        let inner = &self.inner;
        if let (Some(m), Some(signals)) = (&inner.metrics, inner.store.signals()) {
            m.coordination_up(signals.key().is_some());
        }
        let sent = Instant::now();
        let sent_wall = SystemTime::now();
        let answers = send().await?;
        if let Some(Acquire::Acquired(term)) = answers
            .iter()
            .map(|(_, a)| acquire(a))
            .find(|a| matches!(a, Acquire::Acquired(_)))
        {
            inner.drift.observe(sent_wall, sent.elapsed(), term.db_now);
        }
        Ok((answers, sent))
    }
}

/// Refuses an interval out of range.
pub(crate) fn check_interval(role: &str, interval: Duration) -> Result<(), Error> {
    let role_name = || role.to_string();
    if interval.is_zero() {
        return Err(Error::ZeroInterval { role: role_name() });
    }
    if interval > DURATION_MAX {
        return Err(Error::IntervalTooLong {
            role: role_name(),
            interval,
            max: DURATION_MAX,
        });
    }
    crate::term::schedule::check_interval(interval).map_err(|source| Error::Schedule {
        role: role_name(),
        source,
    })
}

impl<S: LeaseStore> Manager<S> {
    /// ACQUIRE: the new term's token and when the statement was sent (the
    /// heartbeat's first anchor), or why no term started.
    async fn acquire(
        &self,
        role: &Role,
        interval: Interval,
    ) -> Result<Result<(Term, Instant), Refusal>, Error> {
        let inner = &self.inner;
        if let (Some(m), Some(signals)) = (&inner.metrics, inner.store.signals()) {
            m.coordination_up(signals.key().is_some());
        }
        // At most twice: once more after releasing a term an unanswered ACQUIRE started.
        loop {
            let sent = Instant::now();
            let sent_wall = SystemTime::now();
            let answer = inner
                .store
                .acquire(role, &inner.holder_id, inner.config.lease_ttl(), interval)
                .await;
            let unanswered = self.note_answer(role, answer.as_ref().err());
            let term = match answer? {
                Acquire::Acquired(term) => term,
                Acquire::Refused(Refusal::Held { holder, .. })
                    if unanswered && holder == inner.holder_id && self.release_unanswered(role).await? =>
                {
                    continue;
                }
                Acquire::Refused(refusal) => return Ok(Err(refusal)),
            };
            inner.drift.observe(sent_wall, sent.elapsed(), term.db_now);
            return Ok(Ok((term, sent)));
        }
    }

    /// Notes whether this ACQUIRE of `role` went unanswered (`error` a
    /// statement sent that did not finish: its commit may have gone
    /// through, as a cancelled wait for a synchronous standby commits
    /// locally); returns whether the one before it did.
    fn note_answer(&self, role: &Role, error: Option<&StoreError>) -> bool {
        let mut unanswered = self.inner.unanswered.lock().expect("unanswered");
        let before = unanswered.remove(role);
        // Sent and cut off (a timeout, a connection lost mid-statement), not
        // refused, nor never sent (no connection, no Patroni word).
        if error.is_some_and(|e| e.is_outage() && !matches!(e, StoreError::Connect { .. })) {
            unanswered.insert(role.clone());
        }
        before
    }

    /// The term an unanswered ACQUIRE of this manager started: nobody runs
    /// it, and the role would wait out its lease. RELEASEs it (interrupted)
    /// when the row still names this holder and nothing else of this
    /// manager asks for or leads the role; true if it did.
    async fn release_unanswered(&self, role: &Role) -> Result<bool, Error> {
        let inner = &self.inner;
        // Another call of this manager leads the role, or asks for it (the
        // review's F1: its live term was released): the term may be its.
        if Running::count(inner, role) > 1 {
            return Ok(false);
        }
        let rows = inner.store.status_of(std::slice::from_ref(role)).await?;
        let Some(row) = rows
            .iter()
            .find(|r| r.holder_id.as_deref() == Some(inner.holder_id.as_str()))
        else {
            return Ok(false);
        };
        let ending = Ending {
            error: Some("its ACQUIRE was not answered: the term ran nothing".into()),
            ..Ending::of(Release::Interrupted)
        };
        let released = inner
            .store
            .release_ending(role, row.token, Release::Interrupted, Duration::ZERO, &ending)
            .await?;
        tracing::info!(%role, token = %row.token, released, "released the term of an ACQUIRE whose answer was lost");
        Ok(released)
    }

    fn heartbeat(
        &self,
        role: &Role,
        token: Token,
        acquire_sent: Instant,
        scope: &TermScope,
        abandon_at: tokio::sync::watch::Sender<Instant>,
    ) -> Heartbeat<S> {
        let inner = &self.inner;
        let batched = scope.family.is_some();
        Heartbeat {
            abandon_at,
            batch: batched.then(|| inner.batcher.clone()),
            grid: batched.then_some(inner.epoch),
            store: inner.store.clone(),
            role: role.clone(),
            token,
            config: inner.config,
            acquire_sent,
            drift: inner.drift.clone(),
            metrics: inner.metrics.clone(),
            signals: inner.store.signals().map(|s| s.role(role.as_str())),
        }
    }

    /// One tick of `role` on `schedule` (an interval, or a [`Schedule`]):
    /// ACQUIRE; if a term starts, run `work` under a heartbeat, then RELEASE
    /// with the outcome. A panic in `work` releases the tick as failed and
    /// then continues unwinding from here. On a cron schedule the term runs
    /// the occurrence due on the database clock ([`Tick::occurrence`]),
    /// at most once to completion.
    ///
    /// RELEASE runs even if this future is dropped mid-tick (as interrupted).
    pub async fn lead<F, Fut, T, E>(
        &self,
        role: &Role,
        schedule: impl Into<Schedule>,
        work: F,
    ) -> Result<Lead<T>, Error>
    where
        F: FnOnce(Tick) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        let schedule = schedule.into();
        match schedule.interval() {
            Some(every) => {
                let interval = Interval {
                    every,
                    long_lived: schedule.is_long_lived(),
                };
                self.lead_every(role, interval, schedule.retry_policy(), work)
                    .await
            }
            None => self.lead_occurrence(role, &schedule, work).await,
        }
    }

    async fn lead_every<F, Fut, T, E>(
        &self,
        role: &Role,
        interval: Interval,
        retry: Retry,
        work: F,
    ) -> Result<Lead<T>, Error>
    where
        F: FnOnce(Tick) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        let inner = &self.inner;
        self.check_tick(role, interval.every)?;
        if inner.shutdown.is_cancelled() {
            return Ok(Lead::ShuttingDown);
        }
        // Counted from before the ACQUIRE is sent until the term's own
        // count starts: an orphan term is released only when this call is
        // the role's one ACQUIRE or term here.
        let _asking = Running::start(inner, role);
        let (term, sent) = match self.acquire(role, interval).await? {
            Ok(started) => started,
            Err(refusal) => return Ok(Lead::Refused(refusal)),
        };
        let scope = TermScope {
            backoff: retry.backoff_in_round(term.failures),
            healthy_run: interval.long_lived.then_some((retry.backoff_max, retry.backoff)),
            ..TermScope::default()
        };
        self.run_term(role, interval.every, term.token, sent, work, scope)
            .await
    }

    /// Why a term whose RELEASE found it over ended: a RENEW of it changes
    /// nothing (term-scoped) and names the reason; a family's goes through
    /// the batcher, one statement for all of them.
    async fn why_over(&self, role: &Role, token: Token, batched: bool) -> LossReason {
        let inner = &self.inner;
        let bound = inner.config.statement_timeout();
        let renew = async {
            match batched {
                true => inner.batcher.renew(role, token).await,
                false => inner.store.renew(role, token, inner.config.lease_ttl()).await,
            }
        };
        match tokio::time::timeout(bound, renew).await {
            Ok(Ok(Renew::Lost(reason))) => reason,
            _ => LossReason::TakenOver,
        }
    }

    /// The term `(role, token)` that an ACQUIRE sent at `sent` started: runs
    /// `work` under a heartbeat, then RELEASEs it with the outcome.
    pub(crate) async fn run_term<F, Fut, T, E>(
        &self,
        role: &Role,
        interval: Duration,
        token: Token,
        sent: Instant,
        work: F,
        scope: TermScope,
    ) -> Result<Lead<T>, Error>
    where
        F: FnOnce(Tick) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        let inner = &self.inner;
        tracing::debug!(%role, %token, holder = %inner.holder_id, "acquired");
        if let Some(m) = &inner.metrics {
            if scope.per_role_metrics() {
                // A cron term's wait is no interval: the stall alert is for intervals.
                if scope.occurrence.is_none() {
                    m.interval(role, interval);
                }
                m.leading(role, true);
            }
            if let Some(family) = &scope.family {
                m.family_leading(&family.name, true);
            }
        }
        let (abandon_at, abandon_seen) = tokio::sync::watch::channel(sent + inner.config.abandon_after());
        let mut guard = TermGuard {
            inner: inner.clone(),
            role: role.clone(),
            token,
            interval,
            armed: true,
            scope: scope.clone(),
            abandon_at: abandon_seen.clone(),
            running: Running::start(inner, role),
        };
        let tick = Tick {
            abandon_at: abandon_seen,
            fence: Fence::new(role.clone(), token),
            cancel: match &scope.removed {
                Some(key) => key.token.clone(),
                None => inner.shutdown.child_token(),
            },
            lost: Arc::default(),
            removed: scope.removed.as_ref().map(|key| key.removed.clone()),
            occurrence: scope.occurrence.as_ref().map(|o| o.at),
            output: Arc::default(),
            server: inner.store.server().map(Arc::new),
        };
        let stop_heartbeat = CancellationToken::new();
        let _stop_on_drop = stop_heartbeat.clone().drop_guard();
        let mut heartbeat = tokio::spawn(
            self.heartbeat(role, token, sent, &scope, abandon_at)
                .run(stop_heartbeat.clone()),
        );

        let mut work = Box::pin(AssertUnwindSafe(work(tick.clone())).catch_unwind());
        let ended = tokio::select! {
            biased;
            lost = &mut heartbeat => {
                // Without a reason the heartbeat task itself died: treat as a timeout.
                Ended::Lost(lost.ok().flatten().unwrap_or(LossReason::HeartbeatTimeout))
            }
            result = &mut work => Ended::Returned(result),
        };
        stop_heartbeat.cancel();
        if let Ended::Lost(reason) = ended {
            // The cause is set before the work is dropped, so anything the work
            // spawned with its Tick sees why.
            tick.lose(reason);
            let drain = Duration::from_millis(inner.lost_drain_ms.load(Ordering::Relaxed));
            if !drain.is_zero() {
                // Its outcome is the loss's whatever it returns.
                let _ = tokio::time::timeout(drain, &mut work).await;
            }
        }
        drop(work);

        let took = sent.elapsed();
        let settled = settle(token, ended, tick.is_cancelled());
        if let Ok(Lead::Failed { error, .. }) = &settled.lead {
            log_failed_tick(role, token, &**error);
        }
        let mut ending = ending(&settled);
        ending.output = tick.output.lock().expect("not poisoned").take();
        let release = settled.release;
        let failed = settled.outcome == TickOutcome::Failed;
        if let Some(o) = &scope.occurrence {
            // An occurrence whose work returned Err is retried after its backoff;
            // otherwise the role waits for its next occurrence, counted from now.
            guard.interval = o.wait(failed);
        } else if let Some(backoff) = scope.backoff.filter(|_| failed) {
            guard.interval = match scope.healthy_run {
                Some((healthy, first)) if took >= healthy => first,
                _ => backoff,
            };
        }
        guard.armed = false;
        let released = guard.release(release, ending).await;
        tracing::debug!(%role, %token, outcome = release.as_str(), ?released, "released");
        let Settled {
            outcome, lost, lead, ..
        } = match released {
            // A panic stays a panic: a defect pages whatever became of the term.
            Released::TermOver | Released::Resent
                if !matches!(settled.outcome, TickOutcome::Lost | TickOutcome::Panicked) =>
            {
                let reason = self.why_over(role, token, scope.family.is_some()).await;
                // Sent again, a RELEASE that finds the row cleared was ended by an earlier try.
                if released == Released::Resent && reason == LossReason::Released {
                    settled
                } else {
                    tracing::info!(%role, %token, %reason, "the term was over when the tick ended: counted as lost");
                    settled.lost(token, reason)
                }
            }
            _ => settled,
        };
        if let Some(m) = &inner.metrics {
            if scope.per_role_metrics() {
                m.tick_ended(role, outcome, took, lost);
            }
            if let Some(family) = &scope.family {
                m.family_tick_ended(&family.name, outcome, lost);
            }
        }
        match lead {
            Ok(lead) => Ok(lead),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// How a tick's work ended: the term was lost under it, or it returned (or panicked).
enum Ended<R> {
    Lost(LossReason),
    Returned(R),
}

/// A panic payload, re-raised from [`Manager::lead`] after RELEASE.
type Panic = Box<dyn std::any::Any + Send + 'static>;

/// What the end of a tick means: the RELEASE outcome, the metric labels, and
/// what `lead` returns (or the panic it raises again).
struct Settled<T> {
    release: Release,
    outcome: TickOutcome,
    lost: Option<LostReason>,
    lead: Result<Lead<T>, Panic>,
}

/// What RELEASE records of a settled tick: its outcome, why it was lost, the error or panic.
fn ending<T>(s: &Settled<T>) -> Ending {
    Ending {
        outcome: s.outcome.as_str(),
        reason: match s.lost {
            Some(LostReason::Lease(reason)) => Some(reason.as_str()),
            _ => None,
        },
        error: match &s.lead {
            Ok(Lead::Failed { error, .. }) => Some(crate::error::chain(&**error)),
            Err(panic) => Some(panic_message(&**panic).to_string()),
            Ok(_) => None,
        },
        output: None,
    }
}

impl<T> Settled<T> {
    /// The tick of a term that was over when it ended: lost, whatever the
    /// work returned (a panic is raised again all the same).
    fn lost(self, token: Token, reason: LossReason) -> Settled<T> {
        Settled {
            release: Release::Lost,
            outcome: TickOutcome::Lost,
            lost: Some(LostReason::Lease(reason)),
            lead: self.lead.map(|_| Lead::Lost { token, reason }),
        }
    }
}

/// What a RELEASE found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Released {
    /// It ended the term.
    Yes,
    /// The term was over already (it answered false): a later term, a pause, or none.
    TermOver,
    /// It failed or did not answer: the lease expires on its own.
    Unknown,
    /// Sent again after a try that did not finish, it found the term over:
    /// that try may have ended it (a RENEW then says `released`), or
    /// another term (it says why).
    Resent,
}

/// Decides a tick's outcome. `interrupted`: shutdown cancelled the tick; it
/// then releases as Interrupted even if its work failed or panicked after.
fn settle<T, E: Into<BoxError>>(
    token: Token,
    ended: Ended<Result<Result<T, E>, Panic>>,
    interrupted: bool,
) -> Settled<T> {
    let settled = |release, outcome, lost, lead| Settled {
        release,
        outcome,
        lost,
        lead,
    };
    match ended {
        Ended::Lost(reason) => settled(
            Release::Lost,
            TickOutcome::Lost,
            Some(LostReason::Lease(reason)),
            Ok(Lead::Lost { token, reason }),
        ),
        Ended::Returned(Err(panic)) if interrupted => {
            settled(Release::Interrupted, TickOutcome::Interrupted, None, Err(panic))
        }
        Ended::Returned(Err(panic)) => settled(
            Release::Failed,
            TickOutcome::Panicked,
            Some(LostReason::Panicked),
            Err(panic),
        ),
        Ended::Returned(Ok(_)) if interrupted => settled(
            Release::Interrupted,
            TickOutcome::Interrupted,
            None,
            Ok(Lead::Interrupted { token }),
        ),
        Ended::Returned(Ok(Ok(value))) => settled(
            Release::Completed,
            TickOutcome::Completed,
            None,
            Ok(Lead::Completed { token, value }),
        ),
        Ended::Returned(Ok(Err(e))) => settled(
            Release::Failed,
            TickOutcome::Failed,
            Some(LostReason::Failed),
            Ok(Lead::Failed {
                token,
                error: e.into(),
            }),
        ),
    }
}

/// Releases the term on a task of its own, so neither a cancelled parent nor a
/// dropped `lead` future can skip RELEASE (dropped mid-tick: released as interrupted).
struct TermGuard<S: LeaseStore> {
    inner: Arc<Inner<S>>,
    role: Role,
    token: Token,
    interval: Duration,
    armed: bool,
    scope: TermScope,
    /// The last acknowledged RENEW (or the ACQUIRE) plus A: where the lease
    /// ends, as this process knows it.
    abandon_at: tokio::sync::watch::Receiver<Instant>,
    /// Held until the term's RELEASE is done.
    running: Arc<Running<S>>,
}

/// One ACQUIRE in flight, or one term until its RELEASE is done, of a
/// role in this manager (counted in `Inner::running`).
struct Running<S: LeaseStore> {
    inner: Arc<Inner<S>>,
    role: Role,
}

impl<S: LeaseStore> Running<S> {
    fn start(inner: &Arc<Inner<S>>, role: &Role) -> Arc<Self> {
        *inner
            .running
            .lock()
            .expect("running")
            .entry(role.clone())
            .or_default() += 1;
        Arc::new(Running {
            inner: inner.clone(),
            role: role.clone(),
        })
    }

    fn count(inner: &Inner<S>, role: &Role) -> usize {
        inner
            .running
            .lock()
            .expect("running")
            .get(role)
            .copied()
            .unwrap_or(0)
    }
}

impl<S: LeaseStore> Drop for Running<S> {
    fn drop(&mut self) {
        let mut running = self.inner.running.lock().expect("running");
        if let Some(n) = running.get_mut(&self.role) {
            *n -= 1;
            if *n == 0 {
                running.remove(&self.role);
            }
        }
    }
}

impl<S: LeaseStore> TermGuard<S> {
    /// On the manager's release tracker, so a shutdown waits for it.
    fn spawn_release(&self, outcome: Release, ending: Ending) -> tokio::task::JoinHandle<Released> {
        let (inner, role, token, interval) =
            (self.inner.clone(), self.role.clone(), self.token, self.interval);
        let batched = self.scope.family.is_some();
        // The lease ends a TTL after the last acknowledged RENEW was sent:
        // until then a RELEASE that could not finish (a reconnect, a
        // switchover) is sent again, so the role is free at once rather than
        // a TTL later. It names its term, and stops with the lease: a RELEASE
        // after it would date the role's cooldown from its own late hour.
        let config = &self.inner.config;
        let grace_end = *self.abandon_at.borrow() - config.abandon_after() + config.lease_ttl();
        let running = self.running.clone();
        self.inner.releases.spawn(async move {
            let _running = running;
            let bound = inner.config.statement_timeout();
            let mut backoff = RELEASE_RETRY_MIN;
            let mut tried = false;
            let released = loop {
                let release = async {
                    if batched {
                        let term = Releasing {
                            role: role.clone(),
                            token,
                            outcome,
                            interval,
                            ending: ending.clone(),
                        };
                        inner.batcher.release(term).await
                    } else {
                        inner
                            .store
                            .release_ending(&role, token, outcome, interval, &ending)
                            .await
                    }
                };
                let error = match tokio::time::timeout(bound, release).await {
                    Ok(Ok(true)) => return Released::Yes,
                    Ok(Ok(false)) if tried => return Released::Resent,
                    Ok(Ok(false)) => return Released::TermOver,
                    Ok(Err(error)) => Some(error),
                    Err(_) => None,
                };
                let again = error.as_ref().is_none_or(StoreError::is_transient)
                    && tokio::time::Instant::now() + backoff + bound < grace_end;
                if !again {
                    match error {
                        Some(error) => tracing::warn!(%role, %token, error = &error as &dyn std::error::Error,
                            "RELEASE failed; the lease expires on its own"),
                        None => tracing::warn!(%role, %token, "RELEASE did not answer; the lease expires on its own"),
                    }
                    break Released::Unknown;
                }
                tried = true;
                tracing::debug!(%role, %token, ?backoff, error = ?error, "RELEASE could not finish; sending it again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(bound);
            };
            if inner.shutdown.is_cancelled() {
                inner.unreleased.fetch_add(1, Ordering::Relaxed);
            }
            released
        })
    }

    async fn release(&self, outcome: Release, ending: Ending) -> Released {
        self.spawn_release(outcome, ending)
            .await
            .unwrap_or(Released::Unknown)
    }
}

impl<S: LeaseStore> Drop for TermGuard<S> {
    fn drop(&mut self) {
        if let Some(m) = &self.inner.metrics {
            if self.scope.per_role_metrics() {
                m.leading(&self.role, false);
            }
            if let Some(family) = &self.scope.family {
                m.family_leading(&family.name, false);
            }
        }
        if self.armed && tokio::runtime::Handle::try_current().is_ok() {
            drop(self.spawn_release(Release::Interrupted, Ending::of(Release::Interrupted)));
        }
    }
}

/// The log line of a tick whose work returned `Err`. A work's error may
/// carry what a command wrote: escaped by the one rule. When the database
/// went away under the work (a failover, a restart, a cut link), the
/// connection's own line at WARN says so once per outage, so this one stays
/// at INFO (issue 42 item 4: one line per failover; the failed tick is
/// still in the history and the metrics).
fn log_failed_tick(role: &Role, token: Token, error: &(dyn std::error::Error + 'static)) {
    let away = crate::error::chain_is_outage(error);
    let error = crate::HistoryEntry::escape(&crate::error::chain(error));
    if away {
        tracing::info!(%role, %token, %error, "tick failed while the database was away");
    } else {
        tracing::warn!(%role, %token, %error, "tick failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Token = Token(7);

    fn outcome(
        ended: Ended<Result<Result<u8, std::io::Error>, Panic>>,
        interrupted: bool,
    ) -> (Release, TickOutcome, Option<LostReason>, String) {
        let s = settle(T, ended, interrupted);
        let lead = match s.lead {
            Ok(lead) => format!("{lead:?}"),
            Err(_) => "panic".into(),
        };
        (s.release, s.outcome, s.lost, lead)
    }

    #[test]
    fn a_returned_tick_releases_by_its_result_unless_shutdown_interrupted_it() {
        let ok = || Ended::Returned(Ok(Ok(1)));
        let err = || Ended::Returned(Ok(Err(std::io::Error::other("no"))));
        let panic = || Ended::Returned(Err(Box::new("boom") as Panic));
        assert_eq!(outcome(ok(), false).0, Release::Completed);
        assert_eq!(outcome(ok(), false).1, TickOutcome::Completed);
        assert_eq!(outcome(err(), false).0, Release::Failed);
        assert_eq!(outcome(err(), false).2, Some(LostReason::Failed));
        assert!(outcome(err(), false).3.starts_with("Failed"));
        assert_eq!(outcome(panic(), false).1, TickOutcome::Panicked);
        assert_eq!(outcome(panic(), false).3, "panic");
        for ended in [ok(), err()] {
            let (release, tick, lost, lead) = outcome(ended, true);
            assert_eq!(
                (release, tick, lost),
                (Release::Interrupted, TickOutcome::Interrupted, None)
            );
            assert_eq!(lead, "Interrupted { token: Token(7) }");
        }
        let (release, _, lost, lead) = outcome(panic(), true);
        assert_eq!(
            (release, lost, lead.as_str()),
            (Release::Interrupted, None, "panic")
        );
    }

    #[test]
    fn a_lost_term_releases_as_lost_whatever_else_happened() {
        for interrupted in [false, true] {
            let (release, tick, lost, lead) = outcome(Ended::Lost(LossReason::Paused), interrupted);
            assert_eq!(release, Release::Lost);
            assert_eq!(tick, TickOutcome::Lost);
            assert_eq!(lost, Some(LostReason::Lease(LossReason::Paused)));
            assert_eq!(lead, "Lost { token: Token(7), reason: Paused }");
        }
    }
}

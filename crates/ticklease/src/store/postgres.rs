//! The Postgres lease store. Every statement is one autocommit `query_typed`
//! (an unnamed statement, so it runs through PgBouncer in transaction mode),
//! bounded by the statement timeout. A statement that does not answer in time
//! loses its connection: it is taken out of the pool, a cancel is sent, and
//! the connection is closed, since a dropped tokio-postgres query leaves the
//! connection busy with it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio::time::{timeout_at, Instant};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::cancel::CancelTarget;
use super::{
    Acquire, Ending, FamilyOccurrenceAsk, Interval, LeaseStatus, LeaseStore, LossReason, OccurrenceAnswer,
    OccurrenceAsk, Refusal, Release, Releasing, Renew, Term, BATCH_MAX, ERROR_SUMMARY_MAX, OUTPUT_KEPT_MAX,
};
use crate::config::Config;
use crate::connect::coordination::Signals;
use crate::connect::hosts::{Hosts, PoolConnect, RECONNECT_MAX, RECONNECT_MIN};
#[cfg(feature = "patroni")]
use crate::connect::patroni::check::{self, Confirmations};
use crate::connect::patroni::Confirmation;
#[cfg(feature = "patroni")]
use crate::connect::patroni::Patroni;
use crate::connect::tls::PgConnect;
use crate::error::{MigrateError, StoreError};
use crate::store::migrate::LIBRARY;
use crate::term::role::Role;
use crate::term::schedule::Skipped;
use crate::term::token::Token;

const ACQUIRE: &str = include_str!("acquire.sql");
const RENEW: &str = include_str!("renew.sql");
const RELEASE: &str = include_str!("release.sql");
const STATUS: &str = include_str!("status.sql");
const STATUS_BOUNDED: &str = include_str!("status_bounded.sql");
const STATUS_OF: &str = include_str!("status_of.sql");
const ACQUIRE_MANY: &str = include_str!("acquire_many.sql");
const ACQUIRE_OCCURRENCE: &str = include_str!("acquire_occurrence.sql");
const RENEW_MANY: &str = include_str!("renew_many.sql");
const RELEASE_MANY: &str = include_str!("release_many.sql");
const BEAT: &str = include_str!("beat.sql");
const LEAVE: &str = include_str!("leave.sql");
const PAUSE: &str = include_str!("pause.sql");
const UNPAUSE: &str = include_str!("unpause.sql");
const SEED: &str = include_str!("seed.sql");
const RUN_NOW: &str = include_str!("run_now.sql");
const SYNCHRONOUS_WAITS: &str = include_str!("synchronous_waits.sql");
const NOTIFY: &str = "SELECT pg_notify('ticklease', p) FROM unnest($1::text[]) AS p";

/// Largest pool the store accepts.
pub const POOL_SIZE_MAX: usize = 64;

/// Connection options of [`PgStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PgStoreOptions {
    /// Connections kept for lease statements (1..=[`POOL_SIZE_MAX`]).
    pub pool_size: usize,
    /// Bound on every statement, including the wait for a connection.
    pub statement_timeout: Duration,
}

impl PgStoreOptions {
    /// A pool of 8: one RENEW per role in flight, plus ACQUIRE and RELEASE,
    /// for a handful of roles; raise it when many roles are led at once.
    pub fn from_config(config: &Config) -> Self {
        PgStoreOptions {
            pool_size: 8,
            statement_timeout: config.statement_timeout(),
        }
    }
}

/// The lease store on Postgres.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    /// The URL's hosts: which one the pool reaches, and host changes.
    hosts: Arc<Hosts>,
    /// The probe of a multi-host URL's hosts, stopped with the last clone.
    _probe: Option<Arc<DropGuard>>,
    /// The reconnects during an outage, stopped with the last clone.
    _reconnect: Arc<DropGuard>,
    statement_timeout: Duration,
    cancel: CancelTarget,
    signals: Option<Signals>,
    /// Whether statements record the session's holder key, so that its end
    /// ends this replica's terms ([`PgStore::with_direct`]) or not
    /// ([`PgStore::with_direct_wakeups`]).
    records_key: bool,
    /// The failover manager's word, when asked ([`PgStore::with_patroni`]).
    #[cfg(feature = "patroni")]
    primary: Option<PrimaryCheck>,
}

/// The Patroni check's state, shared by the store's clones.
#[cfg(feature = "patroni")]
#[derive(Clone)]
struct PrimaryCheck {
    confirmations: Arc<Confirmations>,
    /// The check's task, stopped with the last clone.
    _watch: Arc<DropGuard>,
    /// How young a confirmation ACQUIRE needs: `abandon_after −
    /// heartbeat_every`, so a new term lives at least a beat.
    fresh_for: Duration,
    /// Moves at each confirmation gained ([`LeaseStore::confirmed_again`]).
    gains: tokio::sync::watch::Receiver<u64>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("statement_timeout", &self.statement_timeout)
            .field("signals", &self.signals)
            .finish()
    }
}

impl PgStore {
    /// Builds the pool and checks the schema: an unmigrated database is
    /// `StoreError::NotMigrated`, before anything is written. TLS as `pg` says
    /// (a [`PgConnect`] parsed from a URL, or a `tokio_postgres::Config`).
    pub async fn connect(pg: impl Into<PgConnect>, options: PgStoreOptions) -> Result<Self, StoreError> {
        if !(1..=POOL_SIZE_MAX).contains(&options.pool_size) {
            return Err(StoreError::Rejected {
                statement: "connect",
                problem: "pool_size must be within 1..=64",
            });
        }
        if options.statement_timeout.is_zero() {
            return Err(StoreError::Rejected {
                statement: "connect",
                problem: "statement_timeout must be greater than zero",
            });
        }
        let pool_size = options.pool_size;
        let pg = pg.into().named("store");
        let cancel = CancelTarget::from_config(&pg, options.statement_timeout);
        let hosts = Arc::new(Hosts::new(&pg, options.statement_timeout));
        let manager = Manager::from_connect(
            pg.config().clone(),
            PoolConnect(hosts.clone()),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(pool_size)
            .pre_recycle(hosts.recycle_hook())
            .build()
            .expect("no runtime-dependent options");
        // Each probe pass is bounded by the statement timeout as a whole.
        let probe = hosts.watch(options.statement_timeout).map(Arc::new);
        let reconnect = Arc::new(watch_outages(
            pool.clone(),
            hosts.clone(),
            options.statement_timeout,
        ));
        let store = PgStore {
            pool,
            hosts,
            _probe: probe,
            _reconnect: reconnect,
            statement_timeout: options.statement_timeout,
            cancel,
            signals: None,
            records_key: false,
            #[cfg(feature = "patroni")]
            primary: None,
        };
        let conn = store
            .conn("schema check", Instant::now() + store.statement_timeout)
            .await?;
        check_schema(&conn).await?;
        Ok(store)
    }

    /// Adds a coordination session on `direct`, a connection straight to
    /// the same database (not through a pooler): a dead holder's role is
    /// taken over as soon as its session ends, and releases, pauses and
    /// unpauses are heard at once. Checks through the pooled path that the
    /// session's key is visible there (both URLs reach one database) and that
    /// a notification sent there reaches the session (it is not pooled).
    pub async fn with_direct(mut self, direct: impl Into<PgConnect>) -> Result<Self, StoreError> {
        let pooled = self.clone();
        let check = move |key: i64, channel: String| {
            let pooled = pooled.clone();
            async move { pooled.coordination_check(key, &channel).await }
        };
        self.signals = Some(Signals::start(direct.into(), self.statement_timeout, check).await?);
        self.records_key = true;
        Ok(self)
    }

    /// A coordination session on `direct` that only wakes this replica:
    /// releases, pauses, unpauses and run-nows are heard at once, as with
    /// [`PgStore::with_direct`], but no holder key is recorded with its
    /// terms, so they end by their lease (or a release, or a pause) and
    /// never because the session ended. For work the fence cannot stop (a
    /// `ticklease run` child): a session's end does not say that its
    /// replica's work stopped (a link cut on the server's side only, a
    /// Postgres restart, `pg_terminate_backend`), and a takeover on it would
    /// start the next term's work beside the last one's. A dead holder's
    /// role is taken over when its lease expires, as without a session.
    pub async fn with_direct_wakeups(self, direct: impl Into<PgConnect>) -> Result<Self, StoreError> {
        let mut store = self.with_direct(direct).await?;
        store.records_key = false;
        Ok(store)
    }

    /// Asks Patroni's REST API, every half `heartbeat_every`, whether the
    /// server this store reaches is the primary (see [`crate::patroni`]):
    /// ACQUIRE is not sent without a confirmation younger than
    /// `abandon_after − heartbeat_every` ([`StoreError::NotConfirmed`]), and
    /// a term ends `abandon_after` after the last one. Reads Patroni's
    /// settings first and refuses `config`'s timings when a term could
    /// outlive its server's leadership, or Patroni's `failsafe_mode`.
    #[cfg(feature = "patroni")]
    pub async fn with_patroni(mut self, patroni: Patroni, config: &Config) -> Result<Self, StoreError> {
        let (abandon_after, statement_timeout) = (config.abandon_after(), config.statement_timeout());
        patroni
            .settings()
            .await
            .and_then(|settings| settings.admit(abandon_after, statement_timeout))
            .map_err(|source| StoreError::Patroni { source })?;
        let pooled = self.clone();
        let (told, looking) = (self.hosts.clone(), self.hosts.clone());
        let (gain, gains) = tokio::sync::watch::channel(0u64);
        let hooks = check::Hooks {
            again: self.hosts.usable(),
            gained: move || {
                told.usable_again();
                gain.send_modify(|n| *n += 1);
            },
            elsewhere: move || {
                let hosts = looking.clone();
                async move { hosts.probe().await }
            },
        };
        let (confirmations, guard) = check::watch(
            config.heartbeat_every() / 2,
            hooks,
            move || {
                let patroni = patroni.clone();
                async move {
                    let word = patroni.leader().await.ok_or(check::Refusal::NoLeader)?;
                    word.confirms(abandon_after, statement_timeout)
                }
            },
            move || {
                let pooled = pooled.clone();
                async move { pooled.server_postmaster().await }
            },
        );
        self.primary = Some(PrimaryCheck {
            confirmations,
            _watch: Arc::new(guard),
            fresh_for: config.abandon_after().saturating_sub(config.heartbeat_every()),
            gains,
        });
        Ok(self)
    }

    /// When the postmaster of the server the pool reaches started, while it is writable.
    #[cfg(feature = "patroni")]
    async fn server_postmaster(&self) -> Option<i64> {
        let rows = self.query("postmaster", check::POSTMASTER_SQL, &[]).await.ok()?;
        rows.first().and_then(|r| r.get(0))
    }

    /// With the Patroni check: an ACQUIRE waits for a fresh confirmation.
    fn check_confirmed(&self, statement: &'static str) -> Result<(), StoreError> {
        let Some((latest, fresh_for)) = self.confirmation_and_freshness() else {
            return Ok(());
        };
        match latest {
            Confirmation::At(at) if at.elapsed() < fresh_for => Ok(()),
            latest => Err(StoreError::NotConfirmed {
                statement,
                since: match latest {
                    Confirmation::At(at) => Some(at.elapsed()),
                    Confirmation::Never => None,
                },
            }),
        }
    }

    /// The latest confirmation and how young ACQUIRE needs it, when the
    /// store asks Patroni.
    fn confirmation_and_freshness(&self) -> Option<(Confirmation, Duration)> {
        #[cfg(feature = "patroni")]
        return self
            .primary
            .as_ref()
            .map(|check| (check.confirmations.latest(), check.fresh_for));
        #[cfg(not(feature = "patroni"))]
        None
    }

    /// Through the pooled path: the session's key is visible (both URLs
    /// reach one database), and a probe goes to the session's own channel
    /// (a session through a transaction-mode pooler would hold its key on a
    /// shared server connection and hear nothing; `Signals::start` waits for it).
    async fn coordination_check(&self, key: i64, channel: &str) -> Result<(), StoreError> {
        let rows = self
            .query(
                "coordination check",
                "SELECT leader_key_alive($1)",
                &[(&key, Type::INT8)],
            )
            .await?;
        if !one("coordination check", rows)?.get::<_, bool>(0) {
            return Err(StoreError::Rejected {
                statement: "coordination check",
                problem: "the direct URL reaches another database than the pooled URL",
            });
        }
        let nonce = key.to_string();
        self.query(
            "coordination check",
            "SELECT pg_notify($1, $2)",
            &[(&channel, Type::TEXT), (&nonce, Type::TEXT)],
        )
        .await?;
        Ok(())
    }

    /// The hosts of the store's URL: the one its connections reach, and how
    /// often that changed (a failover, a switchover).
    pub fn hosts(&self) -> &Hosts {
        &self.hosts
    }

    /// This replica's holder key while its coordination session is up (a
    /// new one after each reconnect), recorded with its terms; `None`
    /// without one, or with [`PgStore::with_direct_wakeups`].
    pub fn holder_key(&self) -> Option<i64> {
        self.signals
            .as_ref()
            .filter(|_| self.records_key)
            .and_then(Signals::key)
    }

    /// Runs a statement that passed this replica's key: when the database
    /// says no session holds it, the coordination session is dead though
    /// its client has not noticed; it is withdrawn and reconnected, and the
    /// statement's retry records no key meanwhile.
    async fn keyed<T>(
        &self,
        key: Option<i64>,
        statement: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = statement.await;
        if let (Err(StoreError::Db { source, .. }), Some(signals), Some(key)) = (&result, &self.signals, key)
        {
            if source.code() == Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE) {
                signals.key_refused(key);
            }
        }
        result
    }

    /// The batched ACQUIRE's rows: on an `interval`, or for the occurrence of `ask`.
    async fn acquire_many_rows(
        &self,
        roles: &[Role],
        holder: &str,
        lease_ttl: Duration,
        interval: Option<Duration>,
        ask: Option<&FamilyOccurrenceAsk>,
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        check_batch("ACQUIRE many", roles.len())?;
        self.check_confirmed("ACQUIRE many")?;
        let names: Vec<&str> = roles.iter().map(Role::as_str).collect();
        let (ttl, interval, key) = (millis(lease_ttl), interval.map(millis), self.holder_key());
        let limit = i32::try_from(limit).unwrap_or(i32::MAX);
        let (occurrence, next) = (ask.map(|a| a.occurrence), ask.map(|a| a.next));
        let schedule = ask.map(|a| a.schedule.as_str());
        let recent = ask.map(|a| a.recent.clone());
        self.keyed(
            key,
            self.query(
                "ACQUIRE many",
                ACQUIRE_MANY,
                &[
                    (&names, Type::TEXT_ARRAY),
                    (&holder, Type::TEXT),
                    (&ttl, Type::INT8),
                    (&interval, Type::INT8),
                    (&key, Type::INT8),
                    (&limit, Type::INT4),
                    (&occurrence, Type::TIMESTAMPTZ),
                    // The term must start before the next occurrence (Latest).
                    (&next, Type::TIMESTAMPTZ),
                    (&schedule, Type::TEXT),
                    (&next, Type::TIMESTAMPTZ),
                    (&recent, Type::TIMESTAMPTZ_ARRAY),
                ],
            ),
        )
        .await
    }

    /// Tells the coordination sessions of a decision that committed (`event`
    /// of `roles`), in a statement of its own: a decision never notifies in
    /// its own transaction, where a full or busy notification queue (any
    /// login can fill it) would fail or hold up its COMMIT. Best effort, on
    /// a task of its own bounded by the statement timeout: a lost
    /// notification costs followers their fallback wake-up.
    fn tell(&self, event: &str, roles: &[&Role]) -> tokio::task::JoinHandle<()> {
        let payloads: Vec<String> = roles.iter().map(|r| format!("{event} {r}")).collect();
        let store = self.clone();
        tokio::spawn(async move {
            if payloads.is_empty() {
                return;
            }
            if let Err(error) = store
                .query("NOTIFY", NOTIFY, &[(&payloads, Type::TEXT_ARRAY)])
                .await
            {
                tracing::debug!(error = &error as &dyn std::error::Error, "notification not sent");
            }
        })
    }

    async fn conn(&self, statement: &'static str, deadline: Instant) -> Result<Object, StoreError> {
        match timeout_at(deadline, self.pool.get()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(source)) => Err(StoreError::Connect {
                statement,
                source: Box::new(source),
            }),
            Err(_) => Err(StoreError::Timeout {
                statement,
                after: self.statement_timeout,
            }),
        }
    }

    pub(crate) async fn query(
        &self,
        statement: &'static str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, StoreError> {
        let deadline = Instant::now() + self.statement_timeout;
        let conn = self.conn(statement, deadline).await?;
        let in_flight = InFlight {
            conn: Some(conn),
            cancel: &self.cancel,
        };
        let client = in_flight.conn.as_ref().expect("set above");
        match timeout_at(deadline, client.query_typed(sql, params)).await {
            Ok(Err(source)) if source.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION) => {
                // A standby (a demoted primary, or a host a multi-host URL
                // reached before a failover): this connection will never
                // write again, so it leaves the pool; the next statement
                // connects afresh and `target_session_attrs=read-write`
                // finds the new primary.
                in_flight.discard();
                Err(classify(statement, source))
            }
            Ok(result) => {
                in_flight.done();
                result.map_err(|source| classify(statement, source))
            }
            Err(_) => Err(StoreError::Timeout {
                statement,
                after: self.statement_timeout,
            }),
        }
    }
}

/// Until the guard is dropped: once an outage begins (a connection lost or
/// not made), runs `SELECT 1` through the pool every [`RECONNECT_MIN`]
/// doubling to [`RECONNECT_MAX`] until one answers, then moves
/// [`Hosts::usable`]: the role loops whose poll failed ask again when the
/// server answers, not `max_poll` later. A statement, not a connection: a
/// pooler in front of a stopped server accepts connections and fails every
/// statement, and waking the loops at each would storm it. One statement
/// per step per store, however many roles wait.
fn watch_outages(pool: Pool, hosts: Arc<Hosts>, statement_timeout: Duration) -> DropGuard {
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    tokio::spawn(async move {
        stopped
            .run_until_cancelled(async {
                loop {
                    hosts.outage_begins().await;
                    let mut backoff = RECONNECT_MIN;
                    loop {
                        tokio::time::sleep(backoff).await;
                        if select_1(&pool, statement_timeout).await {
                            break;
                        }
                        backoff = (backoff * 2).min(RECONNECT_MAX);
                    }
                    hosts.usable_again();
                }
            })
            .await;
    });
    stop.drop_guard()
}

/// Whether `SELECT 1` answered through the pool within `bound` (each of the
/// wait for a connection and the statement). A connection whose statement
/// did not answer is closed, never given back to the pool.
async fn select_1(pool: &Pool, bound: Duration) -> bool {
    let Ok(Ok(conn)) = tokio::time::timeout(bound, pool.get()).await else {
        return false;
    };
    match tokio::time::timeout(bound, conn.query_typed("SELECT 1", &[])).await {
        Ok(answer) => answer.is_ok(),
        Err(_) => {
            drop(Object::take(conn));
            false
        }
    }
}

/// A connection with a statement in flight. Dropped before `done` (timeout, or
/// the caller's future dropped), it leaves the pool and its statement is cancelled.
struct InFlight<'a> {
    conn: Option<Object>,
    cancel: &'a CancelTarget,
}

impl InFlight<'_> {
    fn done(mut self) {
        self.conn.take();
    }

    /// Closes the connection instead of returning it to the pool; its
    /// statement has answered, so there is nothing to cancel.
    fn discard(mut self) {
        if let Some(conn) = self.conn.take() {
            drop(Object::take(conn));
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.cancel.cancel_and_close(Object::take(conn));
        }
    }
}

fn classify(statement: &'static str, source: tokio_postgres::Error) -> StoreError {
    let code = source.code().cloned();
    match code {
        Some(c) if c == SqlState::UNDEFINED_TABLE || c == SqlState::UNDEFINED_FUNCTION => {
            StoreError::NotMigrated {
                detail: source
                    .as_db_error()
                    .map(|e| e.message().to_string())
                    .unwrap_or_default(),
                command: LIBRARY.command,
            }
        }
        Some(c) if c == SqlState::INSUFFICIENT_PRIVILEGE => {
            StoreError::PermissionDenied { statement, source }
        }
        Some(c) if c == SqlState::INVALID_PARAMETER_VALUE || c == SqlState::CHECK_VIOLATION => {
            StoreError::Invalid { statement, source }
        }
        _ => StoreError::Db { statement, source },
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn one(statement: &'static str, rows: Vec<Row>) -> Result<Row, StoreError> {
    rows.into_iter().next().ok_or(StoreError::NotMigrated {
        detail: format!("{statement} returned no row"),
        command: LIBRARY.command,
    })
}

/// A batch larger than [`BATCH_MAX`] is the caller's bug: refused before anything is sent.
fn check_batch(statement: &'static str, len: usize) -> Result<(), StoreError> {
    if len > BATCH_MAX {
        return Err(StoreError::Rejected {
            statement,
            problem: "a batch holds at most 1000 roles (BATCH_MAX)",
        });
    }
    Ok(())
}

/// The error text the history keeps: cut, and without NUL, which Postgres
/// text refuses (a panic message may hold one; the RELEASE must not fail on it).
fn error_summary(ending: &Ending) -> Option<String> {
    ending
        .error
        .as_deref()
        .map(|e| e.chars().filter(|c| *c != '\0').take(ERROR_SUMMARY_MAX).collect())
}

/// The output the history keeps: its last [`OUTPUT_KEPT_MAX`] characters,
/// without NUL (which Postgres text refuses).
fn output_kept(output: &str) -> String {
    let kept: Vec<char> = output.chars().filter(|c| *c != '\0').collect();
    kept[kept.len().saturating_sub(OUTPUT_KEPT_MAX)..]
        .iter()
        .collect()
}

/// An ACQUIRE row: the term it started, or why none.
fn acquired(row: &Row) -> Acquire {
    let db_now: SystemTime = row.get("db_now");
    if let Some(token) = row.get::<_, Option<i64>>("holder_token") {
        return Acquire::Acquired(Term {
            token: Token(token),
            db_now,
            failures: u32::try_from(row.get::<_, i32>("failures")).unwrap_or_default(),
        });
    }
    let paused_by: Option<String> = row.get("paused_by");
    let held: Option<bool> = row.get("held");
    let due_at: Option<SystemTime> = row.get("due_at");
    if let Some(by) = paused_by {
        Acquire::Refused(Refusal::Paused {
            by,
            reason: row.get::<_, Option<String>>("pause_reason").unwrap_or_default(),
        })
    } else if held == Some(true) {
        let expires_at: SystemTime = row.get("expires_at");
        Acquire::Refused(Refusal::Held {
            holder: row.get("holder_id"),
            expires_at,
            remaining: expires_at.duration_since(db_now).unwrap_or_default(),
            holder_key: row.get("holder_key"),
        })
    } else if let Some(due_at) = due_at.filter(|d| *d > db_now) {
        Acquire::Refused(Refusal::NotDue {
            due_at,
            remaining: due_at.duration_since(db_now).unwrap_or_default(),
        })
    } else {
        Acquire::Refused(Refusal::Contended)
    }
}

/// A batched ACQUIRE's row: past the limit, or as one ACQUIRE's.
fn acquired_many(row: &Row) -> Acquire {
    if row.get::<_, bool>("over_limit") {
        Acquire::Refused(Refusal::OverLimit)
    } else {
        acquired(row)
    }
}

/// A RENEW row of the term `token`.
fn renewed(row: &Row, token: Token) -> Renew {
    if row.get::<_, bool>("renewed") {
        return Renew::Renewed {
            db_now: row.get("db_now"),
        };
    }
    let current: Option<i64> = row.get("holder_token");
    let holder: Option<String> = row.get("holder_id");
    let paused: Option<bool> = row.get("paused");
    Renew::Lost(loss_reason(token, current, holder, paused))
}

impl LeaseStore for PgStore {
    async fn acquire(
        &self,
        role: &Role,
        holder: &str,
        lease_ttl: Duration,
        interval: impl Into<Interval> + Send,
    ) -> Result<Acquire, StoreError> {
        self.check_confirmed("ACQUIRE")?;
        let Interval { every, long_lived } = interval.into();
        let (ttl, interval, key) = (millis(lease_ttl), millis(every), self.holder_key());
        let rows = self
            .keyed(
                key,
                self.query(
                    "ACQUIRE",
                    ACQUIRE,
                    &[
                        (&role.as_str(), Type::TEXT),
                        (&holder, Type::TEXT),
                        (&ttl, Type::INT8),
                        (&interval, Type::INT8),
                        (&key, Type::INT8),
                        (&long_lived, Type::BOOL),
                    ],
                ),
            )
            .await?;
        Ok(acquired(&one("ACQUIRE", rows)?))
    }

    async fn acquire_occurrence(
        &self,
        role: &Role,
        holder: &str,
        lease_ttl: Duration,
        ask: &OccurrenceAsk,
    ) -> Result<OccurrenceAnswer, StoreError> {
        self.check_confirmed("ACQUIRE occurrence")?;
        let (ttl, key) = (millis(lease_ttl), self.holder_key());
        let reasons: Vec<&str> = ask.skipped.iter().map(|k| k.reason.as_str()).collect();
        let summaries: Vec<String> = ask.skipped.iter().map(Skipped::summary).collect();
        let rows = self
            .keyed(
                key,
                self.query(
                    "ACQUIRE occurrence",
                    ACQUIRE_OCCURRENCE,
                    &[
                        (&role.as_str(), Type::TEXT),
                        (&holder, Type::TEXT),
                        (&ttl, Type::INT8),
                        (&ask.occurrence, Type::TIMESTAMPTZ),
                        (&ask.before, Type::TIMESTAMPTZ),
                        (&key, Type::INT8),
                        (&reasons, Type::TEXT_ARRAY),
                        (&summaries, Type::TEXT_ARRAY),
                        (&ask.schedule, Type::TEXT),
                        (&ask.next, Type::TIMESTAMPTZ),
                    ],
                ),
            )
            .await?;
        let row = one("ACQUIRE occurrence", rows)?;
        let db_now: SystemTime = row.get("db_now");
        Ok(OccurrenceAnswer {
            acquire: acquired(&row),
            after: row
                .get::<_, Option<SystemTime>>("after_occurrence")
                .unwrap_or(db_now),
            failures: u32::try_from(row.get::<_, i32>("failures")).unwrap_or_default(),
            started: row.get("started_occurrence"),
            db_now,
            manual_by: row.get("manual_by"),
            run_now_pending: row.get::<_, Option<bool>>("run_now_pending").unwrap_or_default(),
            last_pause: row
                .get::<_, Option<SystemTime>>("last_paused_at")
                .zip(row.get::<_, Option<SystemTime>>("last_unpaused_at")),
        })
    }

    async fn acquire_many(
        &self,
        roles: &[Role],
        holder: &str,
        lease_ttl: Duration,
        interval: Duration,
        limit: usize,
    ) -> Result<Vec<(Role, Acquire)>, StoreError> {
        let rows = self
            .acquire_many_rows(roles, holder, lease_ttl, Some(interval), None, limit)
            .await?;
        Ok(rows
            .iter()
            .map(|row| (Role(row.get("role")), acquired_many(row)))
            .collect())
    }

    async fn acquire_many_occurrence(
        &self,
        roles: &[Role],
        holder: &str,
        lease_ttl: Duration,
        ask: &FamilyOccurrenceAsk,
        limit: usize,
    ) -> Result<Vec<(Role, OccurrenceAnswer)>, StoreError> {
        let rows = self
            .acquire_many_rows(roles, holder, lease_ttl, None, Some(ask), limit)
            .await?;
        Ok(rows
            .iter()
            .map(|row| {
                let db_now: SystemTime = row.get("db_now");
                let answer = OccurrenceAnswer {
                    acquire: acquired_many(row),
                    after: row
                        .get::<_, Option<SystemTime>>("after_occurrence")
                        .unwrap_or(db_now),
                    failures: row
                        .get::<_, Option<i32>>("failures")
                        .and_then(|f| u32::try_from(f).ok())
                        .unwrap_or_default(),
                    // The family's statement counts its skipped occurrences itself.
                    started: None,
                    manual_by: row.get("manual_by"),
                    run_now_pending: false,
                    db_now,
                    last_pause: None,
                };
                (Role(row.get("role")), answer)
            })
            .collect())
    }

    async fn renew_many(
        &self,
        terms: &[(Role, Token)],
        lease_ttl: Duration,
    ) -> Result<Vec<Renew>, StoreError> {
        check_batch("RENEW many", terms.len())?;
        let names: Vec<&str> = terms.iter().map(|(r, _)| r.as_str()).collect();
        let tokens: Vec<i64> = terms.iter().map(|(_, t)| t.0).collect();
        let (ttl, key) = (millis(lease_ttl), self.holder_key());
        let rows = self
            .keyed(
                key,
                self.query(
                    "RENEW many",
                    RENEW_MANY,
                    &[
                        (&names, Type::TEXT_ARRAY),
                        (&tokens, Type::INT8_ARRAY),
                        (&ttl, Type::INT8),
                        (&key, Type::INT8),
                    ],
                ),
            )
            .await?;
        let answers: std::collections::HashMap<(String, i64), Renew> = rows
            .iter()
            .map(|row| {
                (
                    (row.get("role"), row.get("token")),
                    renewed(row, Token(row.get("token"))),
                )
            })
            .collect();
        terms
            .iter()
            .map(|(role, token)| {
                answers
                    .get(&(role.0.clone(), token.0))
                    .copied()
                    .ok_or(StoreError::NotMigrated {
                        detail: format!("RENEW many returned no row for {role}"),
                        command: LIBRARY.command,
                    })
            })
            .collect()
    }

    async fn release_many(&self, terms: &[Releasing]) -> Result<Vec<bool>, StoreError> {
        check_batch("RELEASE many", terms.len())?;
        let names: Vec<&str> = terms.iter().map(|t| t.role.as_str()).collect();
        let tokens: Vec<i64> = terms.iter().map(|t| t.token.0).collect();
        let stamps: Vec<bool> = terms.iter().map(|t| t.outcome.stamps_last_tick()).collect();
        let cooldowns: Vec<Option<i64>> = terms
            .iter()
            .map(|t| t.outcome.cooldown(t.interval).map(millis))
            .collect();
        let outcomes: Vec<&str> = terms.iter().map(|t| t.ending.outcome).collect();
        let reasons: Vec<Option<&str>> = terms.iter().map(|t| t.ending.reason).collect();
        let errors: Vec<Option<String>> = terms.iter().map(|t| error_summary(&t.ending)).collect();
        let rows = self
            .query(
                "RELEASE many",
                RELEASE_MANY,
                &[
                    (&names, Type::TEXT_ARRAY),
                    (&tokens, Type::INT8_ARRAY),
                    (&stamps, Type::BOOL_ARRAY),
                    (&cooldowns, Type::INT8_ARRAY),
                    (&outcomes, Type::TEXT_ARRAY),
                    (&reasons, Type::TEXT_ARRAY),
                    (&errors, Type::TEXT_ARRAY),
                ],
            )
            .await?;
        let answers: std::collections::HashMap<(String, i64), bool> = rows
            .iter()
            .map(|row| ((row.get("role"), row.get("token")), row.get("released")))
            .collect();
        let released: Vec<bool> = terms
            .iter()
            .map(|t| {
                answers
                    .get(&(t.role.0.clone(), t.token.0))
                    .copied()
                    .unwrap_or(false)
            })
            .collect();
        let told: Vec<&Role> = terms
            .iter()
            .zip(&released)
            .filter_map(|(t, r)| r.then_some(&t.role))
            .collect();
        self.tell("release", &told);
        Ok(released)
    }

    async fn beat(&self, family: &str, holder: &str, lease_ttl: Duration) -> Result<Vec<String>, StoreError> {
        let (ttl, key) = (millis(lease_ttl), self.holder_key());
        let rows = self
            .keyed(
                key,
                self.query(
                    "REPLICA BEAT",
                    BEAT,
                    &[
                        (&family, Type::TEXT),
                        (&holder, Type::TEXT),
                        (&ttl, Type::INT8),
                        (&key, Type::INT8),
                    ],
                ),
            )
            .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn leave(&self, family: &str, holder: &str) -> Result<bool, StoreError> {
        let rows = self
            .query(
                "REPLICA LEAVE",
                LEAVE,
                &[(&family, Type::TEXT), (&holder, Type::TEXT)],
            )
            .await?;
        Ok(one("REPLICA LEAVE", rows)?.get(0))
    }

    async fn renew(&self, role: &Role, token: Token, lease_ttl: Duration) -> Result<Renew, StoreError> {
        let (ttl, key) = (millis(lease_ttl), self.holder_key());
        let rows = self
            .keyed(
                key,
                self.query(
                    "RENEW",
                    RENEW,
                    &[
                        (&role.as_str(), Type::TEXT),
                        (&token.0, Type::INT8),
                        (&ttl, Type::INT8),
                        (&key, Type::INT8),
                    ],
                ),
            )
            .await?;
        Ok(renewed(&one("RENEW", rows)?, token))
    }

    async fn release(
        &self,
        role: &Role,
        token: Token,
        outcome: Release,
        interval: Duration,
    ) -> Result<bool, StoreError> {
        self.release_ending(role, token, outcome, interval, &Ending::of(outcome))
            .await
    }

    async fn release_ending(
        &self,
        role: &Role,
        token: Token,
        outcome: Release,
        interval: Duration,
        ending: &Ending,
    ) -> Result<bool, StoreError> {
        let stamp = outcome.stamps_last_tick();
        let cooldown = outcome.cooldown(interval).map(millis);
        let error = error_summary(ending);
        let output = ending.output.as_deref().map(output_kept);
        let rows = self
            .query(
                "RELEASE",
                RELEASE,
                &[
                    (&role.as_str(), Type::TEXT),
                    (&token.0, Type::INT8),
                    (&stamp, Type::BOOL),
                    (&cooldown, Type::INT8),
                    (&ending.outcome, Type::TEXT),
                    (&ending.reason, Type::TEXT),
                    (&error, Type::TEXT),
                    (&output, Type::TEXT),
                ],
            )
            .await?;
        let released: bool = one("RELEASE", rows)?.get(0);
        if released {
            self.tell("release", &[role]);
        }
        Ok(released)
    }

    async fn pause(&self, role: &Role, by: &str, reason: &str) -> Result<bool, StoreError> {
        check_pauser(by)?;
        let rows = self
            .query(
                "PAUSE",
                PAUSE,
                &[
                    (&role.as_str(), Type::TEXT),
                    (&by, Type::TEXT),
                    (&reason, Type::TEXT),
                ],
            )
            .await
            .map_err(|e| unknown_role(e, role))?;
        let changed: bool = one("PAUSE", rows)?.get(0);
        if changed {
            // An operator's command: it waits for the notification (bounded).
            let _ = self.tell("pause", &[role]).await;
        }
        Ok(changed)
    }

    async fn unpause(&self, role: &Role) -> Result<bool, StoreError> {
        let rows = self
            .query("UNPAUSE", UNPAUSE, &[(&role.as_str(), Type::TEXT)])
            .await
            .map_err(|e| unknown_role(e, role))?;
        let changed: bool = one("UNPAUSE", rows)?.get(0);
        if changed {
            // An operator's command: it waits for the notification (bounded).
            let _ = self.tell("unpause", &[role]).await;
        }
        Ok(changed)
    }

    async fn run_now(&self, role: &Role) -> Result<bool, StoreError> {
        let rows = self
            .query("RUN NOW", RUN_NOW, &[(&role.as_str(), Type::TEXT)])
            .await
            .map_err(|e| unknown_role(e, role))?;
        let changed: bool = one("RUN NOW", rows)?.get(0);
        // An operator's command: it waits for the notification (bounded), so
        // the role's replicas ask for the manual run at once.
        let _ = self.tell("run_now", &[role]).await;
        Ok(changed)
    }

    async fn seed(&self, roles: &[Role]) -> Result<(), StoreError> {
        let names: Vec<&str> = roles.iter().map(Role::as_str).collect();
        self.query("SEED", SEED, &[(&names, Type::TEXT_ARRAY)]).await?;
        Ok(())
    }

    async fn status(&self) -> Result<Vec<LeaseStatus>, StoreError> {
        let rows = self.query("STATUS", STATUS, &[]).await?;
        Ok(rows.iter().map(status_row).collect())
    }

    async fn status_bounded(&self, limit: usize) -> Result<(Vec<LeaseStatus>, u64), StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let counted = i64::try_from(crate::store::STATUS_COUNTED_MAX).unwrap_or(i64::MAX);
        let rows = self
            .query(
                "STATUS",
                STATUS_BOUNDED,
                &[(&limit, Type::INT8), (&counted, Type::INT8)],
            )
            .await?;
        // Each row carries the count of all (none when there are none, or for a limit of 0).
        let total = rows.first().map_or(0, |r| r.get::<_, i64>("total"));
        Ok((
            rows.iter().map(status_row).collect(),
            u64::try_from(total).unwrap_or(0),
        ))
    }

    async fn status_of(&self, roles: &[Role]) -> Result<Vec<LeaseStatus>, StoreError> {
        let names: Vec<&str> = roles.iter().map(Role::as_str).collect();
        let rows = self
            .query("STATUS", STATUS_OF, &[(&names, Type::TEXT_ARRAY)])
            .await?;
        Ok(rows.iter().map(status_row).collect())
    }

    fn signals(&self) -> Option<&Signals> {
        self.signals.as_ref()
    }

    fn server(&self) -> Option<crate::connect::hosts::Server> {
        self.hosts.current().cloned()
    }

    fn connection_events(&self) -> Option<crate::connect::hosts::ConnectionEvents> {
        Some(self.hosts.events())
    }

    fn usable(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.hosts.usable())
    }

    async fn synchronous_waits(&self) -> Result<Option<super::SynchronousWaits>, StoreError> {
        let rows = self.query("synchronous waits", SYNCHRONOUS_WAITS, &[]).await?;
        let row = one("synchronous waits", rows)?;
        let longest: f64 = row.get("longest");
        Ok(Some(super::SynchronousWaits {
            waiting: u64::try_from(row.get::<_, i64>("waiting")).unwrap_or(0),
            longest: Duration::try_from_secs_f64(longest).unwrap_or_default(),
        }))
    }

    #[cfg(feature = "patroni")]
    fn confirmed_again(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.primary.as_ref().map(|check| check.gains.clone())
    }

    fn primary_confirmation(&self) -> Option<Confirmation> {
        self.confirmation_and_freshness().map(|(latest, _)| latest)
    }
}

/// Why a RENEW of `token` found its term over, from the row as it is after
/// the statement: `current` token, `holder`, `paused` (all `None` without a row).
fn loss_reason(
    token: Token,
    current: Option<i64>,
    holder: Option<String>,
    paused: Option<bool>,
) -> LossReason {
    match (current, holder, paused) {
        (_, _, Some(true)) => LossReason::Paused,
        (Some(t), _, _) if t != token.0 => LossReason::TakenOver,
        // Our token, cleared holder (released, or a pause since undone), or no row.
        _ => LossReason::Released,
    }
}

/// Who paused a role must be named (the SQL function checks the same for psql callers).
pub(crate) fn check_pauser(by: &str) -> Result<(), StoreError> {
    if by.trim().is_empty() {
        return Err(StoreError::Rejected {
            statement: "PAUSE",
            problem: "who paused the role must be named",
        });
    }
    Ok(())
}

fn unknown_role(e: StoreError, role: &Role) -> StoreError {
    match &e {
        StoreError::Db { source, .. } if source.code() == Some(&SqlState::NO_DATA_FOUND) => {
            StoreError::UnknownRole {
                role: role.to_string(),
            }
        }
        _ => e,
    }
}

/// Checks that every library migration is applied, unchanged, and the
/// definitions of this build or newer ones: the store's
/// startup check, as a store error (`NotMigrated`, `PermissionDenied`, …).
async fn check_schema(client: &tokio_postgres::Client) -> Result<(), StoreError> {
    let checked = match LIBRARY.verify(client).await {
        Ok(()) => super::definitions::verify(client, LIBRARY.command).await,
        failed => failed,
    };
    checked.map_err(|e| match e {
        MigrateError::NotMigrated { detail, command } => StoreError::NotMigrated { detail, command },
        MigrateError::Db { source, .. } => classify("schema check", source),
        other => StoreError::NotMigrated {
            detail: other.to_string(),
            command: LIBRARY.command,
        },
    })
}

/// One row of STATUS (or its bounded form).
fn status_row(r: &Row) -> LeaseStatus {
    LeaseStatus {
        role: r.get("role"),
        held: r.get("held"),
        holder_id: r.get("holder_id"),
        token: Token(r.get("holder_token")),
        acquired_at: r.get("acquired_at"),
        expires_at: r.get("expires_at"),
        db_now: r.get("db_now"),
        remaining: r
            .get::<_, Option<f64>>("remaining_seconds")
            .map(|s| Duration::from_secs_f64(s.max(0.0))),
        paused_at: r.get("paused_at"),
        paused_by: r.get("paused_by"),
        pause_reason: r.get("pause_reason"),
        last_tick_ended_at: r.get("last_tick_ended_at"),
        last_tick_holder: r.get("last_tick_holder"),
        not_before: r.get("not_before"),
        last_outcome: r.get("last_outcome"),
        schedule: r.get("schedule"),
        last_occurrence: r.get("last_occurrence"),
        next_occurrence: r.get("next_occurrence"),
        long_lived: r.get("long_lived"),
        tick_interval: r
            .get::<_, Option<i64>>("tick_interval_ms")
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Duration::from_millis),
    }
}

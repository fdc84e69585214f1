//! Embedded schema migrations: versions and checksums in a table, every
//! pending file in one transaction under an advisory transaction lock, so
//! replicas may run it concurrently; an applied file that changed is refused.
//!
//! Migrations use the simple query protocol and a transaction-scoped lock,
//! so they also run through a transaction-mode pooler.
//!
//! Every wait is bounded on the server: a run waits at most
//! [`MIGRATION_LOCK_WAIT`] for its advisory lock (any login may hold the
//! fixed key: the error then names the holding backend), every lock wait
//! after it as long, and each statement of the run at most
//! [`MIGRATION_STATEMENT_TIMEOUT`]. [`grant`] keeps the same bounds.

use std::time::Duration;

use tokio_postgres::{Client, SimpleQueryMessage};

use crate::connect::hosts::{Hosts, HostsError};
use crate::connect::tls::PgConnect;
use crate::error::MigrateError;
use crate::store::definitions;
pub use crate::store::definitions::{Definition, DEFINITIONS, DEFINITIONS_GENERATION, DEFINITIONS_TABLE};

/// One embedded migration file.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Applied in ascending order.
    pub version: i32,
    /// A short name, recorded with the version.
    pub name: &'static str,
    /// The SQL, run with the simple query protocol.
    pub sql: &'static str,
}

impl Migration {
    /// SHA-256 of the file, hex.
    pub fn checksum(&self) -> String {
        definitions::checksum(self.sql)
    }
}

/// The library's migrations, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "leader_leases",
        sql: include_str!("migrations/0001_leader_leases.sql"),
    },
    Migration {
        version: 2,
        name: "least_privilege",
        sql: include_str!("migrations/0002_least_privilege.sql"),
    },
    Migration {
        version: 3,
        name: "hardening",
        sql: include_str!("migrations/0003_hardening.sql"),
    },
    Migration {
        version: 4,
        name: "coordination",
        sql: include_str!("migrations/0004_coordination.sql"),
    },
    Migration {
        version: 5,
        name: "history",
        sql: include_str!("migrations/0005_history.sql"),
    },
    Migration {
        version: 6,
        name: "families",
        sql: include_str!("migrations/0006_families.sql"),
    },
    Migration {
        version: 7,
        name: "hardening_ii",
        sql: include_str!("migrations/0007_hardening_ii.sql"),
    },
    Migration {
        version: 8,
        name: "occurrences",
        sql: include_str!("migrations/0008_occurrences.sql"),
    },
    Migration {
        version: 9,
        name: "pause_window",
        sql: include_str!("migrations/0009_pause_window.sql"),
    },
    Migration {
        version: 10,
        name: "pause_wait",
        sql: include_str!("migrations/0010_pause_wait.sql"),
    },
    Migration {
        version: 11,
        name: "long_lived",
        sql: include_str!("migrations/0011_long_lived.sql"),
    },
    Migration {
        version: 12,
        name: "status_bounds",
        sql: include_str!("migrations/0012_status_bounds.sql"),
    },
    Migration {
        version: 13,
        name: "fence_lock",
        sql: include_str!("migrations/0013_fence_lock.sql"),
    },
];

/// The database roles migration 0002 grants to (created if missing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateOptions {
    /// Renews and releases its terms, acquires through `leader_acquire_v2`; default `ticklease_app`.
    pub app_role: String,
    /// Pauses, unpauses, runs now, reads `leader_status`; default `ticklease_operator`.
    pub operator_role: String,
}

impl MigrateOptions {
    /// Role names checked as ticklease accepts them (`[a-z_][a-z0-9_]*`, at most 63 bytes).
    pub fn new(app_role: &str, operator_role: &str) -> Result<Self, MigrateError> {
        check_role_name(app_role)?;
        check_role_name(operator_role)?;
        Ok(MigrateOptions {
            app_role: app_role.to_string(),
            operator_role: operator_role.to_string(),
        })
    }
}

impl Default for MigrateOptions {
    fn default() -> Self {
        MigrateOptions {
            app_role: "ticklease_app".into(),
            operator_role: "ticklease_operator".into(),
        }
    }
}

/// A database role name as ticklease accepts it: `[a-z_][a-z0-9_]*`, at most 63 bytes.
pub(crate) fn check_role_name(name: &str) -> Result<(), MigrateError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(MigrateError::InvalidRoleName {
            name: name.to_string(),
        })
    }
}

/// Longest wait of a migration run for its advisory lock, and for any other
/// lock a statement of the run waits on (`lock_timeout`).
pub const MIGRATION_LOCK_WAIT: Duration = Duration::from_secs(10);

/// Longest statement of a migration run or a [`grant`] (`statement_timeout`,
/// server side): generous, for a migration that rewrites a large table.
pub const MIGRATION_STATEMENT_TIMEOUT: Duration = Duration::from_secs(300);

/// Longest wait of [`migrate_at`] for its connection, per host of the URL,
/// when the URL sets no `connect_timeout` (TCP, TLS and authentication).
pub const MIGRATION_CONNECT_WAIT: Duration = Duration::from_secs(10);

/// Longest run of [`migrate_at`] once connected, on the client's clock: a
/// server that stops answering mid-run (a black-holed host) ends it too.
pub const MIGRATION_RUN_MAX: Duration = Duration::from_secs(15 * 60);

/// `SET LOCAL` of the bounds above, for the start of a transaction; notices
/// are not sent (a second run's "already exists, skipping").
pub fn bounded_transaction() -> String {
    format!(
        "SET LOCAL client_min_messages = warning; \
         SET LOCAL lock_timeout = '{}ms'; SET LOCAL statement_timeout = '{}ms'",
        MIGRATION_LOCK_WAIT.as_millis(),
        MIGRATION_STATEMENT_TIMEOUT.as_millis()
    )
}

/// The table that records applied migrations.
pub const MIGRATIONS_TABLE: &str = "ticklease_schema_migrations";

/// A list of migrations with its own bookkeeping table and lock, so an
/// application (the reference worker) can version its schema the same way.
#[derive(Debug, Clone, Copy)]
pub struct MigrationSet {
    /// The bookkeeping table (version, name, checksum).
    pub table: &'static str,
    /// The advisory transaction lock that serializes concurrent runners.
    pub lock_key: i64,
    /// The migrations, in order.
    pub migrations: &'static [Migration],
    /// The command that applies this set, named when it is missing.
    pub command: &'static str,
}

/// The library's own schema.
pub const LIBRARY: MigrationSet = MigrationSet {
    table: MIGRATIONS_TABLE,
    lock_key: 0x7469_636b_6c65_6173, // "tickleas" in ASCII
    migrations: MIGRATIONS,
    command: "ticklease migrate",
};

/// What a migration run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrateReport {
    /// Versions applied by this run.
    pub applied: Vec<i32>,
    /// Versions found applied before.
    pub already_applied: Vec<i32>,
    /// Definition files applied by this run (`definitions/`).
    pub definitions: Vec<String>,
    /// The database's definitions generation when it is newer than this
    /// build's: they were left in place (a rolling deploy's older replica).
    pub definitions_newer: Option<i32>,
    /// The schema owner's name when it has not the rights of
    /// `pg_signal_backend` (neither a superuser nor a member that inherits
    /// them): the drain cannot end a frozen claimer, so a
    /// takeover or pause of its role fails with `55P03` until the claim
    /// ends (docs/runbook.md, "A claim that holds its lease row").
    pub owner_cannot_end_claimers: Option<String>,
}

/// Applies every pending migration in one transaction, granting to the default roles.
pub async fn migrate(client: &mut Client) -> Result<MigrateReport, MigrateError> {
    migrate_with(client, &MigrateOptions::default()).await
}

/// Connects to `target` (TLS as its `sslmode` says), applies every pending
/// migration with `options` as [`migrate_with`] does, and closes the
/// connection: one call for an application's startup. The connect waits at
/// most [`MIGRATION_CONNECT_WAIT`] per host, the run [`MIGRATION_RUN_MAX`].
pub async fn migrate_at(target: &PgConnect, options: &MigrateOptions) -> Result<MigrateReport, MigrateError> {
    let target = target.clone().named("migrate");
    let n = u32::try_from(target.config().get_hosts().len().max(1)).unwrap_or(u32::MAX);
    // Each host its own attempt: a first host that never answers costs its share, then the next is tried.
    let hosts = Hosts::new(&target, MIGRATION_CONNECT_WAIT * n);
    let (mut client, connection) = match hosts.connect().await {
        Ok(pair) => pair,
        Err(HostsError::Db(source)) => {
            return Err(MigrateError::Db {
                step: "connect".into(),
                source,
            })
        }
        Err(HostsError::TimedOut { per_host }) => {
            return Err(MigrateError::NoAnswer {
                what: "connect",
                waited: per_host * n,
            })
        }
        Err(HostsError::Superseded { by, timeline }) => {
            return Err(MigrateError::Superseded { by, timeline })
        }
    };
    let driver = tokio::spawn(connection);
    let run = tokio::time::timeout(MIGRATION_RUN_MAX, migrate_with(&mut client, options)).await;
    drop(client);
    driver.abort();
    run.unwrap_or(Err(MigrateError::NoAnswer {
        what: "migration run",
        waited: MIGRATION_RUN_MAX,
    }))
}

/// Applies every pending migration in one transaction, then grants the
/// roles of `options` (also when every migration was applied before, so
/// naming new roles on a migrated database grants them).
pub async fn migrate_with(
    client: &mut Client,
    options: &MigrateOptions,
) -> Result<MigrateReport, MigrateError> {
    check_role_name(&options.app_role)?;
    check_role_name(&options.operator_role)?;
    // Transaction-local: read by migrations 0002 and 0003, gone at commit.
    let settings = format!(
        "SELECT set_config('ticklease.app_role', '{}', true), set_config('ticklease.operator_role', '{}', true)",
        options.app_role, options.operator_role
    );
    // The grant runs in the migration's transaction, under its advisory lock:
    // concurrent runners would otherwise race on the same GRANTs.
    let grant = format!(
        "SELECT leader_grant('{}', '{}')",
        options.app_role, options.operator_role
    );
    match apply(client, &LIBRARY, &settings, Some(options), &grant).await {
        // The roles are the cluster's, not the database's: a migration of
        // another database that created one as this run looked it up (the
        // name cached as absent in this transaction) fails the GRANT. The
        // run wrote nothing; a new transaction sees the role.
        Err(MigrateError::Db { step, source })
            if step == "grant"
                && source.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_OBJECT) =>
        {
            tracing::debug!(error = %source, "a role created concurrently: migrating once more");
            apply(client, &LIBRARY, &settings, Some(options), &grant).await
        }
        other => other,
    }
}

impl MigrationSet {
    /// Applies every pending migration in one transaction, after running
    /// `prelude` (transaction-local settings; may be empty) in it.
    pub async fn apply(&self, client: &mut Client, prelude: &str) -> Result<MigrateReport, MigrateError> {
        apply(client, self, prelude, None, "").await
    }

    /// Checks that every migration is applied, unchanged; `NotMigrated`
    /// names what is missing and the command that applies it.
    pub async fn verify(&self, client: &Client) -> Result<(), MigrateError> {
        let table = self.table;
        let not_migrated = |detail: String| MigrateError::NotMigrated {
            detail,
            command: self.command,
        };
        let sql = format!("SELECT version, checksum FROM {table}");
        let rows = match client.query_typed(&sql, &[]).await {
            Ok(rows) => rows,
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
                return Err(not_migrated(format!("table {table} does not exist")))
            }
            Err(source) => {
                return Err(MigrateError::Db {
                    step: "verify".into(),
                    source,
                })
            }
        };
        for m in self.migrations {
            match rows.iter().find(|r| r.get::<_, i32>(0) == m.version) {
                None => {
                    return Err(not_migrated(format!(
                        "migration {} ({}) is not applied",
                        m.version, m.name
                    )))
                }
                Some(r) if r.get::<_, String>(1) != m.checksum() => {
                    return Err(not_migrated(format!(
                        "migration {} ({}) was applied with a different checksum",
                        m.version, m.name
                    )))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// Applies `set` in one transaction under its advisory lock: `prelude`, the
/// pending migrations, then `epilogue` (each may be empty). `library`: the
/// library's own run, with its roles: it first checks who may write the
/// schema, a fresh database starts from the tables file, and the
/// definitions follow the versioned migrations.
async fn apply(
    client: &mut Client,
    set: &MigrationSet,
    prelude: &str,
    library: Option<&MigrateOptions>,
    epilogue: &str,
) -> Result<MigrateReport, MigrateError> {
    let db = |step: &str| {
        let step = step.to_string();
        move |source| MigrateError::Db { step, source }
    };
    let table = set.table;
    let key = set.lock_key;
    let tx = client.transaction().await.map_err(db("begin"))?;
    tx.batch_execute(&bounded_transaction())
        .await
        .map_err(db("bound the transaction"))?;
    if let Err(source) = tx
        .batch_execute(&format!("SELECT pg_advisory_xact_lock({key})"))
        .await
    {
        let waited = source.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE);
        drop(tx);
        if !waited {
            return Err(db("take the migration lock")(source));
        }
        let holders = lock_holders(client, key).await;
        return Err(MigrateError::Db {
            step: format!(
                "lock (waited {}s for the migration lock, advisory key {key} of `{}`, held by {holders})",
                MIGRATION_LOCK_WAIT.as_secs(),
                set.command
            ),
            source,
        });
    }
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             checksum   text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now())"
    ))
    .await
    .map_err(db("create the migrations table"))?;
    if !prelude.is_empty() {
        tx.batch_execute(prelude).await.map_err(db("prelude"))?;
    }
    let mut applied = applied(&tx, table).await.map_err(db("read applied migrations"))?;
    let mut report = MigrateReport::default();
    for (version, checksum) in &applied {
        match set.migrations.iter().find(|m| m.version == *version) {
            None => return Err(MigrateError::UnknownApplied { version: *version }),
            Some(m) if m.checksum() != *checksum => {
                return Err(MigrateError::Modified {
                    version: m.version,
                    name: m.name.to_string(),
                })
            }
            Some(m) => report.already_applied.push(m.version),
        }
    }
    if let Some(options) = library {
        definitions::check_writers(&tx, [&options.app_role, &options.operator_role]).await?;
    }
    if library.is_some() && applied.is_empty() {
        report.applied = start_from_tables(&tx, set).await?;
        applied = applied_of(set, &report.applied);
    }
    let pending: Vec<&Migration> = set
        .migrations
        .iter()
        .filter(|m| !applied.iter().any(|(v, _)| *v == m.version))
        .collect();
    if library.is_some() && !pending.is_empty() {
        if let Err(source) = tx.batch_execute(LOCK_STATUS_VIEW).await {
            drop(tx);
            let step = "lock leader_status first".into();
            return Err(lock_error(client, step, &["leader_status"], MIGRATION_LOCK_WAIT, source).await);
        }
    }
    for m in pending {
        let step = format!("{:04}_{}", m.version, m.name);
        if let Err(source) = tx.batch_execute(m.sql).await {
            drop(tx);
            // 0008, 0012 and 0013 wait 500 ms for the tables they lock, the others the run's wait.
            let tables = ["leader_leases", "leader_history"];
            return Err(lock_error(client, step, &tables, Duration::from_millis(500), source).await);
        }
        record(&tx, table, m).await.map_err(db(&step))?;
        report.applied.push(m.version);
    }
    if library.is_some() {
        match definitions::apply(&tx).await {
            Ok(applied) => (report.definitions, report.definitions_newer) = applied,
            Err(MigrateError::Db { step, source }) => {
                drop(tx);
                return Err(lock_error(client, step, &["leader_status"], MIGRATION_LOCK_WAIT, source).await);
            }
            Err(e) => return Err(e),
        }
    }
    // Only over this build's definitions: newer ones may name the drain otherwise.
    if library.is_some() && report.definitions_newer.is_none() {
        report.owner_cannot_end_claimers = owner_cannot_end_claimers(&tx)
            .await
            .map_err(db("read the owner's rights"))?;
    }
    if !epilogue.is_empty() {
        tx.batch_execute(epilogue).await.map_err(db("grant"))?;
    }
    tx.commit().await.map_err(db("commit"))?;
    Ok(report)
}

/// The owner of the drain (the schema owner, with whose rights it ends
/// claimers' backends) when it is neither a superuser nor has the rights of
/// `pg_signal_backend` (a member that inherits them: `pg_terminate_backend`
/// asks for the rights, and a NOINHERIT member has none), said in a warning.
async fn owner_cannot_end_claimers(
    tx: &tokio_postgres::Transaction<'_>,
) -> Result<Option<String>, tokio_postgres::Error> {
    let row = tx
        .query_typed(
            "SELECT r.rolname::text,
                    r.rolsuper OR pg_catalog.pg_has_role(r.oid, 'pg_signal_backend', 'USAGE')
               FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_roles AS r ON r.oid = p.proowner
              WHERE p.oid = pg_catalog.to_regprocedure('leader_fence_drain(text[], bigint[], boolean)')",
            &[],
        )
        .await?;
    let [row] = row.as_slice() else {
        return Ok(None);
    };
    let owner: Option<String> = (!row.get::<_, bool>(1)).then(|| row.get(0));
    if let Some(owner) = &owner {
        tracing::warn!(
            %owner,
            "the schema owner may end no claimer's backend: grant it pg_signal_backend (and, \
             NOINHERIT, make it inherit), or a takeover or pause of a role whose claimer froze fails with 55P03"
        );
    }
    Ok(owner)
}

/// The status view's lock, taken before any migration locks a table: the
/// definitions replace the view at the end of the run, and any login can
/// hold its lock (a read of it takes the lock before its privileges are
/// checked, and keeps it until that transaction ends). Waited for with
/// nothing else held, a run that cannot have it fails without having held
/// up a lease statement; taken later, behind a migration's lock on
/// `leader_leases` (0012's index), every RENEW would queue for the whole
/// wait. `ALTER VIEW … DROP DEFAULT` of a column with none changes nothing
/// and locks the view alone (`LOCK TABLE` of a view locks its tables too).
const LOCK_STATUS_VIEW: &str = "DO $lock$ BEGIN
    IF to_regclass('leader_status') IS NOT NULL THEN
        ALTER VIEW leader_status ALTER COLUMN role DROP DEFAULT;
    END IF;
END $lock$";

/// A run's error at `step`; when its wait of `waited` for a lock on one of
/// `relations` timed out, it names who holds them.
async fn lock_error(
    client: &Client,
    step: String,
    relations: &[&str],
    waited: Duration,
    source: tokio_postgres::Error,
) -> MigrateError {
    if source.code() != Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
        return MigrateError::Db { step, source };
    }
    let holders = relation_lock_holders(client, relations, waited).await;
    MigrateError::Db {
        step: format!(
            "{step} (waited {waited:?} for a lock; {} is locked by {holders})",
            relations.join(" or ")
        ),
        source,
    }
}

/// Creates the tables of a fresh database from the tables file and records
/// the migrations it stands in for as applied, with their checksums: the
/// catalog test holds the result equal to running them.
async fn start_from_tables(
    tx: &tokio_postgres::Transaction<'_>,
    set: &MigrationSet,
) -> Result<Vec<i32>, MigrateError> {
    let db = |source| MigrateError::Db {
        step: "tables_at_0007.sql".into(),
        source,
    };
    tx.batch_execute(definitions::TABLES).await.map_err(db)?;
    let mut versions = Vec::new();
    for m in set
        .migrations
        .iter()
        .filter(|m| m.version <= definitions::TABLES_AT)
    {
        record(tx, set.table, m).await.map_err(db)?;
        versions.push(m.version);
    }
    Ok(versions)
}

fn applied_of(set: &MigrationSet, versions: &[i32]) -> Vec<(i32, String)> {
    set.migrations
        .iter()
        .filter(|m| versions.contains(&m.version))
        .map(|m| (m.version, m.checksum()))
        .collect()
}

async fn record(
    tx: &tokio_postgres::Transaction<'_>,
    table: &str,
    m: &Migration,
) -> Result<(), tokio_postgres::Error> {
    tx.batch_execute(&format!(
        "INSERT INTO {table} (version, name, checksum) VALUES ({}, '{}', '{}')",
        m.version,
        m.name,
        m.checksum()
    ))
    .await
}

/// Who holds a lock on `relations` of the current schema, as a phrase for
/// an error: the sessions whose transaction began before a wait of
/// `waited` that just timed out (those queued behind the run were granted
/// the lock once it gave up: they are not why it waited).
async fn relation_lock_holders(client: &Client, relations: &[&str], waited: Duration) -> String {
    let names = relations
        .iter()
        .map(|r| format!("to_regclass(quote_ident(current_schema()) || '.{r}')"))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT coalesce(string_agg(DISTINCT format('pid %s (user %s, application %L)', l.pid,
                                                    coalesce(a.usename::text, '?'), a.application_name), ', '),
                         'a session that has gone since')
           FROM pg_locks AS l LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
          WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
            AND l.relation IN ({names})
            AND (a.xact_start IS NULL OR a.xact_start <= clock_timestamp() - interval '{} milliseconds')",
        waited.as_millis()
    );
    first_text(client, &sql)
        .await
        .unwrap_or_else(|| "another session".into())
}

/// The first column of the first row, through the simple protocol.
async fn first_text(client: &Client, sql: &str) -> Option<String> {
    client.simple_query(sql).await.ok()?.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    })
}

/// Who holds advisory lock `key` (a migration lock that was waited for
/// in vain), as a phrase for an error: backend pid, login and application.
async fn lock_holders(client: &Client, key: i64) -> String {
    let sql = format!(
        "SELECT coalesce(string_agg(format('pid %s (user %s, application %L)', l.pid,
                                           coalesce(a.usename::text, '?'), a.application_name), ', '),
                         'a session that has gone since')
           FROM pg_locks AS l LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
          WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND ((l.classid::int8 << 32) | l.objid::int8) = {key}"
    );
    first_text(client, &sql)
        .await
        .unwrap_or_else(|| "another session (pg_locks unreadable)".into())
}

async fn applied(
    tx: &tokio_postgres::Transaction<'_>,
    table: &str,
) -> Result<Vec<(i32, String)>, tokio_postgres::Error> {
    let rows = tx
        .simple_query(&format!("SELECT version, checksum FROM {table} ORDER BY version"))
        .await?;
    Ok(rows
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some((
                r.get(0).and_then(|v| v.parse().ok()).unwrap_or_default(),
                r.get(1).unwrap_or_default().to_string(),
            )),
            _ => None,
        })
        .collect())
}

/// Grants the application and operator roles (created if missing) what they
/// need; idempotent. Runs as the owner of the schema.
pub async fn grant(client: &Client, options: &MigrateOptions) -> Result<(), MigrateError> {
    check_role_name(&options.app_role)?;
    check_role_name(&options.operator_role)?;
    // One implicit transaction: the bounds are gone at its end.
    client
        .batch_execute(&format!(
            "{}; SELECT leader_grant('{}', '{}')",
            bounded_transaction(),
            options.app_role,
            options.operator_role
        ))
        .await
        .map_err(|source| MigrateError::Db {
            step: "leader_grant".into(),
            source,
        })
}

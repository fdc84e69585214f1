//! # ticklease-worker: the reference worker
//!
//! The spec's five singleton roles on five real stores, each led through
//! ticklease: `billing`, `dunning`, `webhook_outbox`, `webhook_delivery`,
//! `email_outbox`. The fencing boundary is the five claim funnels
//! ([`funnel::FUNNELS`]): each carries `AND (SELECT leader_fence_v2($1, $2))` in its
//! innermost WHERE and takes a [`ticklease::Fence`], so a superseded leader
//! claims nothing. Work already in flight completes through row
//! compare-and-sets and idempotency keys instead:
//!
//! | role | claim | completion guard |
//! |---|---|---|
//! | billing | due subscriptions | the period writer proves the (status, period start, watermark) it read; `invoices_billing_period_dedup` |
//! | dunning | due runs | recording proves `attempt_count` and stores the in-flight key; settling proves that key; idempotency key `dunning-{run}-{attempt}`, reused until the provider answers |
//! | webhook_outbox | undispatched events, locked | fan-out and the dispatched mark commit with the claim; `UNIQUE (event_id, endpoint_id)` |
//! | webhook_delivery | pending deliveries | CAS on (id, attempt): a stale mark is refused; `webhook-id` per event |
//! | email_outbox | claimBatch (bumps attempt) | CAS on (id, attempt); `Message-ID` per row |
//!
//! Outbound effects stay at-least-once across a takeover; receivers dedupe by
//! `webhook-id`, the payment provider by idempotency key, mail readers by
//! `Message-ID`.

use std::time::Duration;

pub mod billing;
pub mod delivery;
pub mod dunning;
pub mod email;
pub mod funnel;
pub mod journal;
pub mod outbox;
pub mod role;
pub mod seed;
pub mod worker;

pub use role::WorkerRole;
use ticklease::migrate::{Migration, MigrationSet};

/// The five roles' names, in the spec's order.
pub const ROLES: [&str; 5] = [
    WorkerRole::ALL[0].as_str(),
    WorkerRole::ALL[1].as_str(),
    WorkerRole::ALL[2].as_str(),
    WorkerRole::ALL[3].as_str(),
    WorkerRole::ALL[4].as_str(),
];

/// The worker's schema, versioned apart from the library's.
pub const SCHEMA: MigrationSet = MigrationSet {
    table: "ticklease_worker_schema_migrations",
    lock_key: 0x7469_636b_776f_726b, // "tickwork"
    migrations: &[
        Migration {
            version: 1,
            name: "worker",
            sql: include_str!("migrations/0001_worker.sql"),
        },
        Migration {
            version: 2,
            name: "dunning_inflight",
            sql: include_str!("migrations/0002_dunning_inflight.sql"),
        },
    ],
    command: "ticklease worker migrate",
};

/// What a completion compare-and-set did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    Marked,
    /// The row moved on since it was read (StaleDeliveryMark and kin): nothing written.
    Stale,
}

impl Mark {
    /// Runs one completion compare-and-set: one row changed is `Marked`, none `Stale`.
    async fn cas(
        client: &tokio_postgres::Client,
        what: &'static str,
        sql: &str,
        params: &[(
            &(dyn tokio_postgres::types::ToSql + Sync),
            tokio_postgres::types::Type,
        )],
    ) -> Result<Mark, WorkerError> {
        let n = client
            .execute_typed(sql, params)
            .await
            .map_err(WorkerError::db(what))?;
        Ok(if n == 1 { Mark::Marked } else { Mark::Stale })
    }
}

/// A worker failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    #[error("{what} failed")]
    Db {
        what: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("{what} failed")]
    Http {
        what: &'static str,
        #[source]
        source: reqwest::Error,
    },
    #[error("the payment provider answered {status} for {key}")]
    Provider { status: u16, key: String },
    #[error("SMTP send failed")]
    Smtp {
        #[source]
        source: lettre::transport::smtp::Error,
    },
    #[error("invalid {what}")]
    Invalid { what: String },
    #[error("lease manager failed")]
    Lease(#[from] ticklease::Error),
    #[error("lease store failed")]
    Store(#[from] ticklease::StoreError),
    #[error("invalid schedule")]
    Schedule(#[from] ticklease::ScheduleError),
    #[error("the worker's schema check failed")]
    Schema(#[from] ticklease::MigrateError),
    #[error("could not get a database connection")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("I/O failed: {what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl WorkerError {
    fn db(what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> WorkerError {
        move |source| WorkerError::Db { what, source }
    }
}

/// Applies the worker's migrations (the library's must be applied too).
pub async fn migrate(
    client: &mut tokio_postgres::Client,
) -> Result<ticklease::MigrateReport, ticklease::MigrateError> {
    SCHEMA.apply(client, "").await
}

/// Default pause between two ticks of a role.
pub const DEFAULT_TICK_INTERVAL: Duration = Duration::from_secs(5);

/// Billing's default schedule: at the top of every hour, UTC (a cron
/// schedule; each occurrence bills what was due at its instant).
pub const DEFAULT_BILLING_CRON: &str = "0 * * * *";

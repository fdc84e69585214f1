//! The worker process: the five roles' jobs on a ticklease scheduler.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager as PoolManager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use ticklease::hosts::{Hosts, PoolConnect};
use ticklease::tls::PgConnect;
use ticklease::{Manager, Metrics, PgStore, PgStoreOptions, Role, Schedule, Scheduler, Steps, Stopped, Tick};
use tokio_util::sync::CancellationToken;

use crate::role::WorkerRole;
use crate::{billing, delivery, dunning, email, outbox};
use crate::{WorkerError, DEFAULT_BILLING_CRON, DEFAULT_TICK_INTERVAL, SCHEMA};

/// Largest claim batch.
pub const BATCH_MAX: i64 = 1000;
/// Delivery attempts before a delivery is marked failed.
pub const DELIVERY_ATTEMPTS_MAX: i32 = 12;
pub(crate) const RETRY_BASE: Duration = Duration::from_millis(500);
pub(crate) const RETRY_CAP: Duration = Duration::from_secs(60);
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
const _: () = assert!(RETRY_BASE.as_millis() < RETRY_CAP.as_millis());

/// Everything a worker process needs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub database: ticklease::PgConnect,
    /// A connection straight to Postgres (not through a pooler) for the
    /// coordination session; `None`: leases alone.
    pub direct: Option<ticklease::PgConnect>,
    /// Patroni's REST APIs: terms run only while it confirms the server
    /// reached as the primary ([`ticklease::PgStore::with_patroni`]).
    pub patroni: Option<ticklease::patroni::Patroni>,
    pub roles: Vec<Role>,
    pub lease: ticklease::Config,
    /// Per-role schedules (an interval or a cron schedule); billing, if not
    /// named here, runs on [`DEFAULT_BILLING_CRON`], the other roles tick
    /// every [`DEFAULT_TICK_INTERVAL`].
    pub schedules: BTreeMap<Role, Schedule>,
    /// Base URL of the payment provider (`POST {url}/charges`).
    pub payments_url: String,
    pub smtp_host: String,
    pub smtp_port: u16,
    pub mail_from: String,
    pub webhook_secret: String,
    pub metrics_addr: Option<SocketAddr>,
    /// Rows claimed per tick (1..=[`BATCH_MAX`]).
    pub batch_size: i64,
    /// How long a declined charge waits before the next attempt.
    pub decline_backoff: Duration,
}

/// What every tick function shares.
pub(crate) struct Ctx {
    pub(crate) pool: Pool,
    pub(crate) http: reqwest::Client,
    pub(crate) smtp: lettre::AsyncSmtpTransport<lettre::Tokio1Executor>,
    pub(crate) cfg: WorkerConfig,
}

/// Runs the configured roles until `shutdown`; ticks in flight are released as interrupted.
pub async fn run(cfg: WorkerConfig, shutdown: CancellationToken) -> Result<Stopped, WorkerError> {
    if !(1..=BATCH_MAX).contains(&cfg.batch_size) {
        return Err(WorkerError::Invalid {
            what: format!("batch size {} (1..={BATCH_MAX})", cfg.batch_size),
        });
    }
    let store = PgStore::connect(cfg.database.clone(), PgStoreOptions::from_config(&cfg.lease)).await?;
    let store = match &cfg.direct {
        Some(direct) => store.with_direct(direct.clone()).await?,
        None => store,
    };
    let store = match &cfg.patroni {
        Some(patroni) => store.with_patroni(patroni.clone(), &cfg.lease).await?,
        None => store,
    };
    let pool = claim_pool(&cfg.database, cfg.lease.statement_timeout());
    SCHEMA.verify(&**pool.get().await?).await?;

    let mut registry = prometheus_client::registry::Registry::with_prefix("ticklease");
    let metrics = Metrics::register(&mut registry, cfg.roles.clone());
    let manager =
        Manager::start_with_metrics(store.clone(), cfg.lease, cfg.roles.clone(), metrics.clone()).await?;
    if let Some(addr) = cfg.metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| WorkerError::Io {
                what: format!("listen on {addr}"),
                source,
            })?;
        tracing::info!(addr = %listener.local_addr().map_err(|source| WorkerError::Io { what: "local addr".into(), source })?, "serving /metrics");
        // Scrapes read status on a connection of their own: a RENEW never
        // queues behind one.
        let status = PgStore::connect(
            cfg.database.clone(),
            PgStoreOptions {
                pool_size: 1,
                ..PgStoreOptions::from_config(&cfg.lease)
            },
        )
        .await?;
        tokio::spawn(ticklease::metrics::serve(
            listener,
            Arc::new(registry),
            metrics,
            status,
            shutdown.clone(),
        ));
    }
    let http = reqwest::Client::builder()
        .timeout(HTTP_TIMEOUT)
        .build()
        .map_err(|source| WorkerError::Http {
            what: "build the HTTP client",
            source,
        })?;
    let smtp = email::transport(&cfg.smtp_host, cfg.smtp_port);
    let ctx = Arc::new(Ctx {
        pool,
        http,
        smtp,
        cfg: cfg.clone(),
    });

    let mut scheduler = Scheduler::new(manager);
    for role in &cfg.roles {
        let schedule = cfg
            .schedules
            .get(role)
            .cloned()
            .map_or_else(|| default_schedule(role), Ok)?;
        let ctx = ctx.clone();
        let worker_role: WorkerRole = role.as_str().parse()?;
        scheduler = scheduler.job(role, schedule, move |tick| {
            tick_of(worker_role, ctx.clone(), tick)
        })?;
    }
    Ok(scheduler.run(shutdown).await)
}

/// The funnels' pool. Its connections follow the library's host rules (each
/// host of a multi-host URL its own bounded attempt, the one that answered
/// last first: a black-holed first host costs a new connection at most its
/// share of `connect_wait`, not the whole run), a wait for one ends after
/// `connect_wait` (a URL's `tcp_user_timeout` and keepalives bound a
/// statement on a connection whose host stopped answering).
fn claim_pool(database: &PgConnect, connect_wait: Duration) -> Pool {
    let hosts = Arc::new(Hosts::new(database, connect_wait));
    let manager = PoolManager::from_connect(
        database.config().clone(),
        PoolConnect::new(hosts.clone()),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(8)
        // Connections to a server a promotion superseded are dropped.
        .pre_recycle(hosts.recycle_hook())
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(connect_wait))
        .create_timeout(Some(connect_wait))
        .build()
        .expect("a runtime is given for the timeouts")
}

/// A role's schedule when the configuration names none.
fn default_schedule(role: &Role) -> Result<Schedule, WorkerError> {
    if role.as_str() == WorkerRole::Billing.as_str() {
        return Ok(Schedule::cron(DEFAULT_BILLING_CRON)?);
    }
    Ok(Schedule::every(DEFAULT_TICK_INTERVAL))
}

/// One tick of `role`: its module's tick function under one step guard.
async fn tick_of(role: WorkerRole, ctx: Arc<Ctx>, tick: Tick) -> Result<(), WorkerError> {
    let mut steps = Steps::new(&tick);
    match role {
        WorkerRole::Billing => billing::tick(&ctx, &tick, &mut steps).await?,
        WorkerRole::Dunning => dunning::tick(&ctx, &tick, &mut steps).await?,
        WorkerRole::WebhookOutbox => outbox::tick(&ctx, &tick).await?,
        WorkerRole::WebhookDelivery => delivery::tick(&ctx, &tick, &mut steps).await?,
        WorkerRole::EmailOutbox => email::tick(&ctx, &tick, &mut steps).await?,
    }
    steps.finish();
    Ok(())
}

//! The worker process: the five roles' jobs on a ticklease scheduler.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager as PoolManager, ManagerConfig, Pool, RecyclingMethod};
use ticklease::error::chain;
use ticklease::{Manager, Metrics, PgStore, PgStoreOptions, Role, Scheduler, Steps, Stopped, Tick};
use tokio_util::sync::CancellationToken;

use crate::billing::{self, PeriodClose};
use crate::delivery;
use crate::dunning::{self, Charge};
use crate::email;
use crate::outbox;
use crate::{Mark, WorkerError, DEFAULT_TICK_INTERVAL, SCHEMA};

/// Largest claim batch.
pub const BATCH_MAX: i64 = 1000;
/// Delivery attempts before a delivery is marked failed.
pub const DELIVERY_ATTEMPTS_MAX: i32 = 12;
const RETRY_BASE: Duration = Duration::from_millis(500);
const RETRY_CAP: Duration = Duration::from_secs(60);
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
const _: () = assert!(RETRY_BASE.as_millis() < RETRY_CAP.as_millis());

/// Everything a worker process needs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub database: ticklease::PgConnect,
    pub roles: Vec<Role>,
    pub lease: ticklease::Config,
    /// Per-role tick intervals; roles not named here use [`DEFAULT_TICK_INTERVAL`].
    pub tick_intervals: BTreeMap<Role, Duration>,
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

struct Ctx {
    pool: Pool,
    http: reqwest::Client,
    smtp: lettre::AsyncSmtpTransport<lettre::Tokio1Executor>,
    cfg: WorkerConfig,
}

/// Runs the configured roles until `shutdown`; ticks in flight are released as interrupted.
pub async fn run(cfg: WorkerConfig, shutdown: CancellationToken) -> Result<Stopped, WorkerError> {
    if !(1..=BATCH_MAX).contains(&cfg.batch_size) {
        return Err(WorkerError::Invalid {
            what: format!("batch size {} (1..={BATCH_MAX})", cfg.batch_size),
        });
    }
    let store = PgStore::connect(cfg.database.clone(), PgStoreOptions::from_config(&cfg.lease)).await?;
    let pool = Pool::builder(PoolManager::from_config(
        cfg.database.config().clone(),
        cfg.database.tls(),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    ))
    .max_size(8)
    .build()
    .expect("no runtime-dependent options");
    ticklease::migrate::check_set(&**pool.get().await?, &SCHEMA).await?;

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
        let interval = cfg
            .tick_intervals
            .get(role)
            .copied()
            .unwrap_or(DEFAULT_TICK_INTERVAL);
        let ctx = ctx.clone();
        let name = role.as_str().to_string();
        scheduler = scheduler.job(role, interval, move |tick| {
            let (ctx, name) = (ctx.clone(), name.clone());
            async move { tick_of(&name, ctx, tick).await }
        })?;
    }
    Ok(scheduler.run(shutdown).await)
}

async fn tick_of(role: &str, ctx: Arc<Ctx>, tick: Tick) -> Result<(), WorkerError> {
    let mut steps = Steps::new(&tick);
    let batch = ctx.cfg.batch_size;
    match role {
        "billing" => {
            let subs = billing::due(&**ctx.pool.get().await?, tick.fence(), batch).await?;
            steps
                .each("bill", subs, |sub| {
                    let ctx = ctx.clone();
                    async move {
                        let result = async {
                            let mut conn = ctx.pool.get().await?;
                            billing::close_period(&mut conn, &sub).await
                        };
                        match result.await {
                            Ok(PeriodClose::Invoiced { invoice_id }) => {
                                tracing::info!(sub = sub.id, invoice_id, "invoiced")
                            }
                            Ok(PeriodClose::WatermarkMoved) => {
                                tracing::info!(sub = sub.id, "watermark moved; nothing written")
                            }
                            Err(e) => tracing::warn!(sub = sub.id, error = %chain(&e), "billing failed"),
                        }
                    }
                })
                .await;
        }
        "dunning" => {
            let runs = dunning::due(&**ctx.pool.get().await?, tick.fence(), batch).await?;
            steps
                .each("charge", runs, |run| {
                    let ctx = ctx.clone();
                    async move {
                        let result = async {
                            let conn = ctx.pool.get().await?;
                            dunning::attempt(&conn, &run, ctx.cfg.decline_backoff, |key| {
                                charge(&ctx, run.invoice_id, run.amount_cents, key)
                            })
                            .await
                        };
                        match result.await {
                            Ok(outcome) => tracing::info!(run = run.id, ?outcome, "dunning attempt"),
                            Err(e) => {
                                tracing::warn!(run = run.id, error = %chain(&e), "dunning attempt failed")
                            }
                        }
                    }
                })
                .await;
        }
        "webhook_outbox" => {
            let mut conn = ctx.pool.get().await?;
            let n = outbox::dispatch(&mut conn, tick.fence(), batch).await?;
            tracing::debug!(events = n, "dispatched");
        }
        "webhook_delivery" => {
            let pending = delivery::pending(&**ctx.pool.get().await?, tick.fence(), batch).await?;
            steps
                .each("deliver", pending, |d| {
                    let ctx = ctx.clone();
                    async move {
                        if let Err(e) = deliver(&ctx, &d).await {
                            tracing::warn!(delivery = d.id, error = %chain(&e), "delivery bookkeeping failed");
                        }
                    }
                })
                .await;
        }
        "email_outbox" => {
            let claim_for = ctx.cfg.lease.lease_ttl() * 3;
            let emails = email::claim_batch(&**ctx.pool.get().await?, tick.fence(), batch, claim_for).await?;
            steps
                .each("send", emails, |m| {
                    let ctx = ctx.clone();
                    async move {
                        if let Err(e) = send_email(&ctx, &m).await {
                            tracing::warn!(email = m.id, error = %chain(&e), "email bookkeeping failed");
                        }
                    }
                })
                .await;
        }
        other => {
            return Err(WorkerError::Invalid {
                what: format!("role {other:?}: not one of the worker's five"),
            })
        }
    }
    steps.finish();
    Ok(())
}

async fn charge(ctx: &Ctx, invoice_id: i64, amount_cents: i64, key: String) -> Result<Charge, WorkerError> {
    let body = serde_json::json!({ "invoice_id": invoice_id, "amount_cents": amount_cents }).to_string();
    let response = ctx
        .http
        .post(format!("{}/charges", ctx.cfg.payments_url.trim_end_matches('/')))
        .header("content-type", "application/json")
        .header("idempotency-key", &key)
        .body(body)
        .send()
        .await
        .map_err(|source| WorkerError::Http {
            what: "charge",
            source,
        })?;
    match response.status().as_u16() {
        200 | 201 => Ok(Charge::Succeeded),
        402 => Ok(Charge::Declined),
        status => Err(WorkerError::Provider { status, key }),
    }
}

async fn deliver(ctx: &Ctx, d: &delivery::Delivery) -> Result<(), WorkerError> {
    let delivered = match delivery::post(&ctx.http, &ctx.cfg.webhook_secret, d).await {
        Ok(ok) => ok,
        Err(e) => {
            tracing::warn!(delivery = d.id, error = %chain(&e), "webhook POST failed");
            false
        }
    };
    let conn = ctx.pool.get().await?;
    let mark = if delivered {
        delivery::mark_delivered(&conn, d.id, d.attempt).await?
    } else {
        let delay = delivery::backoff(d.attempt + 1, RETRY_BASE, RETRY_CAP);
        delivery::mark_retry(&conn, d.id, d.attempt, delay, DELIVERY_ATTEMPTS_MAX).await?
    };
    if mark == Mark::Stale {
        tracing::info!(
            delivery = d.id,
            attempt = d.attempt,
            "StaleDeliveryMark: the delivery moved on; nothing written"
        );
    }
    Ok(())
}

async fn send_email(ctx: &Ctx, m: &email::Email) -> Result<(), WorkerError> {
    let sent = email::send(&ctx.smtp, &ctx.cfg.mail_from, m).await;
    let conn = ctx.pool.get().await?;
    let mark = match sent {
        Ok(()) => email::mark_sent(&conn, m.id, m.attempt).await?,
        Err(e) => {
            tracing::warn!(email = m.id, error = %chain(&e), "SMTP send failed");
            email::mark_retry(
                &conn,
                m.id,
                m.attempt,
                delivery::backoff(m.attempt, RETRY_BASE, RETRY_CAP),
            )
            .await?
        }
    };
    if mark == Mark::Stale {
        tracing::info!(
            email = m.id,
            attempt = m.attempt,
            "stale email mark: the row moved on; nothing written"
        );
    }
    Ok(())
}

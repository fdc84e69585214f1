//! A service built on ticklease from the README alone: its own sqlx pool,
//! two singleton jobs (an hourly billing, a 2 s outbox that claims 50 rows
//! with `FOR UPDATE SKIP LOCKED` behind the fence), the lease metrics and
//! status page merged into the service's own axum router, one URL shared by
//! sqlx and ticklease, and a clean stop on SIGTERM.
//!
//! Run it on every replica: `DATABASE_URL=postgres://billing_svc@db/app
//! OWNER_URL=postgres://owner@db/app cargo run --example service --features sqlx`.
//! `tests/example_service.rs` runs it against the test kit's Postgres.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use ticklease::prometheus_client::registry::Registry;
use ticklease::tls::PgConnect;
use ticklease::{axum, CancellationToken, Config, Manager, Metrics, MigrateOptions, PgStore, PgStoreOptions};
use ticklease::{Role, Scheduler, Stopped};

/// Up to 50 unsent rows of the outbox, only while this replica's term is live.
const CLAIM: &str = "UPDATE outbox SET sent_by = $1
  WHERE id IN (SELECT id FROM outbox WHERE sent_by IS NULL AND (SELECT leader_fence_v2($2, $3))
                ORDER BY id LIMIT 50 FOR UPDATE SKIP LOCKED)
 RETURNING id";

/// The service until `shutdown`: migrates as `owner_url`, works as `app_url`
/// (the same URL its sqlx pool uses), serves HTTP on `listener`.
pub async fn run(
    owner_url: &str,
    app_url: &str,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<Stopped> {
    ticklease::migrate_at(&owner_url.parse()?, &MigrateOptions::default()).await?;
    let pool = PgPoolOptions::new().max_connections(4).connect(app_url).await?;

    let config = Config::default();
    let store = PgStore::connect(
        app_url.parse::<PgConnect>()?,
        PgStoreOptions::from_config(&config),
    )
    .await?;
    let (billing, outbox) = (Role::new("billing")?, Role::new("outbox")?);
    let mut registry = Registry::with_prefix("myapp"); // alert with `ticklease alerts --prefix myapp`
    let metrics = Metrics::register(&mut registry, [billing.clone(), outbox.clone()]);
    let manager = Manager::start_with_metrics(
        store.clone(),
        config,
        [billing.clone(), outbox.clone()],
        metrics.clone(),
    )
    .await?;

    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "the service's own page\n" }))
        .nest_service(
            "/ops",
            ticklease::metrics::router(Arc::new(registry), metrics, store),
        );
    let stop_http = shutdown.clone();
    let http = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(stop_http.cancelled_owned())
            .await
    });

    let scheduler = Scheduler::new(manager)
        .job(&billing, Duration::from_secs(3600), |tick| async move {
            println!("billing for the hour, term {}", tick.token());
            Ok::<_, std::io::Error>(())
        })?
        .job(&outbox, Duration::from_secs(2), move |tick| {
            let pool = pool.clone();
            async move {
                let fence = tick.fence();
                // A transaction keeps both of sqlx's round trips on one server
                // behind a transaction-mode pooler (see `Fence::bind`).
                let mut tx = pool.begin().await?;
                let query = sqlx::query(CLAIM).persistent(false).bind(fence.token().get());
                let sent = fence.bind(query).fetch_all(&mut *tx).await?;
                tx.commit().await?;
                println!("outbox: sent {} rows in term {}", sent.len(), fence.token());
                Ok::<_, sqlx::Error>(())
            }
        })?;
    let stopped = scheduler.run(shutdown).await;
    http.await??;
    Ok(stopped)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let app_url = std::env::var("DATABASE_URL")?;
    let owner_url = std::env::var("OWNER_URL").unwrap_or_else(|_| app_url.clone());
    let shutdown = CancellationToken::new();
    ticklease::cancel_on_signals(shutdown.clone())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
    let stopped = run(&owner_url, &app_url, listener, shutdown).await?;
    anyhow::ensure!(stopped.all_released(), "{stopped}");
    Ok(())
}

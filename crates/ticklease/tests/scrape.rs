//! `/metrics` under a scrape flood: the lease statements never wait behind it.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;

use ticklease::{Config, Lead, Manager, Metrics, PgStore, PgStoreOptions, Role};
use ticklease_testkit::{connect, http_get, serve_metrics, Fault, FaultProxy, PgCluster};

/// 100 concurrent scrapers, without pause, against a replica whose link to
/// Postgres adds 200 ms per chunk, and `/metrics` served from the lease
/// store itself: a tick that needs several RENEWs still completes.
#[tokio::test]
async fn a_scrape_flood_over_a_slow_link_costs_no_heartbeat() {
    let cluster = PgCluster::shared();
    let name = cluster.create_database().await.unwrap();
    ticklease::migrate(&mut connect(&cluster.config(&name)).await.unwrap())
        .await
        .unwrap();
    let proxy = FaultProxy::start(([127, 0, 0, 1], cluster.port()).into())
        .await
        .unwrap();
    let mut via = tokio_postgres::Config::new();
    via.host("127.0.0.1")
        .port(proxy.port())
        .user("postgres")
        .dbname(&name);
    // Timings for a 400 ms round trip: a RENEW answers well inside its timeout.
    let config = Config::builder()
        .lease_ttl(Duration::from_secs(6))
        .heartbeat_every(Duration::from_millis(800))
        .statement_timeout(Duration::from_millis(1800))
        .abandon_after(Duration::from_millis(3600))
        .max_poll(Duration::from_millis(200))
        .build()
        .unwrap();
    let store = PgStore::connect(via, PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let billing = Role::new("billing").unwrap();
    let mut registry = Registry::with_prefix("ticklease");
    let metrics = Metrics::register(&mut registry, [billing.clone()]);
    let manager = Manager::start_with_metrics(store.clone(), config, [billing.clone()], metrics.clone())
        .await
        .unwrap();
    proxy.set(Fault::Latency(Duration::from_millis(200)));

    let (addr, stop) = serve_metrics(registry, metrics, store).await;
    let scrapers: Vec<_> = (0..100)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut served = 0;
                while !stop.is_cancelled() {
                    if http_get(addr, "/metrics")
                        .await
                        .is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
                    {
                        served += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                served
            })
        })
        .collect();

    // Longer than the TTL: the term lives only if RENEWs get through.
    let lead = manager
        .lead(&billing, Duration::from_secs(3600), |tick| async move {
            tokio::time::sleep(Duration::from_secs(7)).await;
            Ok::<_, std::convert::Infallible>(tick.token())
        })
        .await
        .unwrap();
    stop.cancel();
    let mut served = 0;
    for s in scrapers {
        served += s.await.unwrap();
    }
    assert!(matches!(lead, Lead::Completed { .. }), "{lead:?}");
    assert!(served >= 100, "the flood was served: {served} scrapes");
}

/// Concurrent scrapes share one refresh (the review: once a refresh took
/// 1 s, 16 scrapes refreshed one after another, the last answered after
/// 32 s): with the table locked, every refresh waits out its statement
/// timeout (1 s), and 16 scrapes sent together all answer within a few.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_scrapes_during_a_slow_refresh_share_it() {
    let cluster = PgCluster::shared();
    let name = cluster.create_database().await.unwrap();
    let mut owner = connect(&cluster.config(&name)).await.unwrap();
    ticklease::migrate(&mut owner).await.unwrap();
    let config = Config::builder()
        .lease_ttl(Duration::from_secs(4))
        .heartbeat_every(Duration::from_millis(500))
        .statement_timeout(Duration::from_secs(1))
        .abandon_after(Duration::from_secs(2))
        .max_poll(Duration::from_millis(500))
        .build()
        .unwrap();
    let store = PgStore::connect(cluster.config(&name), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let mut registry = Registry::with_prefix("ticklease");
    let metrics = Metrics::register(&mut registry, [Role::new("billing").unwrap()]);
    let (addr, stop) = serve_metrics(registry, metrics, store).await;
    let locker = owner.transaction().await.unwrap();
    locker
        .batch_execute("LOCK TABLE leader_leases IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let scrapes: Vec<_> = (0..16)
        .map(|_| {
            tokio::spawn(async move {
                let started = tokio::time::Instant::now();
                let response = http_get(addr, "/metrics").await.unwrap();
                (response, started.elapsed())
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for scrape in scrapes {
        let (response, took) = scrape.await.unwrap();
        assert!(
            response.starts_with("HTTP/1.1 200") && response.contains("ticklease_leader_status_unreadable 1"),
            "{response:.500}"
        );
        slowest = slowest.max(took);
    }
    locker.rollback().await.unwrap();
    stop.cancel();
    // One refresh (1 s) and some; one after another would be 16 s.
    assert!(
        slowest < Duration::from_secs(5),
        "the slowest scrape took {slowest:?}"
    );
}

/// The routes join the application's own router, merged at its root or
/// mounted under a path of a router with state, beside the app's routes;
/// the re-exported crates are the ones the API takes.
#[tokio::test]
async fn the_routes_join_the_applications_own_router() {
    use axum::routing::get;
    let db = ticklease_testkit::migrated_db(PgCluster::shared()).await;
    let config = Config::default();
    let store = PgStore::connect(db, PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let billing = Role::new("billing").unwrap();
    let mut registry = ticklease::prometheus_client::registry::Registry::with_prefix("myapp");
    let metrics = Metrics::register(&mut registry, [billing]);
    let registry = Arc::new(registry);
    let ours = ticklease::metrics::router(registry, metrics, store);

    #[derive(Clone)]
    struct AppState(&'static str);
    let app: axum::Router = axum::Router::new()
        .route(
            "/orders",
            get(|axum::extract::State(s): axum::extract::State<AppState>| async move { s.0 }),
        )
        .nest_service("/ops", ours.clone())
        .with_state(AppState("orders of the app"));
    let merged: axum::Router = axum::Router::new()
        .route("/hello", get(|| async { "hi" }))
        .merge(ours);
    let stop: ticklease::CancellationToken = ticklease::CancellationToken::new();
    let mut addrs = Vec::new();
    for router in [app, merged] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap());
        let stop = stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
        });
    }
    let (app, merged) = (addrs[0], addrs[1]);
    assert!(get_ok(app, "/orders").await.contains("orders of the app"));
    assert!(get_ok(app, "/ops/metrics")
        .await
        .contains("myapp_leader_is_leader"));
    assert!(get_ok(app, "/ops/healthz").await.ends_with("ok\n"));
    assert!(get_ok(merged, "/hello").await.ends_with("hi"));
    assert!(get_ok(merged, "/metrics")
        .await
        .contains("myapp_leader_is_leader"));
    stop.cancel();
}

async fn get_ok(addr: std::net::SocketAddr, path: &str) -> String {
    let response = http_get(addr, path).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{path}: {response:.300}");
    response
}

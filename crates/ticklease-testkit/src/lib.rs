//! Test kit for ticklease: throwaway Postgres clusters (a fresh database per
//! test), an in-memory fake store for paused-time tests, and the conformance
//! suite both stores pass.

pub mod cluster;
pub mod conformance;
pub mod fake;

use std::time::Duration;

pub use cluster::{connect, KitError, PgCluster};
pub use fake::FakeStore;

use ticklease::{Config, PgStore, PgStoreOptions};

/// Scaled-down timings for tests against real Postgres: TTL 2 s, heartbeat
/// 300 ms, statement timeout 500 ms, abandon 1.2 s, poll 200 ms. Generous
/// enough for a loaded 2-core machine.
pub fn test_config() -> Config {
    Config::builder()
        .lease_ttl(Duration::from_millis(2000))
        .heartbeat_every(Duration::from_millis(300))
        .statement_timeout(Duration::from_millis(500))
        .abandon_after(Duration::from_millis(1200))
        .max_poll(Duration::from_millis(200))
        .build()
        .expect("valid test timings")
}

/// A fresh, migrated database on `cluster`.
pub async fn migrated_db(cluster: &PgCluster) -> tokio_postgres::Config {
    let name = cluster.create_database().await.expect("create database");
    let config = cluster.config(&name);
    let mut client = connect(&config).await.expect("connect");
    ticklease::migrate(&mut client).await.expect("migrate");
    config
}

/// A store on a fresh, migrated database of the shared cluster.
pub async fn pg_store(config: &Config) -> (PgStore, tokio_postgres::Config) {
    let db = migrated_db(PgCluster::shared()).await;
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(config))
        .await
        .expect("PgStore");
    (store, db)
}

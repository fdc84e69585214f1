//! Test kit for ticklease: an in-memory fake store for paused-time tests,
//! the conformance suite both stores pass, a TCP fault proxy, PgBouncer, a
//! TLS cluster (its CA made with rcgen) and the tests' timings. The
//! throwaway clusters (a fresh database per test), network peers, worker
//! processes and the effects audit come from `ticklease-sandbox`, re-exported
//! here, so the binary that runs the demo carries none of this kit.

pub mod bouncer;
pub mod conformance;
pub mod counting;
pub mod exporter;
pub mod ha;
pub mod proxy;
pub mod tls;

use std::time::Duration;

pub use bouncer::PgBouncer;
pub use conformance::lease_row;
pub use counting::Counting;
pub use exporter::{http_get, serve_metrics};
pub use proxy::{Fault, FaultProxy};
/// The library's in-memory store, under the name the suites use.
pub use ticklease::testing::MemoryStore as FakeStore;
pub use ticklease_sandbox::{audit, cluster, patroni, peers, standby};
pub use ticklease_sandbox::{
    config_for_hosts, connect, signal, url_for_hosts, HttpPeer, PatroniCluster, PgCluster,
    SandboxError as KitError, SmtpSink, Standby, WorkerProcess,
};
pub use tls::{TestCa, TlsCluster};

use ticklease::{Config, PgStore, PgStoreOptions};

/// [`test_config`]'s timings as the CLI's flags (`ticklease run`, `worker`).
pub const TEST_TIMING_FLAGS: [&str; 10] = [
    "--lease-ttl",
    "2s",
    "--heartbeat-every",
    "300ms",
    "--statement-timeout",
    "500ms",
    "--abandon-after",
    "1200ms",
    "--max-poll",
    "200ms",
];

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

/// The one switch for the pooler suites: with `TICKLEASE_TEST_POOLER=pgbouncer`,
/// tests on the shared cluster reach it through a shared PgBouncer in
/// transaction mode with a server pool of 2.
pub fn shared_bouncer() -> Option<&'static PgBouncer> {
    static BOUNCER: std::sync::OnceLock<Option<PgBouncer>> = std::sync::OnceLock::new();
    BOUNCER
        .get_or_init(|| match std::env::var("TICKLEASE_TEST_POOLER").as_deref() {
            Ok("pgbouncer") => {
                let cluster = PgCluster::shared();
                match ticklease_sandbox::on_lasting_thread(move || {
                    PgBouncer::start_inner(cluster, 2, "", true)
                }) {
                    Ok(b) => Some(b),
                    Err(e) => panic!("test kit could not start pgbouncer: {e}"),
                }
            }
            Ok("") | Err(_) => None,
            Ok(other) => panic!("TICKLEASE_TEST_POOLER={other:?}: the only pooler is \"pgbouncer\""),
        })
        .as_ref()
}

/// How the application reaches `dbname` on `cluster`: through the shared
/// bouncer when the pooler switch is on and this is the shared cluster, else directly.
pub fn app_config(cluster: &PgCluster, dbname: &str) -> tokio_postgres::Config {
    match shared_bouncer() {
        Some(b) if std::ptr::eq(cluster, PgCluster::shared()) => b.config(dbname),
        _ => cluster.config(dbname),
    }
}

/// A direct (bouncer-free) config for a database of the shared cluster, for a
/// test's own observers and lock holders, which must not queue for the
/// application's pooled server connections.
pub fn direct(db: &tokio_postgres::Config) -> tokio_postgres::Config {
    PgCluster::shared().config(db.get_dbname().expect("a database name"))
}

/// A fresh, migrated database on `cluster` (migrated directly, as a deploy
/// would), and the config the application uses to reach it.
pub async fn migrated_db(cluster: &PgCluster) -> tokio_postgres::Config {
    let name = cluster.create_database().await.expect("create database");
    let mut client = connect(&cluster.config(&name)).await.expect("connect");
    ticklease::migrate(&mut client).await.expect("migrate");
    app_config(cluster, &name)
}

/// A primary with a migrated database, and its streaming standby caught up.
pub async fn primary_and_standby() -> (PgCluster, Standby, String) {
    let primary = PgCluster::start_primary().expect("start a primary");
    let db = primary.create_database().await.expect("create database");
    ticklease::migrate(&mut connect(&primary.config(&db)).await.expect("connect"))
        .await
        .expect("migrate");
    let standby = Standby::start(&primary).expect("start a standby");
    standby
        .wait_caught_up(&primary)
        .await
        .expect("standby catches up");
    (primary, standby, db)
}

/// One value from a query without parameters, as an unnamed statement (safe
/// through a transaction-mode pooler).
pub async fn scalar<T>(client: &tokio_postgres::Client, sql: &str) -> T
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    let rows = client
        .query_typed(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.first().unwrap_or_else(|| panic!("{sql}: no row")).get(0)
}

/// A store on a fresh, migrated database of the shared cluster.
pub async fn pg_store(config: &Config) -> (PgStore, tokio_postgres::Config) {
    let db = migrated_db(PgCluster::shared()).await;
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(config))
        .await
        .expect("PgStore");
    (store, db)
}

//! Replicas on an HA Postgres (a Patroni cluster): each leads the same
//! roles on a multi-host URL, and each tick is a fenced claim on the server
//! its term started on (`Tick::server`, the rule `ticklease run` children
//! follow), recorded in a `claims` table; with checks of that table. Used
//! by the Patroni test and benchmark.

use std::time::Duration;

use tokio::time::Instant;

use ticklease::patroni::Patroni;
use ticklease::{
    CancellationToken, Config, Manager, PgConnect, PgStore, PgStoreOptions, Role, Scheduler, Tick,
};

use crate::{connect, scalar};

/// The roles every replica leads.
pub const ROLES: [&str; 3] = ["billing", "dunning", "outbox"];
/// How often each role ticks.
const EVERY: Duration = Duration::from_millis(100);

/// Creates the claims table (on the primary of `url`).
pub async fn create_claims(url: &str) {
    let client = connect(&url.parse().unwrap()).await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE claims (id serial PRIMARY KEY, role text, token bigint, replica int,
                                  at timestamptz DEFAULT clock_timestamp())",
        )
        .await
        .unwrap();
}

/// A fenced claim of the tick's term, on the server the term started on.
async fn claim(
    tick: Tick,
    dbname: String,
    replica: i32,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let server = tick.server().ok_or("no server")?;
    let (host, port) = (&server.host, server.port);
    let config = format!("host={host} port={port} user=postgres dbname={dbname} connect_timeout=2");
    let (client, connection) = tokio_postgres::connect(&config, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    client
        .execute(
            "INSERT INTO claims (role, token, replica)
             SELECT $1, $2, $3 WHERE (SELECT leader_fence_v2($1, $2))",
            &[&tick.role().as_str(), &tick.token().get(), &replica],
        )
        .await?;
    Ok(())
}

/// Starts a replica: its store on `url` (and on `url` as its direct URL when
/// `direct`), a scheduler ticking every role every 100 ms until `stop`.
pub async fn spawn_replica(url: &str, config: Config, replica: i32, direct: bool, stop: CancellationToken) {
    spawn_checked_replica(url, config, replica, direct, None, stop).await;
}

/// [`spawn_replica`], its terms run only while `patroni` (when given)
/// confirms the server its store reaches as the primary.
pub async fn spawn_checked_replica(
    url: &str,
    config: Config,
    replica: i32,
    direct: bool,
    patroni: Option<Patroni>,
    stop: CancellationToken,
) {
    let pg: PgConnect = url.parse().unwrap();
    let dbname = pg.config().get_dbname().unwrap().to_owned();
    let mut store = PgStore::connect(pg.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    if direct {
        store = store.with_direct(pg).await.unwrap();
    }
    if let Some(patroni) = patroni {
        store = store.with_patroni(patroni, &config).await.unwrap();
    }
    let roles: Vec<Role> = ROLES.iter().map(|r| Role::new(*r).unwrap()).collect();
    let manager = Manager::start(store, config, roles.clone()).await.unwrap();
    let mut scheduler = Scheduler::new(manager);
    for role in &roles {
        let dbname = dbname.clone();
        scheduler = scheduler
            .job(role, EVERY, move |tick| claim(tick, dbname.clone(), replica))
            .unwrap();
    }
    tokio::spawn(scheduler.run(stop));
}

/// `query`'s one number, read on the primary as soon as one answers (a
/// fresh connection each time: the primary may be moving), within `bound`.
pub async fn on_primary(url: &str, query: &str, bound: Duration) -> i64 {
    let started = Instant::now();
    loop {
        if let Ok(client) = connect(&url.parse().unwrap()).await {
            if let Ok(row) = client.query_one(query, &[]).await {
                return row.get(0);
            }
        }
        assert!(started.elapsed() < bound, "no primary answered within {bound:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every role has a claim after claim `after`; how long it took.
pub async fn every_role_claims_after(url: &str, after: i64, bound: Duration) -> Duration {
    let started = Instant::now();
    let query = format!("SELECT count(DISTINCT role) FROM claims WHERE id > {after}");
    while on_primary(url, &query, bound).await < ROLES.len() as i64 {
        assert!(
            started.elapsed() < bound,
            "a role did not lead again within {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

/// The last claim's id, read on the primary.
pub async fn last_claim(url: &str) -> i64 {
    let last = "SELECT coalesce(max(id), 0)::int8 FROM claims";
    on_primary(url, last, Duration::from_secs(30)).await
}

/// What the claims on the primary break: terms whose claims came from two
/// replicas, and claims under a token below an earlier claim's of the role.
pub async fn claim_violations(url: &str) -> (i64, i64) {
    let client = connect(&url.parse().unwrap()).await.unwrap();
    let shared = scalar(
        &client,
        "SELECT count(*) FROM (SELECT role, token FROM claims GROUP BY 1, 2
                                HAVING count(DISTINCT replica) > 1) s",
    )
    .await;
    let backwards = scalar(
        &client,
        "SELECT count(*) FROM (SELECT token < max(token) OVER (PARTITION BY role ORDER BY id
                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS back FROM claims) s
          WHERE back",
    )
    .await;
    (shared, backwards)
}

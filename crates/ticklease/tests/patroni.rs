//! Issue 35, item 6: ticklease on a real Patroni 3.0 + etcd cluster of three
//! members (Debian's packages). Three replicas lead three roles on the
//! multi-host URL, each tick a fenced claim on the server its term started
//! on (`Tick::server`, the rule `ticklease run` children follow); through a
//! switchover and a SIGKILLed primary postmaster, every role leads again
//! within a bound of the cluster's recovery, no claim of a term is made by
//! two replicas, and tokens only grow in the order claims commit.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use ticklease::{Config, Manager, PgConnect, PgStore, PgStoreOptions, Role, Scheduler, Tick};
use ticklease_testkit::{connect, scalar, test_config, PatroniCluster};

const ROLES: [&str; 3] = ["billing", "dunning", "outbox"];
const DB: &str = "app";

/// A fenced claim of the tick's term, on the server the term started on.
async fn claim(tick: Tick, replica: usize) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let server = tick.server().ok_or("no server")?.to_owned();
    let (host, port) = server.rsplit_once(':').ok_or("no port")?;
    let (client, connection) = tokio_postgres::connect(
        &format!("host={host} port={port} user=postgres dbname={DB}"),
        tokio_postgres::NoTls,
    )
    .await?;
    tokio::spawn(connection);
    client
        .execute(
            "INSERT INTO claims (role, token, replica)
             SELECT $1, $2, $3 WHERE (SELECT leader_fence($1, $2))",
            &[&tick.role().as_str(), &tick.token().get(), &(replica as i32)],
        )
        .await?;
    Ok(())
}

/// A replica: its store on the multi-host URL (the direct URL too), and a
/// scheduler ticking every role every 100 ms until `stop`.
async fn replica(url: &str, config: Config, replica: usize, stop: CancellationToken) {
    let pg: PgConnect = url.parse().unwrap();
    let store = PgStore::connect(pg.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap()
        .with_direct(pg)
        .await
        .unwrap();
    let roles: Vec<Role> = ROLES.iter().map(|r| Role::new(*r).unwrap()).collect();
    let manager = Manager::start(store, config, roles.clone()).await.unwrap();
    let mut scheduler = Scheduler::new(manager);
    for role in &roles {
        scheduler = scheduler
            .job(role, Duration::from_millis(100), move |tick| claim(tick, replica))
            .unwrap();
    }
    tokio::spawn(scheduler.run(stop));
}

/// `query`'s one number, read on the primary as soon as one answers (a
/// fresh connection each time: the primary may be moving), within `bound`.
async fn on_primary(url: &str, query: &str, bound: Duration) -> i64 {
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
async fn every_role_claims_after(url: &str, after: i64, bound: Duration) -> Duration {
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
async fn last_claim(url: &str) -> i64 {
    let last = "SELECT coalesce(max(id), 0)::int8 FROM claims";
    on_primary(url, last, Duration::from_secs(30)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_switchover_and_a_killed_primary_every_role_leads_again_and_tokens_only_grow() {
    let cluster = tokio::task::spawn_blocking(PatroniCluster::start)
        .await
        .unwrap()
        .unwrap();
    let owner_url = cluster.url("postgres");
    let owner = connect(&owner_url.parse().unwrap()).await.unwrap();
    owner
        .batch_execute(&format!("CREATE DATABASE {DB}"))
        .await
        .unwrap();
    let url = cluster.url(DB);
    let mut app = connect(&url.parse().unwrap()).await.unwrap();
    ticklease::migrate(&mut app).await.unwrap();
    app.batch_execute(
        "CREATE TABLE claims (id serial PRIMARY KEY, role text, token bigint, replica int,
                              at timestamptz DEFAULT clock_timestamp())",
    )
    .await
    .unwrap();
    let config = test_config();
    let stop = CancellationToken::new();
    for r in 0..3 {
        replica(&url, config, r, stop.clone()).await;
    }
    // The bound after the cluster is healthy again: a lease's expiry, a
    // poll, a probe of the hosts and a statement, doubled for a loaded machine.
    let bound = (config.lease_ttl() + config.max_poll() + config.statement_timeout() * 3) * 2;
    every_role_claims_after(&url, 0, Duration::from_secs(30)).await;

    let candidate = cluster
        .members()
        .iter()
        .find(|m| Some(m.name.as_str()) != cluster.leader().map(|l| l.name.as_str()))
        .unwrap()
        .name
        .clone();
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.switchover(&candidate).unwrap();
        cluster.wait_healthy().unwrap();
        cluster
    })
    .await
    .unwrap();
    let after = last_claim(&url).await;
    let took = every_role_claims_after(&url, after, bound).await;
    eprintln!("switchover: every role led again {took:?} after the cluster was healthy");

    let cluster = tokio::task::spawn_blocking(move || {
        cluster.kill_leader_postmaster().unwrap();
        cluster.wait_healthy().unwrap();
        cluster
    })
    .await
    .unwrap();
    let after = last_claim(&url).await;
    let took = every_role_claims_after(&url, after, bound).await;
    eprintln!("killed primary: every role led again {took:?} after the cluster was healthy");
    stop.cancel();

    let client = connect(&url.parse().unwrap()).await.unwrap();
    let shared: i64 = scalar(
        &client,
        "SELECT count(*) FROM (SELECT role, token FROM claims GROUP BY 1, 2 HAVING count(DISTINCT replica) > 1) s",
    )
    .await;
    assert_eq!(shared, 0, "a term's claims were made by two replicas");
    let backwards: i64 = scalar(
        &client,
        "SELECT count(*) FROM (SELECT token < max(token) OVER (PARTITION BY role ORDER BY id
                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS back FROM claims) s
          WHERE back",
    )
    .await;
    assert_eq!(
        backwards, 0,
        "a claim committed under a token below an earlier one's"
    );
    drop(cluster);
}

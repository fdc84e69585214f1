//! A fenced `FOR UPDATE SKIP LOCKED` claim through sqlx (feature `sqlx`),
//! as `Fence::bind` and `push_fence!` document it, also through PgBouncer
//! (the pooler suite runs this file): the term's claims take rows, the same
//! claims with the fence of a term that is over take none.
//!
//! sqlx runs an unnamed statement in two round trips (Parse, then Bind and
//! Execute, each ending in Sync). Outside a transaction a transaction-mode
//! pooler may give the second to another server, where the statement does
//! not exist (26000) or is another client's. Each claim here runs in a
//! transaction, as the docs say, while another client's queries keep the
//! pooler's servers changing hands.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::Row;

use ticklease::{Fence, Lead, Manager, PgStore, PgStoreOptions, Role};
use ticklease_testkit::{connect, direct, migrated_db, test_config, PgCluster};

const HOUR: Duration = Duration::from_secs(3600);
/// Rows each claim takes, and claims of each kind in the term.
const BATCH: i32 = 10;
const ROUNDS: i32 = 15;

/// The sqlx URL of a test kit config (TCP or a socket directory).
fn url_of(db: &tokio_postgres::Config) -> String {
    let port = db.get_ports()[0];
    let (user, name) = (db.get_user().unwrap(), db.get_dbname().unwrap());
    match &db.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(host) => format!("postgres://{user}@{host}:{port}/{name}"),
        tokio_postgres::config::Host::Unix(dir) => {
            format!("postgres://{user}@localhost:{port}/{name}?host={}", dir.display())
        }
    }
}

/// The claim of `Fence::bind`: up to 10 unclaimed rows, stamped with the
/// token. A static string (sqlx 0.9 takes no dynamic SQL unasserted), the
/// predicate written out as `Fence::predicate(2)` writes it.
const CLAIM: &str = "UPDATE outbox SET claimed_by = $1
  WHERE id IN (SELECT id FROM outbox WHERE claimed_by IS NULL AND (SELECT leader_fence_v2($2, $3))
                ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED)
 RETURNING id";

async fn claim_bound(pool: &sqlx::PgPool, fence: &Fence) -> Vec<i32> {
    assert!(CLAIM.contains(&fence.predicate(2)));
    let mut tx = pool.begin().await.unwrap();
    let query = sqlx::query(CLAIM).persistent(false).bind(fence.token().get());
    let rows = fence.bind(query).fetch_all(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    rows.iter().map(|r| r.get::<i32, _>(0)).collect()
}

/// The same claim built with `push_fence!`.
async fn claim_built(pool: &sqlx::PgPool, fence: &Fence) -> Vec<i32> {
    let mut builder = sqlx::QueryBuilder::<sqlx::Postgres>::new("UPDATE outbox SET claimed_by = ");
    builder
        .push_bind(fence.token().get())
        .push(" WHERE id IN (SELECT id FROM outbox WHERE claimed_by IS NULL AND ");
    ticklease::push_fence!(builder, fence);
    builder.push(" ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED) RETURNING id");
    let mut tx = pool.begin().await.unwrap();
    let rows = builder
        .build()
        .persistent(false)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    rows.iter().map(|r| r.get::<i32, _>(0)).collect()
}

/// Another client's simple queries until `stop`: each takes whichever
/// server the pooler has free (and drops that server's unnamed statement).
fn other_client(pool: sqlx::PgPool, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            sqlx::raw_sql("SELECT 1").execute(&pool).await.unwrap();
        }
    })
}

/// In one term, `ROUNDS` claims of each kind, alternating: the ids each took.
async fn claims_in_a_term(
    manager: &Manager<PgStore>,
    outbox: &Role,
    pool: &sqlx::PgPool,
) -> (Fence, Vec<Vec<i32>>) {
    let lead = manager
        .lead(outbox, HOUR, |tick| {
            let pool = pool.clone();
            async move {
                let fence = tick.fence().clone();
                let mut taken = Vec::new();
                for _ in 0..ROUNDS {
                    taken.push(claim_bound(&pool, &fence).await);
                    taken.push(claim_built(&pool, &fence).await);
                }
                Ok::<_, std::io::Error>((fence, taken))
            }
        })
        .await
        .unwrap();
    let Lead::Completed { value, .. } = lead else {
        panic!("{lead:?}")
    };
    value
}

#[tokio::test]
async fn fenced_skip_locked_claims_through_sqlx_take_rows_only_in_their_term() {
    let db = migrated_db(PgCluster::shared()).await;
    connect(&direct(&db))
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE outbox (id int PRIMARY KEY, claimed_by bigint);
             INSERT INTO outbox SELECT g, NULL FROM generate_series(1, 1000) AS g",
        )
        .await
        .unwrap();
    let url = url_of(&db);
    let connect_pool = || PgPoolOptions::new().max_connections(2).connect(&url);
    let (pool, others) = (connect_pool().await.unwrap(), connect_pool().await.unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let noise = [
        other_client(others.clone(), stop.clone()),
        other_client(others, stop.clone()),
    ];
    let config = test_config();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let outbox = Role::new("outbox").unwrap();
    let manager = Manager::start(store, config, [outbox.clone()]).await.unwrap();
    let (stale, taken) = claims_in_a_term(&manager, &outbox, &pool).await;
    let expected: Vec<Vec<i32>> = (0..2 * ROUNDS)
        .map(|k| (k * BATCH + 1..=(k + 1) * BATCH).collect())
        .collect();
    assert_eq!(taken, expected, "each claim takes the next rows in the term");
    assert!(
        claim_bound(&pool, &stale).await.is_empty(),
        "a released term's fence claims nothing"
    );
    assert!(claim_built(&pool, &stale).await.is_empty());
    stop.store(true, Ordering::Relaxed);
    for task in noise {
        task.await.unwrap();
    }
}

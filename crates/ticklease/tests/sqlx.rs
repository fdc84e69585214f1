//! A fenced `FOR UPDATE SKIP LOCKED` claim through sqlx (feature `sqlx`),
//! as `Fence::bind` and `push_fence!` document it, also through PgBouncer
//! (the pooler suite runs this file): the term's claim takes rows, the same
//! claim with the fence of a term that is over takes none.

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::Row;

use ticklease::{Fence, Lead, Manager, PgStore, PgStoreOptions, Role};
use ticklease_testkit::{connect, direct, migrated_db, test_config, PgCluster};

const HOUR: Duration = Duration::from_secs(3600);

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

/// The claim of `Fence::bind`: up to 50 unclaimed rows, stamped with the
/// token. A static string (sqlx 0.9 takes no dynamic SQL unasserted), the
/// predicate written out as `Fence::predicate(2)` writes it.
const CLAIM: &str = "UPDATE outbox SET claimed_by = $1
  WHERE id IN (SELECT id FROM outbox WHERE claimed_by IS NULL AND (SELECT leader_fence($2, $3))
                ORDER BY id LIMIT 50 FOR UPDATE SKIP LOCKED)
 RETURNING id";

async fn claim_bound(pool: &sqlx::PgPool, fence: &Fence) -> Vec<i32> {
    assert!(CLAIM.contains(&fence.predicate(2)));
    let query = sqlx::query(CLAIM).persistent(false).bind(fence.token().get());
    let rows = fence.bind(query).fetch_all(pool).await.unwrap();
    rows.iter().map(|r| r.get::<i32, _>(0)).collect()
}

/// The same claim built with `push_fence!`.
async fn claim_built(pool: &sqlx::PgPool, fence: &Fence) -> Vec<i32> {
    let mut builder = sqlx::QueryBuilder::<sqlx::Postgres>::new("UPDATE outbox SET claimed_by = ");
    builder
        .push_bind(fence.token().get())
        .push(" WHERE id IN (SELECT id FROM outbox WHERE claimed_by IS NULL AND ");
    ticklease::push_fence!(builder, fence);
    builder.push(" ORDER BY id LIMIT 50 FOR UPDATE SKIP LOCKED) RETURNING id");
    let rows = builder.build().persistent(false).fetch_all(pool).await.unwrap();
    rows.iter().map(|r| r.get::<i32, _>(0)).collect()
}

#[tokio::test]
async fn a_fenced_skip_locked_claim_through_sqlx_takes_rows_only_in_its_term() {
    let db = migrated_db(PgCluster::shared()).await;
    connect(&direct(&db))
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE outbox (id int PRIMARY KEY, claimed_by bigint);
             INSERT INTO outbox SELECT g, NULL FROM generate_series(1, 200) AS g",
        )
        .await
        .unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url_of(&db))
        .await
        .unwrap();
    let config = test_config();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let outbox = Role::new("outbox").unwrap();
    let manager = Manager::start(store, config, [outbox.clone()]).await.unwrap();
    let lead = manager
        .lead(&outbox, HOUR, |tick| {
            let pool = pool.clone();
            async move {
                let fence = tick.fence().clone();
                let bound = claim_bound(&pool, &fence).await;
                let built = claim_built(&pool, &fence).await;
                Ok::<_, std::io::Error>((fence, bound, built))
            }
        })
        .await
        .unwrap();
    let Lead::Completed {
        value: (stale, bound, built),
        ..
    } = lead
    else {
        panic!("{lead:?}")
    };
    assert_eq!(bound, (1..=50).collect::<Vec<_>>());
    assert_eq!(built, (51..=100).collect::<Vec<_>>());
    assert!(
        claim_bound(&pool, &stale).await.is_empty(),
        "a released term's fence claims nothing"
    );
    assert!(claim_built(&pool, &stale).await.is_empty());
}

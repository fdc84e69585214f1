//! The outbox recipe (docs/sql-api.md, "Recipe: an outbox with a fenced
//! reclaim"): one role sends the rows of an outbox table. Each term claims up
//! to 50 rows (fenced), sends them, then marks them sent (fenced, and only
//! the rows it claimed). A term that dies between its claim and its
//! completion leaves its rows claimed by its token; a later term, whose
//! token is higher, **reclaims** them: tokens only grow, so a row claimed by
//! a lower token belongs to a term that is over. Sending is at least once (a
//! term that sent and died before completing is sent again): give the
//! receiver the row's id as an idempotency key.
//!
//! Run it on every replica: `DATABASE_URL=postgres://app@db/app cargo run
//! --example outbox`; `tests/outbox_recipe.rs` runs it against the test
//! kit's Postgres, with a term that dies between claim and send.
//!
//! ```sql
//! CREATE TABLE outbox (id bigint PRIMARY KEY, payload text NOT NULL,
//!                      claimed_by bigint, sent_at timestamptz);
//! ```

use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

use ticklease::{CancellationToken, Config, Fence, Manager, PgStore, PgStoreOptions, Role, Scheduler};

/// Rows one term claims at most.
pub const CLAIM_MAX: i64 = 50;

/// The claim: unsent rows that are unclaimed or claimed by an earlier
/// (ended) term, only while this term is live. `$1` the token, `$4` the
/// limit, the fence's `$2`, `$3`.
fn claim_sql(fence: &Fence) -> String {
    format!(
        "UPDATE outbox SET claimed_by = $1
          WHERE id IN (SELECT id FROM outbox
                        WHERE sent_at IS NULL AND (claimed_by IS NULL OR claimed_by < $1)
                        ORDER BY id LIMIT $4 FOR UPDATE SKIP LOCKED)
            AND {}
         RETURNING id, payload",
        fence.predicate(2)
    )
}

/// The completion: the rows this term claimed and sent, only while it is live.
fn complete_sql(fence: &Fence) -> String {
    format!(
        "UPDATE outbox SET sent_at = now() WHERE id = ANY($4) AND claimed_by = $1 AND {}",
        fence.predicate(2)
    )
}

/// One term's work: claim, send each row (`send`, keyed by the row's id),
/// complete. Returns how many rows it marked sent. An error from `send`
/// leaves the unsent rows claimed by this term, for a later term to reclaim.
pub async fn dispatch<E>(
    client: &mut Client,
    fence: &Fence,
    mut send: impl FnMut(i64, &str) -> Result<(), E>,
) -> anyhow::Result<u64>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let token = fence.token().get();
    let [(role, role_type), (term, term_type)] = fence.params();
    let tx = client.transaction().await?;
    let claim: &[(&(dyn ToSql + Sync), Type)] = &[
        (&token, Type::INT8),
        (role, role_type.clone()),
        (term, term_type.clone()),
        (&CLAIM_MAX, Type::INT8),
    ];
    let rows = tx.query_typed(&claim_sql(fence), claim).await?;
    tx.commit().await?;
    let mut sent = Vec::with_capacity(rows.len());
    for row in &rows {
        let id: i64 = row.get("id");
        send(id, row.get("payload"))?;
        sent.push(id);
    }
    let tx = client.transaction().await?;
    let complete: &[(&(dyn ToSql + Sync), Type)] = &[
        (&token, Type::INT8),
        (role, role_type),
        (term, term_type),
        (&sent, Type::INT8_ARRAY),
    ];
    let done = tx.execute_typed(&complete_sql(fence), complete).await?;
    tx.commit().await?;
    Ok(done)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL")?;
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let client = std::sync::Arc::new(tokio::sync::Mutex::new(client));
    let config = Config::default();
    let store = PgStore::connect(
        url.parse::<ticklease::tls::PgConnect>()?,
        PgStoreOptions::from_config(&config),
    )
    .await?;
    let outbox = Role::new("outbox")?;
    let manager = Manager::start(store, config, [outbox.clone()]).await?;
    let scheduler = Scheduler::new(manager).job(&outbox, Duration::from_secs(2), move |tick| {
        let client = client.clone();
        async move {
            let send = |id: i64, payload: &str| {
                println!("send {id}: {payload}");
                Ok::<_, std::io::Error>(())
            };
            let sent = dispatch(&mut *client.lock().await, tick.fence(), send).await?;
            println!("outbox: {sent} rows sent in term {}", tick.token());
            anyhow::Ok(())
        }
    })?;
    let shutdown = CancellationToken::new();
    ticklease::cancel_on_signals(shutdown.clone())?;
    let stopped = scheduler.run(shutdown).await;
    anyhow::ensure!(stopped.all_released(), "{stopped}");
    Ok(())
}

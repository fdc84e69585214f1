//! A demo workload: subscriptions due now, emails, events, and webhook endpoints.

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::WorkerError;

/// How much to insert.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seed {
    pub subscriptions: i64,
    pub emails: i64,
    pub events: i64,
    /// Webhook endpoint URLs (existing ones are kept).
    pub endpoints: Vec<String>,
}

/// Inserts the workload in one transaction, each statement and lock wait
/// bounded as a migration's ([`ticklease::migrate::bounded_transaction`]).
pub async fn seed(client: &mut Client, s: &Seed) -> Result<(), WorkerError> {
    let db = |what| move |source| WorkerError::Db { what, source };
    let tx = client.transaction().await.map_err(db("begin"))?;
    tx.batch_execute(&ticklease::migrate::bounded_transaction())
        .await
        .map_err(db("bound the transaction"))?;
    tx.execute_typed(
        "INSERT INTO subscriptions (period_start, next_billing_at, amount_cents, customer_email)
         SELECT now() - interval '1 hour', now(), 1000 + g, 'customer' || g || '@example.test'
           FROM generate_series(1, $1) g",
        &[(&s.subscriptions, Type::INT8)],
    )
    .await
    .map_err(db("seed subscriptions"))?;
    tx.execute_typed(
        "INSERT INTO email_outbox (to_addr, subject, body)
         SELECT 'user' || g || '@example.test', 'Welcome ' || g, 'Hello number ' || g FROM generate_series(1, $1) g",
        &[(&s.emails, Type::INT8)],
    )
    .await
    .map_err(db("seed emails"))?;
    tx.execute_typed(
        "INSERT INTO webhook_events (kind, payload)
         SELECT 'demo.event', json_build_object('type', 'demo.event', 'n', g)::text FROM generate_series(1, $1) g",
        &[(&s.events, Type::INT8)],
    )
    .await
    .map_err(db("seed events"))?;
    tx.execute_typed(
        "INSERT INTO webhook_endpoints (url) SELECT unnest($1::text[]) ON CONFLICT (url) DO NOTHING",
        &[(&s.endpoints, Type::TEXT_ARRAY)],
    )
    .await
    .map_err(db("seed endpoints"))?;
    tx.commit().await.map_err(db("commit"))?;
    Ok(())
}

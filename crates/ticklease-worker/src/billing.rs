//! billing: bills each due subscription once per period, on a cron
//! schedule whose occurrence is the instant it bills as of.
//!
//! The period writer is one UPDATE that proves the (status, period start,
//! watermark) snapshot the tick read, as the first statement of the
//! transaction that inserts the invoice, opens its dunning run, and enqueues
//! `invoice.finalized` and the customer's email. A stale snapshot writes
//! nothing: [`PeriodClose::WatermarkMoved`].

use std::time::{Duration, SystemTime};

use std::sync::Arc;

use ticklease::error::chain;
use ticklease::{Fence, Steps, Tick};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::funnel::BILLING;
use crate::worker::Ctx;
use crate::WorkerError;

/// A subscription as the funnel read it.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscription {
    pub id: i64,
    pub status: String,
    pub period_start: SystemTime,
    pub next_billing_at: SystemTime,
    pub period: Duration,
    pub amount_cents: i64,
    pub customer_email: String,
}

/// Subscriptions due as of `as_of` (`None`: the database's now), at most
/// `limit`, claimed under `fence`.
pub async fn due(
    client: &Client,
    fence: &Fence,
    limit: i64,
    as_of: Option<SystemTime>,
) -> Result<Vec<Subscription>, WorkerError> {
    let rows = BILLING
        .claim(
            client,
            fence,
            &[(&limit, Type::INT8), (&as_of, Type::TIMESTAMPTZ)],
        )
        .await
        .map_err(WorkerError::db("billing claim"))?;
    Ok(rows
        .iter()
        .map(|r| Subscription {
            id: r.get("id"),
            status: r.get("status"),
            period_start: r.get("period_start"),
            next_billing_at: r.get("next_billing_at"),
            period: Duration::from_secs_f64(r.get::<_, f64>("period_seconds")),
            amount_cents: r.get("amount_cents"),
            customer_email: r.get("customer_email"),
        })
        .collect())
}

/// What closing a period did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeriodClose {
    /// The invoice for the period starting at the old watermark now exists.
    Invoiced { invoice_id: i64 },
    /// The subscription no longer matches the snapshot read: nothing written.
    WatermarkMoved,
}

const CLOSE_PERIOD: &str = "UPDATE subscriptions
    SET period_start = next_billing_at, next_billing_at = next_billing_at + period
  WHERE id = $1 AND status = $2 AND period_start = $3 AND next_billing_at = $4
  RETURNING period_start";

const INSERT_INVOICE: &str = "INSERT INTO invoices (subscription_id, period_start, amount_cents)
  VALUES ($1, $2, $3) RETURNING id";

const OPEN_DUNNING: &str = "INSERT INTO dunning_runs (invoice_id) VALUES ($1)";

const ENQUEUE_EVENT: &str = "INSERT INTO webhook_events (kind, payload) VALUES ('invoice.finalized', $1)";

const ENQUEUE_EMAIL: &str = "INSERT INTO email_outbox (to_addr, subject, body) VALUES ($1, $2, $3)";

/// Closes the subscription's current period from the snapshot `sub`.
pub async fn close_period(client: &mut Client, sub: &Subscription) -> Result<PeriodClose, WorkerError> {
    let db = WorkerError::db;
    let tx = client.transaction().await.map_err(db("begin"))?;
    let closed = tx
        .query_typed(
            CLOSE_PERIOD,
            &[
                (&sub.id, Type::INT8),
                (&sub.status, Type::TEXT),
                (&sub.period_start, Type::TIMESTAMPTZ),
                (&sub.next_billing_at, Type::TIMESTAMPTZ),
            ],
        )
        .await
        .map_err(db("close period"))?;
    let Some(row) = closed.first() else {
        tx.rollback().await.map_err(db("rollback"))?;
        return Ok(PeriodClose::WatermarkMoved);
    };
    let period_start: SystemTime = row.get(0);
    let invoice_id: i64 = tx
        .query_typed(
            INSERT_INVOICE,
            &[
                (&sub.id, Type::INT8),
                (&period_start, Type::TIMESTAMPTZ),
                (&sub.amount_cents, Type::INT8),
            ],
        )
        .await
        .map_err(db("insert invoice"))?[0]
        .get(0);
    tx.execute_typed(OPEN_DUNNING, &[(&invoice_id, Type::INT8)])
        .await
        .map_err(db("open dunning run"))?;
    let payload = serde_json::json!({
        "type": "invoice.finalized",
        "invoice_id": invoice_id,
        "subscription_id": sub.id,
        "amount_cents": sub.amount_cents,
    })
    .to_string();
    tx.execute_typed(ENQUEUE_EVENT, &[(&payload, Type::TEXT)])
        .await
        .map_err(db("enqueue event"))?;
    let subject = format!("Invoice {invoice_id}");
    let body = format!(
        "Your invoice {invoice_id} for {} cents is ready.",
        sub.amount_cents
    );
    tx.execute_typed(
        ENQUEUE_EMAIL,
        &[
            (&sub.customer_email, Type::TEXT),
            (&subject, Type::TEXT),
            (&body, Type::TEXT),
        ],
    )
    .await
    .map_err(db("enqueue email"))?;
    tx.commit().await.map_err(db("commit"))?;
    Ok(PeriodClose::Invoiced { invoice_id })
}

/// One billing tick: closes the period of each subscription due as of the
/// tick's occurrence, the period key: every attempt of an occurrence bills
/// the same periods, and one that starts late does not bill periods due
/// after its instant (the next occurrence does). A run-now or an interval
/// tick bills what is due now.
pub(crate) async fn tick(ctx: &Arc<Ctx>, tick: &Tick, steps: &mut Steps) -> Result<(), WorkerError> {
    let as_of = tick.occurrence();
    let subs = due(&**ctx.pool.get().await?, tick.fence(), ctx.cfg.batch_size, as_of).await?;
    steps
        .each("bill", subs, |sub| {
            let ctx = ctx.clone();
            async move {
                let result = async {
                    let mut conn = ctx.pool.get().await?;
                    close_period(&mut conn, &sub).await
                };
                match result.await {
                    Ok(PeriodClose::Invoiced { invoice_id }) => {
                        tracing::info!(sub = sub.id, invoice_id, "invoiced")
                    }
                    Ok(PeriodClose::WatermarkMoved) => {
                        tracing::info!(sub = sub.id, "watermark moved; nothing written")
                    }
                    Err(e) => tracing::warn!(sub = sub.id, error = %chain(&e), "billing failed"),
                }
            }
        })
        .await;
    Ok(())
}

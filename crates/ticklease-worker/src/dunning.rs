//! dunning: charges each due run's invoice through the payment provider.
//!
//! An attempt is recorded before its charge, by a compare-and-set that proves
//! the attempt count it read and stores the attempt's idempotency key (derived
//! from run and attempt number) as the run's in-flight key. Only a definitive
//! answer settles it, by a compare-and-set on that key: paid, or declined
//! (which clears the key, so the next attempt gets a new one). Anything else
//! (a transport error, an unexpected status, a panic, a tick dropped on lease
//! loss or shutdown, a killed process) leaves the attempt in flight: the
//! provider may have charged, so the next tick asks again under the same key,
//! which is one charge at the provider, and spends no attempt.

use std::time::Duration;

use std::sync::Arc;

use ticklease::error::chain;
use ticklease::{Fence, Steps, Tick};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::funnel::DUNNING;
use crate::worker::Ctx;
use crate::WorkerError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub id: i64,
    pub invoice_id: i64,
    pub attempt_count: i32,
    pub max_attempts: i32,
    pub amount_cents: i64,
    /// The key of the attempt in flight, whose outcome is unknown.
    pub inflight_key: Option<String>,
}

pub async fn due(client: &Client, fence: &Fence, limit: i64) -> Result<Vec<Run>, WorkerError> {
    let rows = DUNNING
        .claim(client, fence, &[(&limit, Type::INT8)])
        .await
        .map_err(WorkerError::db("dunning claim"))?;
    Ok(rows
        .iter()
        .map(|r| Run {
            id: r.get("id"),
            invoice_id: r.get("invoice_id"),
            attempt_count: r.get("attempt_count"),
            max_attempts: r.get("max_attempts"),
            amount_cents: r.get("amount_cents"),
            inflight_key: r.get("inflight_key"),
        })
        .collect())
}

/// The idempotency key of one attempt of one run.
pub fn idempotency_key(run_id: i64, attempt: i32) -> String {
    format!("dunning-{run_id}-{attempt}")
}

/// What the provider answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    Succeeded,
    Declined,
}

/// What one attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    Paid,
    Declined {
        exhausted: bool,
    },
    /// No definitive answer: the attempt stays in flight, and the next tick
    /// charges again under the same key.
    Unknown,
    /// The run moved since it was listed (another tick recorded or settled the attempt): nothing written.
    Stale,
}

const RECORD: &str = "UPDATE dunning_runs
    SET attempt_count = attempt_count + 1, inflight_key = $3, inflight_started_at = now()
  WHERE id = $1 AND attempt_count = $2 AND state = 'active' AND inflight_key IS NULL";
const PAID: &str = "UPDATE dunning_runs
    SET state = 'paid', last_outcome = 'succeeded', inflight_key = NULL, inflight_started_at = NULL
  WHERE id = $1 AND inflight_key = $2 AND state = 'active'";
const DECLINED: &str = "UPDATE dunning_runs
    SET state = CASE WHEN attempt_count >= max_attempts THEN 'exhausted' ELSE 'active' END,
        next_attempt_at = now() + $3 * interval '1 second', last_outcome = 'declined',
        inflight_key = NULL, inflight_started_at = NULL
  WHERE id = $1 AND inflight_key = $2 AND state = 'active'
  RETURNING state";

/// The key to charge `run` under: its in-flight key, or a new attempt's,
/// recorded by CAS on the count read (`None` if the run moved).
async fn key_for(client: &Client, run: &Run) -> Result<Option<String>, WorkerError> {
    if let Some(key) = &run.inflight_key {
        return Ok(Some(key.clone()));
    }
    let key = idempotency_key(run.id, run.attempt_count + 1);
    let n = client
        .execute_typed(
            RECORD,
            &[
                (&run.id, Type::INT8),
                (&run.attempt_count, Type::INT4),
                (&key, Type::TEXT),
            ],
        )
        .await
        .map_err(WorkerError::db("record attempt"))?;
    Ok((n == 1).then_some(key))
}

/// One attempt: record it (or take up the one in flight), charge under its
/// idempotency key, settle a definitive answer by CAS on that key. `charge`
/// is the provider call; if it fails or panics the attempt stays in flight.
pub async fn attempt<F, Fut>(
    client: &Client,
    run: &Run,
    decline_backoff: Duration,
    charge: F,
) -> Result<Attempt, WorkerError>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<Charge, WorkerError>>,
{
    let Some(key) = key_for(client, run).await? else {
        return Ok(Attempt::Stale);
    };
    let db = WorkerError::db;
    match charge(key.clone()).await {
        Err(error) => {
            tracing::warn!(run = run.id, key, error = %error, "charge outcome unknown; the next tick retries under the same key");
            Ok(Attempt::Unknown)
        }
        Ok(Charge::Succeeded) => {
            let n = client
                .execute_typed(PAID, &[(&run.id, Type::INT8), (&key, Type::TEXT)])
                .await
                .map_err(db("settle paid"))?;
            Ok(if n == 1 { Attempt::Paid } else { Attempt::Stale })
        }
        Ok(Charge::Declined) => {
            let backoff = decline_backoff.as_secs_f64();
            let rows = client
                .query_typed(
                    DECLINED,
                    &[
                        (&run.id, Type::INT8),
                        (&key, Type::TEXT),
                        (&backoff, Type::FLOAT8),
                    ],
                )
                .await
                .map_err(db("settle declined"))?;
            Ok(match rows.first() {
                Some(r) => Attempt::Declined {
                    exhausted: r.get::<_, String>(0) == "exhausted",
                },
                None => Attempt::Stale,
            })
        }
    }
}

/// One dunning tick: an attempt for each due run.
pub(crate) async fn tick(ctx: &Arc<Ctx>, tick: &Tick, steps: &mut Steps) -> Result<(), WorkerError> {
    let runs = due(&**ctx.pool.get().await?, tick.fence(), ctx.cfg.batch_size).await?;
    steps
        .each("charge", runs, |run| {
            let ctx = ctx.clone();
            async move {
                let result = async {
                    let conn = ctx.pool.get().await?;
                    attempt(&conn, &run, ctx.cfg.decline_backoff, |key| {
                        charge(&ctx, run.invoice_id, run.amount_cents, key)
                    })
                    .await
                };
                match result.await {
                    Ok(outcome) => tracing::info!(run = run.id, ?outcome, "dunning attempt"),
                    Err(e) => tracing::warn!(run = run.id, error = %chain(&e), "dunning attempt failed"),
                }
            }
        })
        .await;
    Ok(())
}

async fn charge(ctx: &Ctx, invoice_id: i64, amount_cents: i64, key: String) -> Result<Charge, WorkerError> {
    let body = serde_json::json!({ "invoice_id": invoice_id, "amount_cents": amount_cents }).to_string();
    let response = ctx
        .http
        .post(format!("{}/charges", ctx.cfg.payments_url.trim_end_matches('/')))
        .header("content-type", "application/json")
        .header("idempotency-key", &key)
        .body(body)
        .send()
        .await
        .map_err(|source| WorkerError::Http {
            what: "charge",
            source,
        })?;
    match response.status().as_u16() {
        200 | 201 => Ok(Charge::Succeeded),
        402 => Ok(Charge::Declined),
        status => Err(WorkerError::Provider { status, key }),
    }
}

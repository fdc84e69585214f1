//! dunning: charges each due run's invoice through the payment provider.
//!
//! Every transition is a compare-and-set that proves the attempt count it
//! read (`AND attempt_count = $expected`): recording an attempt, settling it,
//! and rewinding it. The idempotency key derives from (run, attempt number),
//! so a retried request is one charge at the provider. Only the provider's own
//! decline counts as a decline; a transport error or a panic rewinds the
//! attempt, so the run is as it was listed.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use ticklease::Fence;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::funnel::DUNNING;
use crate::WorkerError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub id: i64,
    pub invoice_id: i64,
    pub attempt_count: i32,
    pub max_attempts: i32,
    pub amount_cents: i64,
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
    /// Transport failure: the attempt was rewound and the run is due again.
    Rewound,
    /// The run moved since it was listed (another tick recorded the attempt): nothing done.
    Stale,
}

const RECORD: &str = "UPDATE dunning_runs SET attempt_count = attempt_count + 1
  WHERE id = $1 AND attempt_count = $2 AND state = 'active'";
const PAID: &str = "UPDATE dunning_runs SET state = 'paid', last_outcome = 'succeeded'
  WHERE id = $1 AND attempt_count = $2 AND state = 'active'";
const DECLINED: &str = "UPDATE dunning_runs
    SET state = CASE WHEN attempt_count >= max_attempts THEN 'exhausted' ELSE 'active' END,
        next_attempt_at = now() + $3 * interval '1 second', last_outcome = 'declined'
  WHERE id = $1 AND attempt_count = $2 AND state = 'active'
  RETURNING state";
const REWIND: &str = "UPDATE dunning_runs SET attempt_count = attempt_count - 1
  WHERE id = $1 AND attempt_count = $2 AND state = 'active'";

/// Records the next attempt of `run` (CAS on the count read); `false` if it moved.
pub async fn record_attempt(client: &Client, run: &Run) -> Result<bool, WorkerError> {
    let n = client
        .execute_typed(RECORD, &[(&run.id, Type::INT8), (&run.attempt_count, Type::INT4)])
        .await
        .map_err(WorkerError::db("record attempt"))?;
    Ok(n == 1)
}

/// Rewinds attempt `attempt` of run `id`; `false` if the run moved on.
pub async fn rewind(client: &Client, id: i64, attempt: i32) -> Result<bool, WorkerError> {
    let n = client
        .execute_typed(REWIND, &[(&id, Type::INT8), (&attempt, Type::INT4)])
        .await
        .map_err(WorkerError::db("rewind attempt"))?;
    Ok(n == 1)
}

/// One attempt: record it, charge with its idempotency key, settle by CAS.
/// `charge` is the provider call; a panic in it rewinds the attempt and then
/// continues unwinding.
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
    if !record_attempt(client, run).await? {
        return Ok(Attempt::Stale);
    }
    let attempt = run.attempt_count + 1;
    let charged = AssertUnwindSafe(charge(idempotency_key(run.id, attempt)))
        .catch_unwind()
        .await;
    let db = WorkerError::db;
    match charged {
        Err(panic) => {
            rewind(client, run.id, attempt).await?;
            std::panic::resume_unwind(panic)
        }
        Ok(Err(error)) => {
            tracing::warn!(run = run.id, attempt, error = %error, "charge failed in transport; rewinding the attempt");
            rewind(client, run.id, attempt).await?;
            Ok(Attempt::Rewound)
        }
        Ok(Ok(Charge::Succeeded)) => {
            let n = client
                .execute_typed(PAID, &[(&run.id, Type::INT8), (&attempt, Type::INT4)])
                .await
                .map_err(db("settle paid"))?;
            Ok(if n == 1 { Attempt::Paid } else { Attempt::Stale })
        }
        Ok(Ok(Charge::Declined)) => {
            let backoff = decline_backoff.as_secs_f64();
            let rows = client
                .query_typed(
                    DECLINED,
                    &[
                        (&run.id, Type::INT8),
                        (&attempt, Type::INT4),
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

//! webhook_delivery: POSTs each pending delivery with Standard Webhooks
//! headers, retries with capped exponential backoff and jitter, and completes
//! through a compare-and-set on (id, attempt), so a stale mark is refused.

use std::time::{Duration, SystemTime};

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::sync::Arc;

use ticklease::error::chain;
use ticklease::{Fence, Steps, Tick};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::funnel::WEBHOOK_DELIVERY;
use crate::worker::{Ctx, DELIVERY_ATTEMPTS_MAX, RETRY_BASE, RETRY_CAP};
use crate::{Mark, WorkerError};

#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub id: i64,
    pub attempt: i32,
    pub url: String,
    pub event_id: i64,
    pub kind: String,
    pub payload: String,
    pub created_at: SystemTime,
}

pub async fn pending(client: &Client, fence: &Fence, limit: i64) -> Result<Vec<Delivery>, WorkerError> {
    let rows = WEBHOOK_DELIVERY
        .claim(client, fence, &[(&limit, Type::INT8)])
        .await
        .map_err(WorkerError::db("delivery claim"))?;
    Ok(rows
        .iter()
        .map(|r| Delivery {
            id: r.get("id"),
            attempt: r.get("attempt"),
            url: r.get("url"),
            event_id: r.get("event_id"),
            kind: r.get("kind"),
            payload: r.get("payload"),
            created_at: r.get("created_at"),
        })
        .collect())
}

/// The `webhook-id` of an event: the same for every endpoint and every retry,
/// so a receiver can drop duplicates.
pub fn webhook_id(event_id: i64) -> String {
    format!("evt_{event_id}")
}

/// The Standard Webhooks signature: `v1,` + base64(HMAC-SHA256(secret, "id.timestamp.body")).
/// A `whsec_`-prefixed secret is base64; any other is used as bytes.
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &str) -> String {
    let engine = base64::engine::general_purpose::STANDARD;
    let key = match secret.strip_prefix("whsec_").map(|s| engine.decode(s)) {
        Some(Ok(key)) => key,
        _ => secret.as_bytes().to_vec(),
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes any key length");
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    format!("v1,{}", engine.encode(mac.finalize().into_bytes()))
}

/// Delay before retry `attempt` (1-based): base × 2^(attempt−1), capped, times
/// a jitter factor in [0.5, 1).
pub fn backoff(attempt: i32, base: Duration, cap: Duration) -> Duration {
    let exp = base
        .saturating_mul(1u32 << attempt.clamp(1, 20).saturating_sub(1) as u32)
        .min(cap);
    exp.mul_f64(rand::random::<f64>() * 0.5 + 0.5)
}

/// POSTs one delivery; `Ok(true)` on a 2xx answer.
pub async fn post(http: &reqwest::Client, secret: &str, d: &Delivery) -> Result<bool, WorkerError> {
    let id = webhook_id(d.event_id);
    let timestamp = d
        .created_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|t| t.as_secs() as i64)
        .unwrap_or(0);
    let response = http
        .post(&d.url)
        .header("content-type", "application/json")
        .header("webhook-id", &id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", sign(secret, &id, timestamp, &d.payload))
        .body(d.payload.clone())
        .send()
        .await
        .map_err(|source| WorkerError::Http {
            what: "webhook POST",
            source,
        })?;
    Ok(response.status().is_success())
}

const DELIVERED: &str = "UPDATE webhook_deliveries SET status = 'delivered', delivered_at = now()
  WHERE id = $1 AND attempt = $2 AND status = 'pending'";
const RETRY: &str = "UPDATE webhook_deliveries
    SET attempt = attempt + 1, next_attempt_at = now() + $3 * interval '1 second',
        status = CASE WHEN attempt + 1 >= $4 THEN 'failed' ELSE 'pending' END
  WHERE id = $1 AND attempt = $2 AND status = 'pending'";

/// Marks delivery `id` delivered if it is still at `attempt`.
pub async fn mark_delivered(client: &Client, id: i64, attempt: i32) -> Result<Mark, WorkerError> {
    Mark::cas(
        client,
        "mark delivered",
        DELIVERED,
        &[(&id, Type::INT8), (&attempt, Type::INT4)],
    )
    .await
}

/// Schedules the next attempt after `delay`; `max_attempts` reached marks it failed.
pub async fn mark_retry(
    client: &Client,
    id: i64,
    attempt: i32,
    delay: Duration,
    max_attempts: i32,
) -> Result<Mark, WorkerError> {
    let secs = delay.as_secs_f64();
    Mark::cas(
        client,
        "schedule retry",
        RETRY,
        &[
            (&id, Type::INT8),
            (&attempt, Type::INT4),
            (&secs, Type::FLOAT8),
            (&max_attempts, Type::INT4),
        ],
    )
    .await
}

/// One webhook-delivery tick: POSTs each pending delivery.
pub(crate) async fn tick(ctx: &Arc<Ctx>, tick: &Tick, steps: &mut Steps) -> Result<(), WorkerError> {
    let pending = pending(&**ctx.pool.get().await?, tick.fence(), ctx.cfg.batch_size).await?;
    steps
        .each("deliver", pending, |d| {
            let ctx = ctx.clone();
            async move {
                if let Err(e) = deliver(&ctx, &d).await {
                    tracing::warn!(delivery = d.id, error = %chain(&e), "delivery bookkeeping failed");
                }
            }
        })
        .await;
    Ok(())
}

async fn deliver(ctx: &Ctx, d: &Delivery) -> Result<(), WorkerError> {
    let delivered = match post(&ctx.http, &ctx.cfg.webhook_secret, d).await {
        Ok(ok) => ok,
        Err(e) => {
            tracing::warn!(delivery = d.id, error = %chain(&e), "webhook POST failed");
            false
        }
    };
    let conn = ctx.pool.get().await?;
    let mark = if delivered {
        mark_delivered(&conn, d.id, d.attempt).await?
    } else {
        let delay = backoff(d.attempt + 1, RETRY_BASE, RETRY_CAP);
        mark_retry(&conn, d.id, d.attempt, delay, DELIVERY_ATTEMPTS_MAX).await?
    };
    if mark == Mark::Stale {
        tracing::info!(
            delivery = d.id,
            attempt = d.attempt,
            "StaleDeliveryMark: the delivery moved on; nothing written"
        );
    }
    Ok(())
}

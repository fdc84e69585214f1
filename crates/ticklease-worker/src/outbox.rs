//! webhook_outbox: fans each claimed event out to every endpoint and marks it
//! dispatched, in the claim's own transaction (the fence's share lock on the
//! lease row is held until that commit).

use ticklease::{Fence, Tick};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::funnel::WEBHOOK_OUTBOX;
use crate::worker::Ctx;
use crate::WorkerError;

const FAN_OUT: &str = "INSERT INTO webhook_deliveries (event_id, endpoint_id)
  SELECT e, ep.id FROM unnest($1::int8[]) AS e CROSS JOIN webhook_endpoints AS ep
  ON CONFLICT (event_id, endpoint_id) DO NOTHING";
const MARK_DISPATCHED: &str = "UPDATE webhook_events SET dispatched_at = now() WHERE id = ANY($1::int8[])";

/// Dispatches up to `limit` events; returns how many.
pub async fn dispatch(client: &mut Client, fence: &Fence, limit: i64) -> Result<usize, WorkerError> {
    let db = WorkerError::db;
    let tx = client.transaction().await.map_err(db("begin"))?;
    let ids: Vec<i64> = WEBHOOK_OUTBOX
        .claim(&tx, fence, &[(&limit, Type::INT8)])
        .await
        .map_err(db("outbox claim"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if !ids.is_empty() {
        tx.execute_typed(FAN_OUT, &[(&ids, Type::INT8_ARRAY)])
            .await
            .map_err(db("fan out"))?;
        tx.execute_typed(MARK_DISPATCHED, &[(&ids, Type::INT8_ARRAY)])
            .await
            .map_err(db("mark dispatched"))?;
    }
    tx.commit().await.map_err(db("commit"))?;
    Ok(ids.len())
}

/// One webhook-outbox tick: fans a batch of events out to every endpoint.
pub(crate) async fn tick(ctx: &Ctx, tick: &Tick) -> Result<(), WorkerError> {
    let mut conn = ctx.pool.get().await?;
    let n = dispatch(&mut conn, tick.fence(), ctx.cfg.batch_size).await?;
    tracing::debug!(events = n, "dispatched");
    Ok(())
}

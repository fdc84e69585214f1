//! What the fence's test files share: the claim table, ACQUIRE, one fenced
//! claim, and the wait for a lease to run out.

use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

/// The claim table `jobs` (ids 1 to 10, none claimed) and the role `billing`.
pub async fn claim_table(owner: &Client) {
    owner
        .batch_execute(
            "CREATE TABLE jobs (id int PRIMARY KEY, claimed_by bigint);
             INSERT INTO jobs SELECT g, NULL FROM generate_series(1, 10) g;
             SELECT leader_seed(ARRAY['billing'])",
        )
        .await
        .unwrap();
}

/// ACQUIRE by `holder` with a lease of `ttl_ms`: the token, or why not.
pub async fn acquire(c: &Client, role: &str, holder: &str, ttl_ms: i64) -> Result<i64, String> {
    let row = c
        .query_typed(
            "SELECT holder_token, acquired, reason FROM leader_acquire_v2($1, $2, $3, 1, NULL, false)",
            &[(&role, Type::TEXT), (&holder, Type::TEXT), (&ttl_ms, Type::INT8)],
        )
        .await
        .map_err(|e| format!("{e:?}"))?;
    let row = &row[0];
    if row.get::<_, bool>(1) {
        Ok(row.get(0))
    } else {
        Err(row.get::<_, Option<String>>(2).unwrap_or_default())
    }
}

/// One fenced claim of job `id` in the caller's transaction, as one unnamed
/// statement: whether it claimed.
pub async fn claim(c: &Client, role: &str, token: i64, id: i32) -> Result<bool, tokio_postgres::Error> {
    let rows = c
        .query_typed(
            "UPDATE jobs SET claimed_by = $2 WHERE id = $3 AND claimed_by IS NULL
                 AND (SELECT leader_fence_v2($1, $2)) RETURNING id",
            &[(&role, Type::TEXT), (&token, Type::INT8), (&id, Type::INT4)],
        )
        .await?;
    Ok(rows.len() == 1)
}

/// Until the role's lease has run out on the database clock.
pub async fn wait_expired(owner: &Client, role: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let over: bool = owner
            .query_one(
                "SELECT expires_at <= clock_timestamp() FROM leader_leases WHERE role = $1",
                &[&role],
            )
            .await
            .unwrap()
            .get(0);
        if over {
            return;
        }
        assert!(Instant::now() < until, "the lease of {role} never ran out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

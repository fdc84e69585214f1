//! The checker over the claim journal: per role, no claim under a superseded
//! token after the first claim of a newer token.
//!
//! Each journal row is written by the claim statement itself, at its
//! statement clock, while the fence holds its share lock on the lease row; a
//! newer term can only start after that claim commits. So for tokens
//! `old < new` of one role, every `old` row must precede the first `new` row.

use std::time::SystemTime;

use tokio_postgres::Client;

use crate::WorkerError;

/// A stale claim that landed after a newer term's first claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub role: String,
    pub stale_token: i64,
    pub stale_at: SystemTime,
    pub newer_token: i64,
    pub newer_first_at: SystemTime,
}

const VIOLATIONS: &str = "
WITH firsts AS (SELECT role, token, min(at) AS first_at FROM worker_journal GROUP BY role, token)
SELECT j.role, j.token, j.at, f.token, f.first_at
  FROM worker_journal j
  JOIN firsts f ON f.role = j.role AND f.token > j.token AND j.at > f.first_at
 ORDER BY j.role, j.at
 LIMIT 100";

pub async fn violations(client: &Client) -> Result<Vec<Violation>, WorkerError> {
    let rows = client
        .query_typed(VIOLATIONS, &[])
        .await
        .map_err(WorkerError::db("journal check"))?;
    Ok(rows
        .iter()
        .map(|r| Violation {
            role: r.get(0),
            stale_token: r.get(1),
            stale_at: r.get(2),
            newer_token: r.get(3),
            newer_first_at: r.get(4),
        })
        .collect())
}

/// Journal rows and distinct terms per role, for reports.
pub async fn terms_per_role(client: &Client) -> Result<Vec<(String, i64, i64)>, WorkerError> {
    let rows = client
        .query_typed(
            "SELECT role, count(*), count(DISTINCT token) FROM worker_journal GROUP BY role ORDER BY role",
            &[],
        )
        .await
        .map_err(WorkerError::db("journal summary"))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
}

//! The checks made from the database after each fault and after a run:
//! terms never overlap, no claim committed twice, outside its term or while
//! paused, a completed term made all of its claims, no tick missed between
//! faults.

use std::time::{Duration, SystemTime};

use tokio_postgres::Client;

use super::db::ms_between;

// Order is read from commit timestamps (`track_commit_timestamp`), not from
// `now()`: a statement that ends a term (RELEASE, a takeover, a pause) may
// start before a claim's commit and wait for its row lock, so only commit
// order says which came first. Every claim is a transaction of its own, and
// the history row of a term is written by the transaction that ended it.
const TERMS: &str = "
WITH ended AS (
    SELECT token, pg_xact_commit_timestamp(xmin) AS ended FROM leader_history WHERE role = $1 AND kind = 'term'
), live AS (
    SELECT holder_token AS token FROM leader_leases WHERE role = $1 AND holder_id IS NOT NULL
), claimed AS (
    SELECT token, min(pg_xact_commit_timestamp(xmin)) AS first, max(pg_xact_commit_timestamp(xmin)) AS last,
           string_agg(DISTINCT replica, ',') AS replicas
      FROM blackbox_claims WHERE role = $1 GROUP BY token
)";

/// A claim committed after its term ended, or of no term of the role.
const OUTSIDE: &str = "
SELECT format('term %s (%s) committed a claim at %s, after it ended at %s', c.token, c.replicas, c.last, e.ended)
  FROM claimed AS c JOIN ended AS e USING (token) WHERE c.last > e.ended
UNION ALL
SELECT format('claims of token %s (%s): no such term', c.token, c.replicas)
  FROM claimed AS c WHERE c.token NOT IN (SELECT token FROM ended UNION ALL SELECT token FROM live)";

/// Two terms at once: a term's first claim committed before the term
/// before it (by token) had ended.
const OVERLAPS: &str = "
SELECT format('term %s (%s) claimed at %s, before term %s ended at %s', c.token, c.replicas, c.first, p.token, p.ended)
  FROM claimed AS c
 CROSS JOIN LATERAL (SELECT e.token, e.ended FROM ended AS e WHERE e.token < c.token
                      ORDER BY e.token DESC LIMIT 1) AS p
 WHERE c.first < p.ended";

/// No claim committed twice: each `seq` once.
const TWICE: &str = "
SELECT format('seq %s committed %s times, by terms %s', seq, count(*), string_agg(token::text, ', '))
  FROM blackbox_claims WHERE role = $1 GROUP BY seq HAVING count(*) > 1";

/// Two processes working under one token: a term is one replica's (a
/// runner's child inherits its replica's name).
const SHARED: &str = "
SELECT format('term %s claimed by %s replicas: %s', token, count(DISTINCT replica), string_agg(DISTINCT replica, ', '))
  FROM blackbox_claims WHERE role = $1 GROUP BY token HAVING count(DISTINCT replica) > 1";

/// A claim committed while the role was paused (between a pause's commit and the next unpause's).
const PAUSED: &str = "
WITH windows AS (
    SELECT pg_xact_commit_timestamp(p.xmin) AS paused,
           (SELECT pg_xact_commit_timestamp(u.xmin) FROM leader_history AS u
             WHERE u.role = $1 AND u.kind = 'unpause' AND u.id > p.id ORDER BY u.id LIMIT 1) AS unpaused
      FROM leader_history AS p WHERE p.role = $1 AND p.kind = 'pause'
)
SELECT format('claim %s of term %s committed at %s, while paused from %s to %s', c.seq, c.token,
              pg_xact_commit_timestamp(c.xmin), w.paused, w.unpaused)
  FROM blackbox_claims AS c JOIN windows AS w
    ON pg_xact_commit_timestamp(c.xmin) > w.paused
   AND pg_xact_commit_timestamp(c.xmin) < coalesce(w.unpaused, 'infinity')
 WHERE c.role = $1";

/// The violations of the invariants for `role`.
pub async fn invariants(owner: &Client, role: &str) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let terms = |check: &str| format!("{TERMS} {check} LIMIT 20");
    for sql in [
        terms(OUTSIDE),
        terms(OVERLAPS),
        format!("{TWICE} LIMIT 20"),
        format!("{SHARED} LIMIT 20"),
        format!("{PAUSED} LIMIT 20"),
    ] {
        for row in owner.query(&sql, &[&role]).await? {
            out.push(format!("{role}: {}", row.get::<_, String>(0)));
        }
    }
    Ok(out)
}

/// A term RELEASEd `completed` made both of its claims (the work is claim,
/// wait, claim, then success): a term with fewer was lost or failed and
/// reported done, which would mark a tick or an occurrence run that was not.
const COMPLETED: &str = "
SELECT format('term %s (%s) was released completed with %s of its 2 claims', h.token,
              coalesce(string_agg(DISTINCT c.replica, ','), 'no replica'), count(c.token))
  FROM leader_history AS h LEFT JOIN blackbox_claims AS c ON c.role = h.role AND c.token = h.token
 WHERE h.role = $1 AND h.kind = 'term' AND h.outcome = 'completed'
 GROUP BY h.token HAVING count(c.token) <> 2";

/// The terms of `role` released `completed` without both claims.
pub async fn completed(owner: &Client, role: &str) -> anyhow::Result<Vec<String>> {
    let rows = owner.query(&format!("{COMPLETED} LIMIT 20"), &[&role]).await?;
    Ok(rows
        .iter()
        .map(|r| format!("{role}: {}", r.get::<_, String>(0)))
        .collect())
}

/// Every check of a role's record: [`invariants`] and [`completed`].
pub async fn all(owner: &Client, role: &str) -> anyhow::Result<Vec<String>> {
    let mut out = invariants(owner, role).await?;
    out.extend(completed(owner, role).await?);
    Ok(out)
}

/// Claims of `role` more than `longest` apart inside a steady window (no tick missed).
pub async fn gaps(
    owner: &Client,
    role: &str,
    windows: &[(SystemTime, SystemTime)],
    longest: Duration,
) -> anyhow::Result<Vec<(SystemTime, String)>> {
    let mut out = Vec::new();
    for &(from, to) in windows {
        let rows = owner
            .query(
                "SELECT at FROM blackbox_claims WHERE role = $1 AND at >= $2 AND at <= $3 ORDER BY at",
                &[&role, &from, &to],
            )
            .await?;
        let at: Vec<SystemTime> = rows.iter().map(|r| r.get(0)).collect();
        let mut edges = vec![from];
        edges.extend(at);
        edges.push(to);
        for pair in edges.windows(2) {
            let gap = ms_between(pair[1], pair[0]);
            if gap > longest.as_secs_f64() * 1000.0 {
                out.push((
                    from,
                    format!("{role}: no claim for {gap:.0} ms between faults (longest allowed {longest:?})"),
                ));
            }
        }
    }
    Ok(out)
}

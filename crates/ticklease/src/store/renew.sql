-- RENEW: $1 role, $2 token, $3 lease TTL (ms). Term-scoped: 0 rows renewed is
-- a definitive loss. The outer SELECT reads the row as it was before this
-- statement, to name the reason.
WITH renewed AS (
    UPDATE leader_leases
       SET expires_at = now() + $3::int8 * interval '1 millisecond'
     WHERE role = $1 AND holder_token = $2 AND holder_id IS NOT NULL
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM renewed) AS renewed,
       now() AS db_now,
       s.holder_token,
       s.holder_id,
       s.paused_at IS NOT NULL AS paused
  FROM (SELECT 1) AS one
  LEFT JOIN leader_leases AS s ON s.role = $1

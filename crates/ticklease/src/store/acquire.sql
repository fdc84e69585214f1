-- ACQUIRE: $1 role, $2 holder id, $3 lease TTL (ms), $4 tick interval (ms).
-- One autocommit statement on the database clock. Racing replicas serialize on
-- the row lock; the loser's WHERE re-evaluates against the winner's row.
-- `role = EXCLUDED.role` writes the key column on purpose: it makes a takeover
-- wait for in-flight fenced claims (see leader_fence_lock).
-- The outer SELECT reads the row as it was before this statement, to say why
-- nothing was acquired.
WITH acquired AS (
    INSERT INTO leader_leases AS l (role, holder_token, holder_id, acquired_at, expires_at)
    VALUES ($1, leader_token_seed(), $2, now(), now() + $3::int8 * interval '1 millisecond')
    ON CONFLICT (role) DO UPDATE
       SET role = EXCLUDED.role,
           holder_token = l.holder_token + 1,
           holder_id = EXCLUDED.holder_id,
           acquired_at = EXCLUDED.acquired_at,
           expires_at = EXCLUDED.expires_at
     WHERE l.paused_at IS NULL
       AND NOT leader_lease_live(l.holder_id, l.expires_at, now())
       AND (l.last_tick_ended_at IS NULL
            OR l.last_tick_ended_at <= now() - $4::int8 * interval '1 millisecond')
       AND (l.not_before IS NULL OR l.not_before <= now())
    RETURNING l.holder_token
)
SELECT a.holder_token,
       now() AS db_now,
       s.holder_id,
       s.expires_at,
       leader_lease_live(s.holder_id, s.expires_at, now()) AS held,
       s.paused_by,
       s.pause_reason,
       greatest(s.last_tick_ended_at + $4::int8 * interval '1 millisecond', s.not_before) AS due_at
  FROM (SELECT 1) AS one
  LEFT JOIN acquired AS a ON true
  LEFT JOIN leader_leases AS s ON s.role = $1

-- ACQUIRE: $1 role, $2 holder id, $3 lease TTL (ms), $4 tick interval (ms).
-- The statement is a SECURITY DEFINER function (migration 0002) so the
-- application role can recreate a missing row without holding INSERT.
SELECT holder_token, db_now, holder_id, expires_at, held, paused_by, pause_reason, due_at
  FROM leader_acquire($1, $2, $3, $4)

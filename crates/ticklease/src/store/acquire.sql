-- ACQUIRE: $1 role, $2 holder id, $3 lease TTL (ms), $4 tick interval (ms),
-- $5 the holder's coordination key (NULL without a coordination session).
-- A SECURITY DEFINER function (migrations 0002, 0004) so the application
-- role can recreate a missing row without holding INSERT.
-- Calls: leader_acquire(text, text, bigint, bigint, bigint)
SELECT holder_token, db_now, holder_id, expires_at, held, paused_by, pause_reason, due_at, holder_key
  FROM leader_acquire($1, $2, $3, $4, $5)

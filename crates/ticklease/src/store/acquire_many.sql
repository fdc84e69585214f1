-- ACQUIRE for many roles of one interval: $1 roles, $2 holder id, $3 lease
-- TTL (ms), $4 tick interval (ms), $5 the coordination key (or NULL), $6
-- the most terms to start (the caller's preferred roles first in $1). One
-- row per role; over_limit: acquirable but past the limit. A SECURITY
-- DEFINER function (migration 0006) over the one-row ACQUIRE.
-- Calls: leader_acquire_many(text[], text, bigint, bigint, bigint, integer)
SELECT role, holder_token, db_now, holder_id, expires_at, held, paused_by, pause_reason, due_at, holder_key,
       over_limit
  FROM leader_acquire_many($1, $2, $3, $4, $5, $6)

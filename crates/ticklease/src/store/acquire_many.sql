-- ACQUIRE for many roles of one interval: $1 roles, $2 holder id, $3 lease
-- TTL (ms), $4 tick interval (ms), $5 the coordination key (or NULL), $6
-- the most terms to start (the caller's preferred roles first in $1). One
-- row per role; over_limit: acquirable but past the limit. A SECURITY
-- DEFINER function (migration 0006) over the one-row ACQUIRE. `failures`
-- as in acquire.sql.
-- Calls: leader_acquire_many(text[], text, bigint, bigint, bigint, integer)
SELECT a.role, a.holder_token, a.db_now, a.holder_id, a.expires_at, a.held, a.paused_by, a.pause_reason,
       a.due_at, a.holder_key, a.over_limit, coalesce(l.failures, 0) AS failures
  FROM leader_acquire_many($1, $2, $3, $4, $5, $6) AS a
  LEFT JOIN leader_leases AS l ON l.role = a.role

-- ACQUIRE: $1 role, $2 holder id, $3 lease TTL (ms), $4 tick interval (ms),
-- $5 the holder's coordination key (NULL without a coordination session),
-- $6 whether the role is long-lived (its work runs for the whole term).
-- A SECURITY DEFINER function (migrations 0002, 0004) so the application
-- role can recreate a missing row without holding INSERT. `failures` (the
-- retry policy's count) is the row as this statement began: only a RELEASE
-- changes it, and one that commits during the statement is at most one
-- attempt behind.
-- Calls: leader_acquire_v2(text, text, bigint, bigint, bigint, boolean)
SELECT a.holder_token, a.db_now, a.holder_id, a.expires_at, a.held, a.paused_by, a.pause_reason, a.due_at,
       a.holder_key, coalesce(l.failures, 0) AS failures
  FROM leader_acquire_v2($1, $2, $3, $4, $5, $6) AS a
  LEFT JOIN leader_leases AS l ON l.role = $1

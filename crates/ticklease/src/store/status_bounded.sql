-- STATUS, bounded: at most $1 rows of the operator view, the ones an
-- operator looks for first (paused, then held, then the most recently
-- ticked, then by role), returned by role, each with the count of all rows.
-- Calls: nothing (reads the view leader_status)
SELECT *
  FROM (SELECT role, held, holder_id, holder_token, acquired_at, expires_at, db_now,
               extract(epoch FROM remaining)::float8 AS remaining_seconds,
               paused_at, paused_by, pause_reason, last_tick_ended_at, last_tick_holder, not_before, last_outcome,
               schedule, last_occurrence, next_occurrence, long_lived, tick_interval_ms,
               count(*) OVER () AS total
          FROM leader_status
         ORDER BY paused_at IS NULL, NOT held, last_tick_ended_at DESC NULLS LAST, role
         LIMIT $1::int8) AS first
 ORDER BY role

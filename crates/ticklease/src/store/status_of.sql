-- STATUS of named roles: $1 the roles. Reads their rows by the primary key
-- alone, so its work is the roles asked, whatever other rows exist.
-- Calls: nothing (reads the view leader_status)
SELECT role, held, holder_id, holder_token, acquired_at, expires_at, db_now,
       extract(epoch FROM remaining)::float8 AS remaining_seconds,
       paused_at, paused_by, pause_reason, last_tick_ended_at, last_tick_holder, not_before, last_outcome,
       schedule, last_occurrence, next_occurrence, long_lived, tick_interval_ms
  FROM leader_status
 WHERE role = ANY ($1::text[])
 ORDER BY role

-- The operator view, with intervals as seconds for the client.
-- Calls: nothing (reads the view leader_status)
SELECT role, held, holder_id, holder_token, acquired_at, expires_at, db_now,
       extract(epoch FROM remaining)::float8 AS remaining_seconds,
       paused_at, paused_by, pause_reason, last_tick_ended_at, last_tick_holder, not_before, last_outcome,
       schedule, last_occurrence, next_occurrence, long_lived, tick_interval_ms
  FROM leader_status
 ORDER BY role

-- RELEASE: $1 role, $2 token, $3 outcome, $4 tick interval (ms). Term-scoped:
-- 0 rows means the term was already over. Only a completed tick stamps
-- last_tick_*; a lost tick cools down min(interval, 60 s); a failed or
-- panicked tick waits one full interval; an interrupted tick is due at once.
UPDATE leader_leases
   SET holder_id = NULL,
       acquired_at = NULL,
       expires_at = NULL,
       last_tick_ended_at = CASE WHEN $3 = 'completed' THEN now() ELSE last_tick_ended_at END,
       last_tick_holder = CASE WHEN $3 = 'completed' THEN holder_id ELSE last_tick_holder END,
       not_before = CASE $3
           WHEN 'lost' THEN now() + least($4::int8 * interval '1 millisecond', interval '60 seconds')
           WHEN 'failed' THEN now() + $4::int8 * interval '1 millisecond'
           ELSE NULL
       END
 WHERE role = $1 AND holder_token = $2 AND holder_id IS NOT NULL
 RETURNING 1

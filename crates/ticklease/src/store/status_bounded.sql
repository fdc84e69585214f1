-- STATUS, bounded by its own work: at most $1 rows of the operator view (the
-- paused ones first, an operator's doing, then by role), returned by role,
-- each with the count of all rows up to $2. Any app login may create rows
-- (leader_seed), so nothing here reads or sorts every row: the paused rows
-- come from their partial index (migration 0012), the others from the
-- primary key, and the count stops at $2.
-- The operator role may read only the role column of leader_leases: the
-- paused rows come through the view (whose columns not asked for are never
-- computed), the others and the count from that column alone.
-- Calls: nothing (reads the view leader_status and leader_leases.role)
WITH chosen AS (
    SELECT c.role
      FROM ((SELECT v.role, 0 AS rank FROM leader_status AS v WHERE v.paused_at IS NOT NULL
              ORDER BY v.role LIMIT $1::int8)
            UNION ALL
            (SELECT l.role, 1 AS rank FROM leader_leases AS l ORDER BY l.role LIMIT $1::int8)) AS c
     GROUP BY c.role
     ORDER BY min(c.rank), c.role
     LIMIT $1::int8
),
counted AS (
    SELECT count(*) AS total FROM (SELECT l.role FROM leader_leases AS l LIMIT $2::int8) AS c
)
SELECT s.role, s.held, s.holder_id, s.holder_token, s.acquired_at, s.expires_at, s.db_now,
       extract(epoch FROM s.remaining)::float8 AS remaining_seconds,
       s.paused_at, s.paused_by, s.pause_reason, s.last_tick_ended_at, s.last_tick_holder, s.not_before,
       s.last_outcome, s.schedule, s.last_occurrence, s.next_occurrence, s.long_lived, s.tick_interval_ms,
       counted.total
  FROM leader_status AS s
 CROSS JOIN counted
 -- An array, so the view is read by the primary key for the chosen roles
 -- alone (joined, the planner may compute the view for every row).
 WHERE s.role = ANY (ARRAY(SELECT chosen.role FROM chosen))
 ORDER BY s.role

-- The leader_status view every reader (CLI, status page, metrics) shares.
-- A file of its own: replacing a view waits for every transaction that
-- holds any lock on it, and any login can take one (even without SELECT:
-- PREPARE locks it), so it is replaced only when this file changes; a
-- migration run that waits longer than its lock wait fails and names the
-- backends holding it.

-- One row per role: its term, whether it is live (the live keys read once
-- for all rows), its pause, its last tick and outcome, and for a cron
-- schedule: the schedule, the last completed occurrence and the next one
-- to run (the current term's while it is not completed, no term runs it
-- and a retry is due before the next one; else the one after the last term's).
CREATE OR REPLACE VIEW leader_status AS
WITH live AS (SELECT ARRAY(SELECT leader_live_keys()) AS keys)
SELECT l.role,
       leader_term_live_among(l.holder_id, l.expires_at, l.holder_key, statement_timestamp(), live.keys) AS held,
       l.holder_id,
       l.holder_token,
       l.acquired_at,
       l.expires_at,
       statement_timestamp() AS db_now,
       CASE WHEN leader_term_live_among(l.holder_id, l.expires_at, l.holder_key, statement_timestamp(), live.keys)
            THEN l.expires_at - statement_timestamp() END AS remaining,
       l.paused_at,
       l.paused_by,
       l.pause_reason,
       l.last_tick_ended_at,
       l.last_tick_holder,
       -- The cooldown, or the wait for a paused term's lease while it holds,
       -- whichever is later.
       CASE WHEN l.pause_wait_until > statement_timestamp() THEN greatest(l.not_before, l.pause_wait_until)
            ELSE l.not_before END AS not_before,
       -- Answered by the index (role, id) (generation 6). With `h.role = l.role`
       -- and ORDER BY id the planner may walk the whole history backwards from
       -- its newest row, betting on a match soon (600 ms over 171,000 rows of
       -- 38 roles); it drops an ORDER BY on a column it knows is constant. As a
       -- range the role is no constant, and only that index gives the order.
       (SELECT h.outcome FROM leader_history AS h
         WHERE h.role >= l.role AND h.role <= l.role AND h.kind = 'term'
         ORDER BY h.role DESC, h.id DESC LIMIT 1) AS last_outcome,
       l.schedule,
       l.last_occurrence,
       CASE WHEN l.occurrence > coalesce(l.last_occurrence, '-infinity')
                 AND NOT leader_term_live_among(l.holder_id, l.expires_at, l.holder_key, statement_timestamp(), live.keys)
                 -- Retries spent: the cooldown reaches the next occurrence.
                 AND (l.not_before IS NULL OR l.next_occurrence IS NULL
                      OR l.not_before < l.next_occurrence - interval '1 second')
            THEN l.occurrence
            ELSE l.next_occurrence END AS next_occurrence,
       -- Added last: a view's columns can only be added at its end.
       l.long_lived,
       l.tick_interval_ms
  FROM leader_leases AS l CROSS JOIN live;

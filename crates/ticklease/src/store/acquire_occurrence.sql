-- ACQUIRE of an occurrence: $1 role, $2 holder id, $3 lease TTL (ms), $4 the
-- occurrence (NULL: only ask where counting starts), $5 the occurrence after
-- it when the asked one must still be the latest (else NULL), $6 the
-- holder's coordination key, $7/$8 the skipped occurrences' reasons and
-- summaries (at most 3), $9 the schedule as text, $10 the occurrence after
-- the asked one. A SECURITY DEFINER function (definitions/40_terms.sql).
-- `started_occurrence` is the row as this statement began (the last
-- occurrence a term started for): the outer query's snapshot predates the
-- function's writes.
-- Calls: leader_acquire_occurrence_v2(text, text, bigint, timestamptz, timestamptz, bigint, text[], text[], text, timestamptz)
SELECT a.holder_token, a.db_now, a.holder_id, a.expires_at, a.held, a.paused_by, a.pause_reason, a.due_at,
       a.holder_key, a.after_occurrence, a.failures, a.manual_by, a.run_now_pending, a.last_paused_at,
       a.last_unpaused_at, l.occurrence AS started_occurrence
  FROM leader_acquire_occurrence_v2($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) AS a
  LEFT JOIN leader_leases AS l ON l.role = $1

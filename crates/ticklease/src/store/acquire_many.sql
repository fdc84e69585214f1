-- ACQUIRE for many roles of one family: $1 roles, $2 holder id, $3 lease
-- TTL (ms), $4 tick interval (ms; NULL on a cron schedule), $5 the
-- coordination key (or NULL), $6 the most terms to start (the caller's
-- preferred roles first in $1); on a cron schedule $7 the occurrence, $8
-- the one after it (it must still be the latest), $9 the schedule as text,
-- $10 the occurrence after the asked one (for operators), $11 the latest
-- occurrences before it (at most 1000, for the skipped records); all NULL
-- on an interval. One row per role; over_limit: acquirable but past the
-- limit. A SECURITY DEFINER function (migration 0006, definitions
-- generation 3) over the one-row ACQUIRE's predicates.
-- Calls: leader_acquire_many(text[], text, bigint, bigint, bigint, integer, timestamptz, timestamptz, text, timestamptz, timestamptz[])
SELECT role, holder_token, db_now, holder_id, expires_at, held, paused_by, pause_reason, due_at, holder_key,
       over_limit, after_occurrence, failures, manual_by
  FROM leader_acquire_many($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)

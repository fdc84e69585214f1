-- The backends this login may see (its own; every backend with
-- pg_read_all_stats) whose commit waits for a synchronous standby's
-- confirmation: how many, and the longest such wait so far, in seconds
-- (from the statement's start: an autocommit statement's commit waits at
-- its end). A read: it never waits for a standby itself.
-- Calls: nothing (reads pg_catalog.pg_stat_activity)
SELECT count(*)::int8 AS waiting,
       coalesce(EXTRACT(epoch FROM max(pg_catalog.clock_timestamp() - a.state_change)), 0)::float8 AS longest
  FROM pg_catalog.pg_stat_activity AS a
 WHERE a.wait_event_type = 'IPC' AND a.wait_event = 'SyncRep'

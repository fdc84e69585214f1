-- Signatures kept only for callers of older releases; this build's library
-- calls none of them. Each delegates to the current function, so it has no
-- logic of its own. One goes by a versioned migration that drops it (and its
-- name leaves leader_grant in 80_privileges.sql) once no caller remains:
--
-- * leader_acquire(text, text, bigint, bigint, bigint, boolean),
--   leader_acquire_occurrence(text, text, bigint, timestamptz, timestamptz,
--   bigint, text[], text[], text, timestamptz), leader_renew(text, bigint,
--   bigint, bigint): the client functions up to generation 4, their rows as
--   they were (a caller may have prepared `SELECT *` of them); generation 5's
--   _v2 add the explicit answer. Can go at the next major version, announced
--   one release before.
-- * leader_release(text, bigint, boolean, bigint, text, text, text):
--   replicas before migration 0011 (no output kept). Can go when no replica
--   older than 0011 runs.
-- * leader_acquire(text, text, bigint, bigint, bigint): replicas before
--   migration 0011 (no long-lived roles: each term it starts records a
--   scheduled role). Can go when no replica older than 0011 runs.
-- * leader_acquire(text, text, bigint, bigint), leader_renew(text, bigint,
--   bigint): replicas of the releases up to migration 0003 (no coordination
--   session). Can go when no replica older than 0004 runs.
-- * leader_release(text, bigint, boolean, bigint): replicas of the release
--   of 0004 (no outcome). Can go when no replica older than 0005 runs.
-- * leader_acquire_many(text[], text, bigint, bigint, bigint, integer):
--   replicas of definitions generations 1-2 (families on intervals alone).
--   Can go when no replica older than migration 0009 runs.
-- * leader_fence_lock(text, bigint): claim statements written against 0002,
--   when the spec's leader_fence was unsound and this was the fence to use
--   (0003 made leader_fence sound). Can go at the next major version,
--   announced one release before.

CREATE OR REPLACE FUNCTION @schema@.leader_acquire(p_role text, p_holder text, p_ttl_ms bigint, p_interval_ms bigint,
                                                 p_key bigint)
RETURNS TABLE (holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
               held boolean, paused_by text, pause_reason text, due_at timestamptz, holder_key bigint)
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    SELECT a.holder_token, a.db_now, a.holder_id, a.expires_at, a.held, a.paused_by, a.pause_reason, a.due_at,
           a.holder_key
      FROM @schema@.leader_acquire_v2(p_role, p_holder, p_ttl_ms, p_interval_ms, p_key, false) AS a
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_acquire(p_role text, p_holder text, p_ttl_ms bigint, p_interval_ms bigint)
RETURNS TABLE (holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
               held boolean, paused_by text, pause_reason text, due_at timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    -- A replica of 0003 has no coordination session.
    SELECT a.holder_token, a.db_now, a.holder_id, a.expires_at, a.held, a.paused_by, a.pause_reason, a.due_at
      FROM @schema@.leader_acquire_v2(p_role, p_holder, p_ttl_ms, p_interval_ms, NULL, false) AS a
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_renew(p_role text, p_token bigint, p_ttl_ms bigint)
RETURNS TABLE (renewed boolean, db_now timestamptz, holder_token bigint, holder_id text, paused boolean)
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    SELECT r.renewed, r.db_now, r.holder_token, r.holder_id, r.paused
      FROM @schema@.leader_renew_v2(p_role, p_token, p_ttl_ms, NULL) AS r
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_release(p_role text, p_token bigint, p_stamp boolean, p_cooldown_ms bigint)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    -- A replica of 0004 names no outcome: it is read from the policy (a
    -- stamp is a completion, no cooldown an interruption, else a failure).
    SELECT @schema@.leader_release(p_role, p_token, p_stamp, p_cooldown_ms,
                                   CASE WHEN p_stamp THEN 'completed'
                                        WHEN p_cooldown_ms IS NULL THEN 'interrupted'
                                        ELSE 'failed' END, NULL, NULL, NULL)
$fn$;

-- The one fence, under the name claims written against 0002 use.
CREATE OR REPLACE FUNCTION @schema@.leader_fence_lock(p_role text, p_token bigint) RETURNS boolean
LANGUAGE sql VOLATILE
AS $fn$ SELECT @schema@.leader_fence(p_role, p_token) $fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_acquire_many(p_roles text[], p_holder text, p_ttl_ms bigint,
                                              p_interval_ms bigint, p_key bigint, p_limit integer)
RETURNS TABLE (role text, holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
               held boolean, paused_by text, pause_reason text, due_at timestamptz, holder_key bigint,
               over_limit boolean)
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    -- A replica of generation 2 or older asks on an interval alone.
    SELECT a.role, a.holder_token, a.db_now, a.holder_id, a.expires_at, a.held, a.paused_by, a.pause_reason,
           a.due_at, a.holder_key, a.over_limit
      FROM @schema@.leader_acquire_many(p_roles, p_holder, p_ttl_ms, p_interval_ms, p_key, p_limit,
                                        NULL, NULL, NULL, NULL, NULL) AS a
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_release(p_role text, p_token bigint, p_stamp boolean, p_cooldown_ms bigint,
                                                 p_outcome text, p_reason text, p_error text)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    SELECT @schema@.leader_release(p_role, p_token, p_stamp, p_cooldown_ms, p_outcome, p_reason, p_error, NULL)
$fn$;

-- The three client functions of generation 4 keep their rows below. A
-- database that holds another row under one of these signatures (the
-- occurrence ACQUIRE of generations 1-2 had 13 columns) has it dropped
-- first: CREATE OR REPLACE cannot change a row type. Counted by arguments,
-- in and out: 6 + 9, 10 + 15, 4 + 5.
DO $guard$
DECLARE
    f record;
BEGIN
    FOR f IN SELECT p.oid::regprocedure AS sig
               FROM (VALUES ('leader_acquire(text, text, bigint, bigint, bigint, boolean)', 15),
                            ('leader_acquire_occurrence(text, text, bigint, timestamptz, timestamptz, bigint, '
                             || 'text[], text[], text, timestamptz)', 25),
                            ('leader_renew(text, bigint, bigint, bigint)', 9)) AS k (signature, args)
               JOIN pg_catalog.pg_proc AS p
                 ON p.oid = pg_catalog.to_regprocedure(pg_catalog.format('%I.%s', @schema_text@, k.signature))
              WHERE pg_catalog.cardinality(p.proallargtypes) IS DISTINCT FROM k.args
    LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', f.sig);
    END LOOP;
END
$guard$;

CREATE OR REPLACE FUNCTION @schema@.leader_acquire(p_role text, p_holder text, p_ttl_ms bigint, p_interval_ms bigint,
                                                 p_key bigint, p_long_lived boolean)
RETURNS TABLE (holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
               held boolean, paused_by text, pause_reason text, due_at timestamptz, holder_key bigint)
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    SELECT a.holder_token, a.db_now, a.holder_id, a.expires_at, a.held, a.paused_by, a.pause_reason, a.due_at,
           a.holder_key
      FROM @schema@.leader_acquire_v2(p_role, p_holder, p_ttl_ms, p_interval_ms, p_key, p_long_lived) AS a
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_acquire_occurrence(p_role text, p_holder text, p_ttl_ms bigint,
                                                    p_occurrence timestamptz, p_before timestamptz, p_key bigint,
                                                    p_skipped_reasons text[], p_skipped_summaries text[],
                                                    p_schedule text, p_next timestamptz)
RETURNS TABLE (holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
               held boolean, paused_by text, pause_reason text, due_at timestamptz, holder_key bigint,
               after_occurrence timestamptz, failures integer, manual_by text, run_now_pending boolean,
               last_paused_at timestamptz, last_unpaused_at timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    SELECT a.holder_token, a.db_now, a.holder_id, a.expires_at, a.held, a.paused_by, a.pause_reason, a.due_at,
           a.holder_key, a.after_occurrence, a.failures, a.manual_by, a.run_now_pending, a.last_paused_at,
           a.last_unpaused_at
      FROM @schema@.leader_acquire_occurrence_v2(p_role, p_holder, p_ttl_ms, p_occurrence, p_before, p_key,
                                                 p_skipped_reasons, p_skipped_summaries, p_schedule, p_next) AS a
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_renew(p_role text, p_token bigint, p_ttl_ms bigint, p_key bigint)
RETURNS TABLE (renewed boolean, db_now timestamptz, holder_token bigint, holder_id text, paused boolean)
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    SELECT r.renewed, r.db_now, r.holder_token, r.holder_id, r.paused
      FROM @schema@.leader_renew_v2(p_role, p_token, p_ttl_ms, p_key) AS r
$fn$;

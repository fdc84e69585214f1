-- [from 0004_coordination.sql]
CREATE OR REPLACE FUNCTION @schema@.leader_acquire(p_role text, p_holder text, p_ttl_ms bigint, p_interval_ms bigint)
RETURNS TABLE (holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
               held boolean, paused_by text, pause_reason text, due_at timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    -- A replica of 0003 has no coordination session.
    SELECT a.holder_token, a.db_now, a.holder_id, a.expires_at, a.held, a.paused_by, a.pause_reason, a.due_at
      FROM @schema@.leader_acquire(p_role, p_holder, p_ttl_ms, p_interval_ms, NULL) AS a
$fn$;

-- [from 0004_coordination.sql]
CREATE OR REPLACE FUNCTION @schema@.leader_renew(p_role text, p_token bigint, p_ttl_ms bigint)
RETURNS TABLE (renewed boolean, db_now timestamptz, holder_token bigint, holder_id text, paused boolean)
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    SELECT * FROM @schema@.leader_renew(p_role, p_token, p_ttl_ms, NULL)
$fn$;

-- [from 0005_history.sql]
CREATE OR REPLACE FUNCTION @schema@.leader_release(p_role text, p_token bigint, p_stamp boolean, p_cooldown_ms bigint)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    -- A replica of 0004 names no outcome: it is read from the policy (a
    -- stamp is a completion, no cooldown an interruption, else a failure).
    SELECT @schema@.leader_release(p_role, p_token, p_stamp, p_cooldown_ms,
                                   CASE WHEN p_stamp THEN 'completed'
                                        WHEN p_cooldown_ms IS NULL THEN 'interrupted'
                                        ELSE 'failed' END, NULL, NULL)
$fn$;

-- The spec-named fence of 0001 was STABLE and unsound; callers built against
-- 0002 call leader_fence_lock. Both now are the one fence above.
-- [from 0003_hardening.sql]
CREATE OR REPLACE FUNCTION @schema@.leader_fence_lock(p_role text, p_token bigint) RETURNS boolean
LANGUAGE sql VOLATILE
AS $fn$ SELECT @schema@.leader_fence(p_role, p_token) $fn$;

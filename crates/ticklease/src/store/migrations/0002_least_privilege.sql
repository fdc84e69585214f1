-- ticklease 0002: least privilege.
--
-- The application role never owns leader_leases and never INSERTs or DELETEs:
-- ACQUIRE (which must recreate a missing row) and seeding run inside
-- SECURITY DEFINER functions owned by the migrating role, with search_path
-- pinned to pg_catalog and this schema so a caller cannot shadow a table or
-- an operator. The operator surface (pause, unpause, run now) is also
-- SECURITY DEFINER, so operators need no table privileges at all.
-- leader_grant(app, operator) creates the two roles if missing and grants
-- exactly that; the migration calls it with the names the runner passes
-- (transaction-local settings ticklease.app_role / ticklease.operator_role,
-- default ticklease_app / ticklease_operator).

CREATE FUNCTION leader_acquire(p_role text, p_holder text, p_ttl_ms bigint, p_interval_ms bigint)
RETURNS TABLE (holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
               held boolean, paused_by text, pause_reason text, due_at timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $$
    -- One statement on the database clock. Racing replicas serialize on the
    -- row lock; the loser's WHERE re-evaluates against the winner's row.
    -- `role = EXCLUDED.role` names the key column on purpose: ON CONFLICT then
    -- locks the row FOR UPDATE, so a takeover waits for in-flight fenced
    -- claims (see leader_fence_lock). The outer SELECT reads the row as it
    -- was before this statement, to say why nothing was acquired.
    WITH acquired AS (
        INSERT INTO leader_leases AS l (role, holder_token, holder_id, acquired_at, expires_at)
        VALUES (p_role, leader_token_seed(), p_holder, now(), now() + p_ttl_ms * interval '1 millisecond')
        ON CONFLICT (role) DO UPDATE
           SET role = EXCLUDED.role,
               holder_token = l.holder_token + 1,
               holder_id = EXCLUDED.holder_id,
               acquired_at = EXCLUDED.acquired_at,
               expires_at = EXCLUDED.expires_at
         WHERE l.paused_at IS NULL
           AND NOT leader_lease_live(l.holder_id, l.expires_at, now())
           AND (l.last_tick_ended_at IS NULL
                OR l.last_tick_ended_at <= now() - p_interval_ms * interval '1 millisecond')
           AND (l.not_before IS NULL OR l.not_before <= now())
        RETURNING l.holder_token
    )
    SELECT a.holder_token,
           now(),
           s.holder_id,
           s.expires_at,
           leader_lease_live(s.holder_id, s.expires_at, now()),
           s.paused_by,
           s.pause_reason,
           greatest(s.last_tick_ended_at + p_interval_ms * interval '1 millisecond', s.not_before)
      FROM (SELECT 1) AS one
      LEFT JOIN acquired AS a ON true
      LEFT JOIN leader_leases AS s ON s.role = p_role
$$;

-- Creates the rows of roles that have none; existing rows are untouched.
CREATE FUNCTION leader_seed(p_roles text[]) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $$ INSERT INTO leader_leases (role) SELECT unnest(p_roles) ON CONFLICT (role) DO NOTHING $$;

-- Clears a cooldown (not_before) so the role runs at its next poll, e.g. after
-- the fix for a panicking tick shipped. True when a cooldown was cleared.
CREATE FUNCTION leader_run_now(p_role text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    had boolean;
BEGIN
    SELECT not_before IS NOT NULL INTO had FROM leader_leases WHERE role = p_role FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ticklease: unknown role %', p_role USING ERRCODE = 'no_data_found';
    END IF;
    UPDATE leader_leases SET not_before = NULL WHERE role = p_role;
    RETURN had;
END
$$;

ALTER FUNCTION leader_pause(text, text, text) SECURITY DEFINER;
ALTER FUNCTION leader_unpause(text) SECURITY DEFINER;

-- Pin search_path of every SECURITY DEFINER function to this schema.
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['leader_acquire(text, text, bigint, bigint)', 'leader_seed(text[])',
                             'leader_run_now(text)', 'leader_pause(text, text, text)', 'leader_unpause(text)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I', f, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;

-- Grants the application role and the operator role what they need and no
-- more. Idempotent; run again (ticklease grant) for other role names.
CREATE FUNCTION leader_grant(p_app text, p_operator text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY[p_app, p_operator] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created concurrently by a migration of another database
            END;
        END IF;
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), r);
        EXECUTE format('GRANT SELECT ON leader_status, ticklease_schema_migrations TO %I', r);
    END LOOP;
    -- The app reads and renews/releases its own terms: no INSERT, DELETE,
    -- TRUNCATE, no pause columns, no ownership.
    EXECUTE format('GRANT SELECT ON leader_leases TO %I', p_app);
    EXECUTE format('GRANT UPDATE (holder_id, acquired_at, expires_at, last_tick_ended_at, last_tick_holder, not_before)
                    ON leader_leases TO %I', p_app);
    EXECUTE format('GRANT EXECUTE ON FUNCTION leader_acquire(text, text, bigint, bigint), leader_seed(text[]),
                    leader_fence(text, bigint), leader_fence_lock(text, bigint) TO %I', p_app);
    EXECUTE format('GRANT EXECUTE ON FUNCTION leader_pause(text, text, text), leader_unpause(text),
                    leader_run_now(text) TO %I', p_operator);
END
$$;
REVOKE EXECUTE ON FUNCTION leader_grant(text, text) FROM PUBLIC;

SELECT leader_grant(coalesce(nullif(current_setting('ticklease.app_role', true), ''), 'ticklease_app'),
                    coalesce(nullif(current_setting('ticklease.operator_role', true), ''), 'ticklease_operator'));

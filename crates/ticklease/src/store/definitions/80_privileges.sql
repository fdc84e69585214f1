-- Grants and privileges: the app role writes our tables only through these
-- functions, the operator role pauses, unpauses, runs now and reads; every
-- SECURITY DEFINER function pins search_path (pg_temp last), and no
-- function of ours is executable by PUBLIC. The migration runner calls
-- leader_secure_functions and leader_regrant after applying any definition.

-- Pins search_path (pg_temp last) on every SECURITY DEFINER function, and
-- revokes EXECUTE from PUBLIC on every function of ours.
CREATE OR REPLACE FUNCTION leader_secure_functions() RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    f regprocedure;
BEGIN
    -- The schema by name (a cast to regnamespace would parse it again as an
    -- identifier); built-ins qualified, as everywhere in this file.
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = pg_catalog.current_schema() AND p.prosecdef LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f,
                                  pg_catalog.current_schema());
    END LOOP;
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = pg_catalog.current_schema() AND p.proname LIKE 'leader\_%' LOOP
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;

-- Grants one application role and/or one operator role (created if missing)
-- what they need and no more; either may be NULL. Idempotent; run again
-- (ticklease grant) for other role names. Readers of leader_status also
-- call its liveness functions; the status page reads leader_timeline.
CREATE OR REPLACE FUNCTION leader_grant(p_app text, p_operator text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r text;
    tables constant text := 'leader_leases, leader_history, leader_history_settings, leader_replicas,
                             leader_fence_claims, leader_fence_secret, ticklease_schema_migrations,
                             ticklease_schema_definitions';
BEGIN
    FOREACH r IN ARRAY pg_catalog.array_remove(ARRAY[p_app, p_operator], NULL) LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created concurrently by a migration of another database
            END;
        END IF;
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA %I TO %I', pg_catalog.current_schema(), r);
        EXECUTE pg_catalog.format('GRANT SELECT ON leader_status, leader_history, leader_replicas,
                        ticklease_schema_migrations, ticklease_schema_definitions TO %I', r);
        -- leader_status calls them with the reader's rights.
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION leader_lease_live(text, timestamptz, timestamptz),
                        leader_key_alive(bigint), leader_term_live(text, timestamptz, bigint, timestamptz),
                        leader_live_keys(), leader_term_live_among(text, timestamptz, bigint, timestamptz, bigint[]),
                        leader_timeline(bigint, integer, integer, integer)
                        TO %I', r);
    END LOOP;
    IF p_app IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles r, pg_catalog.pg_class c
                    WHERE r.rolname = p_app AND c.oid = 'leader_leases'::regclass
                      AND (r.rolsuper OR pg_catalog.pg_has_role(r.oid, c.relowner, 'USAGE'))) THEN
            RAISE EXCEPTION 'ticklease: % owns the schema (or is a superuser): it cannot be the application role', p_app
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Create a separate login role for the application, a member of the app role.';
        END IF;
        -- The app reads the tables and writes them only through these functions
        -- (also what default privileges gave it).
        EXECUTE pg_catalog.format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON %s FROM %I', tables, p_app);
        -- The secret the PREPARE guard's keys come from: the owner's alone.
        EXECUTE pg_catalog.format('REVOKE ALL ON leader_fence_secret FROM %I', p_app);
        EXECUTE pg_catalog.format('GRANT SELECT ON leader_leases TO %I', p_app);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION leader_acquire(text, text, bigint, bigint),
                        leader_acquire(text, text, bigint, bigint, bigint),
                        leader_acquire(text, text, bigint, bigint, bigint, boolean),
                        leader_acquire_v2(text, text, bigint, bigint, bigint, boolean),
                        leader_acquire_occurrence(text, text, bigint, timestamptz, timestamptz, bigint, text[], text[], text, timestamptz),
                        leader_acquire_occurrence_v2(text, text, bigint, timestamptz, timestamptz, bigint, text[], text[], text, timestamptz),
                        leader_renew(text, bigint, bigint), leader_renew(text, bigint, bigint, bigint),
                        leader_renew_v2(text, bigint, bigint, bigint),
                        leader_release(text, bigint, boolean, bigint),
                        leader_release(text, bigint, boolean, bigint, text, text, text),
                        leader_release(text, bigint, boolean, bigint, text, text, text, text),
                        leader_acquire_many(text[], text, bigint, bigint, bigint, integer),
                        leader_acquire_many(text[], text, bigint, bigint, bigint, integer, timestamptz, timestamptz,
                                            text, timestamptz, timestamptz[]),
                        leader_renew_many(text[], bigint[], bigint, bigint),
                        leader_release_many(text[], bigint[], boolean[], bigint[], text[], text[], text[]),
                        leader_replica_beat(text, text, bigint, bigint), leader_replica_leave(text, text),
                        leader_seed(text[]), leader_fence(text, bigint), leader_fence_v2(text, bigint),
                        leader_fence_lock(text, bigint),
                        leader_fence_sweep(text[]), leader_key_wait(bigint)
                        TO %I', p_app);
    END IF;
    IF p_operator IS NOT NULL THEN
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r, pg_catalog.pg_class c
                        WHERE r.rolname = p_operator AND c.oid = 'leader_leases'::regclass
                          AND (r.rolsuper OR pg_catalog.pg_has_role(r.oid, c.relowner, 'USAGE'))) THEN
            EXECUTE pg_catalog.format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON %s FROM %I', tables, p_operator);
            EXECUTE pg_catalog.format('REVOKE ALL ON leader_fence_secret FROM %I', p_operator);
        END IF;
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION leader_pause(text, text, text), leader_unpause(text),
                        leader_run_now(text), leader_fence_sweep(text[]), leader_forget(text)
                        TO %I', p_operator);
        -- leader_timeline (the status page) lists the roles with its reader's
        -- rights; the role names alone, no holder, key or token.
        EXECUTE pg_catalog.format('GRANT SELECT (role) ON leader_leases TO %I', p_operator);
    END IF;
END
$$;

-- Re-grants every role granted before (by a migration or `ticklease
-- grant`), so replicas of older releases and new ones find what they call.
CREATE OR REPLACE FUNCTION leader_regrant() RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r text;
BEGIN
    FOR r IN SELECT DISTINCT g.rolname
               FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a, pg_catalog.pg_roles g
              WHERE p.oid = 'leader_acquire(text, text, bigint, bigint, bigint)'::regprocedure AND g.oid = a.grantee
                AND a.privilege_type = 'EXECUTE' AND NOT g.rolsuper
                AND NOT pg_catalog.pg_has_role(g.oid, p.proowner, 'USAGE') LOOP
        PERFORM leader_grant(r, NULL);
    END LOOP;
    FOR r IN SELECT DISTINCT g.rolname
               FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a, pg_catalog.pg_roles g
              WHERE p.oid = 'leader_pause(text, text, text)'::regprocedure AND g.oid = a.grantee
                AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner LOOP
        PERFORM leader_grant(NULL, r);
    END LOOP;
END
$$;

-- ticklease 0004: coordination (issue 12). Upgrades a database with live
-- terms in place; replicas of 0003 keep working (their statements call the
-- new functions with no coordination key).
--
-- 1. A term may record its holder's coordination key: a session advisory
--    lock that the holder replica's coordination session (a direct
--    connection) holds. When no backend of this database holds the key any
--    more, the holder's process (or its coordination session) is gone and
--    ACQUIRE may start a new term at once instead of waiting for the lease
--    to run out. The fence does not look at the key: it keeps checking
--    token and expiry, so a faster signal only makes a term acquirable
--    earlier; the new term's token is what ends the old one.
-- 2. RELEASE, pause, unpause and run-now notify channel 'ticklease' in the
--    same statement ('<event> <role>'), delivered at commit, through
--    PgBouncer too: followers ACQUIRE at once, a paused holder renews at once.

SET LOCAL lock_timeout = '5s';

ALTER TABLE leader_leases ADD COLUMN holder_key bigint;

DO $migration$
DECLARE
    def text;
BEGIN
    FOREACH def IN ARRAY ARRAY[
$def$
CREATE FUNCTION @schema@.leader_key_alive(p_key bigint) RETURNS boolean
LANGUAGE sql VOLATILE
AS $fn$
    -- True unless the key is held by no session of this database. NULL (a
    -- holder without a coordination session): the lease alone decides. A
    -- held key is held exclusively, so a shared try-lock fails exactly while
    -- its session lives (a backend never conflicts with itself: the
    -- coordination session never runs these statements); a granted try-lock
    -- is released at the end of the caller's transaction (autocommit
    -- statements here), so nothing stays in a session.
    SELECT p_key IS NULL OR NOT pg_try_advisory_xact_lock_shared(p_key)
$fn$
$def$,
$def$
CREATE FUNCTION @schema@.leader_term_live(p_holder_id text, p_expires_at timestamptz, p_key bigint, p_at timestamptz)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $fn$
    -- The one liveness predicate of a term, for ACQUIRE and leader_status:
    -- the lease has not run out on the database clock and its holder's
    -- coordination session (if it had one) lives. The fence and its commit
    -- check use leader_lease_live (token and expiry) alone. Qualified: the
    -- view calls this with the reader's search_path.
    SELECT @schema@.leader_lease_live(p_holder_id, p_expires_at, p_at) AND @schema@.leader_key_alive(p_key)
$fn$
$def$,
$def$
CREATE FUNCTION @schema@.leader_require_key(p_key bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- A key a replica passes must be held: otherwise its direct URL reaches
-- another database than its pooled one, and every term it starts would be
-- acquirable by anyone at once.
BEGIN
    IF NOT @schema@.leader_key_alive(p_key) THEN
        RAISE EXCEPTION 'ticklease: coordination key % is held by no session of this database', p_key
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'The coordination session ended, or the direct URL reaches another database than the pooled URL.';
    END IF;
END
$fn$
$def$,
$def$
CREATE FUNCTION @schema@.leader_acquire(p_role text, p_holder text, p_ttl_ms bigint, p_interval_ms bigint, p_key bigint)
RETURNS TABLE (holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
               held boolean, paused_by text, pause_reason text, due_at timestamptz, holder_key bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- ACQUIRE as in 0003, recording the holder's coordination key (NULL for
-- none), and taking over a term whose holder's key is held no more. The
-- liveness test runs under the row lock (ON CONFLICT DO UPDATE ... WHERE).
#variable_conflict use_column
BEGIN
    PERFORM @schema@.leader_require_key(p_key);
    RETURN QUERY
    WITH acquired AS (
        INSERT INTO @schema@.leader_leases AS l (role, holder_token, holder_id, acquired_at, expires_at, holder_key)
        VALUES (p_role, @schema@.leader_token_seed(), p_holder, now(),
                now() + @schema@.leader_check_ms('lease_ttl', p_ttl_ms), p_key)
        ON CONFLICT (role) DO UPDATE
           SET role = EXCLUDED.role,
               holder_token = greatest(l.holder_token + 1, @schema@.leader_token_seed()),
               holder_id = EXCLUDED.holder_id,
               acquired_at = EXCLUDED.acquired_at,
               expires_at = EXCLUDED.expires_at,
               holder_key = EXCLUDED.holder_key
         WHERE l.paused_at IS NULL
           AND NOT @schema@.leader_term_live(l.holder_id, l.expires_at, l.holder_key, now())
           AND (l.last_tick_ended_at IS NULL
                OR l.last_tick_ended_at <= now() - @schema@.leader_check_ms('interval', p_interval_ms))
           AND (l.not_before IS NULL OR l.not_before <= now())
        RETURNING l.holder_token
    )
    SELECT a.holder_token,
           now(),
           s.holder_id,
           s.expires_at,
           @schema@.leader_term_live(s.holder_id, s.expires_at, s.holder_key, now()),
           s.paused_by,
           s.pause_reason,
           greatest(s.last_tick_ended_at + @schema@.leader_check_ms('interval', p_interval_ms), s.not_before),
           s.holder_key
      FROM (SELECT 1) AS one
      LEFT JOIN acquired AS a ON true
      LEFT JOIN @schema@.leader_leases AS s ON s.role = p_role;
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_acquire(p_role text, p_holder text, p_ttl_ms bigint, p_interval_ms bigint)
RETURNS TABLE (holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
               held boolean, paused_by text, pause_reason text, due_at timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    -- A replica of 0003 has no coordination session.
    SELECT a.holder_token, a.db_now, a.holder_id, a.expires_at, a.held, a.paused_by, a.pause_reason, a.due_at
      FROM @schema@.leader_acquire(p_role, p_holder, p_ttl_ms, p_interval_ms, NULL) AS a
$fn$
$def$,
$def$
CREATE FUNCTION @schema@.leader_renew(p_role text, p_token bigint, p_ttl_ms bigint, p_key bigint)
RETURNS TABLE (renewed boolean, db_now timestamptz, holder_token bigint, holder_id text, paused boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- RENEW as in 0003; it records the holder's current coordination key (a
-- replica whose session reconnected has a new one; NULL: none now).
BEGIN
    PERFORM @schema@.leader_require_key(p_key);
    UPDATE @schema@.leader_leases AS l
       SET expires_at = now() + @schema@.leader_check_ms('lease_ttl', p_ttl_ms),
           holder_key = p_key
     WHERE l.role = p_role AND l.holder_token = p_token AND l.holder_id IS NOT NULL;
    IF FOUND THEN
        RETURN QUERY SELECT true, now(), p_token, NULL::text, false;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT false, now(), s.holder_token, s.holder_id, s.paused_at IS NOT NULL
          FROM (SELECT 1) AS one
          LEFT JOIN @schema@.leader_leases AS s ON s.role = p_role;
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_renew(p_role text, p_token bigint, p_ttl_ms bigint)
RETURNS TABLE (renewed boolean, db_now timestamptz, holder_token bigint, holder_id text, paused boolean)
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    SELECT * FROM @schema@.leader_renew(p_role, p_token, p_ttl_ms, NULL)
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_release(p_role text, p_token bigint, p_stamp boolean, p_cooldown_ms bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- RELEASE as in 0003, and followers are told at commit.
DECLARE
    cooldown interval := CASE WHEN p_cooldown_ms IS NOT NULL
                              THEN @schema@.leader_check_ms('cooldown', p_cooldown_ms) END;
BEGIN
    IF p_stamp IS NULL THEN
        RAISE EXCEPTION 'ticklease: leader_release needs p_stamp' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE @schema@.leader_leases AS l
       SET holder_id = NULL,
           acquired_at = NULL,
           expires_at = NULL,
           holder_key = NULL,
           last_tick_ended_at = CASE WHEN p_stamp THEN now() ELSE l.last_tick_ended_at END,
           last_tick_holder = CASE WHEN p_stamp THEN l.holder_id ELSE l.last_tick_holder END,
           not_before = now() + cooldown
     WHERE l.role = p_role AND l.holder_token = p_token AND l.holder_id IS NOT NULL;
    IF FOUND THEN
        PERFORM pg_notify('ticklease', 'release ' || p_role);
        RETURN true;
    END IF;
    RETURN false;
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_pause(p_role text, p_by text, p_reason text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Pause as in 0003; the holder is told at commit and renews at once, which
-- reports the loss and cancels its work.
DECLARE
    changed boolean;
BEGIN
    IF p_by IS NULL OR btrim(p_by) = '' THEN
        RAISE EXCEPTION 'ticklease: leader_pause(%): who paused it must be named', p_role
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE @schema@.leader_leases AS l
       SET paused_at = now(), paused_by = p_by, pause_reason = coalesce(p_reason, ''),
           holder_id = NULL, acquired_at = NULL, expires_at = NULL, holder_key = NULL
     WHERE l.role = p_role AND l.paused_at IS NULL
    RETURNING true INTO changed;
    PERFORM 1 FROM @schema@.leader_leases AS l WHERE l.role = p_role FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ticklease: unknown role %', p_role USING ERRCODE = 'no_data_found';
    END IF;
    IF changed THEN
        PERFORM pg_notify('ticklease', 'pause ' || p_role);
    END IF;
    RETURN coalesce(changed, false);
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_unpause(p_role text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Unpause as in 0003; followers are told at commit.
DECLARE
    changed boolean;
BEGIN
    UPDATE @schema@.leader_leases AS l
       SET paused_at = NULL, paused_by = NULL, pause_reason = NULL
     WHERE l.role = p_role AND l.paused_at IS NOT NULL
    RETURNING true INTO changed;
    IF changed IS NULL THEN
        PERFORM 1 FROM @schema@.leader_leases AS l WHERE l.role = p_role;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'ticklease: unknown role %', p_role USING ERRCODE = 'no_data_found';
        END IF;
        RETURN false;
    END IF;
    PERFORM pg_notify('ticklease', 'unpause ' || p_role);
    RETURN true;
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_run_now(p_role text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Run-now as in 0003; followers are told at commit.
DECLARE
    had boolean;
BEGIN
    SELECT l.not_before IS NOT NULL INTO had FROM @schema@.leader_leases AS l WHERE l.role = p_role FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ticklease: unknown role %', p_role USING ERRCODE = 'no_data_found';
    END IF;
    UPDATE @schema@.leader_leases AS l SET not_before = NULL WHERE l.role = p_role;
    IF had THEN
        PERFORM pg_notify('ticklease', 'run_now ' || p_role);
    END IF;
    RETURN had;
END
$fn$
$def$
    ] LOOP
        EXECUTE replace(def, '@schema@', quote_ident(current_schema()));
    END LOOP;
END
$migration$;

CREATE OR REPLACE VIEW leader_status AS
SELECT role,
       leader_term_live(holder_id, expires_at, holder_key, statement_timestamp()) AS held,
       holder_id,
       holder_token,
       acquired_at,
       expires_at,
       statement_timestamp() AS db_now,
       CASE WHEN leader_term_live(holder_id, expires_at, holder_key, statement_timestamp())
            THEN expires_at - statement_timestamp() END AS remaining,
       paused_at,
       paused_by,
       pause_reason,
       last_tick_ended_at,
       last_tick_holder,
       not_before
  FROM leader_leases;

-- As in 0003: pin search_path (pg_temp last) on every SECURITY DEFINER
-- function, and revoke EXECUTE from PUBLIC on every function of ours. A
-- function from here on, so each later migration runs the same code.
CREATE FUNCTION leader_secure_functions() RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.pronamespace = current_schema()::regnamespace AND p.prosecdef LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, current_schema());
    END LOOP;
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'leader\_%' LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
SELECT leader_secure_functions();

-- leader_grant of 0003, granting the new functions too.
CREATE OR REPLACE FUNCTION leader_grant(p_app text, p_operator text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY array_remove(ARRAY[p_app, p_operator], NULL) LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created concurrently by a migration of another database
            END;
        END IF;
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), r);
        EXECUTE format('GRANT SELECT ON leader_status, ticklease_schema_migrations TO %I', r);
        -- leader_status calls them with the reader's rights.
        EXECUTE format('GRANT EXECUTE ON FUNCTION leader_lease_live(text, timestamptz, timestamptz),
                        leader_key_alive(bigint), leader_term_live(text, timestamptz, bigint, timestamptz)
                        TO %I', r);
    END LOOP;
    IF p_app IS NOT NULL THEN
        -- Revoking writes from the owner (or a role with its rights) would
        -- break every definer function; such a role needs no grants.
        IF EXISTS (SELECT 1 FROM pg_roles r, pg_class c
                    WHERE r.rolname = p_app AND c.oid = 'leader_leases'::regclass
                      AND (r.rolsuper OR pg_has_role(r.oid, c.relowner, 'USAGE'))) THEN
            RAISE EXCEPTION 'ticklease: % owns the schema (or is a superuser): it cannot be the application role', p_app
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Create a separate login role for the application, a member of the app role.';
        END IF;
        -- The app reads the table and writes it only through these functions.
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON leader_leases FROM %I', p_app);
        EXECUTE format('GRANT SELECT ON leader_leases TO %I', p_app);
        EXECUTE format('GRANT EXECUTE ON FUNCTION leader_acquire(text, text, bigint, bigint),
                        leader_acquire(text, text, bigint, bigint, bigint),
                        leader_renew(text, bigint, bigint), leader_renew(text, bigint, bigint, bigint),
                        leader_release(text, bigint, boolean, bigint),
                        leader_seed(text[]), leader_fence(text, bigint), leader_fence_lock(text, bigint)
                        TO %I', p_app);
    END IF;
    IF p_operator IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION leader_pause(text, text, text), leader_unpause(text),
                        leader_run_now(text) TO %I', p_operator);
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION leader_grant(text, text) FROM PUBLIC;

-- Re-grant every role granted before (by 0002, 0003 or `ticklease grant`),
-- so replicas of 0003 and new ones both find what they call. A function
-- from here on, for later migrations that grant more.
CREATE FUNCTION leader_regrant() RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r text;
BEGIN
    FOR r IN SELECT DISTINCT g.rolname
               FROM pg_proc p, aclexplode(p.proacl) a, pg_roles g
              WHERE p.oid = 'leader_acquire(text, text, bigint, bigint)'::regprocedure AND g.oid = a.grantee
                AND a.privilege_type = 'EXECUTE' AND NOT g.rolsuper
                AND NOT pg_has_role(g.oid, p.proowner, 'USAGE') LOOP
        PERFORM leader_grant(r, NULL);
    END LOOP;
    FOR r IN SELECT DISTINCT g.rolname
               FROM pg_proc p, aclexplode(p.proacl) a, pg_roles g
              WHERE p.oid = 'leader_pause(text, text, text)'::regprocedure AND g.oid = a.grantee
                AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner LOOP
        PERFORM leader_grant(NULL, r);
    END LOOP;
END
$$;
REVOKE EXECUTE ON FUNCTION leader_secure_functions(), leader_regrant() FROM PUBLIC;
SELECT leader_regrant();

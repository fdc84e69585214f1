-- ticklease 0003: hardening (issue 10). Upgrades a database with live terms in
-- place: every term keeps its token, holder and expiry.
--
-- 1. Every SECURITY DEFINER function pins search_path = pg_catalog, <schema>,
--    pg_temp (pg_temp last: otherwise a caller's temporary table shadows ours
--    inside the definer's rights) and names its relations schema-qualified.
--    EXECUTE is revoked from PUBLIC on every function.
-- 2. The app role writes leader_leases only through functions: RENEW and
--    RELEASE become leader_renew / leader_release; its UPDATE grant goes.
--    Timestamps are finite (CHECK), TTL and interval are bounded server-side.
-- 3. The fence holds no lock across the claim's transaction. leader_fence
--    checks the term at execution (clock_timestamp()) and registers the
--    transaction; a deferred constraint trigger checks the term again at
--    COMMIT under FOR KEY SHARE, so a claim commits only inside its term and
--    a frozen claimer can neither delay a takeover nor a pause.
-- 4. A RENEW that finds its term over names the reason from the row as it is
--    after the statement (a pause racing a RENEW is a pause, not a takeover).
-- 5. ACQUIRE issues greatest(token + 1, the database clock in ms): a token
--    issued after a failover that lost commits is above every token of the
--    lost timeline when the failover took longer than the tokens' lead over
--    the clock (issue 14; crate docs, guarantee 1).

-- A replica of 0002 may hold a lease row lock in a frozen claim: fail the
-- upgrade rather than queue every RENEW behind ALTER TABLE's lock.
SET LOCAL lock_timeout = '5s';

-- A forged or hand-edited infinite timestamp would make the CHECKs below fail
-- (and breaks leader_status): such a term is ended, such a stamp cleared.
UPDATE leader_leases SET holder_id = NULL, acquired_at = NULL, expires_at = NULL
 WHERE NOT isfinite(expires_at) OR NOT isfinite(acquired_at);
UPDATE leader_leases SET not_before = NULL WHERE NOT isfinite(not_before);
UPDATE leader_leases SET last_tick_ended_at = NULL WHERE NOT isfinite(last_tick_ended_at);
UPDATE leader_leases SET paused_at = now() WHERE NOT isfinite(paused_at);

ALTER TABLE leader_leases
    ADD CONSTRAINT leader_leases_finite_times CHECK (
        isfinite(acquired_at) AND isfinite(expires_at) AND isfinite(paused_at)
        AND isfinite(not_before) AND isfinite(last_tick_ended_at));

-- Transactions that passed the fence and have not committed yet. UNLOGGED:
-- a row lives from the fence to its transaction's commit.
CREATE UNLOGGED TABLE leader_fence_claims (
    xid   xid8   NOT NULL,
    role  text   NOT NULL,
    token bigint NOT NULL,
    PRIMARY KEY (xid, role, token)
);

-- Durations in ms, bounded like ticklease::Config (0 < d <= 24 h).
CREATE FUNCTION leader_check_ms(p_name text, p_ms bigint) RETURNS interval
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_ms IS NULL OR p_ms <= 0 OR p_ms > 86400000 THEN
        RAISE EXCEPTION 'ticklease: % must be within 1 ms .. 24 h, got % ms', p_name, p_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN p_ms * interval '1 millisecond';
END
$$;

-- The definer functions, created with @schema@ replaced by this schema.
DO $migration$
DECLARE
    def text;
BEGIN
    FOREACH def IN ARRAY ARRAY[
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_acquire(p_role text, p_holder text, p_ttl_ms bigint, p_interval_ms bigint)
RETURNS TABLE (holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
               held boolean, paused_by text, pause_reason text, due_at timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    -- One statement on the database clock. Racing replicas serialize on the
    -- row lock; the loser's WHERE re-evaluates against the winner's row.
    -- `role = EXCLUDED.role` names the key column on purpose: ON CONFLICT then
    -- locks the row FOR UPDATE, so a takeover waits for a claim that is
    -- committing (see leader_fence_commit). The outer SELECT reads the row as
    -- it was before this statement, to say why nothing was acquired.
    WITH acquired AS (
        INSERT INTO @schema@.leader_leases AS l (role, holder_token, holder_id, acquired_at, expires_at)
        VALUES (p_role, @schema@.leader_token_seed(), p_holder, now(),
                now() + @schema@.leader_check_ms('lease_ttl', p_ttl_ms))
        ON CONFLICT (role) DO UPDATE
           SET role = EXCLUDED.role,
               holder_token = greatest(l.holder_token + 1, @schema@.leader_token_seed()),
               holder_id = EXCLUDED.holder_id,
               acquired_at = EXCLUDED.acquired_at,
               expires_at = EXCLUDED.expires_at
         WHERE l.paused_at IS NULL
           AND NOT @schema@.leader_lease_live(l.holder_id, l.expires_at, now())
           AND (l.last_tick_ended_at IS NULL
                OR l.last_tick_ended_at <= now() - @schema@.leader_check_ms('interval', p_interval_ms))
           AND (l.not_before IS NULL OR l.not_before <= now())
        RETURNING l.holder_token
    )
    SELECT a.holder_token,
           now(),
           s.holder_id,
           s.expires_at,
           @schema@.leader_lease_live(s.holder_id, s.expires_at, now()),
           s.paused_by,
           s.pause_reason,
           greatest(s.last_tick_ended_at + @schema@.leader_check_ms('interval', p_interval_ms), s.not_before)
      FROM (SELECT 1) AS one
      LEFT JOIN acquired AS a ON true
      LEFT JOIN @schema@.leader_leases AS s ON s.role = p_role
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_renew(p_role text, p_token bigint, p_ttl_ms bigint)
RETURNS TABLE (renewed boolean, db_now timestamptz, holder_token bigint, holder_id text, paused boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- RENEW, term-scoped: false means the term is over, definitively. The reason
-- is read by a second statement, after the UPDATE waited for any concurrent
-- writer of the row: a pause that raced this RENEW reads as a pause.
BEGIN
    UPDATE @schema@.leader_leases AS l
       SET expires_at = now() + @schema@.leader_check_ms('lease_ttl', p_ttl_ms)
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
CREATE OR REPLACE FUNCTION @schema@.leader_release(p_role text, p_token bigint, p_stamp boolean, p_cooldown_ms bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- RELEASE, term-scoped: false when the term was already over. The outcome's
-- policy (ticklease::Release) arrives as values: whether to stamp
-- last_tick_* (a completed tick) and the cooldown (NULL: due at once).
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
           last_tick_ended_at = CASE WHEN p_stamp THEN now() ELSE l.last_tick_ended_at END,
           last_tick_holder = CASE WHEN p_stamp THEN l.holder_id ELSE l.last_tick_holder END,
           not_before = now() + cooldown
     WHERE l.role = p_role AND l.holder_token = p_token AND l.holder_id IS NOT NULL;
    RETURN FOUND;
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_fence(p_role text, p_token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- The fence. True while (role, token) is the live, unpaused term at this
-- instant (clock_timestamp(): not the transaction's or the client message's
-- start). Call it as an uncorrelated scalar subquery, (SELECT leader_fence($r, $t)),
-- so it runs once per statement. When true it registers the transaction, and
-- leader_fence_commit checks the term again when the transaction commits:
-- a claim commits only while its term is live, and holds no lock on the
-- lease row until then. The transaction's idle_in_transaction_session_timeout
-- is lowered to the term's remaining time (at least 1 s), so a claimer frozen in its
-- transaction gives back the rows it locked soon after its term ends.
DECLARE
    remaining interval;
    idle_ms bigint;
BEGIN
    -- Under REPEATABLE READ or SERIALIZABLE both checks would read the
    -- transaction's snapshot and miss a pause made since.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'ticklease: leader_fence needs READ COMMITTED, not %',
                        current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported';
    END IF;
    SELECT l.expires_at - clock_timestamp() INTO remaining
      FROM @schema@.leader_leases AS l
     WHERE l.role = p_role AND l.holder_token = p_token AND l.paused_at IS NULL
       AND @schema@.leader_lease_live(l.holder_id, l.expires_at, clock_timestamp());
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO @schema@.leader_fence_claims (xid, role, token)
    VALUES (pg_current_xact_id(), p_role, p_token)
    ON CONFLICT DO NOTHING;
    -- With SET CONSTRAINTS ... IMMEDIATE the check has fired already, at the
    -- INSERT, and would not run at COMMIT.
    PERFORM 1 FROM @schema@.leader_fence_claims AS c
     WHERE c.xid = pg_current_xact_id() AND c.role = p_role AND c.token = p_token;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ticklease: the fence''s commit check is deferred; SET CONSTRAINTS ... IMMEDIATE would skip it'
            USING ERRCODE = 'feature_not_supported';
    END IF;
    idle_ms := greatest(ceil(extract(epoch FROM remaining) * 1000)::bigint, 1000);
    IF current_setting('idle_in_transaction_session_timeout')::interval = interval '0'
       OR current_setting('idle_in_transaction_session_timeout')::interval > idle_ms * interval '1 millisecond' THEN
        PERFORM set_config('idle_in_transaction_session_timeout', idle_ms || 'ms', true);
    END IF;
    RETURN true;
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_fence_commit() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- At COMMIT of a transaction that passed the fence: the term must still be
-- live and unpaused. FOR KEY SHARE makes a takeover (FOR UPDATE) or a pause
-- (FOR UPDATE after its mark) wait for this commit to finish; it is held only
-- from here to the end of the commit.
BEGIN
    -- Fired early (SET CONSTRAINTS ... IMMEDIATE after the fence) or at
    -- PREPARE TRANSACTION, the check would hold its lock until a commit that
    -- may never come: refuse both.
    IF current_query() ~* '(set\s+constraints|prepare\s+transaction)' THEN
        RAISE EXCEPTION 'ticklease: a fenced transaction cannot set its constraints immediate or be prepared'
            USING ERRCODE = 'feature_not_supported';
    END IF;
    PERFORM 1 FROM @schema@.leader_leases AS l
     WHERE l.role = NEW.role AND l.holder_token = NEW.token AND l.paused_at IS NULL
       AND @schema@.leader_lease_live(l.holder_id, l.expires_at, clock_timestamp())
       FOR KEY SHARE;
    -- A second read with a fresh snapshot: a pause (a non-key update, which
    -- FOR KEY SHARE waited for but does not re-check) committed meanwhile.
    IF FOUND THEN
        PERFORM 1 FROM @schema@.leader_leases AS l
         WHERE l.role = NEW.role AND l.holder_token = NEW.token AND l.paused_at IS NULL
           AND @schema@.leader_lease_live(l.holder_id, l.expires_at, clock_timestamp());
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ticklease: the term (%, %) ended before this fenced transaction committed',
                        NEW.role, NEW.token
            USING ERRCODE = 'serialization_failure',
                  HINT = 'A superseded leader claims nothing; the claim was rolled back.';
    END IF;
    DELETE FROM @schema@.leader_fence_claims AS c
     WHERE c.xid = NEW.xid AND c.role = NEW.role AND c.token = NEW.token;
    RETURN NULL;
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_pause(p_role text, p_by text, p_reason text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Operator pause: ends the current term in the same statement and refuses
-- ACQUIRE until leader_unpause. The mark takes FOR NO KEY UPDATE, which no
-- claim holds, so it never waits for a claim; from its commit every fence
-- and every commit check fails. It then upgrades to FOR UPDATE, which waits
-- only for claims inside their commit (their check passed before the mark):
-- when pause returns, no claim of the paused term can still commit.
-- True when this call paused the role, false when it was paused already.
DECLARE
    changed boolean;
BEGIN
    IF p_by IS NULL OR btrim(p_by) = '' THEN
        RAISE EXCEPTION 'ticklease: leader_pause(%): who paused it must be named', p_role
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE @schema@.leader_leases AS l
       SET paused_at = now(), paused_by = p_by, pause_reason = coalesce(p_reason, ''),
           holder_id = NULL, acquired_at = NULL, expires_at = NULL
     WHERE l.role = p_role AND l.paused_at IS NULL
    RETURNING true INTO changed;
    PERFORM 1 FROM @schema@.leader_leases AS l WHERE l.role = p_role FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ticklease: unknown role %', p_role USING ERRCODE = 'no_data_found';
    END IF;
    RETURN coalesce(changed, false);
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_unpause(p_role text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Unpause leaves not_before alone: a role in a failure cooldown stays in it.
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
    RETURN true;
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_run_now(p_role text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Clears a cooldown (not_before) so the role runs at its next poll, e.g. after
-- the fix for a panicking tick shipped. True when a cooldown was cleared.
DECLARE
    had boolean;
BEGIN
    SELECT l.not_before IS NOT NULL INTO had FROM @schema@.leader_leases AS l WHERE l.role = p_role FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ticklease: unknown role %', p_role USING ERRCODE = 'no_data_found';
    END IF;
    UPDATE @schema@.leader_leases AS l SET not_before = NULL WHERE l.role = p_role;
    RETURN had;
END
$fn$
$def$,
$def$
-- The spec-named fence of 0001 was STABLE and unsound; callers built against
-- 0002 call leader_fence_lock. Both now are the one fence above.
CREATE OR REPLACE FUNCTION @schema@.leader_fence_lock(p_role text, p_token bigint) RETURNS boolean
LANGUAGE sql VOLATILE
AS $fn$ SELECT @schema@.leader_fence(p_role, p_token) $fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_seed(p_roles text[]) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    -- Creates the rows of roles that have none; existing rows are untouched.
    INSERT INTO @schema@.leader_leases (role) SELECT unnest(p_roles) ON CONFLICT (role) DO NOTHING
$fn$
$def$
    ] LOOP
        EXECUTE replace(def, '@schema@', quote_ident(current_schema()));
    END LOOP;
END
$migration$;


CREATE CONSTRAINT TRIGGER leader_fence_commit
    AFTER INSERT ON leader_fence_claims
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION leader_fence_commit();

-- Pin search_path (pg_temp last) on every SECURITY DEFINER function of this
-- schema, and revoke EXECUTE from PUBLIC on every function of ours.
DO $$
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

-- Grants one application role and/or one operator role (created if missing)
-- what they need and no more; either may be NULL. Idempotent; run again
-- (ticklease grant) for other role names.
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
        -- leader_status calls it with the reader's rights.
        EXECUTE format('GRANT EXECUTE ON FUNCTION leader_lease_live(text, timestamptz, timestamptz) TO %I', r);
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
                        leader_renew(text, bigint, bigint), leader_release(text, bigint, boolean, bigint),
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

-- Re-grant every role granted before (by 0002 or `ticklease grant`), which
-- also takes the app roles' direct UPDATE on leader_leases away.
DO $$
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

SELECT leader_grant(coalesce(nullif(current_setting('ticklease.app_role', true), ''), 'ticklease_app'),
                    coalesce(nullif(current_setting('ticklease.operator_role', true), ''), 'ticklease_operator'));

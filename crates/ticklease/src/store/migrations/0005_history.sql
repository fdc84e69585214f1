-- ticklease 0005: tick history (issue 15). One row per term that ended and
-- per operator event, written by the lease statements themselves (no extra
-- round trip): RELEASE records how its term ended, ACQUIRE records a term it
-- took over without a RELEASE (its holder died, froze or was cut off) as
-- lost, pause / unpause / run-now record who did it. Readable by the app and
-- operator roles, written only through these SECURITY DEFINER functions.
-- Retention is bounded per role by count and age, pruned by the writers
-- themselves on one write in 16 on average, at most 1,000 rows at a time
-- (no separate job). Every text is cut to 500 characters.

SET LOCAL lock_timeout = '5s';

CREATE TABLE leader_history (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    role        text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('term', 'pause', 'unpause', 'run_now')),
    at          timestamptz NOT NULL DEFAULT now(),
    -- A term: its token, holder and start; `at` is when it ended.
    token       bigint,
    holder_id   text,
    acquired_at timestamptz,
    outcome     text CHECK (outcome IN ('completed', 'interrupted', 'lost', 'failed', 'panicked')),
    -- Why a term was lost (a LossReason label, or expired / holder_gone when
    -- taken over without a RELEASE); why a role was paused.
    reason      text CHECK (length(reason) <= 500),
    -- Who paused, unpaused or ran it now.
    by          text CHECK (length(by) <= 500),
    -- A short summary of the error or panic that failed the tick.
    error       text CHECK (length(error) <= 500),
    CONSTRAINT leader_history_term_fields CHECK ((kind = 'term') = (token IS NOT NULL AND outcome IS NOT NULL))
);
-- At most one row per term: a RELEASE and a takeover racing for one term
-- record it once, whichever commits first.
CREATE UNIQUE INDEX leader_history_term ON leader_history (role, token) WHERE kind = 'term';
CREATE INDEX leader_history_role_id ON leader_history (role, id);
CREATE INDEX leader_history_at ON leader_history (at);

-- Retention, one row; change it with UPDATE as the schema owner.
CREATE TABLE leader_history_settings (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    keep_per_role integer NOT NULL DEFAULT 10000 CHECK (keep_per_role BETWEEN 10 AND 100000),
    keep_for      interval NOT NULL DEFAULT '30 days' CHECK (keep_for >= interval '1 hour')
);
INSERT INTO leader_history_settings DEFAULT VALUES;

DO $migration$
DECLARE
    def text;
BEGIN
    FOREACH def IN ARRAY ARRAY[
$def$
CREATE FUNCTION @schema@.leader_history_add(p_role text, p_kind text, p_token bigint, p_holder text,
                                             p_acquired_at timestamptz, p_outcome text, p_reason text,
                                             p_by text, p_error text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Appends one row and, on one write of the role in 16 on average (random:
-- ids are shared by every role, so a modulo would skip some roles for
-- good), prunes the role's history to its retention, at most 1,000 rows at
-- a time so a lowered setting never stalls a lease statement. The history
-- holds about keep_per_role + 16 rows per role.
DECLARE
    new_id bigint;
    keep @schema@.leader_history_settings;
BEGIN
    INSERT INTO @schema@.leader_history (role, kind, token, holder_id, acquired_at, outcome, reason, by, error)
    VALUES (p_role, p_kind, p_token, left(p_holder, 500), p_acquired_at, p_outcome, left(p_reason, 500),
            left(p_by, 500), left(p_error, 500))
    ON CONFLICT DO NOTHING
    RETURNING id INTO new_id;
    IF new_id IS NULL OR random() >= 1.0 / 16 THEN
        RETURN;
    END IF;
    SELECT * INTO keep FROM @schema@.leader_history_settings;
    DELETE FROM @schema@.leader_history AS h
     WHERE h.id IN (SELECT o.id FROM @schema@.leader_history AS o
                     WHERE o.role = p_role
                       AND (o.at < now() - keep.keep_for
                            OR o.id < (SELECT min(r.id) FROM (SELECT k.id FROM @schema@.leader_history AS k
                                                               WHERE k.role = p_role ORDER BY k.id DESC
                                                               LIMIT keep.keep_per_role) AS r))
                     ORDER BY o.id
                     LIMIT 1000);
END
$fn$
$def$,
$def$
CREATE FUNCTION @schema@.leader_release(p_role text, p_token bigint, p_stamp boolean, p_cooldown_ms bigint,
                                         p_outcome text, p_reason text, p_error text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- RELEASE as in 0004, recording how the term ended.
DECLARE
    cooldown interval := CASE WHEN p_cooldown_ms IS NOT NULL
                              THEN @schema@.leader_check_ms('cooldown', p_cooldown_ms) END;
    ended @schema@.leader_leases;
BEGIN
    IF p_stamp IS NULL OR p_outcome IS NULL
       OR p_outcome NOT IN ('completed', 'interrupted', 'lost', 'failed', 'panicked')
       OR p_reason NOT IN ('taken_over', 'paused', 'released', 'heartbeat_timeout') THEN
        RAISE EXCEPTION 'ticklease: leader_release needs p_stamp, an outcome and a known loss reason, got % / % / %',
                        p_stamp, p_outcome, left(p_reason, 40)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The lock RELEASE's UPDATE takes anyway (no key column changes), so it
    -- still never waits for a claim's commit check.
    SELECT * INTO ended FROM @schema@.leader_leases AS l
     WHERE l.role = p_role AND l.holder_token = p_token AND l.holder_id IS NOT NULL
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE @schema@.leader_leases AS l
       SET holder_id = NULL,
           acquired_at = NULL,
           expires_at = NULL,
           holder_key = NULL,
           last_tick_ended_at = CASE WHEN p_stamp THEN now() ELSE l.last_tick_ended_at END,
           last_tick_holder = CASE WHEN p_stamp THEN l.holder_id ELSE l.last_tick_holder END,
           not_before = now() + cooldown
     WHERE l.role = p_role;
    PERFORM @schema@.leader_history_add(p_role, 'term', p_token, ended.holder_id, ended.acquired_at,
                                        p_outcome, p_reason, NULL, p_error);
    PERFORM pg_notify('ticklease', 'release ' || p_role);
    RETURN true;
END
$fn$
$def$,
$def$
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
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_acquire(p_role text, p_holder text, p_ttl_ms bigint, p_interval_ms bigint, p_key bigint)
RETURNS TABLE (holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
               held boolean, paused_by text, pause_reason text, due_at timestamptz, holder_key bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- ACQUIRE as in 0004. A term it takes over that was never released (its
-- holder died, froze or lost its link) is recorded as lost: expired, or
-- holder_gone when its holder's coordination key was held no more. `s` is
-- the row as of the statement's start; if a RELEASE of that term committed
-- in between, it recorded the term first and this row is not written.
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
    ),
    taken_over AS (
        SELECT @schema@.leader_history_add(p_role, 'term', s.holder_token, s.holder_id, s.acquired_at, 'lost',
                   CASE WHEN s.expires_at <= now() THEN 'expired' ELSE 'holder_gone' END, NULL, NULL)
          FROM acquired AS a
          JOIN @schema@.leader_leases AS s ON s.role = p_role AND s.holder_id IS NOT NULL
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
      LEFT JOIN @schema@.leader_leases AS s ON s.role = p_role
      -- Referenced, so the planner cannot drop the join and the row with it.
      JOIN (SELECT count(*) AS n FROM taken_over) AS recorded ON recorded.n IS NOT NULL;
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_pause(p_role text, p_by text, p_reason text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Pause as in 0004, recording the pause and the term it ended (lost: paused).
DECLARE
    ended @schema@.leader_leases;
    changed boolean;
BEGIN
    IF p_by IS NULL OR btrim(p_by) = '' THEN
        RAISE EXCEPTION 'ticklease: leader_pause(%): who paused it must be named', p_role
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The mark's own lock (it conflicts with no claim), taken first so the
    -- term recorded is the one the mark ends.
    SELECT * INTO ended FROM @schema@.leader_leases AS l WHERE l.role = p_role FOR NO KEY UPDATE;
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
        IF ended.holder_id IS NOT NULL THEN
            PERFORM @schema@.leader_history_add(p_role, 'term', ended.holder_token, ended.holder_id,
                                                ended.acquired_at, 'lost',
                                                CASE WHEN ended.expires_at <= now() THEN 'expired' ELSE 'paused' END,
                                                NULL, NULL);
        END IF;
        PERFORM @schema@.leader_history_add(p_role, 'pause', NULL, NULL, NULL, NULL,
                                            coalesce(p_reason, ''), p_by, NULL);
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
-- Unpause as in 0004, recorded with the session's login user.
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
    PERFORM @schema@.leader_history_add(p_role, 'unpause', NULL, NULL, NULL, NULL, NULL, session_user, NULL);
    PERFORM pg_notify('ticklease', 'unpause ' || p_role);
    RETURN true;
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_run_now(p_role text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Run-now as in 0004, recorded with the session's login user.
DECLARE
    had boolean;
BEGIN
    SELECT l.not_before IS NOT NULL INTO had FROM @schema@.leader_leases AS l WHERE l.role = p_role FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ticklease: unknown role %', p_role USING ERRCODE = 'no_data_found';
    END IF;
    UPDATE @schema@.leader_leases AS l SET not_before = NULL WHERE l.role = p_role;
    PERFORM @schema@.leader_history_add(p_role, 'run_now', NULL, NULL, NULL, NULL, NULL, session_user, NULL);
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

-- Each role's last recorded term outcome, for `ticklease status`.
CREATE OR REPLACE VIEW leader_status AS
SELECT l.role,
       leader_term_live(l.holder_id, l.expires_at, l.holder_key, statement_timestamp()) AS held,
       l.holder_id,
       l.holder_token,
       l.acquired_at,
       l.expires_at,
       statement_timestamp() AS db_now,
       CASE WHEN leader_term_live(l.holder_id, l.expires_at, l.holder_key, statement_timestamp())
            THEN l.expires_at - statement_timestamp() END AS remaining,
       l.paused_at,
       l.paused_by,
       l.pause_reason,
       l.last_tick_ended_at,
       l.last_tick_holder,
       l.not_before,
       (SELECT h.outcome FROM leader_history AS h
         WHERE h.role = l.role AND h.kind = 'term' ORDER BY h.id DESC LIMIT 1) AS last_outcome
  FROM leader_leases AS l;

SELECT leader_secure_functions();
REVOKE ALL ON leader_history, leader_history_settings FROM PUBLIC;

-- leader_grant of 0004, granting the history too.
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
        EXECUTE format('GRANT SELECT ON leader_status, leader_history, ticklease_schema_migrations TO %I', r);
        -- leader_status calls them with the reader's rights.
        EXECUTE format('GRANT EXECUTE ON FUNCTION leader_lease_live(text, timestamptz, timestamptz),
                        leader_key_alive(bigint), leader_term_live(text, timestamptz, bigint, timestamptz)
                        TO %I', r);
    END LOOP;
    IF p_app IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pg_roles r, pg_class c
                    WHERE r.rolname = p_app AND c.oid = 'leader_leases'::regclass
                      AND (r.rolsuper OR pg_has_role(r.oid, c.relowner, 'USAGE'))) THEN
            RAISE EXCEPTION 'ticklease: % owns the schema (or is a superuser): it cannot be the application role', p_app
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Create a separate login role for the application, a member of the app role.';
        END IF;
        -- The app reads the tables and writes them only through these functions.
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON leader_leases, leader_history FROM %I', p_app);
        EXECUTE format('GRANT SELECT ON leader_leases TO %I', p_app);
        EXECUTE format('GRANT EXECUTE ON FUNCTION leader_acquire(text, text, bigint, bigint),
                        leader_acquire(text, text, bigint, bigint, bigint),
                        leader_renew(text, bigint, bigint), leader_renew(text, bigint, bigint, bigint),
                        leader_release(text, bigint, boolean, bigint),
                        leader_release(text, bigint, boolean, bigint, text, text, text),
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

SELECT leader_regrant();

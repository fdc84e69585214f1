-- The lease statements of one role: ACQUIRE, RENEW, RELEASE, each
-- term-scoped by (role, token), and the seeding of declared roles.

-- Generation 7: ACQUIRE's first step.
CREATE OR REPLACE FUNCTION @schema@.leader_drain_for_takeover(p_role text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $fn$
-- When p_role's row is held by a term that is neither live nor paused,
-- drains that term's claims in flight (leader_fence_drain) and says whether
-- it may be taken over: its row is then locked FOR UPDATE by this
-- transaction, and no claim of the term holds it. Otherwise one read
-- without a lock: a live, paused, released or missing row needs no drain
-- (a RELEASE and a pause drained their own term). Liveness is judged at
-- now(), as the upsert after it judges it.
DECLARE
    r record;
BEGIN
    SELECT l.holder_id, l.holder_token, l.expires_at, l.holder_key, l.paused_at INTO r
      FROM @schema@.leader_leases AS l
     WHERE l.role = p_role;
    IF NOT FOUND OR r.holder_id IS NULL OR r.paused_at IS NOT NULL
       OR @schema@.leader_term_live(r.holder_id, r.expires_at, r.holder_key, now()) THEN
        RETURN false;
    END IF;
    RETURN cardinality(@schema@.leader_fence_drain(ARRAY[p_role], ARRAY[r.holder_token], false)) > 0;
END
$fn$;

-- Generation 5 added the explicit answer (acquired, reason) under a new
-- name: a new row type under the old name would break every caller that
-- prepared `SELECT * FROM leader_acquire(...)` ("cached plan must not
-- change result type"). The old name keeps its row, delegating here
-- (70_compatibility.sql); so do RENEW and the occurrence ACQUIRE.
CREATE OR REPLACE FUNCTION @schema@.leader_acquire_v2(p_role text, p_holder text, p_ttl_ms bigint, p_interval_ms bigint, p_key bigint,
                                        p_long_lived boolean)
RETURNS TABLE (holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
               held boolean, paused_by text, pause_reason text, due_at timestamptz, holder_key bigint,
               acquired boolean, reason text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- ACQUIRE: starts a term when the role is unheld (or its term expired, or
-- its holder's coordination key is gone), unpaused and due; otherwise
-- says who holds it until when. A holder id over 200 characters is
-- refused (as the batched ACQUIRE does). A term it takes over that was never released (its
-- holder died, froze or lost its link) is recorded as lost: expired, or
-- holder_gone when its holder's coordination key was held no more; and the
-- transactions still open in it are ended (leader_fence_sweep). `s` is
-- the row as of the statement's start; if a RELEASE of that term committed
-- in between, it recorded the term first and this row is not written.
-- A started term records whether the role is long-lived (p_long_lived: its
-- work runs for the whole term, so its health is being held, not ticking)
-- and its interval, for readers (metrics: the stall alert's threshold).
-- `acquired` says whether a term started; `reason` why not, in the order a
-- client acts on: paused, held (a live term), not_due (due_at ahead), or
-- contended (another statement changed the row meanwhile: ask again soon).
-- A held term that is no longer live is taken over only once its claims in
-- flight are drained (generation 7: leader_fence_drain, which waits for the
-- fence's row locks at most a grace and then ends their backends); the
-- upsert itself names no key column, so it never waits for a claim.
#variable_conflict use_column
DECLARE
    drained boolean;
BEGIN
    PERFORM @schema@.leader_check_role('leader_acquire', p_role);
    IF p_holder IS NULL OR length(p_holder) > 200 THEN
        RAISE EXCEPTION 'ticklease: leader_acquire needs a holder id of at most 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_long_lived IS NULL THEN
        RAISE EXCEPTION 'ticklease: leader_acquire needs p_long_lived (true or false)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Bounds first, in a statement of their own: a refusal from inside the
    -- statement below would carry its whole text in the error's CONTEXT.
    PERFORM @schema@.leader_check_ms('lease_ttl', p_ttl_ms), @schema@.leader_check_ms('interval', p_interval_ms);
    PERFORM @schema@.leader_require_key(p_key);
    drained := @schema@.leader_drain_for_takeover(p_role);
    RETURN QUERY
    WITH started AS (
        INSERT INTO @schema@.leader_leases AS l (role, holder_token, holder_id, acquired_at, expires_at, holder_key,
                                                 long_lived, tick_interval_ms, fence_salt)
        VALUES (p_role, @schema@.leader_token_seed(), p_holder, now(),
                now() + @schema@.leader_check_ms('lease_ttl', p_ttl_ms), p_key, p_long_lived, p_interval_ms,
                @schema@.leader_fence_salt())
        ON CONFLICT (role) DO UPDATE
           SET holder_token = greatest(l.holder_token + 1, @schema@.leader_token_seed()),
               fence_salt = EXCLUDED.fence_salt,
               holder_id = EXCLUDED.holder_id,
               acquired_at = EXCLUDED.acquired_at,
               expires_at = EXCLUDED.expires_at,
               holder_key = EXCLUDED.holder_key,
               long_lived = EXCLUDED.long_lived,
               tick_interval_ms = EXCLUDED.tick_interval_ms,
               -- An interval tick is no occurrence: a role moved off a cron schedule
               -- keeps only where its counting stands (last_occurrence).
               occurrence = NULL,
               -- An operator's run-now that waited makes this term its manual run.
               manual_by = l.run_now_by,
               run_now_by = NULL,
               schedule = NULL,
               next_occurrence = NULL
         WHERE l.paused_at IS NULL
           AND NOT @schema@.leader_term_live(l.holder_id, l.expires_at, l.holder_key, now())
           AND (l.holder_id IS NULL OR drained)
           AND ((l.last_tick_ended_at IS NULL
                 OR l.last_tick_ended_at <= now() - @schema@.leader_check_ms('interval', p_interval_ms))
                AND coalesce(greatest(l.not_before, l.pause_wait_until) <= now(), true)
                -- A run-now is due at once (generation 6), whatever the interval and
                -- the cooldown, but not before a pause's wait (as a cron role's).
                OR (l.run_now_by IS NOT NULL AND NOT @schema@.leader_pause_waits(l.pause_wait_until, now())))
        RETURNING l.holder_token
    ),
    taken_over AS (
        SELECT @schema@.leader_history_add(p_role, 'term', s.holder_token, s.holder_id, s.acquired_at, 'lost',
                   CASE WHEN s.expires_at <= now() THEN 'expired' ELSE 'holder_gone' END, s.manual_by, NULL),
               @schema@.leader_fence_sweep(ARRAY[p_role])
          FROM started AS a
          JOIN @schema@.leader_leases AS s ON s.role = p_role AND s.holder_id IS NOT NULL
    )
    SELECT a.holder_token,
           now(),
           s.holder_id,
           s.expires_at,
           @schema@.leader_term_live(s.holder_id, s.expires_at, s.holder_key, now()),
           s.paused_by,
           s.pause_reason,
           greatest(s.last_tick_ended_at + @schema@.leader_check_ms('interval', p_interval_ms), s.not_before,
                    s.pause_wait_until),
           s.holder_key,
           a.holder_token IS NOT NULL,
           CASE WHEN a.holder_token IS NOT NULL THEN NULL
                WHEN s.paused_at IS NOT NULL THEN 'paused'
                WHEN @schema@.leader_term_live(s.holder_id, s.expires_at, s.holder_key, now()) THEN 'held'
                WHEN greatest(s.last_tick_ended_at + @schema@.leader_check_ms('interval', p_interval_ms),
                              s.not_before, s.pause_wait_until) > now() THEN 'not_due'
                ELSE 'contended' END
      FROM (SELECT 1) AS one
      LEFT JOIN started AS a ON true
      LEFT JOIN @schema@.leader_leases AS s ON s.role = p_role
      -- Referenced, so the planner cannot drop the join and the row with it.
      JOIN (SELECT count(*) AS n FROM taken_over) AS recorded ON recorded.n IS NOT NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_occurrence_runnable(p_occurrence timestamptz, p_before timestamptz,
                                                    p_after timestamptz, p_not_before timestamptz)
RETURNS boolean
LANGUAGE sql STABLE
AS $fn$
    -- An occurrence runs once the database clock reached it and the role's
    -- cooldown (p_not_before) passed, when it is later than the last
    -- completed one (p_after) and, if the caller says it must be the
    -- latest, before the next one (p_before).
    SELECT p_occurrence IS NOT NULL AND p_occurrence <= now() AND p_occurrence > p_after
           AND (p_before IS NULL OR now() < p_before)
           AND (p_not_before IS NULL OR p_not_before <= now())
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_occurrence_floor(p_last timestamptz, p_since timestamptz,
                                                          p_started timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE
AS $fn$
    -- Occurrences at or before this never run (one role): the last completed
    -- one; before any, where the role's counting started (its first look),
    -- less a minute while no occurrence ever started (p_started, the row's
    -- last asked occurrence, is NULL). So a role's first occurrence may be
    -- up to a minute older than its first look: a crontab line that starts
    -- `ticklease run --once` just after its own occurrence runs it. The
    -- caller asks for at most the latest occurrence of that minute, and
    -- counts none of it as skipped (Schedule::due).
    SELECT coalesce(p_last, CASE WHEN p_started IS NULL THEN p_since - interval '1 minute' ELSE p_since END)
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_overtaken_summary(p_occurrence timestamptz)
RETURNS text
LANGUAGE sql STABLE
AS $fn$
    -- The skipped summary of one occurrence a later one overtook (generation 6):
    -- it started, its term was never released (its holder died or froze
    -- mid-run), and a term of a later occurrence took over, so it never runs.
    -- A released term's occurrence was attempted: it is not counted again;
    -- nor is the occurrence a manual term leaves on the row (it ran none).
    SELECT '1 occurrence from ' || to_char(p_occurrence AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
           || ' to ' || to_char(p_occurrence AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
$fn$;

-- Generation 5: the explicit answer under a new name, as leader_acquire_v2.
CREATE OR REPLACE FUNCTION @schema@.leader_acquire_occurrence_v2(p_role text, p_holder text, p_ttl_ms bigint,
                                                    p_occurrence timestamptz, p_before timestamptz, p_key bigint,
                                                    p_skipped_reasons text[], p_skipped_summaries text[],
                                                    p_schedule text, p_next timestamptz)
RETURNS TABLE (holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
               held boolean, paused_by text, pause_reason text, due_at timestamptz, holder_key bigint,
               after_occurrence timestamptz, failures integer, manual_by text, run_now_pending boolean,
               last_paused_at timestamptz, last_unpaused_at timestamptz, acquired boolean, reason text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- ACQUIRE of one occurrence of a cron schedule: starts a term for
-- p_occurrence when the database clock has reached it, it is later than
-- the last completed occurrence (or, before any, than occurrences_since,
-- less a minute for a role's first occurrence: leader_occurrence_floor),
-- it is still the latest one when the caller says it must be (p_before:
-- the occurrence after it, not reached yet), and the role is unheld,
-- unpaused and out of its cooldown, as ACQUIRE. A NULL occurrence starts
-- nothing: it tells the caller where counting starts (`after_occurrence`)
-- and the database's now, setting occurrences_since on a role's first
-- look. The occurrence arithmetic (cron, zones) is the caller's; this
-- decides on the database clock alone. A started term records the skipped
-- occurrences the caller names (at most 3 summaries: reason and text),
-- and, for operators, the caller's schedule (text) and the occurrence after
-- the one it runs (p_next); a role's first look records the schedule too.
-- An operator's run-now (run_now_by) starts a manual term when no asked
-- occurrence is runnable: it runs no occurrence (its `occurrence` stays the
-- last asked one), and its RELEASE completes none.
-- A term it takes over is recorded and swept as in leader_acquire. The
-- answer carries the role's last pause (when paused and unpaused), so the
-- caller can name the occurrences that fell due while it was paused.
-- `acquired` and `reason` as in leader_acquire, with one more reason:
-- not_runnable (no occurrence asked, or the asked one completed already,
-- is not after after_occurrence, or is no longer the latest). A held term
-- no longer live is drained first, as in leader_acquire.
#variable_conflict use_column
DECLARE
    drained boolean;
BEGIN
    IF p_holder IS NULL OR length(p_holder) > 200 THEN
        RAISE EXCEPTION 'ticklease: leader_acquire_occurrence needs a holder id of at most 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @schema@.leader_check_role('leader_acquire_occurrence', p_role);
    -- In a statement of its own, as leader_acquire's bounds.
    PERFORM @schema@.leader_check_ms('lease_ttl', p_ttl_ms);
    IF NOT isfinite(p_occurrence) OR NOT isfinite(p_before) OR NOT isfinite(p_next)
       OR p_next <= p_occurrence OR p_next > now() + interval '100 years'
       OR p_occurrence < '1970-01-01' OR length(p_schedule) > 200
       OR coalesce(cardinality(p_skipped_reasons), 0) > 3
       OR coalesce(cardinality(p_skipped_reasons), 0) <> coalesce(cardinality(p_skipped_summaries), 0)
       OR EXISTS (SELECT 1 FROM unnest(p_skipped_reasons) AS r WHERE r IS NULL OR r NOT IN ('deadline', 'paused', 'catch_up')) THEN
        RAISE EXCEPTION 'ticklease: leader_acquire_occurrence needs finite instants (the next after the asked one, within 100 years), a schedule of at most 200 characters and at most 3 skipped summaries with known reasons'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @schema@.leader_require_key(p_key);
    -- A role's first look: counting starts now (a new schedule does not run
    -- the past, but for its first occurrence: leader_occurrence_floor).
    IF NOT EXISTS (SELECT 1 FROM @schema@.leader_leases AS l
                    WHERE l.role = p_role AND (l.occurrences_since IS NOT NULL OR l.last_occurrence IS NOT NULL)) THEN
        INSERT INTO @schema@.leader_leases AS l (role, holder_token, occurrences_since, schedule)
        VALUES (p_role, @schema@.leader_token_seed(), now(), p_schedule)
        ON CONFLICT (role) DO UPDATE SET occurrences_since = now(), schedule = p_schedule
         WHERE l.occurrences_since IS NULL AND l.last_occurrence IS NULL;
    END IF;
    -- A look records the caller's schedule when the row shows another or none
    -- (a role back from an interval): operators and run-now see a cron role.
    IF p_occurrence IS NULL THEN
        UPDATE @schema@.leader_leases AS l SET schedule = p_schedule
         WHERE l.role = p_role AND l.schedule IS DISTINCT FROM p_schedule;
    END IF;
    drained := @schema@.leader_drain_for_takeover(p_role);
    RETURN QUERY
    WITH upserted AS (
        -- The upsert's conflict path names no key column (generation 7), so
        -- it never waits for a claim: a held term is taken over only once
        -- drained. Its insert path (a row forgotten since the look above)
        -- creates an unheld row, counting from now, and starts nothing.
        INSERT INTO @schema@.leader_leases AS l (role, holder_token, occurrences_since, schedule)
        VALUES (p_role, @schema@.leader_token_seed(), now(), p_schedule)
        ON CONFLICT (role) DO UPDATE
           SET holder_token = greatest(l.holder_token + 1, @schema@.leader_token_seed()),
               fence_salt = @schema@.leader_fence_salt(),
               holder_id = p_holder,
               acquired_at = now(),
               expires_at = now() + @schema@.leader_check_ms('lease_ttl', p_ttl_ms),
               holder_key = p_key,
               failures = CASE WHEN NOT @schema@.leader_occurrence_runnable(
                                       p_occurrence, p_before, @schema@.leader_occurrence_floor(l.last_occurrence, l.occurrences_since, l.occurrence),
                                          greatest(l.not_before, l.pause_wait_until))
                               THEN l.failures
                               WHEN l.occurrence IS NOT DISTINCT FROM p_occurrence THEN l.failures ELSE 0 END,
               occurrence = CASE WHEN @schema@.leader_occurrence_runnable(
                                          p_occurrence, p_before, @schema@.leader_occurrence_floor(l.last_occurrence, l.occurrences_since, l.occurrence),
                                          greatest(l.not_before, l.pause_wait_until))
                                 THEN p_occurrence ELSE l.occurrence END,
               next_occurrence = CASE WHEN @schema@.leader_occurrence_runnable(
                                          p_occurrence, p_before, @schema@.leader_occurrence_floor(l.last_occurrence, l.occurrences_since, l.occurrence),
                                          greatest(l.not_before, l.pause_wait_until))
                                 THEN p_next ELSE l.next_occurrence END,
               manual_by = CASE WHEN @schema@.leader_occurrence_runnable(
                                          p_occurrence, p_before, @schema@.leader_occurrence_floor(l.last_occurrence, l.occurrences_since, l.occurrence),
                                          greatest(l.not_before, l.pause_wait_until))
                                THEN NULL ELSE l.run_now_by END,
               run_now_by = CASE WHEN @schema@.leader_occurrence_runnable(
                                          p_occurrence, p_before, @schema@.leader_occurrence_floor(l.last_occurrence, l.occurrences_since, l.occurrence),
                                          greatest(l.not_before, l.pause_wait_until))
                                 THEN l.run_now_by END,
               schedule = p_schedule,
               -- A cron role has no interval and is no long-lived one.
               tick_interval_ms = NULL,
               long_lived = false
         WHERE l.paused_at IS NULL
           AND NOT @schema@.leader_term_live(l.holder_id, l.expires_at, l.holder_key, now())
           AND (l.holder_id IS NULL OR drained)
           -- A manual run waits for no cooldown (it is asked for at once), only for a pause's wait.
           AND (@schema@.leader_occurrence_runnable(p_occurrence, p_before, @schema@.leader_occurrence_floor(l.last_occurrence, l.occurrences_since, l.occurrence),
                                          greatest(l.not_before, l.pause_wait_until))
                OR (l.run_now_by IS NOT NULL
                    AND NOT @schema@.leader_pause_waits(l.pause_wait_until, now())))
        RETURNING l.holder_token, l.holder_id, l.manual_by
    ),
    began AS (
        SELECT u.holder_token, u.manual_by FROM upserted AS u WHERE u.holder_id IS NOT NULL
    ),
    taken_over AS (
        SELECT @schema@.leader_history_add(p_role, 'term', s.holder_token, s.holder_id, s.acquired_at, 'lost',
                   CASE WHEN s.expires_at <= now() THEN 'expired' ELSE 'holder_gone' END, s.manual_by, NULL),
               @schema@.leader_fence_sweep(ARRAY[p_role])
          FROM began AS a
          JOIN @schema@.leader_leases AS s ON s.role = p_role AND s.holder_id IS NOT NULL
    ),
    skipped AS (
        SELECT @schema@.leader_history_add(p_role, 'skipped', NULL, NULL, NULL, NULL, k.reason, NULL, k.summary)
          FROM began AS a
          CROSS JOIN unnest(p_skipped_reasons, p_skipped_summaries) AS k (reason, summary)
         WHERE a.manual_by IS NULL
        UNION ALL
        -- The occurrence the row last started, never completed, that this later one overtakes.
        SELECT @schema@.leader_history_add(p_role, 'skipped', NULL, NULL, NULL, NULL, 'overtaken', NULL,
                   @schema@.leader_overtaken_summary(s.occurrence))
          FROM began AS a
          JOIN @schema@.leader_leases AS s ON s.role = p_role
         WHERE a.manual_by IS NULL AND s.holder_id IS NOT NULL AND s.manual_by IS NULL
           AND s.occurrence < p_occurrence
           AND s.occurrence > coalesce(s.last_occurrence, s.occurrences_since)
    )
    SELECT a.holder_token,
           now(),
           s.holder_id,
           s.expires_at,
           @schema@.leader_term_live(s.holder_id, s.expires_at, s.holder_key, now()),
           s.paused_by,
           s.pause_reason,
           CASE WHEN greatest(s.not_before, s.pause_wait_until) > now() THEN greatest(s.not_before, s.pause_wait_until)
                WHEN p_occurrence > now() THEN p_occurrence END,
           s.holder_key,
           coalesce(s.last_occurrence, s.occurrences_since),
           CASE WHEN s.occurrence IS NOT DISTINCT FROM p_occurrence THEN s.failures ELSE 0 END,
           a.manual_by,
           -- The row as it was before this statement: a run-now this did not start still waits.
           s.run_now_by IS NOT NULL AND a.manual_by IS NULL,
           s.last_paused_at,
           s.last_unpaused_at,
           a.holder_token IS NOT NULL,
           CASE WHEN a.holder_token IS NOT NULL THEN NULL
                WHEN s.paused_at IS NOT NULL THEN 'paused'
                WHEN @schema@.leader_term_live(s.holder_id, s.expires_at, s.holder_key, now()) THEN 'held'
                WHEN greatest(s.not_before, s.pause_wait_until) > now() OR p_occurrence > now() THEN 'not_due'
                -- Startable as the row was before: another statement won it meanwhile.
                WHEN @schema@.leader_occurrence_runnable(p_occurrence, p_before,
                         @schema@.leader_occurrence_floor(s.last_occurrence, s.occurrences_since, s.occurrence),
                         greatest(s.not_before, s.pause_wait_until))
                     OR (s.run_now_by IS NOT NULL AND NOT @schema@.leader_pause_waits(s.pause_wait_until, now()))
                     THEN 'contended'
                ELSE 'not_runnable' END
      FROM (SELECT 1) AS one
      LEFT JOIN began AS a ON true
      LEFT JOIN @schema@.leader_leases AS s ON s.role = p_role
      -- Referenced, so the planner cannot drop the joins and the rows with them.
      JOIN (SELECT count(*) AS n FROM taken_over) AS recorded ON recorded.n IS NOT NULL
      JOIN (SELECT count(*) AS n FROM skipped) AS noted ON noted.n IS NOT NULL;
END
$fn$;

-- Generation 5: the loss's reason under a new name, as leader_acquire_v2.
CREATE OR REPLACE FUNCTION @schema@.leader_renew_v2(p_role text, p_token bigint, p_ttl_ms bigint, p_key bigint)
RETURNS TABLE (renewed boolean, db_now timestamptz, holder_token bigint, holder_id text, paused boolean,
               reason text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- RENEW: extends the term while (role, token) still holds it; it records the holder's current coordination key (a
-- replica whose session reconnected has a new one; NULL: none now). A lost
-- term's reason is the one its RELEASE passes on: paused, taken_over (a later
-- term started), or released (ended before, or the row forgotten).
BEGIN
    -- In a statement of its own, as leader_acquire's bounds.
    PERFORM @schema@.leader_check_ms('lease_ttl', p_ttl_ms), @schema@.leader_require_key(p_key);
    UPDATE @schema@.leader_leases AS l
       SET expires_at = now() + @schema@.leader_check_ms('lease_ttl', p_ttl_ms),
           holder_key = p_key
     WHERE l.role = p_role AND l.holder_token = p_token AND l.holder_id IS NOT NULL;
    IF FOUND THEN
        RETURN QUERY SELECT true, now(), p_token, NULL::text, false, NULL::text;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT false, now(), s.holder_token, s.holder_id, s.paused_at IS NOT NULL,
               CASE WHEN s.paused_at IS NOT NULL THEN 'paused'
                    WHEN s.holder_token <> p_token THEN 'taken_over'
                    ELSE 'released' END
          FROM (SELECT 1) AS one
          LEFT JOIN @schema@.leader_leases AS s ON s.role = p_role;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_check_release(p_stamp boolean, p_cooldown_ms bigint, p_outcome text,
                                                         p_reason text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $fn$
-- The values a RELEASE takes, checked before it looks at the term (so a
-- refused call ends nothing), one entry at a time by the batched RELEASE too.
BEGIN
    IF p_stamp IS NULL OR p_outcome IS NULL
       OR p_outcome NOT IN ('completed', 'interrupted', 'lost', 'failed', 'panicked')
       OR p_reason NOT IN ('taken_over', 'paused', 'released', 'heartbeat_timeout', 'superseded') THEN
        RAISE EXCEPTION 'ticklease: leader_release needs p_stamp, an outcome and a known loss reason, got % / % / %',
                        p_stamp, p_outcome, left(p_reason, 40)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_cooldown_ms <> 0 THEN
        PERFORM @schema@.leader_check_ms('cooldown', p_cooldown_ms);
    END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_release(p_role text, p_token bigint, p_stamp boolean, p_cooldown_ms bigint,
                                         p_outcome text, p_reason text, p_error text, p_output text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- RELEASE: ends the term (role, token), stamps a completed tick (and its
-- occurrence, for a cron schedule) and the cooldown, counts a failed
-- attempt, and records how the term ended, with the last part of what its
-- work said (p_output: its last 4,000 characters are kept). It notifies no one:
-- the library notifies after the commit, in a statement of its own. The
-- RELEASE of a term a pause ended (still the row's last term) ends the
-- wait the pause set for it (leader_pause) and returns false: its holder's
-- work has stopped, so the next term need not wait for its lease.
DECLARE
    cooldown interval;
    ended @schema@.leader_leases;
BEGIN
    PERFORM @schema@.leader_check_release(p_stamp, p_cooldown_ms, p_outcome, p_reason);
    -- NULL and 0 are no cooldown (generation 5 accepts 0, once refused).
    cooldown := CASE WHEN p_cooldown_ms <> 0 THEN @schema@.leader_check_ms('cooldown', p_cooldown_ms) END;
    -- The term's claims in flight first (generation 7): the row is locked
    -- FOR UPDATE once they ended or the grace ran out and their backends
    -- were ended, so no claim of the term commits after its RELEASE. A
    -- paused term was drained by its pause.
    PERFORM @schema@.leader_fence_drain(ARRAY[p_role], ARRAY[p_token], true);
    SELECT * INTO ended FROM @schema@.leader_leases AS l
     WHERE l.role = p_role AND l.holder_token = p_token AND l.holder_id IS NOT NULL
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        -- No term started since the pause (the token is the ended one's).
        UPDATE @schema@.leader_leases AS l
           SET pause_wait_until = NULL
         WHERE l.role = p_role AND l.holder_token = p_token AND l.holder_id IS NULL
           AND l.pause_wait_until IS NOT NULL;
        RETURN false;
    END IF;
    UPDATE @schema@.leader_leases AS l
       SET holder_id = NULL,
           acquired_at = NULL,
           expires_at = NULL,
           holder_key = NULL,
           last_tick_ended_at = CASE WHEN p_stamp THEN now() ELSE l.last_tick_ended_at END,
           last_tick_holder = CASE WHEN p_stamp THEN l.holder_id ELSE l.last_tick_holder END,
           -- A completed occurrence is never run again; a failed one counts an
           -- attempt. A manual run (run-now) does neither.
           last_occurrence = CASE WHEN p_stamp AND l.occurrence IS NOT NULL AND l.manual_by IS NULL
                                  THEN greatest(l.last_occurrence, l.occurrence) ELSE l.last_occurrence END,
           failures = CASE WHEN l.manual_by IS NOT NULL THEN l.failures
                           WHEN p_stamp THEN 0
                           WHEN p_outcome IN ('failed', 'panicked') THEN least(l.failures + 1, 1000000)
                           ELSE l.failures END,
           manual_by = NULL,
           -- A manual run leaves the cooldown (a failed occurrence's backoff) alone.
           not_before = CASE WHEN l.manual_by IS NULL THEN now() + cooldown ELSE l.not_before END
     WHERE l.role = p_role;
    -- A manual run's row names who asked for it.
    PERFORM @schema@.leader_history_add(p_role, 'term', p_token, ended.holder_id, ended.acquired_at,
                                        p_outcome, p_reason, ended.manual_by, p_error, p_output);
    RETURN true;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_seed(p_roles text[]) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    -- Creates the rows of roles that have none; existing rows are untouched.
    INSERT INTO @schema@.leader_leases (role) SELECT unnest(p_roles) ON CONFLICT (role) DO NOTHING
$fn$;

-- The operator's surface: pause, unpause, run now, forget a role.

CREATE OR REPLACE FUNCTION @schema@.leader_pause(p_role text, p_by text, p_reason text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Pause: ends the current term (its claims refused from here on), marks
-- the role paused so no ACQUIRE starts a term, and records the pause and the term it ended (lost: paused).
-- Who and why are cut to 200 and 500 characters, as the history keeps them.
-- The next term waits until the ended term's lease would have run out,
-- unless its holder RELEASEs it first, once its work stopped
-- (pause_wait_until, read with not_before by every ACQUIRE; leader_release
-- ends it; leader_pause_waits): the holder learns of the pause only
-- at its next RENEW or notification, and its unfenced work may take its
-- grace to stop, so an unpause within that time must not start the next
-- term beside it. It notifies no one (see leader_release).
DECLARE
    ended @schema@.leader_leases;
    changed boolean;
BEGIN
    p_by := left(p_by, 200);
    p_reason := left(p_reason, 500);
    IF p_by IS NULL OR btrim(p_by) = '' THEN
        RAISE EXCEPTION 'ticklease: leader_pause(%): who paused it must be named', p_role
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The mark's own lock, taken first so the term recorded is the one the
    -- mark ends: it keeps ACQUIRE and RENEW out, not the claims.
    SELECT * INTO ended FROM @schema@.leader_leases AS l WHERE l.role = p_role FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ticklease: unknown role %', p_role USING ERRCODE = 'no_data_found';
    END IF;
    -- Then the term's claims in flight (generation 7): the row is locked
    -- FOR UPDATE once they ended, or the grace ran out and their backends
    -- were ended, so no claim of the paused term commits after the pause.
    IF ended.holder_id IS NOT NULL AND ended.paused_at IS NULL THEN
        PERFORM @schema@.leader_fence_drain(ARRAY[p_role], ARRAY[ended.holder_token], true);
    END IF;
    UPDATE @schema@.leader_leases AS l
       SET paused_at = now(), paused_by = p_by, pause_reason = coalesce(p_reason, ''),
           holder_id = NULL, acquired_at = NULL, expires_at = NULL, holder_key = NULL,
           pause_wait_until = CASE WHEN l.holder_id IS NOT NULL AND l.expires_at > now()
                                   THEN l.expires_at ELSE l.pause_wait_until END
     WHERE l.role = p_role AND l.paused_at IS NULL
    RETURNING true INTO changed;
    IF changed THEN
        IF ended.holder_id IS NOT NULL THEN
            PERFORM @schema@.leader_history_add(p_role, 'term', ended.holder_token, ended.holder_id,
                                                ended.acquired_at, 'lost',
                                                CASE WHEN ended.expires_at <= now() THEN 'expired' ELSE 'paused' END,
                                                ended.manual_by, NULL);
        END IF;
        PERFORM @schema@.leader_history_add(p_role, 'pause', NULL, NULL, NULL, NULL,
                                            coalesce(p_reason, ''), p_by, NULL);
        -- The paused term's generation-6 claims end (their COMMIT would fail).
        PERFORM @schema@.leader_fence_sweep(ARRAY[p_role]);
    END IF;
    RETURN coalesce(changed, false);
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_unpause(p_role text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Unpause: ACQUIRE may start terms again; recorded with the session's login user; it notifies
-- no one (see leader_release).
DECLARE
    changed boolean;
BEGIN
    -- The pause's window stays, for the occurrences it passed over.
    UPDATE @schema@.leader_leases AS l
       SET paused_at = NULL, paused_by = NULL, pause_reason = NULL,
           last_paused_at = l.paused_at, last_unpaused_at = greatest(now(), l.paused_at)
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
    RETURN true;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_run_now(p_role text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Run now: the role's next term starts at once, as a manual run that the next ACQUIRE starts whatever
-- its interval, its cooldown or its schedule (generation 6: an interval role's too; before, an interval
-- role only had its cooldown cleared, and one that was not due did nothing). A manual run of a cron role
-- consumes no occurrence; its RELEASE stamps the tick of an interval role (its next interval counts
-- from it) and leaves the cooldown (a failed tick's backoff) alone. It does not pass the wait a pause
-- set for the term it ended (leader_pause_waits). Its term's history row names who asked (the session's
-- login user), as does a 'run_now' row. Returns whether the role had a cooldown (now passed over).
-- It notifies no one (see leader_release).
DECLARE
    had boolean;
BEGIN
    -- A mark, no key: it never waits for a claim (generation 7).
    SELECT l.not_before IS NOT NULL AND l.not_before > now() INTO had
      FROM @schema@.leader_leases AS l WHERE l.role = p_role FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ticklease: unknown role %', p_role USING ERRCODE = 'no_data_found';
    END IF;
    UPDATE @schema@.leader_leases AS l SET run_now_by = left(session_user, 200) WHERE l.role = p_role;
    PERFORM @schema@.leader_history_add(p_role, 'run_now', NULL, NULL, NULL, NULL, NULL, session_user, NULL);
    RETURN had;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_forget(p_role text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- An operator's way out for a role that is gone for good (a removed family
-- key, a retired job): deletes its lease row and its history, unless a term
-- is live or the role is paused (false). An ACQUIRE of the role later
-- creates the row afresh, its token seeded from the clock. Unknown role:
-- no_data_found.
DECLARE
    gone @schema@.leader_leases;
BEGIN
    SELECT * INTO gone FROM @schema@.leader_leases AS l WHERE l.role = p_role FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ticklease: unknown role %', left(p_role, 63) USING ERRCODE = 'no_data_found';
    END IF;
    IF gone.paused_at IS NOT NULL
       OR @schema@.leader_term_live(gone.holder_id, gone.expires_at, gone.holder_key, now()) THEN
        RETURN false;
    END IF;
    -- A term never released: its claims in flight end first (generation 7).
    IF gone.holder_id IS NOT NULL THEN
        PERFORM @schema@.leader_fence_drain(ARRAY[p_role], ARRAY[gone.holder_token], false);
    END IF;
    DELETE FROM @schema@.leader_leases AS l WHERE l.role = p_role;
    DELETE FROM @schema@.leader_history AS h WHERE h.role = p_role;
    RETURN true;
END
$fn$;

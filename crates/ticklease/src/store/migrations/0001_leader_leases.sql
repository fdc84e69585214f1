-- ticklease 0001: one row per role, the fence, the operator surface.

-- Tokens start at the epoch in milliseconds, so a table dropped and re-created
-- (rollback + re-apply) reseeds above every token issued before, as long as a
-- role was acquired fewer than 1000 times a second on average.
CREATE FUNCTION leader_token_seed() RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

CREATE TABLE leader_leases (
    role               text PRIMARY KEY,
    holder_token       bigint NOT NULL DEFAULT leader_token_seed(),
    holder_id          text,
    acquired_at        timestamptz,
    expires_at         timestamptz,
    last_tick_ended_at timestamptz,
    last_tick_holder   text,
    paused_at          timestamptz,
    paused_by          text,
    pause_reason       text,
    not_before         timestamptz,
    -- Same rule as ticklease::Role::new; a test pins the two together.
    CONSTRAINT leader_leases_role_name CHECK (
        role ~ '^[a-z][a-z0-9_]*(:[a-z0-9][a-z0-9_.-]*)?$' AND length(role) <= 63),
    CONSTRAINT leader_leases_held_has_expiry CHECK (
        (holder_id IS NULL) = (expires_at IS NULL) AND (holder_id IS NULL) = (acquired_at IS NULL)),
    CONSTRAINT leader_leases_paused_is_unheld CHECK (paused_at IS NULL OR holder_id IS NULL),
    CONSTRAINT leader_leases_pause_has_author CHECK ((paused_at IS NULL) = (paused_by IS NULL))
);

-- The expiry predicate, in one place: every statement that asks "is this
-- term live?" asks it here, so a later liveness rule changes one function.
CREATE FUNCTION leader_lease_live(p_holder_id text, p_expires_at timestamptz, p_at timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$ SELECT p_holder_id IS NOT NULL AND p_expires_at > p_at $$;

-- True while (role, token) is the live, unpaused term. statement_timestamp(),
-- not now(): now() is frozen at BEGIN and would accept an expired lease inside
-- a long transaction. STABLE: it reads in the caller's snapshot and locks nothing.
CREATE FUNCTION leader_fence(p_role text, p_token bigint) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (
        SELECT 1 FROM leader_leases
         WHERE role = p_role AND holder_token = p_token AND paused_at IS NULL
           AND leader_lease_live(holder_id, expires_at, statement_timestamp()))
$$;

-- The fence a claim statement uses: as leader_fence, and it takes FOR KEY SHARE
-- on the lease row until the claim's transaction ends. Takeover (ACQUIRE, whose
-- ON CONFLICT DO UPDATE names the key column) and PAUSE (SELECT ... FOR UPDATE)
-- take the FOR UPDATE lock, which waits for that share lock: a claim that
-- passed the fence commits before the term ends. RENEW and RELEASE write only
-- non-key columns and do not wait.
-- VOLATILE because it locks; call it as an uncorrelated scalar subquery,
-- (SELECT leader_fence_lock($r, $t)), so it runs once per statement, not per row.
CREATE FUNCTION leader_fence_lock(p_role text, p_token bigint) RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT EXISTS (
        SELECT 1 FROM leader_leases
         WHERE role = p_role AND holder_token = p_token AND paused_at IS NULL
           AND leader_lease_live(holder_id, expires_at, statement_timestamp())
           FOR KEY SHARE)
$$;

-- Operator pause: ends the current term in the same statement (the fence is
-- false from the commit instant) and refuses ACQUIRE until leader_unpause.
-- Returns true when this call paused the role, false when it was paused already.
CREATE FUNCTION leader_pause(p_role text, p_by text, p_reason text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    changed boolean;
BEGIN
    IF p_by IS NULL OR btrim(p_by) = '' THEN
        RAISE EXCEPTION 'ticklease: leader_pause(%): who paused it must be named', p_role
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- FOR UPDATE waits for the share locks of in-flight fenced claims, so a
    -- claim that passed the fence commits before the pause does. (A plain
    -- UPDATE that leaves the key unchanged would not wait.)
    PERFORM 1 FROM leader_leases WHERE role = p_role FOR UPDATE;
    UPDATE leader_leases
       SET paused_at = now(), paused_by = p_by, pause_reason = coalesce(p_reason, ''),
           holder_id = NULL, acquired_at = NULL, expires_at = NULL
     WHERE role = p_role AND paused_at IS NULL
    RETURNING true INTO changed;
    IF changed IS NULL THEN
        PERFORM 1 FROM leader_leases WHERE role = p_role;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'ticklease: unknown role %', p_role USING ERRCODE = 'no_data_found';
        END IF;
        RETURN false;
    END IF;
    RETURN true;
END
$$;

-- Unpause leaves not_before alone: a role in a failure cooldown stays in it.
CREATE FUNCTION leader_unpause(p_role text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    changed boolean;
BEGIN
    UPDATE leader_leases
       SET paused_at = NULL, paused_by = NULL, pause_reason = NULL
     WHERE role = p_role AND paused_at IS NOT NULL
    RETURNING true INTO changed;
    IF changed IS NULL THEN
        PERFORM 1 FROM leader_leases WHERE role = p_role;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'ticklease: unknown role %', p_role USING ERRCODE = 'no_data_found';
        END IF;
        RETURN false;
    END IF;
    RETURN true;
END
$$;

CREATE VIEW leader_status AS
SELECT role,
       leader_lease_live(holder_id, expires_at, statement_timestamp()) AS held,
       holder_id,
       holder_token,
       acquired_at,
       expires_at,
       statement_timestamp() AS db_now,
       CASE WHEN leader_lease_live(holder_id, expires_at, statement_timestamp())
            THEN expires_at - statement_timestamp() END AS remaining,
       paused_at,
       paused_by,
       pause_reason,
       last_tick_ended_at,
       last_tick_holder,
       not_before
  FROM leader_leases;

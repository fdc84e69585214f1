-- Liveness and bounds: when a term counts as live (its expiry and, for a
-- holder with a coordination session, its key), the first token of a role,
-- and the checks every lease statement applies to its inputs.

-- Tokens start at the epoch in milliseconds, so a table dropped and re-created
-- (rollback + re-apply) reseeds above every token issued before, as long as a
-- role was acquired fewer than 1000 times a second on average.
CREATE OR REPLACE FUNCTION leader_token_seed() RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

-- Every new row's first token. Set only where the column has no default (a
-- database created from migrations/tables_at_0007.sql), so an upgrade takes
-- no lock on the lease table.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attrdef AS d JOIN pg_attribute AS a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
                    WHERE d.adrelid = 'leader_leases'::regclass AND a.attname = 'holder_token') THEN
        ALTER TABLE leader_leases ALTER COLUMN holder_token SET DEFAULT leader_token_seed();
    END IF;
END
$$;

-- Durations in ms, bounded like ticklease::Config (0 < d <= 24 h).
CREATE OR REPLACE FUNCTION leader_check_ms(p_name text, p_ms bigint) RETURNS interval
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

CREATE OR REPLACE FUNCTION @schema@.leader_check_batch(p_name text, p_roles text[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $fn$
BEGIN
    IF p_roles IS NULL OR cardinality(p_roles) > 10000 OR array_ndims(p_roles) > 1 THEN
        RAISE EXCEPTION 'ticklease: % takes a list of 0 to 10000 roles, got %', p_name, cardinality(p_roles)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(p_roles, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'ticklease: % got a NULL role', p_name USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @schema@.leader_check_role(p_name, r) FROM unnest(p_roles) AS r;
END
$fn$;

-- A role name as the lease table's constraint (leader_leases_role_name,
-- migration 0001) and ticklease::Role::new have it, checked before a
-- function's main statement: the constraint's own refusal would carry that
-- statement's whole text in its CONTEXT.
CREATE OR REPLACE FUNCTION @schema@.leader_check_role(p_name text, p_role text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $fn$
BEGIN
    IF p_role IS NULL OR length(p_role) > 63 OR p_role !~ '^[a-z][a-z0-9_]*(:[a-z0-9][a-z0-9_.-]*)?$' THEN
        RAISE EXCEPTION 'ticklease: % needs a role name ([a-z][a-z0-9_]*, optionally :key of [a-z0-9][a-z0-9_.-]*, at most 63 characters), got %',
                        p_name, coalesce(quote_literal(left(p_role, 64)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

-- The expiry predicate, in one place: every statement that asks "is this
-- term live?" asks it here, so a later liveness rule changes one function.
CREATE OR REPLACE FUNCTION leader_lease_live(p_holder_id text, p_expires_at timestamptz, p_at timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$ SELECT p_holder_id IS NOT NULL AND p_expires_at > p_at $$;

CREATE OR REPLACE FUNCTION @schema@.leader_pause_waits(p_wait_until timestamptz, p_at timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $fn$
    -- Whether the wait a pause set for the term it ended (leader_pause,
    -- pause_wait_until) still holds the next term back at p_at: its holder
    -- has not RELEASEd it and its lease has not run out. No term started
    -- since (every ACQUIRE reads it with not_before). No run-now passes it:
    -- the ended term's unfenced work may still run.
    SELECT coalesce(p_wait_until > p_at, false)
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_live_keys() RETURNS SETOF bigint
LANGUAGE sql VOLATILE
AS $fn$
    -- The coordination keys held now, each by the backend that took it: a
    -- session advisory lock on a bigint key shows as (classid, objid) = its
    -- high and low 32 bits with objsubid 1, and a coordination key's high 32
    -- bits are its backend's pid. One read of the lock table (its size is
    -- max_locks_per_transaction x max_connections, whatever the app role
    -- creates); it takes no lock. Qualified: the view calls this with the
    -- reader's search_path.
    SELECT (k.classid::bigint << 32) | k.objid::bigint
      FROM pg_catalog.pg_locks AS k
     WHERE k.locktype = 'advisory' AND k.objsubid = 1 AND k.mode = 'ExclusiveLock' AND k.granted
       AND k.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())
       AND k.pid::bigint = k.classid::bigint
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_key_alive(p_key bigint) RETURNS boolean
LANGUAGE sql VOLATILE
AS $fn$
    -- True unless no session of this database holds the key, or only a
    -- backend other than the one that took it. NULL (a holder without a
    -- coordination session): the lease alone decides.
    SELECT p_key IS NULL OR p_key IN (SELECT @schema@.leader_live_keys())
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_key_wait(p_key bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT
-- Restores the caller's lock_timeout when the function returns (the
-- set_config below would otherwise last to the end of a caller's transaction).
SET lock_timeout = '1s'
AS $fn$
-- One slice of a follower's wait on a holder's key: true once the key is
-- gone (its holder's session ended and the shared lock was granted, or a
-- session other than the one that took it holds it now), false when it is
-- still alive after the slice. The lock timeout is caught here, so no
-- waiting slice leaves an ERROR in the server's log; it is 90 % of
-- deadlock_timeout (at most a second, at least 100 ms), so that
-- log_lock_waits has nothing to report either (while deadlock_timeout is
-- above 111 ms); between slices the
-- waiter is idle, so it can close without a FATAL. The shared lock, once
-- granted, is kept until the waiter's session ends; it conflicts with
-- nothing (liveness counts only the key's own backend's exclusive lock).
DECLARE
    deadlock_ms constant numeric := extract(epoch FROM pg_catalog.current_setting('deadlock_timeout')::interval) * 1000;
BEGIN
    PERFORM pg_catalog.set_config('lock_timeout',
                                  pg_catalog.round(greatest(100, least(1000, deadlock_ms * 0.9)))::text || 'ms', true);
    PERFORM pg_catalog.pg_advisory_lock_shared(p_key);
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN NOT @schema@.leader_key_alive(p_key);
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_term_live(p_holder_id text, p_expires_at timestamptz, p_key bigint, p_at timestamptz)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $fn$
    -- The one liveness predicate of a term, for ACQUIRE and leader_status:
    -- the lease has not run out on the database clock and its holder's
    -- coordination session (if it had one) lives. The fence and its commit
    -- check use leader_lease_live (token and expiry) alone. Qualified: the
    -- view calls this with the reader's search_path.
    SELECT @schema@.leader_lease_live(p_holder_id, p_expires_at, p_at) AND @schema@.leader_key_alive(p_key)
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_term_live_among(p_holder_id text, p_expires_at timestamptz, p_key bigint,
                                                p_at timestamptz, p_live bigint[])
RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $fn$
    -- leader_term_live with the live keys read once for a whole statement.
    SELECT @schema@.leader_lease_live(p_holder_id, p_expires_at, p_at) AND (p_key IS NULL OR p_key = ANY (p_live))
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_require_key(p_key bigint) RETURNS void
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
$fn$;

-- ticklease-bench candidate "row-lock+marker": the "row-lock" candidate
-- (row_lock.sql) and leader_fence_v2's marker (the term's salt read with the
-- lock, one SHA-256 of salt and xid, one shared advisory lock), to tell what
-- the marker costs (docs/benchmarks/fence-cost.md, "Where the cost goes").
-- A BENCH CANDIDATE ONLY, NOT A FENCE: see row_lock.sql.
CREATE OR REPLACE FUNCTION @schema@.leader_fence(p_role text, p_token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $fn$
DECLARE
    salt bigint;
    xid bigint;
BEGIN
    -- Under REPEATABLE READ or SERIALIZABLE the read would see the
    -- transaction's snapshot, as for the migrated fence: refused the same way.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'ticklease: leader_fence needs READ COMMITTED, not %',
                        current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported';
    END IF;
    -- SECURITY DEFINER: FOR KEY SHARE needs UPDATE on leader_leases, which no
    -- client role is granted.
    SELECT l.fence_salt INTO salt
      FROM @schema@.leader_leases AS l
     WHERE l.role = p_role AND l.holder_token = p_token AND l.paused_at IS NULL
       AND @schema@.leader_lease_live(l.holder_id, l.expires_at, clock_timestamp())
       FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- The marker, as leader_fence_v2 takes it (30_fence.sql).
    xid := pg_current_xact_id()::text::bigint & 4294967295;
    IF NOT pg_try_advisory_xact_lock_shared(@schema@.leader_role_hash(p_role, 3), @schema@.leader_fence_marker(salt, xid, 1)) THEN
        RAISE EXCEPTION 'row-lock+marker: the marker is taken' USING ERRCODE = 'lock_not_available';
    END IF;
    RETURN true;
END
$fn$;

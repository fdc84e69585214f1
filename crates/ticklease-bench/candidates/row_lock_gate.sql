-- ticklease-bench candidate "row-lock+gate": the "row-lock" candidate
-- (row_lock.sql) and leader_fence_v2's gate, to tell what the gate costs
-- (docs/benchmarks/fence-cost.md, "Where the cost goes").
-- A BENCH CANDIDATE ONLY, NOT A FENCE: see row_lock.sql.
CREATE OR REPLACE FUNCTION @schema@.leader_fence(p_role text, p_token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $fn$
BEGIN
    -- The gate, as leader_fence_v2 takes it (30_fence.sql): tried
    -- exclusively and let go; when another backend holds it, the probe.
    IF pg_try_advisory_lock(@schema@.leader_role_hash(p_role, 4), @schema@.leader_token_low(p_token)) THEN
        PERFORM pg_advisory_unlock(@schema@.leader_role_hash(p_role, 4), @schema@.leader_token_low(p_token));
    ELSE
        BEGIN
            PERFORM 1 FROM @schema@.leader_leases AS l
             WHERE l.role = p_role AND l.holder_token = p_token AND l.paused_at IS NULL
               AND @schema@.leader_lease_live(l.holder_id, l.expires_at, clock_timestamp())
               FOR SHARE;
            RAISE SQLSTATE 'TLGT0';
        EXCEPTION WHEN SQLSTATE 'TLGT0' THEN
            NULL;
        END;
    END IF;
    -- Under REPEATABLE READ or SERIALIZABLE the read would see the
    -- transaction's snapshot, as for the migrated fence: refused the same way.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'ticklease: leader_fence needs READ COMMITTED, not %',
                        current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported';
    END IF;
    -- SECURITY DEFINER: FOR KEY SHARE needs UPDATE on leader_leases, which no
    -- client role is granted.
    PERFORM 1
       FROM @schema@.leader_leases AS l
      WHERE l.role = p_role AND l.holder_token = p_token AND l.paused_at IS NULL
        AND @schema@.leader_lease_live(l.holder_id, l.expires_at, clock_timestamp())
        FOR KEY SHARE;
    RETURN FOUND;
END
$fn$;

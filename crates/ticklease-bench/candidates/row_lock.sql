-- ticklease-bench candidate "row-lock": issue 43's lock at the fence (C2 of
-- docs/design/fence-at-one-row-lock.md, the study's prototype fs.fence_rl),
-- for `ticklease-bench fence --candidate row-lock=crates/ticklease-bench/candidates/row_lock.sql`.
--
-- A BENCH CANDIDATE ONLY, NOT A FENCE. It measures the floor of the cost: one
-- read of the lease row and one FOR KEY SHARE lock on it, held to the
-- transaction's end. That lock fences a claim only once everything that ends a
-- term (takeover, pause, RELEASE, forget) takes a lock that conflicts with it
-- and drains the claims holding the row (the design's leader_fence_drain:
-- wait up to a grace, then end the holders). The migrated enders do not: a
-- pause and a RELEASE are no-key updates, which FOR KEY SHARE lets through, and
-- the generation-6 sweep looks for advisory locks this candidate does not take.
-- Nor is PREPARE TRANSACTION refused here (the design's guard is left out).
-- So without the enders' drain a claim behind it can commit outside its term.
--
-- The bench calls (SELECT leader_fence(:role, :token)) for a candidate and
-- applies this file with CREATE OR REPLACE in a database of its own, after
-- migrate; @schema@ is the migrated schema. CREATE OR REPLACE drops the SET
-- clauses of the migrated function, so the pinned search_path is restated.
-- With no INSERT into leader_fence_claims, the deferred commit check never fires.
CREATE OR REPLACE FUNCTION @schema@.leader_fence(p_role text, p_token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $fn$
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
    PERFORM 1
       FROM @schema@.leader_leases AS l
      WHERE l.role = p_role AND l.holder_token = p_token AND l.paused_at IS NULL
        AND @schema@.leader_lease_live(l.holder_id, l.expires_at, clock_timestamp())
        FOR KEY SHARE;
    RETURN FOUND;
END
$fn$;

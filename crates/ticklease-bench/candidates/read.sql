-- ticklease-bench candidate "read": a PL/pgSQL function that reads the lease
-- row's live term, with no lock, no SECURITY DEFINER and no checks: what any
-- fence called as a PL/pgSQL function costs at the least, to set the other
-- candidates against (docs/benchmarks/fence-cost.md, "Where the cost goes").
-- A BENCH CANDIDATE ONLY, NOT A FENCE: it takes no lock, so a term can end
-- and a claim behind it commit after (the spec's lock-free fence, in PL/pgSQL).
-- The bench runs its claims as the superuser, who may read leader_leases.
CREATE OR REPLACE FUNCTION @schema@.leader_fence(p_role text, p_token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    RETURN EXISTS (SELECT 1 FROM @schema@.leader_leases AS l
                    WHERE l.role = p_role AND l.holder_token = p_token AND l.paused_at IS NULL
                      AND @schema@.leader_lease_live(l.holder_id, l.expires_at, clock_timestamp()));
END
$fn$;

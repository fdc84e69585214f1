-- History: one row per ended term and per operator action, bounded per role
-- and by age (leader_history_settings).

CREATE OR REPLACE FUNCTION @schema@.leader_history_add(p_role text, p_kind text, p_token bigint, p_holder text,
                                             p_acquired_at timestamptz, p_outcome text, p_reason text,
                                             p_by text, p_error text, p_output text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Appends one row and, on one write of the role in 16 on average (random:
-- ids are shared by every role, so a modulo would skip some roles for
-- good), prunes the role's history to its retention, at most 1,000 rows at
-- a time so a lowered setting never stalls a lease statement. The history
-- holds about keep_per_role + 16 rows per role. The same write then deletes
-- up to 1,000 rows of any role older than keep_for (the oldest first,
-- through the index on at): a role no longer written (a removed family key)
-- ages out too. Texts are cut to 500 characters; a term's output keeps
-- its last 4,000.
DECLARE
    new_id bigint;
    keep @schema@.leader_history_settings;
BEGIN
    INSERT INTO @schema@.leader_history (role, kind, token, holder_id, acquired_at, outcome, reason, by, error,
                                         output)
    VALUES (p_role, p_kind, p_token, left(p_holder, 500), p_acquired_at, p_outcome, left(p_reason, 500),
            left(p_by, 500), left(p_error, 500), right(p_output, 4000))
    ON CONFLICT DO NOTHING
    RETURNING id INTO new_id;
    IF new_id IS NULL OR random() >= 1.0 / 16 THEN
        RETURN;
    END IF;
    SELECT * INTO keep FROM @schema@.leader_history_settings;
    -- The role as a range and ordered with it, so the index (role, id)
    -- answers both reads (generation 6): with `role = p_role` the planner may
    -- walk the whole history by id instead, betting on a match soon (the
    -- view's last outcome did, 600 ms over 171,000 rows of 38 roles).
    DELETE FROM @schema@.leader_history AS h
     WHERE h.id IN (SELECT o.id FROM @schema@.leader_history AS o
                     WHERE o.role >= p_role AND o.role <= p_role
                       AND (o.at < now() - keep.keep_for
                            OR o.id < (SELECT min(r.id) FROM (SELECT k.id FROM @schema@.leader_history AS k
                                                               WHERE k.role >= p_role AND k.role <= p_role
                                                               ORDER BY k.role DESC, k.id DESC
                                                               LIMIT keep.keep_per_role) AS r))
                     ORDER BY o.role, o.id
                     LIMIT 1000);
    DELETE FROM @schema@.leader_history AS h
     WHERE h.id IN (SELECT o.id FROM @schema@.leader_history AS o
                     WHERE o.at < now() - keep.keep_for
                     ORDER BY o.at
                     LIMIT 1000);
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_history_add(p_role text, p_kind text, p_token bigint, p_holder text,
                                             p_acquired_at timestamptz, p_outcome text, p_reason text,
                                             p_by text, p_error text) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $fn$
    -- Every row but a term's that kept what its work said.
    SELECT @schema@.leader_history_add(p_role, p_kind, p_token, p_holder, p_acquired_at, p_outcome, p_reason,
                                       p_by, p_error, NULL)
$fn$;

-- Per role (the lease rows, in order, at most `$3`) and cell of `f`
-- adjacent slices (`f` = the fewest that keep roles × cells within `$3`):
-- how many terms ended in it (an index-only probe of at most `$4` entries
-- of `leader_history_term_at`), and the worst of at most `$4` terms that
-- did not complete (`leader_history_notable_at`). Empty cells are left out.
-- $1 window in ms, $2 slices, $3 most cells, $4 most terms read per cell;
-- the reader's rights. JIT off: the plan's cost estimate always passes
-- jit_above_cost, and compiling it took longer (0.7 s) than running it.
CREATE OR REPLACE FUNCTION @schema@.leader_timeline(p_window_ms bigint, p_slices integer, p_cells integer,
                                                    p_terms integer)
RETURNS TABLE (role text, bucket integer, span integer, terms bigint, outcome text, takeover boolean)
LANGUAGE sql STABLE
SET jit = off
AS $fn$
WITH p AS (
       SELECT now() - $1::int8 * interval '1 millisecond' AS since,
              $1::int8 * interval '1 millisecond' / $2::int4 AS width,
              greatest(1, least($2::int4, ceil($2::int4 * (SELECT count(*) FROM @schema@.leader_leases)::numeric
                                                / $3::int4)::int4)) AS f),
     r AS (SELECT l.role FROM @schema@.leader_leases AS l ORDER BY l.role LIMIT $3::int4),
     g AS (SELECT b AS bucket, least($2::int4, b + p.f) - b AS span, p.since + b * p.width AS lo,
                  CASE WHEN b + p.f >= $2::int4 THEN 'infinity'::timestamptz
                       ELSE p.since + (b + p.f) * p.width END AS hi
             FROM p, generate_series(0, $2::int4 - 1, p.f) AS b)
SELECT r.role, g.bucket::int4 AS bucket, g.span::int4 AS span, c.terms,
       (ARRAY['completed', 'interrupted', 'lost', 'failed', 'panicked'])[coalesce(n.rank, 1)] AS outcome,
       coalesce(n.takeover, false) AS takeover
  FROM r CROSS JOIN g
 CROSS JOIN LATERAL (SELECT count(*) AS terms
                       FROM (SELECT 1 FROM @schema@.leader_history AS h
                              WHERE h.role = r.role AND h.kind = 'term' AND h.at >= g.lo AND h.at < g.hi
                              LIMIT $4::int4) AS x) AS c
 CROSS JOIN LATERAL (SELECT max(CASE y.outcome WHEN 'interrupted' THEN 2 WHEN 'lost' THEN 3
                                               WHEN 'failed' THEN 4 ELSE 5 END) AS rank,
                            bool_or(y.reason IN ('expired', 'holder_gone')) AS takeover
                       FROM (SELECT h.outcome, h.reason FROM @schema@.leader_history AS h
                              WHERE h.role = r.role AND h.kind = 'term' AND h.outcome <> 'completed'
                                AND h.at >= g.lo AND h.at < g.hi
                              LIMIT $4::int4) AS y) AS n
 WHERE c.terms > 0
 ORDER BY r.role, g.bucket
$fn$;

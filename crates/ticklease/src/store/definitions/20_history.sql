-- History: one row per ended term and per operator action, bounded per role
-- and by age (leader_history_settings).

CREATE OR REPLACE FUNCTION @schema@.leader_history_add(p_role text, p_kind text, p_token bigint, p_holder text,
                                             p_acquired_at timestamptz, p_outcome text, p_reason text,
                                             p_by text, p_error text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Appends one row and, on one write of the role in 16 on average (random:
-- ids are shared by every role, so a modulo would skip some roles for
-- good), prunes the role's history to its retention, at most 1,000 rows at
-- a time so a lowered setting never stalls a lease statement. The history
-- holds about keep_per_role + 16 rows per role. The same write then deletes
-- up to 1,000 rows of any role older than keep_for (the oldest first,
-- through the index on at): a role no longer written (a removed family key)
-- ages out too.
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
    DELETE FROM @schema@.leader_history AS h
     WHERE h.id IN (SELECT o.id FROM @schema@.leader_history AS o
                     WHERE o.at < now() - keep.keep_for
                     ORDER BY o.at
                     LIMIT 1000);
END
$fn$;

-- Families: the batched lease statements (one statement for many roles of
-- one family) and the registry of the replicas that serve a family.

CREATE OR REPLACE FUNCTION @schema@.leader_family_due(l @schema@.leader_leases, p_every interval,
                                                   p_occurrence timestamptz, p_before timestamptz)
RETURNS boolean
LANGUAGE sql STABLE
AS $fn$
    -- Whether a family key's row is due (leaving aside who holds it): on an
    -- interval (p_occurrence NULL) as ACQUIRE decides it; on a cron schedule
    -- when p_occurrence is runnable; on either when an operator's run-now
    -- waits (generation 6: an interval key's too).
    SELECT l.paused_at IS NULL
           AND CASE WHEN p_occurrence IS NULL
                    THEN (l.last_tick_ended_at IS NULL OR l.last_tick_ended_at <= now() - p_every)
                         AND coalesce(greatest(l.not_before, l.pause_wait_until) <= now(), true)
                         OR (l.run_now_by IS NOT NULL
                             AND NOT @schema@.leader_pause_waits(l.pause_wait_until, now()))
                    ELSE @schema@.leader_occurrence_runnable(p_occurrence, p_before,
                             coalesce(l.last_occurrence, l.occurrences_since), greatest(l.not_before, l.pause_wait_until))
                         OR (l.run_now_by IS NOT NULL
                             AND NOT @schema@.leader_pause_waits(l.pause_wait_until, now()))
               END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_family_skipped(p_occurrences timestamptz[], p_capped boolean)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $fn$
    -- The history's summary of skipped occurrences (as the library writes
    -- one): how many, from when to when (UTC); a lower bound when the
    -- occurrences it was given did not reach back to the first skipped.
    SELECT CASE WHEN p_capped THEN 'more than ' ELSE '' END
           || cardinality(p_occurrences)
           || CASE WHEN cardinality(p_occurrences) = 1 AND NOT p_capped THEN ' occurrence' ELSE ' occurrences' END
           || ' from ' || to_char(min(o) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
           || ' to ' || to_char(max(o) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
      FROM unnest(p_occurrences) AS o
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_acquire_many(p_roles text[], p_holder text, p_ttl_ms bigint,
                                              p_interval_ms bigint, p_key bigint, p_limit integer,
                                              p_occurrence timestamptz, p_before timestamptz,
                                              p_schedule text, p_next timestamptz, p_recent timestamptz[])
RETURNS TABLE (role text, holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
               held boolean, paused_by text, pause_reason text, due_at timestamptz, holder_key bigint,
               over_limit boolean, after_occurrence timestamptz, failures integer, manual_by text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- ACQUIRE for many roles of one family: starts terms on at most p_limit
-- of them, taken in the caller's order (its preferred roles first) among
-- those that look acquirable. The picked rows are locked in role order and
-- checked again under the lock with ACQUIRE's predicate (a row another
-- replica took meanwhile drops out), each gets ACQUIRE's token and
-- expiry, and a term taken over without a RELEASE is recorded as lost
-- (expired, or holder_gone) as the one-row ACQUIRE does, its claims in
-- flight ended first (leader_fence_drain; generation-6 claims by
-- leader_fence_sweep). Rows it
-- does not pick are read without a lock, so a batch never waits on terms
-- held elsewhere. over_limit: acquirable, but past the limit. The live
-- coordination keys are read once (leader_live_keys), not once per row.
--
-- On an interval (p_occurrence NULL) each key is due as ACQUIRE decides.
-- On a cron schedule each key runs p_occurrence as leader_acquire_occurrence
-- decides it under the Latest catch-up policy (p_before, the occurrence
-- after it, not reached yet), counting from its first ask, or starts the
-- manual run an operator asked for when the occurrence is not runnable; a
-- started occurrence records the occurrences the key passed over since its
-- last started one, from p_recent (the caller's latest occurrences before
-- p_occurrence, at most 1000): those due while the key was paused as `paused`, the others as
-- `catch_up`. A refused key's due_at is its cooldown, else the next
-- occurrence when this one completed, else this one while not reached.
#variable_conflict use_column
DECLARE
    picked text[];
    won_roles text[];
    won_tokens bigint[];
    gone text[];
    drained text[];
    noted bigint;
    cron boolean := p_occurrence IS NOT NULL;
    every_interval interval := CASE WHEN p_occurrence IS NULL
                                    THEN @schema@.leader_check_ms('interval', p_interval_ms) END;
    ttl interval := @schema@.leader_check_ms('lease_ttl', p_ttl_ms);
    live bigint[] := ARRAY(SELECT @schema@.leader_live_keys());
BEGIN
    PERFORM @schema@.leader_check_batch('leader_acquire_many', p_roles);
    IF p_limit IS NULL OR p_limit < 0 THEN
        RAISE EXCEPTION 'ticklease: leader_acquire_many needs a limit of 0 or more, got %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_holder IS NULL OR length(p_holder) > 200 THEN
        RAISE EXCEPTION 'ticklease: leader_acquire_many needs a holder id of at most 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cron AND (NOT isfinite(p_occurrence) OR p_occurrence < '1970-01-01'
                 OR p_next IS NULL OR NOT isfinite(p_next) OR p_next <= p_occurrence
                 OR p_next > now() + interval '100 years'
                 OR p_before IS NULL OR p_before <= p_occurrence OR NOT isfinite(p_before)
                 OR length(p_schedule) > 200 OR coalesce(cardinality(p_recent), 0) > 1000
                 OR EXISTS (SELECT 1 FROM unnest(p_recent) AS o WHERE o IS NULL OR o >= p_occurrence OR NOT isfinite(o))) THEN
        RAISE EXCEPTION 'ticklease: leader_acquire_many of an occurrence needs finite instants (the next after it, within 100 years), a schedule of at most 200 characters and at most 1000 earlier occurrences'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT cron AND (p_before IS NOT NULL OR p_schedule IS NOT NULL OR p_next IS NOT NULL OR p_recent IS NOT NULL) THEN
        RAISE EXCEPTION 'ticklease: leader_acquire_many on an interval takes no occurrence, schedule or earlier occurrences'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT (p_key IS NULL OR p_key = ANY (live)) THEN
        PERFORM @schema@.leader_require_key(p_key);
    END IF;
    IF cron THEN
        -- Every key counts from its first ask (a new key does not run the
        -- past): rows created or marked in role order, as leader_seed does;
        -- only those not counting yet (an upsert locks every row it meets).
        INSERT INTO @schema@.leader_leases AS l (role, holder_token, occurrences_since, schedule)
        SELECT r, @schema@.leader_token_seed(), now(), p_schedule
          FROM (SELECT DISTINCT u AS r FROM unnest(p_roles) AS u) AS d
         WHERE NOT EXISTS (SELECT 1 FROM @schema@.leader_leases AS x
                            WHERE x.role = d.r AND (x.occurrences_since IS NOT NULL OR x.last_occurrence IS NOT NULL))
         ORDER BY r
        ON CONFLICT (role) DO UPDATE SET occurrences_since = now(), schedule = p_schedule
         WHERE l.occurrences_since IS NULL AND l.last_occurrence IS NULL;
    END IF;
    SELECT coalesce(array_agg(c.role ORDER BY c.ord), '{}') INTO picked
      FROM (SELECT f.role, f.ord
              FROM (SELECT u.role, min(u.ord) AS ord
                      FROM unnest(p_roles) WITH ORDINALITY AS u(role, ord)
                     GROUP BY u.role) AS f
              -- Row by row through the primary key: the table is updated
              -- all the time, and a scan of it would grow with its dead rows.
              LEFT JOIN LATERAL (SELECT x.*, x AS whole FROM @schema@.leader_leases AS x WHERE x.role = f.role) AS l
                ON true
             WHERE l.role IS NULL
                OR (NOT @schema@.leader_term_live_among(l.holder_id, l.expires_at, l.holder_key, now(), live)
                    AND @schema@.leader_family_due(l.whole, every_interval, p_occurrence, p_before))
             ORDER BY f.ord
             LIMIT p_limit) AS c;
    -- Picked roles without a row get one first (a new statement: visible
    -- below), created in role order: batches that create the same new rows
    -- in their callers' orders would deadlock on each other's inserts.
    PERFORM @schema@.leader_seed(ARRAY(SELECT p FROM unnest(picked) AS p ORDER BY p));
    -- The picked rows locked first, in role order, with a lock no claim
    -- waits for and that keeps RENEW and other ACQUIREs out (generation 7);
    -- then the live keys read once more, fresh for every locked row (a
    -- holder may have renewed with a new key since the first read), instead
    -- of once per row. Then the terms to be taken over are drained (their
    -- claims in flight end: leader_fence_drain), one grace for the batch.
    PERFORM 1 FROM @schema@.leader_leases AS l WHERE l.role = ANY (picked) ORDER BY l.role FOR NO KEY UPDATE OF l;
    live := ARRAY(SELECT @schema@.leader_live_keys());
    -- Judged here with the keys read once (the rows are locked: no RENEW
    -- revives them), so the drain need not read them again per row.
    SELECT @schema@.leader_fence_drain(coalesce(array_agg(l.role ORDER BY l.role), '{}'),
                                       coalesce(array_agg(l.holder_token ORDER BY l.role), '{}'), true)
      INTO drained
      FROM @schema@.leader_leases AS l
     WHERE l.role = ANY (picked) AND l.holder_id IS NOT NULL AND l.paused_at IS NULL
       AND NOT @schema@.leader_term_live_among(l.holder_id, l.expires_at, l.holder_key, now(), live);
    WITH locked AS (
        SELECT l.role, l.holder_token, l.holder_id, l.acquired_at, l.expires_at, l.manual_by, l.run_now_by,
               l.occurrence, l.last_paused_at, l.last_unpaused_at,
               coalesce(l.last_occurrence, l.occurrences_since) AS after,
               cron AND @schema@.leader_occurrence_runnable(p_occurrence, p_before,
                            coalesce(l.last_occurrence, l.occurrences_since), greatest(l.not_before, l.pause_wait_until)) AS runs
          FROM @schema@.leader_leases AS l
         WHERE l.role = ANY (picked)
           AND NOT @schema@.leader_term_live_among(l.holder_id, l.expires_at, l.holder_key, now(), live)
           AND (l.holder_id IS NULL OR l.role = ANY (drained))
           AND @schema@.leader_family_due(l, every_interval, p_occurrence, p_before)
         ORDER BY l.role
           FOR NO KEY UPDATE OF l
    ),
    started AS (
        UPDATE @schema@.leader_leases AS l
           SET holder_token = greatest(l.holder_token + 1, @schema@.leader_token_seed()),
               fence_salt = @schema@.leader_fence_salt(),
               holder_id = p_holder,
               acquired_at = now(),
               expires_at = now() + ttl,
               holder_key = p_key,
               -- An interval tick is no occurrence (as leader_acquire); a cron
               -- term runs p_occurrence, or is the manual run that waited.
               occurrence = CASE WHEN k.runs THEN p_occurrence WHEN cron THEN l.occurrence END,
               failures = CASE WHEN k.runs AND l.occurrence IS DISTINCT FROM p_occurrence THEN 0 ELSE l.failures END,
               -- A term that runs no occurrence is the manual run that waited, if one did.
               manual_by = CASE WHEN NOT k.runs THEN l.run_now_by END,
               run_now_by = CASE WHEN k.runs THEN l.run_now_by END,
               schedule = CASE WHEN cron THEN p_schedule END,
               tick_interval_ms = CASE WHEN cron THEN NULL ELSE p_interval_ms END,
               long_lived = false,
               next_occurrence = CASE WHEN k.runs THEN p_next WHEN cron THEN l.next_occurrence END
          FROM locked AS k
         WHERE l.role = k.role
        RETURNING l.role, l.holder_token
    ),
    taken_over AS (
        SELECT k.role,
               @schema@.leader_history_add(k.role, 'term', k.holder_token, k.holder_id, k.acquired_at, 'lost',
                   CASE WHEN k.expires_at <= now() THEN 'expired' ELSE 'holder_gone' END, k.manual_by, NULL)
          FROM locked AS k
         WHERE k.holder_id IS NOT NULL
    ),
    skipped AS (
        SELECT @schema@.leader_history_add(g.role, 'skipped', NULL, NULL, NULL, NULL, g.reason, NULL,
                   @schema@.leader_family_skipped(g.occurrences, g.capped))
          FROM (SELECT k.role,
                       CASE WHEN o >= k.last_paused_at AND o < k.last_unpaused_at THEN 'paused' ELSE 'catch_up' END
                           AS reason,
                       array_agg(o ORDER BY o) AS occurrences,
                       -- A lower bound only for the reason of the oldest listed.
                       cardinality(p_recent) = 1000 AND greatest(k.after, k.occurrence) < min(o)
                           AND min(o) = (SELECT min(m) FROM unnest(p_recent) AS m) AS capped
                  FROM locked AS k
                  CROSS JOIN unnest(p_recent) AS o
                 -- Those at or before the last started occurrence (attempted,
                 -- or recorded as skipped when it started) are not counted again.
                 WHERE k.runs AND o > greatest(k.after, k.occurrence)
                 GROUP BY 1, 2, k.after, k.occurrence) AS g
        UNION ALL
        -- The occurrence a key last started, never completed, that this later one overtakes.
        SELECT @schema@.leader_history_add(k.role, 'skipped', NULL, NULL, NULL, NULL, 'overtaken', NULL,
                   @schema@.leader_overtaken_summary(k.occurrence))
          FROM locked AS k
         WHERE k.runs AND k.holder_id IS NOT NULL AND k.manual_by IS NULL
           AND k.occurrence < p_occurrence AND k.occurrence > k.after
    )
    SELECT coalesce(array_agg(t.role), '{}'), coalesce(array_agg(t.holder_token), '{}'),
           -- Referenced, so the planner keeps them.
           (SELECT array_agg(o.role) FROM taken_over AS o),
           (SELECT count(*) FROM skipped)
      INTO won_roles, won_tokens, gone, noted
      FROM started AS t;
    -- The taken-over terms' open transactions end, in one read of the lock table.
    IF cardinality(gone) > 0 THEN
        PERFORM @schema@.leader_fence_sweep(gone);
    END IF;
    RETURN QUERY
        SELECT w.role, w.token, now(), p_holder, now() + ttl, true, NULL::text, NULL::text, NULL::timestamptz,
               p_key, false, coalesce(s.last_occurrence, s.occurrences_since), s.failures, s.manual_by
          FROM unnest(won_roles, won_tokens) AS w(role, token)
          JOIN @schema@.leader_leases AS s ON s.role = w.role;
    -- The others, as they are now (a fresh snapshot: a race's winner shows).
    RETURN QUERY
        SELECT DISTINCT ON (u.role)
               u.role, NULL::bigint, now(), s.holder_id, s.expires_at,
               coalesce(@schema@.leader_term_live_among(s.holder_id, s.expires_at, s.holder_key, now(), live), false),
               s.paused_by, s.pause_reason,
               CASE WHEN NOT cron THEN greatest(s.last_tick_ended_at + every_interval, s.not_before, s.pause_wait_until)
                    WHEN greatest(s.not_before, s.pause_wait_until) > now() THEN greatest(s.not_before, s.pause_wait_until)
                    WHEN coalesce(s.last_occurrence, s.occurrences_since) >= p_occurrence THEN p_next
                    WHEN p_occurrence > now() THEN p_occurrence END,
               s.holder_key,
               u.role <> ALL (picked)
               AND (s.role IS NULL
                    OR (NOT @schema@.leader_term_live_among(s.holder_id, s.expires_at, s.holder_key, now(), live)
                        AND @schema@.leader_family_due(s.whole, every_interval, p_occurrence, p_before))),
               coalesce(s.last_occurrence, s.occurrences_since), s.failures, NULL::text
          FROM unnest(p_roles) AS u(role)
          LEFT JOIN LATERAL (SELECT x.*, x AS whole FROM @schema@.leader_leases AS x WHERE x.role = u.role) AS s
            ON true
         WHERE u.role <> ALL (won_roles)
         ORDER BY u.role;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_renew_many(p_roles text[], p_tokens bigint[], p_ttl_ms bigint, p_key bigint)
RETURNS TABLE (role text, token bigint, renewed boolean, db_now timestamptz, holder_token bigint,
               holder_id text, paused boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- RENEW for many terms in one UPDATE, rows locked in role order, each
-- term-scoped as the one-row RENEW: (role, token) still holding.
-- renewed = false is that term's definitive loss; the other columns name
-- the reason, read after the UPDATE (a fresh snapshot: a pause that
-- committed meanwhile shows).
#variable_conflict use_column
DECLARE
    ttl interval := @schema@.leader_check_ms('lease_ttl', p_ttl_ms);
    renewed_roles text[];
    renewed_tokens bigint[];
BEGIN
    PERFORM @schema@.leader_check_batch('leader_renew_many', p_roles);
    IF p_tokens IS NULL OR cardinality(p_tokens) <> cardinality(p_roles) OR array_ndims(p_tokens) > 1
       OR array_position(p_tokens, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'ticklease: leader_renew_many needs one token per role'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @schema@.leader_require_key(p_key);
    WITH input AS (
        SELECT u.role, u.token FROM unnest(p_roles, p_tokens) AS u(role, token)
    ),
    locked AS (
        SELECT l.role, l.holder_token
          FROM @schema@.leader_leases AS l
         WHERE l.role = ANY (p_roles)
           AND (l.role, l.holder_token) IN (SELECT i.role, i.token FROM input AS i)
           AND l.holder_id IS NOT NULL
         ORDER BY l.role
           -- No key: a RENEW never waits for a claim (generation 7).
           FOR NO KEY UPDATE OF l
    ),
    done AS (
        UPDATE @schema@.leader_leases AS l
           SET expires_at = now() + ttl,
               holder_key = p_key
          FROM locked AS k
         WHERE l.role = k.role AND l.holder_token = k.holder_token AND l.holder_id IS NOT NULL
        RETURNING l.role, l.holder_token
    )
    SELECT coalesce(array_agg(d.role), '{}'), coalesce(array_agg(d.holder_token), '{}')
      INTO renewed_roles, renewed_tokens
      FROM done AS d;
    RETURN QUERY
        SELECT i.role, i.token, r.role IS NOT NULL, now(),
               CASE WHEN r.role IS NOT NULL THEN i.token ELSE s.holder_token END,
               CASE WHEN r.role IS NOT NULL THEN NULL ELSE s.holder_id END,
               r.role IS NULL AND s.paused_at IS NOT NULL
          FROM unnest(p_roles, p_tokens) AS i(role, token)
          LEFT JOIN unnest(renewed_roles, renewed_tokens) AS r(role, token)
                 ON r.role = i.role AND r.token = i.token
          LEFT JOIN LATERAL (SELECT x.* FROM @schema@.leader_leases AS x WHERE x.role = i.role) AS s ON true;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_release_many(p_roles text[], p_tokens bigint[], p_stamps boolean[],
                                              p_cooldowns_ms bigint[], p_outcomes text[], p_reasons text[],
                                              p_errors text[])
RETURNS TABLE (role text, token bigint, released boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- RELEASE for many terms, each the one-row RELEASE (history), in
-- role order. Their claims in flight are drained first, together: one
-- grace for the batch, where each RELEASE's own drain would wait one per
-- role (generation 8; review 8, L3). Each RELEASE's drain then finds its
-- row locked by this transaction already. Every row of the batch is
-- locked first, in role order, so the drain (which locks only the current
-- terms' rows) and the RELEASEs after it (which also write the rows of
-- terms a pause ended) take no row out of that order (review 9, L4).
#variable_conflict use_column
DECLARE
    n integer := cardinality(p_roles);
    i integer;
BEGIN
    PERFORM @schema@.leader_check_batch('leader_release_many', p_roles);
    IF cardinality(p_tokens) IS DISTINCT FROM n OR cardinality(p_stamps) IS DISTINCT FROM n
       OR cardinality(p_cooldowns_ms) IS DISTINCT FROM n OR cardinality(p_outcomes) IS DISTINCT FROM n
       OR cardinality(p_reasons) IS DISTINCT FROM n OR cardinality(p_errors) IS DISTINCT FROM n
       OR array_position(p_tokens, NULL) IS NOT NULL OR array_ndims(p_tokens) > 1 THEN
        RAISE EXCEPTION 'ticklease: leader_release_many needs one entry per role in every array'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Every entry's values before any term ends, each in a statement of its
    -- own: a refusal from inside the loop's query would carry its text.
    FOR i IN 1 .. n LOOP
        PERFORM @schema@.leader_check_release(p_stamps[i], p_cooldowns_ms[i], p_outcomes[i], p_reasons[i]);
    END LOOP;
    PERFORM 1 FROM @schema@.leader_leases AS l WHERE l.role = ANY (p_roles) ORDER BY l.role FOR NO KEY UPDATE;
    PERFORM @schema@.leader_fence_drain(p_roles, p_tokens, true);
    FOR i IN SELECT o.i FROM generate_subscripts(p_roles, 1) AS o(i) ORDER BY p_roles[o.i], p_tokens[o.i] LOOP
        RETURN QUERY SELECT p_roles[i], p_tokens[i],
                            @schema@.leader_release(p_roles[i], p_tokens[i], p_stamps[i], p_cooldowns_ms[i],
                                                    p_outcomes[i], p_reasons[i], p_errors[i]);
    END LOOP;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_replica_beat(p_family text, p_holder text, p_ttl_ms bigint, p_key bigint)
RETURNS TABLE (holder_id text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Registers this replica as serving the family for another lease TTL (at
-- most a minute, whatever the caller asks: a registration no one renews
-- is gone within a minute) and returns the replicas that do, ordered by
-- holder id, at most 1,000 (this one always among them). Rows dead for a
-- minute are deleted, at most 1,000 a beat.
#variable_conflict use_column
BEGIN
    -- In a statement of its own, as leader_acquire's bounds.
    PERFORM @schema@.leader_check_ms('lease_ttl', p_ttl_ms), @schema@.leader_require_key(p_key);
    INSERT INTO @schema@.leader_replicas AS x (family, holder_id, holder_key, seen_at, expires_at)
    VALUES (p_family, p_holder, p_key, now(),
            now() + least(@schema@.leader_check_ms('lease_ttl', p_ttl_ms), interval '1 minute'))
    ON CONFLICT (family, holder_id) DO UPDATE
       SET holder_key = EXCLUDED.holder_key, seen_at = EXCLUDED.seen_at, expires_at = EXCLUDED.expires_at;
    -- Rows another beat is deleting are skipped: two beats never wait on each other.
    DELETE FROM @schema@.leader_replicas AS x
     WHERE x.ctid IN (SELECT d.ctid FROM @schema@.leader_replicas AS d
                       WHERE d.family = p_family AND d.expires_at < now() - interval '1 minute'
                       LIMIT 1000
                       FOR UPDATE SKIP LOCKED);
    RETURN QUERY
        SELECT r.holder_id
          FROM (SELECT x.holder_id FROM @schema@.leader_replicas AS x
                 WHERE x.family = p_family AND x.expires_at > now()
                   AND (x.holder_key IS NULL OR x.holder_key IN (SELECT @schema@.leader_live_keys()))
                 ORDER BY x.holder_id = p_holder DESC, x.holder_id
                 LIMIT 1000) AS r
         ORDER BY r.holder_id;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_replica_leave(p_family text, p_holder text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- A replica stopping: the others count without it at once.
BEGIN
    DELETE FROM @schema@.leader_replicas AS x WHERE x.family = p_family AND x.holder_id = p_holder;
    RETURN FOUND;
END
$fn$;

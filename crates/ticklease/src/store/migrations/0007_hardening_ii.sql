-- ticklease 0007: hardening II (issue 22). Upgrades a database with live
-- terms in place: every term keeps its token, holder and expiry.
--
-- 1. No decision notifies. RELEASE, pause, unpause and run-now called
--    pg_notify in their own transaction: Postgres adds notifications to its
--    one cluster-wide queue at COMMIT, under a cluster-wide lock, and fails
--    the COMMIT when the queue is full, which any login can bring about (a
--    listener idle in a transaction holds the queue's tail). The library now
--    notifies after the decision committed, in a statement of its own; a
--    lost notification costs followers only their fallback wake-up.
-- 2. Liveness takes no lock. leader_key_alive granted a shared advisory
--    lock for every dead key it tested, held to the end of the caller's
--    transaction: a statement over many dead keys filled the cluster's lock
--    table. It now reads pg_locks. And a key counts only while the backend
--    that took it holds it: a key's high 32 bits are its coordination
--    backend's pid (the session builds it so), so a login that queues for a
--    dead holder's key cannot keep its term alive. Statements over many rows
--    (leader_status, the batched ACQUIRE, the registry) read the lock table
--    a fixed number of times (at most 3), not once per row.
-- 3. The fence's commit check runs only at COMMIT, decided without reading
--    query text: fired early (SET CONSTRAINTS ... IMMEDIATE, from anywhere)
--    it refuses, and a fenced transaction cannot be prepared. The fence no
--    longer cuts a live term's slow transaction by an idle limit; the next
--    term's leader ends a superseded term's transactions instead.
-- 4. Texts are bounded at every entry point: holder ids 200 characters
--    (refused), who paused 200 and why 500 (cut), as the history keeps them.
-- 5. Two indexes bound the status page's timeline by roles x slices.
-- 6. A replica registration lives at most a minute past its last beat, and
--    a beat returns at most 1,000 replicas.
-- 7. Retention reaches roles no longer written (history writes also delete
--    the oldest rows of any role past keep_for, 1,000 at a time), and an
--    operator can forget a role for good (leader_forget).

SET LOCAL lock_timeout = '5s';

-- Texts stored before the bounds are cut to them.
UPDATE leader_leases SET paused_by = left(paused_by, 200) WHERE length(paused_by) > 200;
UPDATE leader_leases SET pause_reason = left(pause_reason, 500) WHERE length(pause_reason) > 500;
UPDATE leader_leases SET holder_id = left(holder_id, 200) WHERE length(holder_id) > 200;
UPDATE leader_leases SET last_tick_holder = left(last_tick_holder, 200) WHERE length(last_tick_holder) > 200;
ALTER TABLE leader_leases
    ADD CONSTRAINT leader_leases_bounded_texts CHECK (
        length(holder_id) <= 200 AND length(last_tick_holder) <= 200
        AND length(paused_by) <= 200 AND length(pause_reason) <= 500);

-- The status page's timeline reads per role and slice through these, at
-- most TimelineSlice::TERMS_READ entries of each per cell, so its cost is
-- bounded by roles x slices, not by the number of ticks. A plain CREATE
-- INDEX holds history writes (RELEASE, a takeover) for the build, about 1-2
-- s per million rows: they wait, bounded by their statement timeout.
CREATE INDEX leader_history_term_at ON leader_history (role, at) WHERE kind = 'term';
CREATE INDEX leader_history_notable_at ON leader_history (role, at) INCLUDE (outcome, reason)
    WHERE kind = 'term' AND outcome <> 'completed';

DO $migration$
DECLARE
    def text;
BEGIN
    FOREACH def IN ARRAY ARRAY[
$def$
CREATE FUNCTION @schema@.leader_live_keys() RETURNS SETOF bigint
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
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_key_alive(p_key bigint) RETURNS boolean
LANGUAGE sql VOLATILE
AS $fn$
    -- True unless no session of this database holds the key, or only a
    -- backend other than the one that took it. NULL (a holder without a
    -- coordination session): the lease alone decides.
    SELECT p_key IS NULL OR p_key IN (SELECT @schema@.leader_live_keys())
$fn$
$def$,
$def$
CREATE FUNCTION @schema@.leader_term_live_among(p_holder_id text, p_expires_at timestamptz, p_key bigint,
                                                p_at timestamptz, p_live bigint[])
RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $fn$
    -- leader_term_live with the live keys read once for a whole statement.
    SELECT @schema@.leader_lease_live(p_holder_id, p_expires_at, p_at) AND (p_key IS NULL OR p_key = ANY (p_live))
$fn$
$def$,
$def$
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
$fn$
$def$,
$def$
CREATE FUNCTION @schema@.leader_forget(p_role text) RETURNS boolean
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
    SELECT * INTO gone FROM @schema@.leader_leases AS l WHERE l.role = p_role FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ticklease: unknown role %', left(p_role, 63) USING ERRCODE = 'no_data_found';
    END IF;
    IF gone.paused_at IS NOT NULL
       OR @schema@.leader_term_live(gone.holder_id, gone.expires_at, gone.holder_key, now()) THEN
        RETURN false;
    END IF;
    DELETE FROM @schema@.leader_leases AS l WHERE l.role = p_role;
    DELETE FROM @schema@.leader_history AS h WHERE h.role = p_role;
    RETURN true;
END
$fn$
$def$,
$def$
CREATE FUNCTION @schema@.leader_role_hash(p_role text, p_which integer) RETURNS integer
LANGUAGE sql IMMUTABLE
AS $fn$
    -- Two independent 32-bit hashes of this schema's role: the fence's locks
    -- carry both, so the sweep mistakes another role (or another schema's
    -- role of the same name) for this one only when both collide (2^-64).
    -- The schema goes with its length: `a:b` + `c` is not `a` + `b:c`.
    SELECT hashtext('ticklease:' || p_which || ':' || length(@schema_text@) || ':' || @schema_text@ || ':' || p_role)
$fn$
$def$,
$def$
CREATE FUNCTION @schema@.leader_token_low(p_token bigint) RETURNS integer
LANGUAGE sql IMMUTABLE
AS $fn$
    -- A token's low 32 bits as the int4 an advisory lock key takes (the
    -- lock shows them as its objid, unsigned).
    SELECT ((p_token & 4294967295) - CASE WHEN (p_token & 2147483648) <> 0 THEN 4294967296 ELSE 0 END)::integer
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_fence(p_role text, p_token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- The fence. True while (role, token) is the live, unpaused term at this
-- instant (clock_timestamp(): not the transaction's or the client message's
-- start). Call it as an uncorrelated scalar subquery, (SELECT leader_fence($r, $t)),
-- so it runs once per statement. When true it registers the transaction, and
-- leader_fence_commit checks the term again when the transaction commits:
-- a claim commits only while its term is live, and holds no lock on the
-- lease row until then. It no longer bounds the transaction's idle time (a
-- live term's slow transaction was cut): it takes two shared advisory locks
-- of the term, (leader_role_hash(role, 1 and 2), the token's low 32 bits),
-- held to the transaction's end and visible in pg_locks, so a later term's
-- leader ends an earlier term's transactions (leader_fence_sweep). Tried,
-- never waited for: any login can queue an exclusive lock on such a key, and
-- a fence that waited would stall the live term's claims; a transaction
-- whose try failed is one the sweep cannot see (its COMMIT check still holds).
BEGIN
    -- Under REPEATABLE READ or SERIALIZABLE both checks would read the
    -- transaction's snapshot and miss a pause made since.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'ticklease: leader_fence needs READ COMMITTED, not %',
                        current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported';
    END IF;
    PERFORM 1
       FROM @schema@.leader_leases AS l
      WHERE l.role = p_role AND l.holder_token = p_token AND l.paused_at IS NULL
        AND @schema@.leader_lease_live(l.holder_id, l.expires_at, clock_timestamp());
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_try_advisory_xact_lock_shared(@schema@.leader_role_hash(p_role, 1), @schema@.leader_token_low(p_token)),
            pg_try_advisory_xact_lock_shared(@schema@.leader_role_hash(p_role, 2), @schema@.leader_token_low(p_token));
    INSERT INTO @schema@.leader_fence_claims (xid, role, token)
    VALUES (pg_current_xact_id(), p_role, p_token)
    ON CONFLICT DO NOTHING;
    -- With SET CONSTRAINTS ... IMMEDIATE the check has fired already, at the
    -- INSERT, and would not run at COMMIT.
    PERFORM 1 FROM @schema@.leader_fence_claims AS c
     WHERE c.xid = pg_current_xact_id() AND c.role = p_role AND c.token = p_token;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ticklease: the fence''s commit check is deferred; SET CONSTRAINTS ... IMMEDIATE would skip it'
            USING ERRCODE = 'feature_not_supported';
    END IF;
    RETURN true;
END
$fn$
$def$,
$def$
CREATE FUNCTION @schema@.leader_fence_sweep(p_roles text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Ends the transactions that passed the fence in a term of p_roles[i] that
-- is over: every term before the role's current one, and the current one
-- too once it is released or paused. So a claimer frozen in a superseded
-- term gives back the rows it locked. The terms are read from the lease
-- row, never from the caller, and only a newer token, a release or a pause
-- counts (not an expiry nor a lost key, after which RENEW may still extend
-- the term): a snapshot older than the row only sees less to end. ACQUIRE
-- calls it when it takes over a term never released, and pause when it
-- ends a term, inside their statements. Earlier is read from the tokens'
-- low 32 bits (the lock's objid): tokens are epoch milliseconds at least,
-- so a term counts as earlier for about 24 days of later acquisitions.
-- Each backend found is looked at again, alone, just before it is ended (a
-- pooled backend may have finished that transaction and begun another
-- client's: then it holds the locks no more). At most 64 a call: the locks
-- are public, and a login's own backends holding matching pairs only cost
-- a look each. It ends backends with its owner's rights: a superuser, or a
-- member of pg_signal_backend (others' backends are skipped, and never a
-- superuser's unless the owner is one). Returns how many it ended.
DECLARE
    claimer integer;
    ended integer := 0;
BEGIN
    PERFORM @schema@.leader_check_batch('leader_fence_sweep', p_roles);
    FOR claimer IN SELECT s.pid FROM @schema@.leader_fence_swept(p_roles, NULL) AS s LIMIT 64 LOOP
        CONTINUE WHEN NOT EXISTS (SELECT 1 FROM @schema@.leader_fence_swept(p_roles, claimer));
        BEGIN
            IF pg_terminate_backend(claimer) THEN
                ended := ended + 1;
            END IF;
        EXCEPTION WHEN insufficient_privilege THEN
            NULL;
        END;
    END LOOP;
    RETURN ended;
END
$fn$
$def$,
$def$
CREATE FUNCTION @schema@.leader_fence_swept(p_roles text[], p_pid integer) RETURNS TABLE (pid integer)
LANGUAGE sql VOLATILE
AS $fn$
    -- The backends (all, or p_pid alone) holding both fence locks of a
    -- term of p_roles that is over (leader_fence_sweep): one read of the
    -- lock table, joined to the roles' two hashes by equality, so its cost
    -- grows with the locks and roles, not with their product.
    WITH over AS (
        SELECT l.role,
               l.holder_token + CASE WHEN l.holder_id IS NULL OR l.paused_at IS NOT NULL THEN 1 ELSE 0 END
                   AS before
          FROM @schema@.leader_leases AS l
         WHERE l.role = ANY (p_roles)
    ),
    hashes AS (
        SELECT o.role, o.before, h.which,
               (@schema@.leader_role_hash(o.role, h.which)::bigint & 4294967295)::oid AS classid
          FROM over AS o CROSS JOIN (VALUES (1), (2)) AS h(which)
    )
    SELECT DISTINCT k.pid
      FROM pg_catalog.pg_locks AS k
      JOIN hashes AS h ON h.classid = k.classid
     WHERE k.locktype = 'advisory' AND k.objsubid = 2 AND k.granted AND k.pid <> pg_backend_pid()
       AND (p_pid IS NULL OR k.pid = p_pid)
       AND k.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())
       AND ((h.before - k.objid::bigint) & 4294967295) BETWEEN 1 AND 2147483647
     -- The same backend holds both hashes' locks of the same term.
     GROUP BY h.role, k.pid, k.objid
    HAVING count(DISTINCT h.which) = 2
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_fence_commit() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- At COMMIT of a transaction that passed the fence: the term must still be
-- live and unpaused. FOR KEY SHARE makes a takeover (FOR UPDATE) or a pause
-- (FOR UPDATE after its mark) wait for this commit to finish; it is held only
-- from here to the end of the commit. So the check must run at COMMIT and
-- nowhere else, and no query text tells where it runs:
-- * Fired early (SET CONSTRAINTS ... IMMEDIATE, at the top level or from a
--   function), its lock would be held until a commit that may come much
--   later. It queues a probe, a row of its own table whose check is
--   deferred like this one: at COMMIT the probe fires after this check
--   returned, at trigger depth 1; under IMMEDIATE it fires inside this
--   check (depth 2) and refuses, which fails the transaction.
-- * At PREPARE TRANSACTION the lock would be held until COMMIT PREPARED.
--   Where prepared transactions are enabled, the check exports a snapshot:
--   Postgres refuses to prepare a transaction that exported one, and drops
--   the export at COMMIT.
BEGIN
    IF NEW.role = '' THEN
        IF pg_trigger_depth() > 1 THEN
            RAISE EXCEPTION 'ticklease: a fenced transaction cannot set its constraints immediate'
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'The fence''s commit check runs at COMMIT; SET CONSTRAINTS ... IMMEDIATE fired it early.';
        END IF;
        DELETE FROM @schema@.leader_fence_claims AS c
         WHERE c.xid = NEW.xid AND c.role = '' AND c.token = NEW.token;
        RETURN NULL;
    END IF;
    -- First, so an early firing is refused before anything else can fail.
    INSERT INTO @schema@.leader_fence_claims (xid, role, token) VALUES (NEW.xid, '', NEW.token)
    ON CONFLICT DO NOTHING;
    IF current_setting('max_prepared_transactions') <> '0' THEN
        PERFORM pg_export_snapshot();
    END IF;
    PERFORM 1 FROM @schema@.leader_leases AS l
     WHERE l.role = NEW.role AND l.holder_token = NEW.token AND l.paused_at IS NULL
       AND @schema@.leader_lease_live(l.holder_id, l.expires_at, clock_timestamp())
       FOR KEY SHARE;
    -- A second read with a fresh snapshot: a pause (a non-key update, which
    -- FOR KEY SHARE waited for but does not re-check) committed meanwhile.
    IF FOUND THEN
        PERFORM 1 FROM @schema@.leader_leases AS l
         WHERE l.role = NEW.role AND l.holder_token = NEW.token AND l.paused_at IS NULL
           AND @schema@.leader_lease_live(l.holder_id, l.expires_at, clock_timestamp());
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ticklease: the term (%, %) ended before this fenced transaction committed',
                        NEW.role, NEW.token
            USING ERRCODE = 'serialization_failure',
                  HINT = 'A superseded leader claims nothing; the claim was rolled back.';
    END IF;
    DELETE FROM @schema@.leader_fence_claims AS c
     WHERE c.xid = NEW.xid AND c.role = NEW.role AND c.token = NEW.token;
    RETURN NULL;
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_release(p_role text, p_token bigint, p_stamp boolean, p_cooldown_ms bigint,
                                         p_outcome text, p_reason text, p_error text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- RELEASE as in 0005, recording how the term ended. It notifies no one:
-- the library notifies after the commit, in a statement of its own.
DECLARE
    cooldown interval := CASE WHEN p_cooldown_ms IS NOT NULL
                              THEN @schema@.leader_check_ms('cooldown', p_cooldown_ms) END;
    ended @schema@.leader_leases;
BEGIN
    IF p_stamp IS NULL OR p_outcome IS NULL
       OR p_outcome NOT IN ('completed', 'interrupted', 'lost', 'failed', 'panicked')
       OR p_reason NOT IN ('taken_over', 'paused', 'released', 'heartbeat_timeout') THEN
        RAISE EXCEPTION 'ticklease: leader_release needs p_stamp, an outcome and a known loss reason, got % / % / %',
                        p_stamp, p_outcome, left(p_reason, 40)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The lock RELEASE's UPDATE takes anyway (no key column changes), so it
    -- still never waits for a claim's commit check.
    SELECT * INTO ended FROM @schema@.leader_leases AS l
     WHERE l.role = p_role AND l.holder_token = p_token AND l.holder_id IS NOT NULL
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE @schema@.leader_leases AS l
       SET holder_id = NULL,
           acquired_at = NULL,
           expires_at = NULL,
           holder_key = NULL,
           last_tick_ended_at = CASE WHEN p_stamp THEN now() ELSE l.last_tick_ended_at END,
           last_tick_holder = CASE WHEN p_stamp THEN l.holder_id ELSE l.last_tick_holder END,
           not_before = now() + cooldown
     WHERE l.role = p_role;
    PERFORM @schema@.leader_history_add(p_role, 'term', p_token, ended.holder_id, ended.acquired_at,
                                        p_outcome, p_reason, NULL, p_error);
    RETURN true;
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_pause(p_role text, p_by text, p_reason text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Pause as in 0005, recording the pause and the term it ended (lost: paused).
-- Who and why are cut to 200 and 500 characters, as the history keeps them.
-- It notifies no one (see leader_release).
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
    -- The mark's own lock (it conflicts with no claim), taken first so the
    -- term recorded is the one the mark ends.
    SELECT * INTO ended FROM @schema@.leader_leases AS l WHERE l.role = p_role FOR NO KEY UPDATE;
    UPDATE @schema@.leader_leases AS l
       SET paused_at = now(), paused_by = p_by, pause_reason = coalesce(p_reason, ''),
           holder_id = NULL, acquired_at = NULL, expires_at = NULL, holder_key = NULL
     WHERE l.role = p_role AND l.paused_at IS NULL
    RETURNING true INTO changed;
    PERFORM 1 FROM @schema@.leader_leases AS l WHERE l.role = p_role FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ticklease: unknown role %', p_role USING ERRCODE = 'no_data_found';
    END IF;
    IF changed THEN
        IF ended.holder_id IS NOT NULL THEN
            PERFORM @schema@.leader_history_add(p_role, 'term', ended.holder_token, ended.holder_id,
                                                ended.acquired_at, 'lost',
                                                CASE WHEN ended.expires_at <= now() THEN 'expired' ELSE 'paused' END,
                                                NULL, NULL);
        END IF;
        PERFORM @schema@.leader_history_add(p_role, 'pause', NULL, NULL, NULL, NULL,
                                            coalesce(p_reason, ''), p_by, NULL);
        -- The paused term's open transactions end (their COMMIT would fail).
        PERFORM @schema@.leader_fence_sweep(ARRAY[p_role]);
    END IF;
    RETURN coalesce(changed, false);
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_unpause(p_role text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Unpause as in 0005, recorded with the session's login user; it notifies
-- no one (see leader_release).
DECLARE
    changed boolean;
BEGIN
    UPDATE @schema@.leader_leases AS l
       SET paused_at = NULL, paused_by = NULL, pause_reason = NULL
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
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_run_now(p_role text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- Run-now as in 0005, recorded with the session's login user; it notifies
-- no one (see leader_release).
DECLARE
    had boolean;
BEGIN
    SELECT l.not_before IS NOT NULL INTO had FROM @schema@.leader_leases AS l WHERE l.role = p_role FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ticklease: unknown role %', p_role USING ERRCODE = 'no_data_found';
    END IF;
    UPDATE @schema@.leader_leases AS l SET not_before = NULL WHERE l.role = p_role;
    PERFORM @schema@.leader_history_add(p_role, 'run_now', NULL, NULL, NULL, NULL, NULL, session_user, NULL);
    RETURN had;
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_acquire(p_role text, p_holder text, p_ttl_ms bigint, p_interval_ms bigint, p_key bigint)
RETURNS TABLE (holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
               held boolean, paused_by text, pause_reason text, due_at timestamptz, holder_key bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- ACQUIRE as in 0005, refusing a holder id over 200 characters (as the
-- batched ACQUIRE does). A term it takes over that was never released (its
-- holder died, froze or lost its link) is recorded as lost: expired, or
-- holder_gone when its holder's coordination key was held no more; and the
-- transactions still open in it are ended (leader_fence_sweep). `s` is
-- the row as of the statement's start; if a RELEASE of that term committed
-- in between, it recorded the term first and this row is not written.
#variable_conflict use_column
BEGIN
    IF p_holder IS NULL OR length(p_holder) > 200 THEN
        RAISE EXCEPTION 'ticklease: leader_acquire needs a holder id of at most 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @schema@.leader_require_key(p_key);
    RETURN QUERY
    WITH acquired AS (
        INSERT INTO @schema@.leader_leases AS l (role, holder_token, holder_id, acquired_at, expires_at, holder_key)
        VALUES (p_role, @schema@.leader_token_seed(), p_holder, now(),
                now() + @schema@.leader_check_ms('lease_ttl', p_ttl_ms), p_key)
        ON CONFLICT (role) DO UPDATE
           SET role = EXCLUDED.role,
               holder_token = greatest(l.holder_token + 1, @schema@.leader_token_seed()),
               holder_id = EXCLUDED.holder_id,
               acquired_at = EXCLUDED.acquired_at,
               expires_at = EXCLUDED.expires_at,
               holder_key = EXCLUDED.holder_key
         WHERE l.paused_at IS NULL
           AND NOT @schema@.leader_term_live(l.holder_id, l.expires_at, l.holder_key, now())
           AND (l.last_tick_ended_at IS NULL
                OR l.last_tick_ended_at <= now() - @schema@.leader_check_ms('interval', p_interval_ms))
           AND (l.not_before IS NULL OR l.not_before <= now())
        RETURNING l.holder_token
    ),
    taken_over AS (
        SELECT @schema@.leader_history_add(p_role, 'term', s.holder_token, s.holder_id, s.acquired_at, 'lost',
                   CASE WHEN s.expires_at <= now() THEN 'expired' ELSE 'holder_gone' END, NULL, NULL),
               @schema@.leader_fence_sweep(ARRAY[p_role])
          FROM acquired AS a
          JOIN @schema@.leader_leases AS s ON s.role = p_role AND s.holder_id IS NOT NULL
    )
    SELECT a.holder_token,
           now(),
           s.holder_id,
           s.expires_at,
           @schema@.leader_term_live(s.holder_id, s.expires_at, s.holder_key, now()),
           s.paused_by,
           s.pause_reason,
           greatest(s.last_tick_ended_at + @schema@.leader_check_ms('interval', p_interval_ms), s.not_before),
           s.holder_key
      FROM (SELECT 1) AS one
      LEFT JOIN acquired AS a ON true
      LEFT JOIN @schema@.leader_leases AS s ON s.role = p_role
      -- Referenced, so the planner cannot drop the join and the row with it.
      JOIN (SELECT count(*) AS n FROM taken_over) AS recorded ON recorded.n IS NOT NULL;
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.leader_acquire_many(p_roles text[], p_holder text, p_ttl_ms bigint,
                                              p_interval_ms bigint, p_key bigint, p_limit integer)
RETURNS TABLE (role text, holder_token bigint, db_now timestamptz, holder_id text, expires_at timestamptz,
               held boolean, paused_by text, pause_reason text, due_at timestamptz, holder_key bigint,
               over_limit boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- ACQUIRE for many roles of one interval: starts terms on at most p_limit
-- of them, taken in the caller's order (its preferred roles first) among
-- those that look acquirable. The picked rows are locked in role order and
-- checked again under the lock with ACQUIRE's predicate (a row another
-- replica took meanwhile drops out), each gets ACQUIRE's token and
-- expiry, and a term taken over without a RELEASE is recorded as lost
-- (expired, or holder_gone) as the one-row ACQUIRE of 0005 does, its open
-- transactions ended (leader_fence_sweep). Rows it
-- does not pick are read without a lock, so a batch never waits on terms
-- held elsewhere. over_limit: acquirable, but past the limit. The live
-- coordination keys are read once (leader_live_keys), not once per row.
#variable_conflict use_column
DECLARE
    picked text[];
    won_roles text[];
    won_tokens bigint[];
    gone text[];
    every_interval interval := @schema@.leader_check_ms('interval', p_interval_ms);
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
    IF NOT (p_key IS NULL OR p_key = ANY (live)) THEN
        PERFORM @schema@.leader_require_key(p_key);
    END IF;
    SELECT coalesce(array_agg(c.role ORDER BY c.ord), '{}') INTO picked
      FROM (SELECT f.role, f.ord
              FROM (SELECT u.role, min(u.ord) AS ord
                      FROM unnest(p_roles) WITH ORDINALITY AS u(role, ord)
                     GROUP BY u.role) AS f
              -- Row by row through the primary key: the table is updated
              -- all the time, and a scan of it would grow with its dead rows.
              LEFT JOIN LATERAL (SELECT x.* FROM @schema@.leader_leases AS x WHERE x.role = f.role) AS l ON true
             WHERE l.role IS NULL
                OR (l.paused_at IS NULL
                    AND NOT @schema@.leader_term_live_among(l.holder_id, l.expires_at, l.holder_key, now(), live)
                    AND (l.last_tick_ended_at IS NULL OR l.last_tick_ended_at <= now() - every_interval)
                    AND (l.not_before IS NULL OR l.not_before <= now()))
             ORDER BY f.ord
             LIMIT p_limit) AS c;
    -- Picked roles without a row get one first (a new statement: visible
    -- below), created in role order: batches that create the same new rows
    -- in their callers' orders would deadlock on each other's inserts.
    PERFORM @schema@.leader_seed(ARRAY(SELECT p FROM unnest(picked) AS p ORDER BY p));
    -- The picked rows locked first, in role order; then the live keys read
    -- once more, fresh for every locked row (a holder may have renewed with
    -- a new key since the first read), instead of once per row.
    PERFORM 1 FROM @schema@.leader_leases AS l WHERE l.role = ANY (picked) ORDER BY l.role FOR UPDATE OF l;
    live := ARRAY(SELECT @schema@.leader_live_keys());
    WITH locked AS (
        SELECT l.role, l.holder_token, l.holder_id, l.acquired_at, l.expires_at
          FROM @schema@.leader_leases AS l
         WHERE l.role = ANY (picked)
           AND l.paused_at IS NULL
           AND NOT @schema@.leader_term_live_among(l.holder_id, l.expires_at, l.holder_key, now(), live)
           AND (l.last_tick_ended_at IS NULL OR l.last_tick_ended_at <= now() - every_interval)
           AND (l.not_before IS NULL OR l.not_before <= now())
         ORDER BY l.role
           FOR UPDATE OF l
    ),
    started AS (
        UPDATE @schema@.leader_leases AS l
           SET holder_token = greatest(l.holder_token + 1, @schema@.leader_token_seed()),
               holder_id = p_holder,
               acquired_at = now(),
               expires_at = now() + ttl,
               holder_key = p_key
          FROM locked AS k
         WHERE l.role = k.role
        RETURNING l.role, l.holder_token
    ),
    taken_over AS (
        SELECT k.role,
               @schema@.leader_history_add(k.role, 'term', k.holder_token, k.holder_id, k.acquired_at, 'lost',
                   CASE WHEN k.expires_at <= now() THEN 'expired' ELSE 'holder_gone' END, NULL, NULL)
          FROM locked AS k
         WHERE k.holder_id IS NOT NULL
    )
    SELECT coalesce(array_agg(t.role), '{}'), coalesce(array_agg(t.holder_token), '{}'),
           -- Referenced, so the planner keeps it.
           (SELECT array_agg(o.role) FROM taken_over AS o)
      INTO won_roles, won_tokens, gone
      FROM started AS t;
    -- The taken-over terms' open transactions end, in one read of the lock table.
    IF cardinality(gone) > 0 THEN
        PERFORM @schema@.leader_fence_sweep(gone);
    END IF;
    RETURN QUERY
        SELECT w.role, w.token, now(), p_holder, now() + ttl, true, NULL::text, NULL::text, NULL::timestamptz,
               p_key, false
          FROM unnest(won_roles, won_tokens) AS w(role, token);
    -- The others, as they are now (a fresh snapshot: a race's winner shows).
    RETURN QUERY
        SELECT DISTINCT ON (u.role)
               u.role, NULL::bigint, now(), s.holder_id, s.expires_at,
               coalesce(@schema@.leader_term_live_among(s.holder_id, s.expires_at, s.holder_key, now(), live), false),
               s.paused_by, s.pause_reason,
               greatest(s.last_tick_ended_at + every_interval, s.not_before),
               s.holder_key,
               u.role <> ALL (picked)
               AND (s.role IS NULL
                    OR (s.paused_at IS NULL
                        AND NOT @schema@.leader_term_live_among(s.holder_id, s.expires_at, s.holder_key, now(), live)
                        AND (s.last_tick_ended_at IS NULL OR s.last_tick_ended_at <= now() - every_interval)
                        AND (s.not_before IS NULL OR s.not_before <= now())))
          FROM unnest(p_roles) AS u(role)
          LEFT JOIN LATERAL (SELECT x.* FROM @schema@.leader_leases AS x WHERE x.role = u.role) AS s ON true
         WHERE u.role <> ALL (won_roles)
         ORDER BY u.role;
END
$fn$
$def$,
$def$
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
    PERFORM @schema@.leader_require_key(p_key);
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
$fn$
$def$
    ] LOOP
        EXECUTE replace(replace(def, '@schema_text@', quote_literal(current_schema())),
                        '@schema@', quote_ident(current_schema()));
    END LOOP;
END
$migration$;

-- leader_status as in 0005, reading the live keys once for all its rows.
CREATE OR REPLACE VIEW leader_status AS
WITH live AS (SELECT ARRAY(SELECT leader_live_keys()) AS keys)
SELECT l.role,
       leader_term_live_among(l.holder_id, l.expires_at, l.holder_key, statement_timestamp(), live.keys) AS held,
       l.holder_id,
       l.holder_token,
       l.acquired_at,
       l.expires_at,
       statement_timestamp() AS db_now,
       CASE WHEN leader_term_live_among(l.holder_id, l.expires_at, l.holder_key, statement_timestamp(), live.keys)
            THEN l.expires_at - statement_timestamp() END AS remaining,
       l.paused_at,
       l.paused_by,
       l.pause_reason,
       l.last_tick_ended_at,
       l.last_tick_holder,
       l.not_before,
       (SELECT h.outcome FROM leader_history AS h
         WHERE h.role = l.role AND h.kind = 'term' ORDER BY h.id DESC LIMIT 1) AS last_outcome
  FROM leader_leases AS l CROSS JOIN live;

SELECT leader_secure_functions();

-- leader_grant of 0006; readers of leader_status also call leader_live_keys
-- and leader_term_live_among.
CREATE OR REPLACE FUNCTION leader_grant(p_app text, p_operator text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY array_remove(ARRAY[p_app, p_operator], NULL) LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created concurrently by a migration of another database
            END;
        END IF;
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), r);
        EXECUTE format('GRANT SELECT ON leader_status, leader_history, leader_replicas,
                        ticklease_schema_migrations TO %I', r);
        -- leader_status calls them with the reader's rights.
        EXECUTE format('GRANT EXECUTE ON FUNCTION leader_lease_live(text, timestamptz, timestamptz),
                        leader_key_alive(bigint), leader_term_live(text, timestamptz, bigint, timestamptz),
                        leader_live_keys(), leader_term_live_among(text, timestamptz, bigint, timestamptz, bigint[])
                        TO %I', r);
    END LOOP;
    IF p_app IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pg_roles r, pg_class c
                    WHERE r.rolname = p_app AND c.oid = 'leader_leases'::regclass
                      AND (r.rolsuper OR pg_has_role(r.oid, c.relowner, 'USAGE'))) THEN
            RAISE EXCEPTION 'ticklease: % owns the schema (or is a superuser): it cannot be the application role', p_app
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Create a separate login role for the application, a member of the app role.';
        END IF;
        -- The app reads the tables and writes them only through these functions.
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON leader_leases, leader_history, leader_replicas
                        FROM %I', p_app);
        EXECUTE format('GRANT SELECT ON leader_leases TO %I', p_app);
        EXECUTE format('GRANT EXECUTE ON FUNCTION leader_acquire(text, text, bigint, bigint),
                        leader_acquire(text, text, bigint, bigint, bigint),
                        leader_renew(text, bigint, bigint), leader_renew(text, bigint, bigint, bigint),
                        leader_release(text, bigint, boolean, bigint),
                        leader_release(text, bigint, boolean, bigint, text, text, text),
                        leader_acquire_many(text[], text, bigint, bigint, bigint, integer),
                        leader_renew_many(text[], bigint[], bigint, bigint),
                        leader_release_many(text[], bigint[], boolean[], bigint[], text[], text[], text[]),
                        leader_replica_beat(text, text, bigint, bigint), leader_replica_leave(text, text),
                        leader_seed(text[]), leader_fence(text, bigint), leader_fence_lock(text, bigint),
                        leader_fence_sweep(text[])
                        TO %I', p_app);
    END IF;
    IF p_operator IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION leader_pause(text, text, text), leader_unpause(text),
                        leader_run_now(text), leader_fence_sweep(text[]), leader_forget(text)
                        TO %I', p_operator);
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION leader_grant(text, text) FROM PUBLIC;

SELECT leader_regrant();

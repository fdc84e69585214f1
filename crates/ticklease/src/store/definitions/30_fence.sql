-- The fence and its commit check: a claim statement passes the fence while
-- its term is live, the commit check refuses its COMMIT once the term is
-- over, and the next term's leader ends a superseded term's open
-- transactions (the sweep), through two advisory locks per term.

CREATE OR REPLACE FUNCTION @schema@.leader_role_hash(p_role text, p_which integer) RETURNS integer
LANGUAGE sql IMMUTABLE
AS $fn$
    -- Independent 32-bit hashes of this schema's role, p_which picks one.
    -- The generation-6 fence's locks carry two, so its sweep mistakes
    -- another role (or another schema's role of the same name) for this one
    -- only when both collide (2^-64). The term's key (generation 9) carries
    -- one and the token's low 32 bits: another role's claimers pass for this
    -- one's only when that hash collides (2^-32 a pair of roles) and their
    -- terms' tokens share their low 32 bits (epoch milliseconds: terms begun
    -- in the same millisecond); a drain then ends them too, which costs them
    -- their claim, never the fence (review 11, L1).
    -- The schema goes with its length: `a:b` + `c` is not `a` + `b:c`.
    -- Every operand is text (generation 7): `text || integer` is the STABLE
    -- textanycat, which kept the function from being inlined into the fence;
    -- the explicit casts give the same text, so the same hashes.
    SELECT hashtext('ticklease:' || p_which::text || ':' || length(@schema_text@)::text || ':' || @schema_text@ || ':' || p_role)
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_token_low(p_token bigint) RETURNS integer
LANGUAGE sql IMMUTABLE
AS $fn$
    -- A token's low 32 bits as the int4 an advisory lock key takes (the
    -- lock shows them as its objid, unsigned).
    SELECT ((p_token & 4294967295) - CASE WHEN (p_token & 2147483648) <> 0 THEN 4294967296 ELSE 0 END)::integer
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_fence_swept(p_roles text[], p_pid integer) RETURNS TABLE (pid integer)
LANGUAGE sql VOLATILE
AS $fn$
    -- The backends (all, or p_pid alone) in a transaction that passed the
    -- fence of a term of p_roles that is over (leader_fence_sweep). One
    -- read of the lock table, whatever it holds (its size is bounded by
    -- max_locks_per_transaction x max_connections, not by this function):
    -- the advisory keys are public, so a backend counts only if it also
    -- holds the ROW EXCLUSIVE lock on leader_fence_claims that the fence's
    -- INSERT takes. Pairs planted on the keys alone are never found. The
    -- table lock is a filter, not a proof: Postgres takes it while parsing,
    -- before it checks privileges, so a login with USAGE on the schema can
    -- hold it (a PREPAREd INSERT in an open transaction). Since generation 7
    -- a backend counts only when its login may execute leader_fence, so
    -- such a login is never taken for a claimer.
    -- The lock table's rows are narrowed to the claimers' first (few: one
    -- per fenced transaction) and only then matched to the roles' hashes, so
    -- the work past the one read grows with the claimers, not the locks.
    WITH locks AS MATERIALIZED (
        SELECT k.pid, k.locktype, k.classid, k.objid
          FROM pg_catalog.pg_locks AS k
         WHERE k.granted AND k.pid <> pg_backend_pid()
           AND (p_pid IS NULL OR k.pid = p_pid)
           AND k.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())
           AND ((k.locktype = 'advisory' AND k.objsubid = 2)
                OR (k.locktype = 'relation' AND k.mode = 'RowExclusiveLock'
                    AND k.relation = (SELECT pg_catalog.format('%I.leader_fence_claims', @schema_text@)::regclass)))
    ),
    claimers AS MATERIALIZED (
        -- Generation 7: and only a backend whose login may call the fence
        -- (the table lock alone is granted to any login with USAGE).
        SELECT DISTINCT c.pid
          FROM locks AS c
          JOIN pg_catalog.pg_stat_activity AS a ON a.pid = c.pid
         WHERE c.locktype = 'relation'
           AND pg_catalog.has_function_privilege(a.usesysid,
                   pg_catalog.format('%I.leader_fence(text, bigint)', @schema_text@)::regprocedure, 'EXECUTE')
    ),
    pairs AS MATERIALIZED (
        SELECT k.pid, k.classid, k.objid
          FROM locks AS k JOIN claimers AS c ON c.pid = k.pid
         WHERE k.locktype = 'advisory'
    ),
    over AS (
        SELECT l.role,
               l.holder_token + CASE WHEN l.holder_id IS NULL OR l.paused_at IS NOT NULL THEN 1 ELSE 0 END
                   AS before
          FROM @schema@.leader_leases AS l
         WHERE l.role = ANY (p_roles)
    ),
    hashes AS MATERIALIZED (
        SELECT o.role, o.before, h.which,
               (@schema@.leader_role_hash(o.role, h.which)::bigint & 4294967295)::oid AS classid
          FROM over AS o CROSS JOIN (VALUES (1), (2)) AS h(which)
    )
    SELECT DISTINCT k.pid
      FROM pairs AS k
      JOIN hashes AS h ON h.classid = k.classid
     WHERE ((h.before - k.objid::bigint) & 4294967295) BETWEEN 1 AND 2147483647
     -- The same backend holds both hashes' locks of the same term.
     GROUP BY h.role, k.pid, k.objid
    HAVING count(DISTINCT h.which) = 2
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_fence_sweep(p_roles text[]) RETURNS integer
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
-- Its work is one read of the lock table and one signal per backend found:
-- only backends in a fenced transaction are found (leader_fence_swept),
-- at most one per connection slot, so what other logins hold in pg_locks
-- neither slows it nor takes a claimer's place. Each is ended right after
-- the read, without a second look (a second read would take as long as
-- the window it closes): a pooled backend that finished the claim and
-- began another client's transaction within those microseconds is ended
-- too. It ends backends with its owner's rights: a superuser, or a member
-- of pg_signal_backend (others' backends are skipped, and never a
-- superuser's unless the owner is one). Returns how many it ended.
DECLARE
    claimer integer;
    ended integer := 0;
BEGIN
    PERFORM @schema@.leader_check_batch('leader_fence_sweep', p_roles);
    FOREACH claimer IN ARRAY ARRAY(SELECT s.pid FROM @schema@.leader_fence_swept(p_roles, NULL) AS s) LOOP
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
$fn$;

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
$fn$;

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
$fn$;

-- The commit check fires at COMMIT for every claim row. Created once: its
-- function above is replaced in place, and re-creating the trigger would
-- wait on every open fenced transaction.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                    WHERE tgrelid = 'leader_fence_claims'::regclass AND tgname = 'leader_fence_commit') THEN
        CREATE CONSTRAINT TRIGGER leader_fence_commit
            AFTER INSERT ON leader_fence_claims
            DEFERRABLE INITIALLY DEFERRED
            FOR EACH ROW EXECUTE FUNCTION leader_fence_commit();
    END IF;
END
$$;

-- Generation 7: the fence at one row lock (issue 43). The fence reads the
-- lease row FOR KEY SHARE and keeps that lock to the transaction's end;
-- everything that ends a term (a takeover, a pause, a RELEASE, forget)
-- locks the row FOR UPDATE before it commits, which waits for the claims in
-- flight, at most a grace, and then ends their backends (the drain). No
-- commit-time check: a claim commits inside its term because its term
-- cannot end while it holds the lock. The generation-6 fence above stays
-- for clients built against it.

CREATE OR REPLACE FUNCTION @schema@.leader_fence_salt() RETURNS bigint
LANGUAGE sql VOLATILE
AS $fn$
    -- A term's salt: 64 bits of the server's strong random source
    -- (gen_random_uuid; md5 only spreads its bits over the 64 taken).
    SELECT ('x' || substr(md5(gen_random_uuid()::text), 1, 16))::bit(64)::bigint
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_fence_keyed(p_key bytea, p_a bigint, p_b bigint) RETURNS integer
LANGUAGE sql IMMUTABLE
AS $fn$
    -- 32 bits of SHA-256(key, a, b): an advisory lock's key that only a
    -- login knowing `key` can compute. Not STRICT, so it is inlined.
    SELECT ('x' || encode(substr(sha256(p_key || int8send(p_a) || int8send(p_b)), 1, 4), 'hex'))::bit(32)::integer
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_fence_marker(p_salt bigint, p_xid bigint, p_try integer) RETURNS integer
LANGUAGE sql IMMUTABLE
AS $fn$
    -- The marker of a fenced transaction: the key of its advisory lock of
    -- class leader_role_hash(role, 3), from the term's salt and the
    -- transaction's top-level xid (its low 32 bits, as pg_locks shows it).
    -- Try 2 is a second key for when the first is taken by another backend.
    SELECT @schema@.leader_fence_keyed(int8send(p_salt), p_xid, p_try)
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_fence_guard() RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
-- Makes PREPARE TRANSACTION fail in this transaction: a prepared claim
-- would keep its lease row locked, and hold every takeover and pause of
-- its role, until an operator's COMMIT or ROLLBACK PREPARED (a prepared
-- transaction has no backend the drain can end). Postgres refuses to
-- prepare a transaction that holds a session-level and a
-- transaction-level lock on the same object: the session lock is this
-- backend's for its life, on a key derived from the schema's secret and
-- the backend's pid, so no other login can take it first. If one holds it
-- (a key copied from pg_locks while an earlier backend of the same pid
-- held it), the transaction exports a snapshot instead, which Postgres
-- also refuses to prepare (and which fails inside a savepoint). Since
-- generation 9 the fence first takes the same two locks on the pid's own
-- key, and calls this only when another backend holds that one.
DECLARE
    class integer := @schema@.leader_role_hash('', 5);
    k integer := (SELECT @schema@.leader_fence_keyed(s.secret, pg_backend_pid(), 0)
                    FROM @schema@.leader_fence_secret AS s);
BEGIN
    IF pg_try_advisory_lock(class, k) THEN
        PERFORM pg_advisory_xact_lock(class, k);
    ELSE
        PERFORM pg_export_snapshot();
    END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_fence_v2(p_role text, p_token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $fn$
-- The fence (generation 7). True while (role, token) is the live, unpaused
-- term at this instant (clock_timestamp()); then the transaction holds the
-- lease row FOR KEY SHARE until it ends, and the term cannot end before:
-- a takeover, a pause, a RELEASE and forget lock the row FOR UPDATE first
-- (leader_fence_drain), which waits for this transaction, at most a grace,
-- and then ends its backend. RENEW (a no-key update) never waits for it.
-- A claim whose lease runs out while nothing ends its term commits (no
-- later term can start before it ended). Call it as an uncorrelated scalar
-- subquery, (SELECT leader_fence_v2($r, $t)), so it runs once per statement.
DECLARE
    gate integer := @schema@.leader_role_hash(p_role, 4);
    low integer := @schema@.leader_token_low(p_token);
    marker integer := @schema@.leader_role_hash(p_role, 3);
    salt bigint;
    xid bigint;
BEGIN
    -- Under REPEATABLE READ or SERIALIZABLE the read would see the
    -- transaction's snapshot and miss a pause made since.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'ticklease: leader_fence_v2 needs READ COMMITTED, not %',
                        current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported';
    END IF;
    -- The gate: a drain that waits for this term's claims holds it shared,
    -- so new claims of an ending term do not keep overtaking its FOR UPDATE
    -- (row locks are not queued fairly). A fence tries it exclusively and
    -- lets go at once. Its key is public: when another backend holds it in
    -- any mode (a drain, a planted lock, another fence at that instant),
    -- the probe tells a drain (which holds the row FOR NO KEY UPDATE, which
    -- FOR SHARE waits for) from anything else (nothing to wait for), in a
    -- subtransaction rolled back so the FOR SHARE lock goes with it. So a
    -- planted lock, shared or exclusive, only sends fences through the
    -- probe; it never lets a claim past a drain (review 8, H1).
    IF pg_try_advisory_lock(gate, low) THEN
        PERFORM pg_advisory_unlock(gate, low);
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
    SELECT l.fence_salt INTO salt
      FROM @schema@.leader_leases AS l
     WHERE l.role = p_role AND l.holder_token = p_token AND l.paused_at IS NULL
       AND @schema@.leader_lease_live(l.holder_id, l.expires_at, clock_timestamp())
       FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- The mark: what the drain finds a claimer by. Generation 9: the
    -- term's own key (its role's class, its token's low 32 bits, as one
    -- bigint), shared, held to the transaction's end; the drain counts a
    -- backend holding it only when its login may call this function
    -- (leader_fence_claimers), so a login with CONNECT alone that holds it
    -- is never taken for a claimer. One lock, as generation 8's marker was,
    -- without its SHA-256 of the salt and the xid.
    IF NOT pg_try_advisory_xact_lock_shared((marker::bigint << 32) | (p_token & 4294967295)) THEN
        -- Another backend holds the term's key exclusively (no fence
        -- does): generation 8's marker, from the salt and the top-level
        -- xid (also from inside a released savepoint, whose own xid's lock
        -- Postgres drops at once), which a login that cannot read the
        -- salts cannot compute, so it cannot take it first.
        IF salt IS NULL THEN
            RAISE EXCEPTION 'ticklease: the term (%, %) has no fence salt; run `ticklease migrate`', p_role, p_token
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        xid := pg_current_xact_id()::text::bigint & 4294967295;
        IF NOT pg_try_advisory_xact_lock_shared(marker, @schema@.leader_fence_marker(salt, xid, 1)) THEN
            IF NOT pg_try_advisory_xact_lock_shared(marker, @schema@.leader_fence_marker(salt, xid, 2)) THEN
                RAISE EXCEPTION 'ticklease: the fence could not mark this transaction: the term''s key and both of its own are locked by other backends'
                    USING ERRCODE = 'lock_not_available';
            END IF;
        END IF;
    END IF;
    -- The PREPARE guard (leader_fence_guard says why): generation 9 takes
    -- it on the backend's own key, its pid, and only when another backend
    -- holds that key (any login may: pids are public) on the key the guard
    -- derives from the schema's secret, which costs a read of the secret
    -- and a SHA-256 per claim.
    IF current_setting('max_prepared_transactions') <> '0' THEN
        IF pg_try_advisory_lock(@schema@.leader_role_hash('', 5), pg_backend_pid()) THEN
            PERFORM pg_advisory_xact_lock(@schema@.leader_role_hash('', 5), pg_backend_pid());
        ELSE
            PERFORM @schema@.leader_fence_guard();
        END IF;
    END IF;
    RETURN true;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_fence_claimers(p_roles text[], p_salts bigint[]) RETURNS TABLE (pid integer)
LANGUAGE sql VOLATILE
-- Hash joins: the lock table may hold tens of thousands of rows (any login
-- can fill it); a nested loop over it would be quadratic. JIT off with it:
-- the planner prices the join it may not use at 1e10, which would compile
-- this query at every call.
SET enable_nestloop = off SET jit = off
AS $fn$
    -- The backends in a transaction that passed the fence in the current
    -- term of p_roles[i], whose salt is p_salts[i] (the drain holds the
    -- rows: the terms cannot change). One read of the lock table. A
    -- backend counts when it holds either mark leader_fence_v2 takes:
    -- * the term's key shared (generation 9), and its login is a member of
    --   a role that may execute leader_fence_v2: the key is public, and a
    --   login without that right is never taken for a claimer;
    -- * a marker computed from the salt and its own top-level xid
    --   (generation 8, and generation 9 when another backend holds the
    --   term's key exclusively): the oldest xid it holds a lock on (a
    --   subtransaction's xid comes after its parent's; compared from the
    --   oldest running xid, so wraparound does not reorder them). A login
    --   that cannot read the salts cannot compute one, and one copied from
    --   pg_locks names another backend's xid.
    -- The login check costs one membership test per login holding the key
    -- and grantee of the fence (review 11, H1: tested per role of the
    -- cluster, 300 planted backends and 5,000 roles made one call 18 s).
    -- The activity is read afresh: Postgres keeps the first read of
    -- pg_stat_activity for the rest of the transaction, where a claimer
    -- that connected since would have no row (review 11, M1).
    SELECT pg_catalog.pg_stat_clear_snapshot();
    WITH locks AS MATERIALIZED (
        SELECT k.pid, k.locktype, k.mode, k.classid, k.objid, k.objsubid, k.transactionid
          FROM pg_catalog.pg_locks AS k
         WHERE k.granted AND k.pid <> pg_backend_pid()
           AND ((k.locktype = 'advisory' AND k.objsubid IN (1, 2)
                 AND k.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database()))
                OR (k.locktype = 'transactionid' AND k.mode = 'ExclusiveLock'))
    ),
    keys AS MATERIALIZED (
        SELECT (@schema@.leader_role_hash(l.role, 3)::bigint & 4294967295)::oid AS classid,
               (l.holder_token & 4294967295)::oid AS objid
          FROM @schema@.leader_leases AS l
         WHERE l.role = ANY (p_roles) AND l.holder_token IS NOT NULL
    ),
    keyed AS MATERIALIZED (
        SELECT DISTINCT k.pid
          FROM locks AS k JOIN keys AS t ON t.classid = k.classid AND t.objid = k.objid
         WHERE k.locktype = 'advisory' AND k.objsubid = 1 AND k.mode = 'ShareLock'
    ),
    terms AS MATERIALIZED (
        SELECT t.salt, (@schema@.leader_role_hash(t.role, 3)::bigint & 4294967295)::oid AS classid
          FROM unnest(p_roles, p_salts) AS t(role, salt)
         WHERE t.salt IS NOT NULL
    ),
    marked AS MATERIALIZED (
        SELECT k.pid, t.salt, k.objid
          FROM locks AS k JOIN terms AS t ON t.classid = k.classid
         WHERE k.locktype = 'advisory' AND k.objsubid = 2
    ),
    oldest AS (
        SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint & 4294967295 AS xid
    ),
    tops AS MATERIALIZED (
        SELECT DISTINCT ON (k.pid) k.pid, k.transactionid::text::bigint AS xid
          FROM locks AS k CROSS JOIN oldest AS o
         WHERE k.locktype = 'transactionid' AND k.pid IN (SELECT m.pid FROM marked AS m)
         ORDER BY k.pid, (k.transactionid::text::bigint - o.xid) & 4294967295
    ),
    activity AS MATERIALIZED (
        SELECT a.pid, a.usesysid
          FROM pg_catalog.pg_stat_activity AS a
         WHERE a.pid IN (SELECT k.pid FROM keyed AS k)
    ),
    -- The roles the fence's ACL grants EXECUTE to (PUBLIC is 0).
    grantees AS MATERIALIZED (
        SELECT DISTINCT g.grantee
          FROM pg_catalog.pg_proc AS p,
               pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) AS g
         WHERE p.oid = pg_catalog.format('%I.leader_fence_v2(text, bigint)', @schema_text@)::regprocedure
           AND g.privilege_type = 'EXECUTE'
    ),
    -- Logins that are a member of a grantee or of a superuser role (the
    -- attribute is not inherited: a claim may come after SET ROLE to it),
    -- also without inheriting its rights (a claim made after SET ROLE).
    allowed AS MATERIALIZED (
        SELECT u.usesysid
          FROM (SELECT DISTINCT a.usesysid FROM activity AS a) AS u
         WHERE EXISTS (SELECT 1 FROM grantees AS g
                        WHERE g.grantee = 0 OR pg_catalog.pg_has_role(u.usesysid, g.grantee, 'MEMBER'))
            OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                        WHERE r.rolsuper AND pg_catalog.pg_has_role(u.usesysid, r.oid, 'MEMBER'))
    )
    SELECT a.pid
      FROM activity AS a JOIN allowed AS w ON w.usesysid = a.usesysid
    UNION
    SELECT m.pid
      FROM marked AS m JOIN tops AS t ON t.pid = m.pid
     WHERE m.objid = (@schema@.leader_fence_marker(m.salt, t.xid, 1)::bigint & 4294967295)::oid
        OR m.objid = (@schema@.leader_fence_marker(m.salt, t.xid, 2)::bigint & 4294967295)::oid
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_fence_grace_ms() RETURNS integer
LANGUAGE sql STABLE
AS $fn$
    -- How long an ender waits for a term's claims in flight before it ends
    -- their backends: 200 ms, or a quarter of the statement timeout when
    -- that is shorter (the drain's three rounds then fit in the statement).
    SELECT CASE WHEN s.ms > 0 THEN least(200, greatest(1, s.ms / 4))::integer ELSE 200 END
      FROM (SELECT setting::bigint AS ms FROM pg_catalog.pg_settings WHERE name = 'statement_timeout') AS s
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_fence_lock_within(p_role text, p_ms integer) RETURNS boolean
LANGUAGE plpgsql VOLATILE
-- The caller's lock_timeout comes back at the return: the gate's waits
-- below set their own.
SET lock_timeout = 0
AS $fn$
-- Locks p_role's lease row FOR UPDATE within p_ms of the clock: true when
-- it holds the lock (kept by the caller's transaction), false when claims
-- still hold the row. The row is tried (NOWAIT) every 2 ms rather than
-- waited for under lock_timeout, which bounds one wait, and a wait begins
-- again whenever the row's lockers change, so a stream of claims kept a
-- drain waiting for as long as it lasted (review 8, H1).
-- Before each try, until it has it, the term's gate, shared, held to the
-- transaction's end (generation 8; generation 7 tried it once per drain,
-- and a lock held at that instant left the whole drain without it, claims
-- overtaking its wait: a helper's rerun of review 8). A fence holds it
-- exclusively for an instant, any login may hold it for longer. Without
-- it, the 2 ms between tries are spent waiting for it in the lock's queue
-- rather than asleep: while this request waits there every fence's
-- exclusive try fails, as behind a holder, so no claim passes, and a
-- holder that lets go hands it to this request before anyone can take it
-- again. A lock held the whole time slows nothing: the tries go on.
DECLARE
    deadline timestamptz := clock_timestamp() + make_interval(secs => p_ms / 1000.0);
    -- The term the drain chose: its FOR NO KEY UPDATE keeps the token.
    gate integer := @schema@.leader_role_hash(p_role, 4);
    low integer := (SELECT @schema@.leader_token_low(l.holder_token) FROM @schema@.leader_leases AS l
                     WHERE l.role = p_role);
    gated boolean := pg_try_advisory_xact_lock_shared(gate, low);
BEGIN
    LOOP
        BEGIN
            PERFORM 1 FROM @schema@.leader_leases AS l WHERE l.role = p_role FOR UPDATE NOWAIT;
            RETURN true;
        EXCEPTION WHEN lock_not_available THEN
            IF clock_timestamp() >= deadline THEN
                RETURN false;
            END IF;
        END;
        IF gated THEN
            PERFORM pg_sleep(0.002);
        ELSE
            BEGIN
                PERFORM set_config('lock_timeout', '2ms', true);
                PERFORM pg_advisory_xact_lock_shared(gate, low);
                gated := true;
            EXCEPTION WHEN lock_not_available THEN
                NULL;
            END;
        END IF;
    END LOOP;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.leader_fence_drain(p_roles text[], p_tokens bigint[], p_any boolean) RETURNS text[]
LANGUAGE plpgsql VOLATILE
SET jit = off
AS $fn$
-- Ends the claims in flight of the terms (p_roles[i], p_tokens[i]) that
-- are still current, unpaused and, unless p_any (a pause, a RELEASE, or a
-- caller that judged them itself under its own lock), no longer live, and
-- returns those terms' roles, whose rows it holds FOR UPDATE: the caller
-- may end them. The choice is made under FOR NO KEY UPDATE, which waits
-- only for a RENEW or an ender in progress and keeps both out from then
-- on (a RENEW that committed first keeps its term); claims keep their
-- FOR KEY SHARE. Then, at most three rounds, in role order: the rows no
-- claim holds are locked at once (SKIP LOCKED); for the others, the gate
-- stops new claims (leader_fence_v2), the row is waited for until a grace
-- has passed (leader_fence_grace_ms), and the backends still holding it
-- are ended (leader_fence_claimers), with the owner's rights: a superuser,
-- or a member of pg_signal_backend. A row still held after three rounds
-- (a backend that cannot be signalled) fails the statement with 55P03,
-- its caller's statement rolled back (backends ended in earlier rounds
-- stay ended).
DECLARE
    chosen text[];
    salts bigint[];
    pending text[];
    took text[];
    done text[] := ARRAY[]::text[];
    grace integer := @schema@.leader_fence_grace_ms();
    deadline timestamptz;
    i integer;
    round integer := 0;
    claimer integer;
BEGIN
    SELECT coalesce(array_agg(c.role ORDER BY c.role), ARRAY[]::text[]), array_agg(c.fence_salt ORDER BY c.role)
      INTO chosen, salts
      FROM (SELECT l.role, l.fence_salt
              FROM @schema@.leader_leases AS l
              JOIN unnest(p_roles, p_tokens) AS t(role, token) ON t.role = l.role AND t.token = l.holder_token
             WHERE l.holder_id IS NOT NULL AND l.paused_at IS NULL
               -- A caller that judged liveness itself, under this lock, passes p_any
               -- (the batched ACQUIRE: the lock table read once for the batch).
               AND CASE WHEN p_any THEN true
                        ELSE NOT @schema@.leader_term_live(l.holder_id, l.expires_at, l.holder_key, now()) END
             ORDER BY l.role
               FOR NO KEY UPDATE OF l) AS c;
    pending := chosen;
    WHILE cardinality(pending) > 0 LOOP
        SELECT coalesce(array_agg(f.role ORDER BY f.role), ARRAY[]::text[]) INTO took
          FROM (SELECT l.role FROM @schema@.leader_leases AS l
                 WHERE l.role = ANY (pending) ORDER BY l.role FOR UPDATE SKIP LOCKED) AS f;
        done := done || took;
        pending := ARRAY(SELECT p FROM unnest(pending) AS p WHERE p <> ALL (took) ORDER BY p);
        EXIT WHEN cardinality(pending) = 0;
        round := round + 1;
        IF round > 3 THEN
            RAISE EXCEPTION 'ticklease: the claims of % still hold their lease rows after three rounds of waiting and ending their backends',
                            pending
                USING ERRCODE = 'lock_not_available',
                      HINT = 'A backend this schema''s owner cannot end holds the row: a superuser''s (unless the owner is one), any other login''s without pg_signal_backend, one frozen in the kernel, or a prepared transaction; see the runbook.';
        END IF;
        -- Every pending term's gate first, tried at once: a role reached
        -- late in the round would otherwise let its new claims through
        -- while the earlier roles were waited for (review 9, M1).
        -- leader_fence_lock_within waits for a gate missed here.
        PERFORM pg_try_advisory_xact_lock_shared(@schema@.leader_role_hash(l.role, 4),
                                                 @schema@.leader_token_low(l.holder_token))
           FROM @schema@.leader_leases AS l
          WHERE l.role = ANY (pending);
        deadline := clock_timestamp() + make_interval(secs => grace / 1000.0);
        took := ARRAY[]::text[];
        -- One wait for the round: a role reached after the deadline gets
        -- one try, none of its own (a 1 ms floor per role cost a batch of
        -- 1,000 three seconds before any claimer was ended; review 9, H1).
        FOR i IN 1 .. cardinality(pending) LOOP
            IF @schema@.leader_fence_lock_within(pending[i],
                   (extract(epoch FROM deadline - clock_timestamp()) * 1000)::integer) THEN
                took := took || pending[i];
            END IF;
        END LOOP;
        done := done || took;
        pending := ARRAY(SELECT p FROM unnest(pending) AS p WHERE p <> ALL (took) ORDER BY p);
        EXIT WHEN cardinality(pending) = 0;
        FOR claimer IN
            SELECT c.pid FROM @schema@.leader_fence_claimers(
                pending, ARRAY(SELECT salts[g.n] FROM generate_subscripts(chosen, 1) AS g(n)
                                WHERE chosen[g.n] = ANY (pending) ORDER BY chosen[g.n])) AS c
        LOOP
            BEGIN
                PERFORM pg_terminate_backend(claimer);
            EXCEPTION WHEN insufficient_privilege THEN
                NULL;
            END;
        END LOOP;
    END LOOP;
    RETURN done;
END
$fn$;

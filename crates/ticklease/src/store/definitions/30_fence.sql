-- The fence and its commit check: a claim statement passes the fence while
-- its term is live, the commit check refuses its COMMIT once the term is
-- over, and the next term's leader ends a superseded term's open
-- transactions (the sweep), through two advisory locks per term.

CREATE OR REPLACE FUNCTION @schema@.leader_role_hash(p_role text, p_which integer) RETURNS integer
LANGUAGE sql IMMUTABLE
AS $fn$
    -- Two independent 32-bit hashes of this schema's role: the fence's locks
    -- carry both, so the sweep mistakes another role (or another schema's
    -- role of the same name) for this one only when both collide (2^-64).
    -- The schema goes with its length: `a:b` + `c` is not `a` + `b:c`.
    SELECT hashtext('ticklease:' || p_which || ':' || length(@schema_text@) || ':' || @schema_text@ || ':' || p_role)
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
    -- hold it (a PREPAREd INSERT in an open transaction) and is then found
    -- and ended like a claimer (crate docs, guarantee 3: the known gap and
    -- its workaround, REVOKE USAGE on the schema from logins that need none).
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
        SELECT DISTINCT c.pid FROM locks AS c WHERE c.locktype = 'relation'
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

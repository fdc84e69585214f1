-- ticklease 0013: what the fence at one row lock (definitions generation 7,
-- issue 43) needs of the tables.
--
-- * leader_leases.fence_salt: a random number per term, written by every
--   ACQUIRE that starts one. A fenced transaction marks itself with an
--   advisory lock whose key is derived from the salt and its own
--   transaction id; a takeover or a pause finds the claimers of a term by
--   that key alone. A login that cannot read leader_leases (a login with
--   CONNECT alone, or with USAGE on the schema) cannot compute one, and a
--   key copied from pg_locks names another transaction than the copier's.
--   The terms live at this migration get theirs here, so a fence of the
--   new generation passes in them.
-- * leader_fence_secret: one random value, readable by the tables' owner
--   alone (the SECURITY DEFINER functions): the per-backend key that stops
--   a fenced transaction from being PREPAREd is derived from it, so no other
--   login can take that key first.
--
-- Locks: leader_leases, waited for at most 500 ms (as 0012), then held to the
-- end of the run (adding a nullable column rewrites nothing). A run that
-- times out writes nothing and is simply run again.

SELECT pg_catalog.set_config('ticklease.lock_timeout_before_0013', pg_catalog.current_setting('lock_timeout'), true);
SET LOCAL lock_timeout = '500ms';

ALTER TABLE leader_leases ADD COLUMN fence_salt bigint;

-- 64 bits of the server's strong random source (gen_random_uuid, built in since 13).
UPDATE leader_leases
   SET fence_salt = ('x' || pg_catalog.substr(pg_catalog.md5(pg_catalog.gen_random_uuid()::text), 1, 16))::bit(64)::bigint
 WHERE holder_id IS NOT NULL;

CREATE TABLE leader_fence_secret (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    secret bytea NOT NULL CHECK (pg_catalog.length(secret) = 32)
);
INSERT INTO leader_fence_secret (secret)
VALUES (pg_catalog.uuid_send(pg_catalog.gen_random_uuid()) || pg_catalog.uuid_send(pg_catalog.gen_random_uuid()));
REVOKE ALL ON leader_fence_secret FROM PUBLIC;

SELECT pg_catalog.set_config('lock_timeout', pg_catalog.current_setting('ticklease.lock_timeout_before_0013'), true);

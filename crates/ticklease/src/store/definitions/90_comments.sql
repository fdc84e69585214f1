-- What `\df+` shows for each function: for a client function, what it does
-- and answers in short (docs/sql-api.md is the reference); for the others,
-- that a client never calls them. Applied last, after every function exists.
-- COMMENT survives CREATE OR REPLACE but not DROP + CREATE: a definitions
-- file that re-creates a function is re-applied with this one whenever the
-- generation is raised (crates/ticklease/tests/sql_api.rs checks that every
-- function has a comment).

-- Client functions (docs/sql-api.md).
COMMENT ON FUNCTION @schema@.leader_acquire_v2(text, text, bigint, bigint, bigint, boolean) IS
'ticklease client: ACQUIRE a role on an interval (or a long-lived role). Args: role, holder id (<= 200 chars), lease TTL ms, interval ms (1 ms..24 h each), coordination key or NULL, long-lived. Always one row: acquired says whether a term started (its token: holder_token), reason why not (paused, held, not_due, contended); the other columns describe the row before this call. App role. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_acquire_occurrence_v2(text, text, bigint, timestamptz, timestamptz, bigint, text[], text[], text, timestamptz) IS
'ticklease client: ACQUIRE one occurrence of a cron schedule the caller computed. Args: role, holder id, lease TTL ms, occurrence (NULL: only look), the next occurrence if the asked one must still be the latest (else NULL), key, skipped reasons and summaries (<= 3), schedule text, next occurrence. Always one row: acquired says whether a term started (a manual run iff manual_by too), reason why not (paused, held, not_due, contended, not_runnable); after_occurrence: occurrences at or before it never run. App role. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_renew_v2(text, bigint, bigint, bigint) IS
'ticklease client: RENEW the term (role, token) to now() + lease TTL ms and record the holder''s current key (or NULL). Always one row: renewed = false means the term is over for good, reason says why (paused, taken_over, released: pass it to RELEASE). App role. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_release(text, bigint, boolean, bigint, text, text, text, text) IS
'ticklease client: RELEASE the term (role, token). Args: role, token, stamp (a completed tick), cooldown ms (NULL or 0: none), outcome (completed, interrupted, lost, failed, panicked), loss reason (NULL, taken_over, paused, released, heartbeat_timeout, superseded), error summary, output. true: this call ended the term; false: it was over already. Notifies no one. App role. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_fence_v2(text, bigint) IS
'ticklease client: the fence (generation 7). true while (role, token) is the live, unpaused term at clock_timestamp(); then the transaction holds the lease row FOR KEY SHARE to its end, and no takeover, pause or RELEASE of the term commits before it ended (they wait at most a grace, then end its backend). Use as (SELECT leader_fence_v2($role, $token)) in the claim statement of a READ COMMITTED read-write transaction. App role. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_fence(text, bigint) IS
'ticklease client (generation 6): the fence with a commit check. true while (role, token) is the live, unpaused term at clock_timestamp(); its COMMIT fails with 40001 if the term ended meanwhile. Kept for clients built before generation 7; new clients call leader_fence_v2. App role. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_seed(text[]) IS
'ticklease client: creates the lease rows of roles that have none; existing rows untouched. Optional. App role. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_key_alive(bigint) IS
'ticklease client: whether a session of this database holds the coordination (holder) key, taken by the backend whose pid its high 32 bits carry; true for NULL. App and operator roles. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_key_wait(bigint) IS
'ticklease client: one slice (90 % of deadlock_timeout, 100 ms to 1 s) of a wait on a holder''s coordination key, on a direct connection of its own: true once the key is gone (its session ended), false while it lives; call again. Catches its own lock timeout. App role. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_fence_sweep(text[]) IS
'ticklease client: ends the open fenced transactions of terms of the roles that are over; returns how many. ACQUIRE and pause call it themselves. App and operator roles. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_acquire_many(text[], text, bigint, bigint, bigint, integer, timestamptz, timestamptz, text, timestamptz, timestamptz[]) IS
'ticklease client (families): ACQUIRE for many roles, starting at most p_limit terms in the order given; on an interval (cron arguments NULL) or for one occurrence. One row per role: started rows (holder_token not NULL) describe the new term; over_limit: acquirable past the limit. App role. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_renew_many(text[], bigint[], bigint, bigint) IS
'ticklease client (families): RENEW of each (role, token) as leader_renew; one row per term. App role. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_release_many(text[], bigint[], boolean[], bigint[], text[], text[], text[]) IS
'ticklease client (families): RELEASE of each term as leader_release (no output kept), in role order; one row per term. App role. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_replica_beat(text, text, bigint, bigint) IS
'ticklease client (families): registers this replica as serving the family for min(TTL ms, 1 minute) and returns the live replicas, ordered, at most 1,000. App role. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_replica_leave(text, text) IS
'ticklease client (families): removes this replica''s registration; true when there was one. App role. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_pause(text, text, text) IS
'ticklease operator: pauses a role (who, why): ends its term at once and refuses ACQUIRE until unpaused; false when paused already. Notifies no one. Operator role. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_unpause(text) IS
'ticklease operator: unpauses a role; false when it was not paused. Notifies no one. Operator role. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_run_now(text) IS
'ticklease operator: asks for a manual run, which the next ACQUIRE starts whatever the interval, cooldown or schedule (true when the role had a cooldown, which stays). Notifies no one. Operator role. See docs/sql-api.md.';

COMMENT ON FUNCTION @schema@.leader_forget(text) IS
'ticklease operator: deletes an idle, unpaused role''s row and history; false while a term is live or it is paused. Operator role. See docs/sql-api.md.';

-- Internal: the functions'', the view''s, the status page''s and the migration runner''s own.
COMMENT ON FUNCTION @schema@.leader_check_batch(text, text[]) IS 'ticklease internal: checks a batched statement''s role list. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_check_role(text, text) IS 'ticklease internal: checks a role name. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_check_ms(text, bigint) IS 'ticklease internal: checks a duration in ms (1 ms .. 24 h). Not for clients.';
COMMENT ON FUNCTION @schema@.leader_check_release(boolean, bigint, text, text) IS 'ticklease internal: checks the values a RELEASE takes. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_family_due(@schema@.leader_leases, interval, timestamptz, timestamptz) IS 'ticklease internal: whether a family key''s row is due. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_family_skipped(timestamptz[], boolean) IS 'ticklease internal: the history summary of skipped occurrences. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_fence_commit() IS 'ticklease internal: the fence''s commit check (a deferred constraint trigger). Not for clients.';
COMMENT ON FUNCTION @schema@.leader_fence_swept(text[], integer) IS 'ticklease internal: the backends leader_fence_sweep ends. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_fence_salt() IS 'ticklease internal: a new term''s fence salt. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_fence_keyed(bytea, bigint, bigint) IS 'ticklease internal: 32 bits of SHA-256 of a key and two numbers, an advisory lock''s key. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_fence_marker(bigint, bigint, integer) IS 'ticklease internal: the marker key of a fenced transaction (the term''s salt, the transaction''s xid). Not for clients.';
COMMENT ON FUNCTION @schema@.leader_fence_guard() IS 'ticklease internal: makes PREPARE TRANSACTION fail in a fenced transaction. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_fence_claimers(text[], bigint[]) IS 'ticklease internal: the backends in a transaction that passed leader_fence_v2 in the given terms. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_fence_grace_ms() IS 'ticklease internal: how long an ender waits for claims in flight. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_fence_lock_within(text, integer) IS 'ticklease internal: a lease row FOR UPDATE within a wait. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_fence_drain(text[], bigint[], boolean) IS 'ticklease internal: ends the claims in flight of terms that end (ACQUIRE, RELEASE, pause, forget). Not for clients.';
COMMENT ON FUNCTION @schema@.leader_drain_for_takeover(text) IS 'ticklease internal: ACQUIRE''s drain of a term it may take over. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_grant(text, text) IS 'ticklease internal: grants the app and operator roles (ticklease migrate, ticklease grant). Not for clients.';
COMMENT ON FUNCTION @schema@.leader_history_add(text, text, bigint, text, timestamptz, text, text, text, text) IS 'ticklease internal: appends a history row. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_history_add(text, text, bigint, text, timestamptz, text, text, text, text, text) IS 'ticklease internal: appends a history row, with output. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_lease_live(text, timestamptz, timestamptz) IS 'ticklease internal: the expiry predicate (leader_status calls it with its reader''s rights). Not for clients.';
COMMENT ON FUNCTION @schema@.leader_live_keys() IS 'ticklease internal: the coordination keys held now (leader_status calls it). Not for clients.';
COMMENT ON FUNCTION @schema@.leader_overtaken_summary(timestamptz) IS 'ticklease internal: the history summary of an occurrence a later one overtook. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_occurrence_floor(timestamptz, timestamptz, timestamptz) IS 'ticklease internal: the instant at or before which a role''s occurrences never run (a first occurrence may be up to a minute older than the first look). Not for clients.';
COMMENT ON FUNCTION @schema@.leader_occurrence_runnable(timestamptz, timestamptz, timestamptz, timestamptz) IS 'ticklease internal: whether an occurrence may start now. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_pause_waits(timestamptz, timestamptz) IS 'ticklease internal: whether a pause''s wait still holds the next term back. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_regrant() IS 'ticklease internal: re-grants the roles granted before (migration runner). Not for clients.';
COMMENT ON FUNCTION @schema@.leader_require_key(bigint) IS 'ticklease internal: refuses a coordination key no session holds. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_role_hash(text, integer) IS 'ticklease internal: a role''s hashes for the fence''s advisory locks. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_secure_functions() IS 'ticklease internal: pins search_path and revokes PUBLIC (migration runner). Not for clients.';
COMMENT ON FUNCTION @schema@.leader_term_live(text, timestamptz, bigint, timestamptz) IS 'ticklease internal: the liveness predicate of a term (leader_status calls it). Not for clients.';
COMMENT ON FUNCTION @schema@.leader_term_live_among(text, timestamptz, bigint, timestamptz, bigint[]) IS 'ticklease internal: leader_term_live over keys read once (leader_status calls it). Not for clients.';
COMMENT ON FUNCTION @schema@.leader_timeline(bigint, integer, integer, integer) IS 'ticklease internal: the status page''s timeline. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_token_low(bigint) IS 'ticklease internal: a token''s low 32 bits for an advisory lock key. Not for clients.';
COMMENT ON FUNCTION @schema@.leader_token_seed() IS 'ticklease internal: a new role''s first token (the clock in epoch ms). Not for clients.';

-- Compatibility: kept for replicas of older releases (definitions/70_compatibility.sql).
COMMENT ON FUNCTION @schema@.leader_acquire(text, text, bigint, bigint) IS 'ticklease compatibility: for replicas up to migration 0003; clients call leader_acquire_v2(text, text, bigint, bigint, bigint, boolean).';
COMMENT ON FUNCTION @schema@.leader_acquire(text, text, bigint, bigint, bigint) IS 'ticklease compatibility: for replicas before migration 0011; clients call leader_acquire_v2(text, text, bigint, bigint, bigint, boolean).';
COMMENT ON FUNCTION @schema@.leader_acquire_many(text[], text, bigint, bigint, bigint, integer) IS 'ticklease compatibility: for replicas of definitions generations 1-2; clients call the 11-argument leader_acquire_many.';
COMMENT ON FUNCTION @schema@.leader_fence_lock(text, bigint) IS 'ticklease compatibility: the fence under the name claims written against migration 0002 use; clients call leader_fence(text, bigint).';
COMMENT ON FUNCTION @schema@.leader_release(text, bigint, boolean, bigint) IS 'ticklease compatibility: for replicas of migration 0004; clients call the 8-argument leader_release.';
COMMENT ON FUNCTION @schema@.leader_release(text, bigint, boolean, bigint, text, text, text) IS 'ticklease compatibility: for replicas before migration 0011; clients call the 8-argument leader_release.';
COMMENT ON FUNCTION @schema@.leader_renew(text, bigint, bigint) IS 'ticklease compatibility: for replicas up to migration 0003; clients call leader_renew_v2(text, bigint, bigint, bigint).';
COMMENT ON FUNCTION @schema@.leader_acquire(text, text, bigint, bigint, bigint, boolean) IS 'ticklease compatibility: the ACQUIRE of generation 4, its row as it was (no acquired, reason); clients call leader_acquire_v2(text, text, bigint, bigint, bigint, boolean).';
COMMENT ON FUNCTION @schema@.leader_acquire_occurrence(text, text, bigint, timestamptz, timestamptz, bigint, text[], text[], text, timestamptz) IS 'ticklease compatibility: the occurrence ACQUIRE of generation 4, its row as it was (no acquired, reason); clients call leader_acquire_occurrence_v2.';
COMMENT ON FUNCTION @schema@.leader_renew(text, bigint, bigint, bigint) IS 'ticklease compatibility: the RENEW of generation 4, its row as it was (no reason); clients call leader_renew_v2(text, bigint, bigint, bigint).';

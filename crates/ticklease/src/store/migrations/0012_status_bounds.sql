-- ticklease 0012: the paused rows found without reading every row (issue 41).
-- Any app login may create rows of leader_leases (leader_seed, ACQUIRE of any
-- name), so a bounded STATUS (the exporter's, the status page's) must not
-- read them all to find the ones an operator paused: this partial index
-- holds the paused rows alone (an operator's doing, so few).
--
-- Locks: leader_leases, waited for at most 500 ms, then held while the index
-- is built (a read of the table: about a second per million rows); lease
-- statements queue behind it. A run that times out writes nothing and is
-- simply run again. The run took the status view's lock before this (which
-- the definitions need later, and any login can hold): it never waits for it
-- while holding this one.

SELECT pg_catalog.set_config('ticklease.lock_timeout_before_0012', pg_catalog.current_setting('lock_timeout'), true);
SET LOCAL lock_timeout = '500ms';

CREATE INDEX leader_leases_paused ON leader_leases (role) WHERE paused_at IS NOT NULL;

SELECT pg_catalog.set_config('lock_timeout', pg_catalog.current_setting('ticklease.lock_timeout_before_0012'), true);

-- ticklease 0010: a pause's wait for the term it ended (issue 32). Upgrades
-- a database with live terms in place: one nullable column, no rewrite, so
-- every term keeps its token, holder and expiry.
--
-- A pause ends the current term at once (the fence refuses its claims from
-- the commit), but its holder learns of it only at its next RENEW or
-- notification, and its unfenced work (a `ticklease run` child in its
-- grace) may run for a while after that. So the pause records here the
-- instant the ended term's lease would have run out, and every ACQUIRE
-- waits for it as for not_before: the holder's RELEASE of that term, once
-- its work stopped, ends the wait early; a run-now clears a cooldown but
-- not this wait. An unpause within the wait no longer starts the next term
-- beside the last one's work.
--
-- Lock: leader_leases alone, waited for at most 500 ms (lease statements
-- queue behind this ALTER, so the wait is kept well inside a heartbeat); a
-- run that times out writes nothing and is simply run again. The check is
-- added NOT VALID: the column is NULL on every existing row.

SELECT pg_catalog.set_config('ticklease.lock_timeout_before_0010', pg_catalog.current_setting('lock_timeout'), true);
SET LOCAL lock_timeout = '500ms';

ALTER TABLE leader_leases
    ADD COLUMN pause_wait_until timestamptz,
    ADD CONSTRAINT leader_leases_finite_pause_wait CHECK (isfinite(pause_wait_until)) NOT VALID;

SELECT pg_catalog.set_config('lock_timeout', pg_catalog.current_setting('ticklease.lock_timeout_before_0010'), true);

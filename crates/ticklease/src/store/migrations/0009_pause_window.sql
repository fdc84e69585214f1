-- ticklease 0009: the last pause's window (issue 25). Upgrades a database
-- with live terms in place: two nullable columns, no rewrite, so every term
-- keeps its token, holder and expiry.
--
-- Unpause records when the role was paused and unpaused, so the first
-- occurrence a replica runs afterwards records the occurrences that fell
-- due while it was paused as skipped for that reason (`paused`), apart
-- from those a catch-up policy or a starting deadline passed over.
--
-- Lock: leader_leases alone, waited for at most 500 ms (lease statements
-- queue behind this ALTER, so the wait is kept well inside a heartbeat); a
-- run that times out writes nothing and is simply run again. The check is
-- added NOT VALID: both columns are NULL on every existing row.

SELECT pg_catalog.set_config('ticklease.lock_timeout_before_0009', pg_catalog.current_setting('lock_timeout'), true);
SET LOCAL lock_timeout = '500ms';

ALTER TABLE leader_leases
    ADD COLUMN last_paused_at timestamptz,
    ADD COLUMN last_unpaused_at timestamptz,
    ADD CONSTRAINT leader_leases_last_pause_window CHECK (
        isfinite(last_paused_at) AND isfinite(last_unpaused_at) AND last_paused_at <= last_unpaused_at) NOT VALID;

SELECT pg_catalog.set_config('lock_timeout', pg_catalog.current_setting('ticklease.lock_timeout_before_0009'), true);

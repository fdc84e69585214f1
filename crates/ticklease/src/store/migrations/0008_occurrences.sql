-- ticklease 0008: wall-clock schedules (issue 25). Upgrades a database with
-- live terms in place: nullable columns and a default that needs no rewrite,
-- so every term keeps its token, holder and expiry.
--
-- A role on a cron schedule runs each occurrence (a scheduled instant) at
-- most once to completion across all replicas and restarts: the row records
-- the last occurrence that completed and the occurrence the current (or
-- last) term ran; ACQUIRE for an occurrence succeeds only once the database
-- clock has reached it and when it is later than the last completed one.
-- Before the first occurrence completes, `occurrences_since` (the instant the
-- role was first asked about an occurrence) bounds the occurrences that
-- count, so a new schedule does not run the past. `failures` counts the
-- failed attempts of the current occurrence, for the retry backoff.
-- `schedule` and `next_occurrence` are what the replica that started the
-- last term declared (its schedule as text, the occurrence after the one it
-- ran), for operators: status, metrics, the late-occurrence alert.
-- `run_now_by` is an operator's run-now of a cron role, waiting for a
-- replica (who asked); `manual_by` marks the current term as that manual
-- run: it completes no occurrence and counts no failed attempt.
-- leader_history gains the kind `skipped`: occurrences passed over, and why.
--
-- Locks: leader_leases, then leader_history (the order every lease
-- statement takes them in, so no deadlock), each waited for at most 500 ms:
-- while this holds the first and waits for the second (any login reading
-- the history, idle in a transaction, holds it off), lease statements wait
-- too, so the wait is kept well inside a heartbeat; a run that times out
-- writes nothing and is simply run again. The new constraints are added
-- NOT VALID: the new columns are NULL or 0 on every existing row, and the
-- widened kind check admits every existing row, so no table is scanned
-- under the lock.

-- The run's own lock wait is restored at the end, for the definitions and
-- grants that follow in the same transaction.
SELECT pg_catalog.set_config('ticklease.lock_timeout_before_0008', pg_catalog.current_setting('lock_timeout'), true);
SET LOCAL lock_timeout = '500ms';

ALTER TABLE leader_leases
    ADD COLUMN occurrence timestamptz,
    ADD COLUMN last_occurrence timestamptz,
    ADD COLUMN occurrences_since timestamptz,
    ADD COLUMN failures integer NOT NULL DEFAULT 0,
    ADD COLUMN schedule text,
    ADD COLUMN next_occurrence timestamptz,
    ADD COLUMN run_now_by text,
    ADD COLUMN manual_by text,
    ADD CONSTRAINT leader_leases_finite_occurrences CHECK (
        isfinite(occurrence) AND isfinite(last_occurrence) AND isfinite(occurrences_since)
        AND isfinite(next_occurrence)) NOT VALID,
    ADD CONSTRAINT leader_leases_schedule_bounded CHECK (
        length(schedule) <= 200 AND length(run_now_by) <= 200 AND length(manual_by) <= 200) NOT VALID,
    ADD CONSTRAINT leader_leases_failures_bounded CHECK (failures BETWEEN 0 AND 1000000) NOT VALID;

ALTER TABLE leader_history
    DROP CONSTRAINT leader_history_kind_check,
    ADD CONSTRAINT leader_history_kind_check CHECK (kind IN ('term', 'pause', 'unpause', 'run_now', 'skipped')) NOT VALID;

SELECT pg_catalog.set_config('lock_timeout', pg_catalog.current_setting('ticklease.lock_timeout_before_0008'), true);

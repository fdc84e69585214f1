-- ticklease 0011: long-lived roles, their intervals for readers, and what
-- each run said (issue 33). Upgrades a database with live terms in place:
-- three columns, one with a constant default (no rewrite), so every term
-- keeps its token, holder and expiry.
--
-- A long-lived role (a relay, a queue consumer: `ticklease run` with no
-- schedule) holds one term for as long as its work runs; it never completes
-- ticks the way a scheduled role does. Its health is that some replica holds
-- it. The replica that starts a term records which kind the role is
-- (leader_acquire's p_long_lived), so any reader (`ticklease metrics`, the
-- status page) tells a healthy long-lived role from a scheduled one that
-- never ran, and pages when a long-lived one is led nowhere. It records the
-- role's interval too (NULL on a cron schedule), so the stall alert's
-- threshold comes from the database, not only from replicas running the role.
--
-- Each history row of a term may keep the last part of what its work said
-- (a command's output: at most 4,000 characters, the last ones), retained
-- as the history is (leader_history_settings), so "why did last night's
-- dump fail" has an answer from any host after its runner is gone.
--
-- Locks: leader_leases and leader_history, each waited for at most 500 ms (lease statements
-- queue behind this ALTER); a run that times out writes nothing and is
-- simply run again.

SELECT pg_catalog.set_config('ticklease.lock_timeout_before_0011', pg_catalog.current_setting('lock_timeout'), true);
SET LOCAL lock_timeout = '500ms';

ALTER TABLE leader_leases
    ADD COLUMN long_lived boolean NOT NULL DEFAULT false,
    ADD COLUMN tick_interval_ms bigint,
    ADD CONSTRAINT leader_leases_tick_interval_positive CHECK (tick_interval_ms > 0) NOT VALID;

ALTER TABLE leader_history
    ADD COLUMN output text,
    ADD CONSTRAINT leader_history_output_bounded CHECK (length(output) <= 4000) NOT VALID;

SELECT pg_catalog.set_config('lock_timeout', pg_catalog.current_setting('ticklease.lock_timeout_before_0011'), true);

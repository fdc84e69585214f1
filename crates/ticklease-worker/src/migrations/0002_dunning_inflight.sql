-- dunning: the attempt in flight. Its key is written by the compare-and-set
-- that records the attempt and cleared only by a definitive answer, so an
-- attempt whose outcome is unknown (a crash, a dropped tick, a timeout) is
-- retried under the same key: one charge at the provider.
-- Nullable columns without defaults: no table rewrite on a live database.
SET LOCAL lock_timeout = '5s';
ALTER TABLE dunning_runs
    ADD COLUMN inflight_key        text,
    ADD COLUMN inflight_started_at timestamptz,
    ADD CONSTRAINT dunning_runs_inflight_whole
        CHECK ((inflight_key IS NULL) = (inflight_started_at IS NULL));

-- Bench-only instrumentation: every change of a lease row, and every fenced
-- write of the drill role, recorded by the database on its own clock.
CREATE TABLE IF NOT EXISTS lease_history (
    id         bigserial PRIMARY KEY,
    role       text NOT NULL,
    old_token  bigint NOT NULL,
    new_token  bigint NOT NULL,
    old_holder text,
    new_holder text,
    at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE OR REPLACE FUNCTION lease_history_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO lease_history (role, old_token, new_token, old_holder, new_holder)
    VALUES (NEW.role, OLD.holder_token, NEW.holder_token, OLD.holder_id, NEW.holder_id);
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS lease_history ON leader_leases;
CREATE TRIGGER lease_history AFTER UPDATE ON leader_leases FOR EACH ROW EXECUTE FUNCTION lease_history_record();

CREATE TABLE IF NOT EXISTS drill_journal (
    id     bigserial PRIMARY KEY,
    role   text NOT NULL,
    token  bigint NOT NULL,
    holder text NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
);

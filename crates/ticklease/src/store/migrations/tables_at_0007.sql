-- ticklease's tables as the shipped migrations 0001-0007 leave them: a
-- database created from nothing starts here instead of replaying them (and
-- records 0001-0007 as applied). Later versioned migrations apply on top of
-- this, as on an upgraded database; the functions, the view and the trigger
-- come from ../definitions/. tests/catalog.rs holds the two paths equal.

-- One row per role: its current term (holder, token, expiry), its last
-- completed tick and its pause. Tokens only grow.
CREATE TABLE leader_leases (
    role               text PRIMARY KEY,
    -- Set to leader_token_seed() by ../definitions/10_liveness.sql, which
    -- creates the function.
    holder_token       bigint NOT NULL,
    holder_id          text,
    acquired_at        timestamptz,
    expires_at         timestamptz,
    last_tick_ended_at timestamptz,
    last_tick_holder   text,
    paused_at          timestamptz,
    paused_by          text,
    pause_reason       text,
    not_before         timestamptz,
    -- The holder's coordination key (its session's advisory lock), or NULL.
    holder_key         bigint,
    -- Same rule as ticklease::Role::new; a test pins the two together.
    CONSTRAINT leader_leases_role_name CHECK (
        role ~ '^[a-z][a-z0-9_]*(:[a-z0-9][a-z0-9_.-]*)?$' AND length(role) <= 63),
    CONSTRAINT leader_leases_held_has_expiry CHECK (
        (holder_id IS NULL) = (expires_at IS NULL) AND (holder_id IS NULL) = (acquired_at IS NULL)),
    CONSTRAINT leader_leases_paused_is_unheld CHECK (paused_at IS NULL OR holder_id IS NULL),
    CONSTRAINT leader_leases_pause_has_author CHECK ((paused_at IS NULL) = (paused_by IS NULL)),
    CONSTRAINT leader_leases_finite_times CHECK (
        isfinite(acquired_at) AND isfinite(expires_at) AND isfinite(paused_at)
        AND isfinite(not_before) AND isfinite(last_tick_ended_at)),
    CONSTRAINT leader_leases_bounded_texts CHECK (
        length(holder_id) <= 200 AND length(last_tick_holder) <= 200
        AND length(paused_by) <= 200 AND length(pause_reason) <= 500)
);

-- Transactions that passed the fence and have not committed yet. UNLOGGED:
-- a row lives from the fence to its transaction's commit.
CREATE UNLOGGED TABLE leader_fence_claims (
    xid   xid8   NOT NULL,
    role  text   NOT NULL,
    token bigint NOT NULL,
    PRIMARY KEY (xid, role, token)
);

CREATE TABLE leader_history (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    role        text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('term', 'pause', 'unpause', 'run_now')),
    at          timestamptz NOT NULL DEFAULT now(),
    -- A term: its token, holder and start; `at` is when it ended.
    token       bigint,
    holder_id   text,
    acquired_at timestamptz,
    outcome     text CHECK (outcome IN ('completed', 'interrupted', 'lost', 'failed', 'panicked')),
    -- Why a term was lost (a LossReason label, or expired / holder_gone when
    -- taken over without a RELEASE); why a role was paused.
    reason      text CHECK (length(reason) <= 500),
    -- Who paused, unpaused or ran it now.
    by          text CHECK (length(by) <= 500),
    -- A short summary of the error or panic that failed the tick.
    error       text CHECK (length(error) <= 500),
    CONSTRAINT leader_history_term_fields CHECK ((kind = 'term') = (token IS NOT NULL AND outcome IS NOT NULL))
);
-- At most one row per term: a RELEASE and a takeover racing for one term
-- record it once, whichever commits first.
CREATE UNIQUE INDEX leader_history_term ON leader_history (role, token) WHERE kind = 'term';
CREATE INDEX leader_history_role_id ON leader_history (role, id);
CREATE INDEX leader_history_at ON leader_history (at);
-- The status page's timeline reads per role and slice through these, at
-- most TimelineSlice::TERMS_READ entries of each per cell, so its cost is
-- bounded by roles x slices, not by the number of ticks.
CREATE INDEX leader_history_term_at ON leader_history (role, at) WHERE kind = 'term';
CREATE INDEX leader_history_notable_at ON leader_history (role, at) INCLUDE (outcome, reason)
    WHERE kind = 'term' AND outcome <> 'completed';

-- Retention, one row; change it with UPDATE as the schema owner.
CREATE TABLE leader_history_settings (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    keep_per_role integer NOT NULL DEFAULT 10000 CHECK (keep_per_role BETWEEN 10 AND 100000),
    keep_for      interval NOT NULL DEFAULT '30 days' CHECK (keep_for >= interval '1 hour')
);
INSERT INTO leader_history_settings DEFAULT VALUES;
REVOKE ALL ON leader_history, leader_history_settings FROM PUBLIC;

-- One row per replica serving a family, renewed once per heartbeat. A
-- replica counts while its row is unexpired and, when it has a coordination
-- session, while that session holds its key (a killed replica drops out at once).
CREATE TABLE leader_replicas (
    family     text NOT NULL CHECK (family ~ '^[a-z][a-z0-9_]*$' AND length(family) <= 63),
    holder_id  text NOT NULL CHECK (length(holder_id) <= 200),
    holder_key bigint,
    seen_at    timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (family, holder_id)
);
REVOKE ALL ON leader_replicas FROM PUBLIC;

-- The reference worker's tables: five stores, one per role.

-- billing: subscriptions billed once per period; the invoice index is the backstop.
CREATE TABLE subscriptions (
    id              bigserial PRIMARY KEY,
    status          text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'canceled')),
    period_start    timestamptz NOT NULL,
    next_billing_at timestamptz NOT NULL,   -- the watermark
    period          interval NOT NULL DEFAULT interval '1 hour' CHECK (period > interval '0'),
    amount_cents    bigint NOT NULL CHECK (amount_cents > 0),
    customer_email  text NOT NULL
);
CREATE INDEX subscriptions_due ON subscriptions (next_billing_at) WHERE status = 'active';

CREATE TABLE invoices (
    id              bigserial PRIMARY KEY,
    subscription_id bigint NOT NULL REFERENCES subscriptions,
    period_start    timestamptz NOT NULL,
    amount_cents    bigint NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX invoices_billing_period_dedup ON invoices (subscription_id, period_start);

-- dunning: one run per invoice; every transition proves the attempt count it read.
CREATE TABLE dunning_runs (
    id              bigserial PRIMARY KEY,
    invoice_id      bigint NOT NULL UNIQUE REFERENCES invoices,
    state           text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'paid', 'exhausted')),
    attempt_count   int NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    max_attempts    int NOT NULL DEFAULT 4 CHECK (max_attempts > 0),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_outcome    text
);
CREATE INDEX dunning_runs_due ON dunning_runs (next_attempt_at) WHERE state = 'active';

-- webhook_outbox: events, fanned out to every endpoint by the dispatcher.
CREATE TABLE webhook_endpoints (
    id  bigserial PRIMARY KEY,
    url text NOT NULL UNIQUE
);
CREATE TABLE webhook_events (
    id            bigserial PRIMARY KEY,
    kind          text NOT NULL,
    payload       text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    dispatched_at timestamptz
);
CREATE INDEX webhook_events_pending ON webhook_events (id) WHERE dispatched_at IS NULL;

-- webhook_delivery: one row per (event, endpoint); completions are a CAS on (id, attempt).
CREATE TABLE webhook_deliveries (
    id              bigserial PRIMARY KEY,
    event_id        bigint NOT NULL REFERENCES webhook_events,
    endpoint_id     bigint NOT NULL REFERENCES webhook_endpoints,
    status          text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempt         int NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    UNIQUE (event_id, endpoint_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';

-- email_outbox: claimed in batches; the Message-ID derives from the row.
CREATE TABLE email_outbox (
    id              bigserial PRIMARY KEY,
    to_addr         text NOT NULL,
    subject         text NOT NULL,
    body            text NOT NULL,
    status          text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'failed')),
    attempt         int NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    sent_at         timestamptz
);
CREATE INDEX email_outbox_due ON email_outbox (next_attempt_at) WHERE status = 'pending';

-- The claim journal: every funnel that claims rows appends (role, token) in
-- the same statement, so who claimed under which term is the database's own
-- record (the chaos checker reads it).
CREATE TABLE worker_journal (
    id      bigserial PRIMARY KEY,
    role    text NOT NULL,
    token   bigint NOT NULL,
    claimed int NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX worker_journal_role_at ON worker_journal (role, at);

//! The five claim funnels: the only leader-only statements, each carrying the
//! fence in its innermost WHERE. `$1` and `$2` are always the fence's role and
//! token, `$3` the batch size; billing's `$4` is the instant it bills as of
//! (its occurrence; NULL: now).

use ticklease::Fence;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, Row};

/// One claim statement, with `{fence}` where the fence predicate goes.
#[derive(Debug, Clone, Copy)]
pub struct Funnel {
    pub role: &'static str,
    /// The table the funnel claims from (what a stale claim must leave unchanged).
    pub table: &'static str,
    pub sql: &'static str,
}

pub const BILLING: Funnel = Funnel {
    role: "billing",
    table: "subscriptions",
    sql: "SELECT id, status, period_start, next_billing_at, extract(epoch FROM period)::float8 AS period_seconds,
                 amount_cents, customer_email
            FROM subscriptions
           WHERE status = 'active' AND next_billing_at <= coalesce($4, now()) AND {fence}
           ORDER BY next_billing_at, id LIMIT $3",
};

pub const DUNNING: Funnel = Funnel {
    role: "dunning",
    table: "dunning_runs",
    sql: "SELECT r.id, r.invoice_id, r.attempt_count, r.max_attempts, r.inflight_key, i.amount_cents
            FROM dunning_runs r JOIN invoices i ON i.id = r.invoice_id
           WHERE r.state = 'active' AND r.next_attempt_at <= now() AND {fence}
           ORDER BY r.next_attempt_at, r.id LIMIT $3",
};

/// Runs inside the dispatcher's transaction: the claimed events stay locked
/// until it fans them out and marks them dispatched.
pub const WEBHOOK_OUTBOX: Funnel = Funnel {
    role: "webhook_outbox",
    table: "webhook_events",
    sql: "SELECT id FROM webhook_events
           WHERE dispatched_at IS NULL AND {fence}
           ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED",
};

pub const WEBHOOK_DELIVERY: Funnel = Funnel {
    role: "webhook_delivery",
    table: "webhook_deliveries",
    sql: "SELECT d.id, d.attempt, e.url, ev.id AS event_id, ev.kind, ev.payload, ev.created_at
            FROM webhook_deliveries d
            JOIN webhook_endpoints e ON e.id = d.endpoint_id
            JOIN webhook_events ev ON ev.id = d.event_id
           WHERE d.status = 'pending' AND d.next_attempt_at <= now() AND {fence}
           ORDER BY d.next_attempt_at, d.id LIMIT $3",
};

/// claimBatch: takes the batch by bumping each row's attempt and pushing its
/// next attempt out by $4 seconds (a crashed sender's rows come back then).
pub const EMAIL_OUTBOX: Funnel = Funnel {
    role: "email_outbox",
    table: "email_outbox",
    sql: "UPDATE email_outbox
             SET attempt = attempt + 1, next_attempt_at = now() + $4 * interval '1 second'
           WHERE id IN (SELECT id FROM email_outbox
                         WHERE status = 'pending' AND next_attempt_at <= now()
                         ORDER BY next_attempt_at, id LIMIT $3 FOR UPDATE SKIP LOCKED)
             AND {fence}
       RETURNING id, to_addr, subject, body, attempt",
};

pub const FUNNELS: [Funnel; 5] = [BILLING, DUNNING, WEBHOOK_OUTBOX, WEBHOOK_DELIVERY, EMAIL_OUTBOX];

impl Funnel {
    /// The statement with `predicate` in the fence's place, journalling
    /// (role, token, rows claimed) in the same statement when it claims any.
    pub fn render(&self, predicate: &str) -> String {
        format!(
            "WITH claimed AS ({}),
                  journal AS (INSERT INTO worker_journal (role, token, claimed)
                              SELECT $1, $2, count(*) FROM claimed HAVING count(*) > 0)
             SELECT * FROM claimed",
            self.sql.replace("{fence}", predicate)
        )
    }

    /// Runs the claim with `fence` and the parameters after `$2`. The fence's
    /// predicate is the only one a claim can run with.
    pub async fn claim<C: GenericClient>(
        &self,
        client: &C,
        fence: &Fence,
        rest: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let [role, token] = fence.params();
        let mut params = vec![role, token];
        params.extend_from_slice(rest);
        client
            .query_typed(&self.render(&fence.predicate(1)), &params)
            .await
    }
}

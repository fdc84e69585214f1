//! The end-of-run audit: what the stores say against what the peers
//! received. Shared by the chaos run and the demo.

use std::collections::{BTreeMap, BTreeSet};

use tokio_postgres::Client;

use crate::{email, journal, WorkerError};

/// What arrived at the peers.
#[derive(Debug, Clone, Default)]
pub struct Received {
    /// Webhook POSTs: (path, webhook-id, body).
    pub hooks: Vec<(String, String, String)>,
    /// Charge requests: (idempotency key, body).
    pub charges: Vec<(String, String)>,
    /// Message-IDs of the emails the SMTP sink accepted (with repeats).
    pub message_ids: Vec<String>,
}

/// Counts for the report, and every broken invariant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Audit {
    pub invoices: i64,
    pub events: i64,
    pub endpoints: Vec<String>,
    pub hooks_received: usize,
    pub hooks_unique: usize,
    pub charge_keys: usize,
    pub charge_requests: usize,
    pub emails: i64,
    pub emails_received: usize,
    pub emails_unique: usize,
    pub violations: Vec<String>,
}

/// Checks: no stale claim in the journal; one invoice per subscription and
/// period, none missing; every event at every endpoint, one body per
/// webhook-id; one charge body per idempotency key; every email arrived.
/// `endpoint_paths` are the receiver paths events must reach.
pub async fn audit(
    db: &Client,
    received: &Received,
    endpoint_paths: &[String],
) -> Result<Audit, WorkerError> {
    let q = |sql: &'static str| async move {
        let rows = db.query_typed(sql, &[]).await.map_err(WorkerError::db("audit"))?;
        Ok::<_, WorkerError>(rows)
    };
    let mut a = Audit {
        endpoints: endpoint_paths.to_vec(),
        ..Audit::default()
    };
    for v in journal::violations(db).await? {
        a.violations.push(format!("stale claim: {v:?}"));
    }
    let counts = &q("SELECT (SELECT count(*) FROM invoices),
                            (SELECT count(*) - count(DISTINCT (subscription_id, period_start)) FROM invoices),
                            (SELECT count(*) FROM subscriptions s
                              WHERE next_billing_at <= now() + interval '1 minute'
                                AND NOT EXISTS (SELECT 1 FROM invoices i WHERE i.subscription_id = s.id))")
    .await?[0];
    let (invoices, duplicates, unbilled): (i64, i64, i64) = (counts.get(0), counts.get(1), counts.get(2));
    a.invoices = invoices;
    if duplicates != 0 || unbilled != 0 {
        a.violations.push(format!(
            "invoices: {duplicates} duplicates, {unbilled} subscriptions unbilled"
        ));
    }

    let mut bodies: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    for (path, id, body) in &received.hooks {
        bodies.entry((path, id)).or_default().insert(body);
    }
    a.hooks_received = received.hooks.len();
    a.hooks_unique = bodies.len();
    let events = q("SELECT id FROM webhook_events ORDER BY id").await?;
    a.events = events.len() as i64;
    for e in events.iter().map(|r| r.get::<_, i64>(0)) {
        let id = crate::delivery::webhook_id(e);
        for path in endpoint_paths {
            match bodies.get(&(path.as_str(), id.as_str())) {
                None => a.violations.push(format!("event {e} never reached {path}")),
                Some(b) if b.len() > 1 => a
                    .violations
                    .push(format!("{id} at {path} arrived with {} bodies", b.len())),
                Some(_) => {}
            }
        }
    }

    let mut charges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (key, body) in &received.charges {
        charges.entry(key).or_default().insert(body);
    }
    a.charge_keys = charges.len();
    a.charge_requests = received.charges.len();
    for (key, b) in charges.iter().filter(|(_, b)| b.len() > 1) {
        a.violations.push(format!(
            "idempotency key {key} used for {} different charges",
            b.len()
        ));
    }

    let got: BTreeSet<&str> = received.message_ids.iter().map(String::as_str).collect();
    a.emails_received = received.message_ids.len();
    a.emails_unique = got.len();
    let emails = q("SELECT id FROM email_outbox ORDER BY id").await?;
    a.emails = emails.len() as i64;
    for id in emails.iter().map(|r| r.get::<_, i64>(0)) {
        if !got.contains(email::message_id(id).as_str()) {
            a.violations.push(format!("email {id} never arrived"));
        }
    }
    Ok(a)
}

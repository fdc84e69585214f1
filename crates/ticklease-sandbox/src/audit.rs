//! The end-of-run audit: what the stores say against what the peers
//! received. Shared by the chaos run and the demo.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use tokio_postgres::Client;

use crate::{email, journal, WorkerError};

/// What arrived at the peers.
#[derive(Debug, Clone, Default)]
pub struct Received {
    /// Webhook POSTs: (path, webhook-id, body).
    pub hooks: Vec<(String, String, String)>,
    /// Charge requests, with repeats.
    pub charges: Vec<ChargeRequest>,
    /// Message-IDs of the emails the SMTP sink accepted (with repeats).
    pub message_ids: Vec<String>,
}

/// One charge request as the payment provider saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeRequest {
    pub key: String,
    pub body: String,
    /// The provider charged under this key (a decline is no charge).
    pub accepted: bool,
}

/// What kind of invariant broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A claim under a superseded token after a newer term's first claim.
    StaleClaim,
    /// An effect that happened twice.
    Duplicate,
    /// An effect that never happened.
    Loss,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::StaleClaim => "stale claim",
            Kind::Duplicate => "duplicate",
            Kind::Loss => "loss",
        })
    }
}

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub kind: Kind,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.detail)
    }
}

/// Counts for the report, and every broken invariant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Audit {
    pub invoices: i64,
    pub events: i64,
    pub endpoints: Vec<String>,
    pub hooks_received: usize,
    pub hooks_unique: usize,
    /// Invoices the provider charged.
    pub charged_invoices: usize,
    pub charge_keys: usize,
    pub charge_requests: usize,
    pub emails: i64,
    pub emails_received: usize,
    pub emails_unique: usize,
    pub violations: Vec<Violation>,
}

impl Audit {
    /// How many violations are of `kind`.
    pub fn count(&self, kind: Kind) -> usize {
        self.violations.iter().filter(|v| v.kind == kind).count()
    }

    fn push(&mut self, kind: Kind, detail: String) {
        self.violations.push(Violation { kind, detail });
    }
}

/// Checks: no stale claim in the journal; one invoice per subscription and
/// period, none missing; every event at every endpoint, one body per
/// webhook-id; every invoice charged under at most one idempotency key (a
/// charge is one key: a retry under a new key is a second charge), every
/// paid run's invoice charged, one body per key; every email arrived.
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
        a.push(Kind::StaleClaim, format!("{v:?}"));
    }
    let counts = &q("SELECT (SELECT count(*) FROM invoices),
                            (SELECT count(*) - count(DISTINCT (subscription_id, period_start)) FROM invoices),
                            (SELECT count(*) FROM subscriptions s
                              WHERE next_billing_at <= now() + interval '1 minute'
                                AND NOT EXISTS (SELECT 1 FROM invoices i WHERE i.subscription_id = s.id))")
    .await?[0];
    let (invoices, duplicates, unbilled): (i64, i64, i64) = (counts.get(0), counts.get(1), counts.get(2));
    a.invoices = invoices;
    if duplicates != 0 {
        a.push(
            Kind::Duplicate,
            format!("{duplicates} invoices for a period already invoiced"),
        );
    }
    if unbilled != 0 {
        a.push(
            Kind::Loss,
            format!("{unbilled} subscriptions due but never invoiced"),
        );
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
                None => a.push(Kind::Loss, format!("event {e} never reached {path}")),
                Some(b) if b.len() > 1 => a.push(
                    Kind::Duplicate,
                    format!("{id} at {path} arrived with {} bodies", b.len()),
                ),
                Some(_) => {}
            }
        }
    }

    charges(db, received, &mut a).await?;

    let got: BTreeSet<&str> = received.message_ids.iter().map(String::as_str).collect();
    a.emails_received = received.message_ids.len();
    a.emails_unique = got.len();
    let emails = q("SELECT id FROM email_outbox ORDER BY id").await?;
    a.emails = emails.len() as i64;
    for id in emails.iter().map(|r| r.get::<_, i64>(0)) {
        if !got.contains(email::message_id(id).as_str()) {
            a.push(Kind::Loss, format!("email {id} never arrived"));
        }
    }
    Ok(a)
}

/// The charges: keys per invoice and bodies per key, against the paid runs.
async fn charges(db: &Client, received: &Received, a: &mut Audit) -> Result<(), WorkerError> {
    let mut bodies: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    // None: a body without an invoice id, still counted (as one unknown invoice).
    let mut keys: BTreeMap<Option<i64>, BTreeSet<&str>> = BTreeMap::new();
    for c in &received.charges {
        bodies.entry(&c.key).or_default().insert(&c.body);
        if c.accepted {
            let invoice = serde_json::from_str::<serde_json::Value>(&c.body)
                .ok()
                .and_then(|b| b["invoice_id"].as_i64());
            keys.entry(invoice).or_default().insert(&c.key);
        }
    }
    a.charge_keys = bodies.len();
    a.charge_requests = received.charges.len();
    a.charged_invoices = keys.len();
    for (key, b) in bodies.iter().filter(|(_, b)| b.len() > 1) {
        a.push(
            Kind::Duplicate,
            format!("idempotency key {key} used for {} different charges", b.len()),
        );
    }
    for (invoice, k) in keys.iter().filter(|(_, k)| k.len() > 1) {
        let invoice = invoice.map_or("with no invoice_id".to_string(), |i| i.to_string());
        a.push(
            Kind::Duplicate,
            format!(
                "invoice {invoice} charged under {} idempotency keys: {k:?}",
                k.len()
            ),
        );
    }
    let paid = db
        .query_typed(
            "SELECT invoice_id FROM dunning_runs WHERE state = 'paid' ORDER BY invoice_id",
            &[],
        )
        .await
        .map_err(WorkerError::db("audit"))?;
    for invoice in paid.iter().map(|r| r.get::<_, i64>(0)) {
        if !keys.contains_key(&Some(invoice)) {
            a.push(
                Kind::Loss,
                format!("invoice {invoice} settled paid but never charged"),
            );
        }
    }
    Ok(())
}

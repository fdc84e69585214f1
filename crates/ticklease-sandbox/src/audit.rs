//! The end-of-run audit: what the stores say against what the peers
//! received. Shared by the chaos run, the demo and the end-to-end tests.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, SystemTime};

use ticklease_worker::{delivery, email, journal, WorkerError};
use tokio_postgres::Client;

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

/// What kind of invariant broke, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Kind {
    /// A claim under a superseded token after a newer term's first claim.
    StaleClaim,
    /// An effect that happened twice.
    Duplicate,
    /// An effect that never happened.
    Loss,
    /// A role without a new term for longer than its bound.
    LeaderlessGap,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::StaleClaim => "stale claim",
            Kind::Duplicate => "duplicate",
            Kind::Loss => "loss",
            Kind::LeaderlessGap => "leaderless gap",
        })
    }
}

/// One broken invariant, with what the check saw.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// A claim under a superseded token after a newer term's first claim.
    StaleClaim(journal::Violation),
    /// An effect that happened twice.
    Duplicate(Duplicate),
    /// An effect that never happened.
    Loss(Loss),
    /// A role had no new term for `gap` after a term started at `after`
    /// (a check of the chaos run, outside Postgres restarts).
    LeaderlessGap {
        role: String,
        gap: Duration,
        bound: Duration,
        after: SystemTime,
    },
}

/// An effect that happened twice.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Duplicate {
    /// Invoices for a (subscription, period) already invoiced.
    Invoices { count: i64 },
    /// One webhook-id arrived at one endpoint with different bodies.
    WebhookBodies {
        webhook_id: String,
        path: String,
        bodies: usize,
    },
    /// One idempotency key carried different charges.
    KeyReused { key: String, charges: usize },
    /// One invoice charged under several keys (`None`: a body without an invoice id).
    InvoiceCharged {
        invoice: Option<i64>,
        keys: BTreeSet<String>,
    },
}

/// An effect that never happened.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Loss {
    /// Subscriptions due but never invoiced.
    Unbilled { subscriptions: i64 },
    /// An event that never reached an endpoint.
    Event { event: i64, path: String },
    /// An invoice settled paid but never charged.
    Charge { invoice: i64 },
    /// An outbox email that never arrived.
    Email { id: i64 },
}

impl Violation {
    pub fn kind(&self) -> Kind {
        match self {
            Violation::StaleClaim(_) => Kind::StaleClaim,
            Violation::Duplicate(_) => Kind::Duplicate,
            Violation::Loss(_) => Kind::Loss,
            Violation::LeaderlessGap { .. } => Kind::LeaderlessGap,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::StaleClaim(v) => write!(f, "{}: {v:?}", self.kind()),
            Violation::Duplicate(d) => write!(f, "{}: {d}", self.kind()),
            Violation::Loss(l) => write!(f, "{}: {l}", self.kind()),
            Violation::LeaderlessGap {
                role,
                gap,
                bound,
                after,
            } => write!(
                f,
                "{role} had no new term for {gap:?} (bound {bound:?}) after {after:?}"
            ),
        }
    }
}

impl fmt::Display for Duplicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Duplicate::Invoices { count } => {
                write!(f, "{count} invoices for a period already invoiced")
            }
            Duplicate::WebhookBodies {
                webhook_id,
                path,
                bodies,
            } => write!(f, "{webhook_id} at {path} arrived with {bodies} bodies"),
            Duplicate::KeyReused { key, charges } => {
                write!(f, "idempotency key {key} used for {charges} different charges")
            }
            Duplicate::InvoiceCharged { invoice, keys } => {
                let invoice = invoice.map_or("with no invoice_id".to_string(), |i| i.to_string());
                write!(
                    f,
                    "invoice {invoice} charged under {} idempotency keys: {keys:?}",
                    keys.len()
                )
            }
        }
    }
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loss::Unbilled { subscriptions } => {
                write!(f, "{subscriptions} subscriptions due but never invoiced")
            }
            Loss::Event { event, path } => write!(f, "event {event} never reached {path}"),
            Loss::Charge { invoice } => write!(f, "invoice {invoice} settled paid but never charged"),
            Loss::Email { id } => write!(f, "email {id} never arrived"),
        }
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
        self.violations.iter().filter(|v| v.kind() == kind).count()
    }
}

/// The audit could not read the stores.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    #[error("an audit query failed")]
    Db(#[source] tokio_postgres::Error),
    #[error("the claim journal check failed")]
    Journal(#[source] WorkerError),
}

async fn rows(db: &Client, sql: &str) -> Result<Vec<tokio_postgres::Row>, AuditError> {
    db.query_typed(sql, &[]).await.map_err(AuditError::Db)
}

/// Checks: no stale claim in the journal; one invoice per subscription and
/// period, none missing; every event at every endpoint, one body per
/// webhook-id; every invoice charged under at most one idempotency key (a
/// charge is one key: a retry under a new key is a second charge), every
/// paid run's invoice charged, one body per key; every email arrived.
/// `endpoint_paths` are the receiver paths events must reach.
pub async fn audit(db: &Client, received: &Received, endpoint_paths: &[String]) -> Result<Audit, AuditError> {
    let mut a = Audit {
        endpoints: endpoint_paths.to_vec(),
        ..Audit::default()
    };
    let stale = journal::violations(db).await.map_err(AuditError::Journal)?;
    a.violations.extend(stale.into_iter().map(Violation::StaleClaim));
    invoices(db, &mut a).await?;
    hooks(db, received, endpoint_paths, &mut a).await?;
    charges(db, received, &mut a).await?;
    emails(db, received, &mut a).await?;
    Ok(a)
}

/// One invoice per subscription and period; every due subscription invoiced.
async fn invoices(db: &Client, a: &mut Audit) -> Result<(), AuditError> {
    let counts = &rows(
        db,
        "SELECT (SELECT count(*) FROM invoices),
                (SELECT count(*) - count(DISTINCT (subscription_id, period_start)) FROM invoices),
                (SELECT count(*) FROM subscriptions s
                  WHERE next_billing_at <= now() + interval '1 minute'
                    AND NOT EXISTS (SELECT 1 FROM invoices i WHERE i.subscription_id = s.id))",
    )
    .await?[0];
    let (invoices, duplicates, unbilled): (i64, i64, i64) = (counts.get(0), counts.get(1), counts.get(2));
    a.invoices = invoices;
    if duplicates != 0 {
        a.violations
            .push(Violation::Duplicate(Duplicate::Invoices { count: duplicates }));
    }
    if unbilled != 0 {
        a.violations.push(Violation::Loss(Loss::Unbilled {
            subscriptions: unbilled,
        }));
    }
    Ok(())
}

/// Every event at every endpoint, one body per webhook-id.
async fn hooks(
    db: &Client,
    received: &Received,
    endpoint_paths: &[String],
    a: &mut Audit,
) -> Result<(), AuditError> {
    let mut bodies: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    for (path, id, body) in &received.hooks {
        bodies.entry((path, id)).or_default().insert(body);
    }
    a.hooks_received = received.hooks.len();
    a.hooks_unique = bodies.len();
    let events = rows(db, "SELECT id FROM webhook_events ORDER BY id").await?;
    a.events = events.len() as i64;
    for event in events.iter().map(|r| r.get::<_, i64>(0)) {
        let id = delivery::webhook_id(event);
        for path in endpoint_paths {
            match bodies.get(&(path.as_str(), id.as_str())) {
                None => a.violations.push(Violation::Loss(Loss::Event {
                    event,
                    path: path.clone(),
                })),
                Some(b) if b.len() > 1 => a.violations.push(Violation::Duplicate(Duplicate::WebhookBodies {
                    webhook_id: id.clone(),
                    path: path.clone(),
                    bodies: b.len(),
                })),
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// The charges: keys per invoice and bodies per key, against the paid runs.
async fn charges(db: &Client, received: &Received, a: &mut Audit) -> Result<(), AuditError> {
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
        a.violations.push(Violation::Duplicate(Duplicate::KeyReused {
            key: key.to_string(),
            charges: b.len(),
        }));
    }
    for (invoice, k) in keys.iter().filter(|(_, k)| k.len() > 1) {
        a.violations.push(Violation::Duplicate(Duplicate::InvoiceCharged {
            invoice: *invoice,
            keys: k.iter().map(|k| k.to_string()).collect(),
        }));
    }
    let paid = rows(
        db,
        "SELECT invoice_id FROM dunning_runs WHERE state = 'paid' ORDER BY invoice_id",
    )
    .await?;
    for invoice in paid.iter().map(|r| r.get::<_, i64>(0)) {
        if !keys.contains_key(&Some(invoice)) {
            a.violations.push(Violation::Loss(Loss::Charge { invoice }));
        }
    }
    Ok(())
}

/// Every outbox email arrived.
async fn emails(db: &Client, received: &Received, a: &mut Audit) -> Result<(), AuditError> {
    let got: BTreeSet<&str> = received.message_ids.iter().map(String::as_str).collect();
    a.emails_received = received.message_ids.len();
    a.emails_unique = got.len();
    let emails = rows(db, "SELECT id FROM email_outbox ORDER BY id").await?;
    a.emails = emails.len() as i64;
    for id in emails.iter().map(|r| r.get::<_, i64>(0)) {
        if !got.contains(email::message_id(id).as_str()) {
            a.violations.push(Violation::Loss(Loss::Email { id }));
        }
    }
    Ok(())
}

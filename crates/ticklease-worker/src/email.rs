//! email_outbox: claims a batch, sends each message over SMTP with a
//! Message-ID derived from the row (a re-send is recognisable), and completes
//! through a compare-and-set on (id, attempt).

use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use std::sync::Arc;

use ticklease::error::chain;
use ticklease::{Fence, Steps, Tick};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::delivery::backoff;
use crate::funnel::EMAIL_OUTBOX;
use crate::worker::{Ctx, RETRY_BASE, RETRY_CAP};
use crate::{Mark, WorkerError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Email {
    pub id: i64,
    pub to: String,
    pub subject: String,
    pub body: String,
    pub attempt: i32,
}

/// claimBatch: up to `limit` due emails; their next attempt moves `claim_for` out.
pub async fn claim_batch(
    client: &Client,
    fence: &Fence,
    limit: i64,
    claim_for: Duration,
) -> Result<Vec<Email>, WorkerError> {
    let secs = claim_for.as_secs_f64();
    let rows = EMAIL_OUTBOX
        .claim(client, fence, &[(&limit, Type::INT8), (&secs, Type::FLOAT8)])
        .await
        .map_err(WorkerError::db("email claim"))?;
    Ok(rows
        .iter()
        .map(|r| Email {
            id: r.get("id"),
            to: r.get("to_addr"),
            subject: r.get("subject"),
            body: r.get("body"),
            attempt: r.get("attempt"),
        })
        .collect())
}

/// The Message-ID of an outbox row: every send of the row carries the same one.
pub fn message_id(id: i64) -> String {
    format!("<email-{id}@ticklease.invalid>")
}

/// An SMTP transport without TLS, for the configured relay (`smtp://host:port`).
pub fn transport(host: &str, port: u16) -> AsyncSmtpTransport<Tokio1Executor> {
    AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host)
        .port(port)
        .timeout(Some(Duration::from_secs(10)))
        .build()
}

pub async fn send(
    smtp: &AsyncSmtpTransport<Tokio1Executor>,
    from: &str,
    email: &Email,
) -> Result<(), WorkerError> {
    let message = Message::builder()
        .from(from.parse().map_err(|e| WorkerError::Invalid {
            what: format!("from address {from:?}: {e}"),
        })?)
        .to(email.to.parse().map_err(|e| WorkerError::Invalid {
            what: format!("to address {:?}: {e}", email.to),
        })?)
        .subject(email.subject.clone())
        .message_id(Some(message_id(email.id)))
        .header(ContentType::TEXT_PLAIN)
        .body(email.body.clone())
        .map_err(|e| WorkerError::Invalid {
            what: format!("email {}: {e}", email.id),
        })?;
    smtp.send(message)
        .await
        .map_err(|source| WorkerError::Smtp { source })?;
    Ok(())
}

const SENT: &str = "UPDATE email_outbox SET status = 'sent', sent_at = now()
  WHERE id = $1 AND attempt = $2 AND status = 'pending'";
const RETRY: &str = "UPDATE email_outbox SET next_attempt_at = now() + $3 * interval '1 second'
  WHERE id = $1 AND attempt = $2 AND status = 'pending'";

pub async fn mark_sent(client: &Client, id: i64, attempt: i32) -> Result<Mark, WorkerError> {
    Mark::cas(
        client,
        "mark sent",
        SENT,
        &[(&id, Type::INT8), (&attempt, Type::INT4)],
    )
    .await
}

pub async fn mark_retry(
    client: &Client,
    id: i64,
    attempt: i32,
    delay: Duration,
) -> Result<Mark, WorkerError> {
    let secs = delay.as_secs_f64();
    Mark::cas(
        client,
        "schedule email retry",
        RETRY,
        &[(&id, Type::INT8), (&attempt, Type::INT4), (&secs, Type::FLOAT8)],
    )
    .await
}

/// One email-outbox tick: sends each claimed email.
pub(crate) async fn tick(ctx: &Arc<Ctx>, tick: &Tick, steps: &mut Steps) -> Result<(), WorkerError> {
    let claim_for = ctx.cfg.lease.lease_ttl() * 3;
    let emails = claim_batch(
        &**ctx.pool.get().await?,
        tick.fence(),
        ctx.cfg.batch_size,
        claim_for,
    )
    .await?;
    steps
        .each("send", emails, |m| {
            let ctx = ctx.clone();
            async move {
                if let Err(e) = send_email(&ctx, &m).await {
                    tracing::warn!(email = m.id, error = %chain(&e), "email bookkeeping failed");
                }
            }
        })
        .await;
    Ok(())
}

async fn send_email(ctx: &Ctx, m: &Email) -> Result<(), WorkerError> {
    let sent = send(&ctx.smtp, &ctx.cfg.mail_from, m).await;
    let conn = ctx.pool.get().await?;
    let mark = match sent {
        Ok(()) => mark_sent(&conn, m.id, m.attempt).await?,
        Err(e) => {
            tracing::warn!(email = m.id, error = %chain(&e), "SMTP send failed");
            mark_retry(&conn, m.id, m.attempt, backoff(m.attempt, RETRY_BASE, RETRY_CAP)).await?
        }
    };
    if mark == Mark::Stale {
        tracing::info!(
            email = m.id,
            attempt = m.attempt,
            "stale email mark: the row moved on; nothing written"
        );
    }
    Ok(())
}

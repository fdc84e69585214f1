//! The tick history (migration 0005): one entry per term that ended and per
//! operator event, newest first. Written by the lease statements themselves;
//! read here for `ticklease history` and the status page.

use std::time::{Duration, SystemTime};

use tokio_postgres::types::Type;

use crate::error::StoreError;
use crate::role::Role;
use crate::store::PgStore;

/// Most entries one read returns.
pub const HISTORY_LIMIT_MAX: usize = 10_000;

const READ: &str = "SELECT kind, role, at, token, holder_id, acquired_at, outcome, reason, by, error
  FROM leader_history
 WHERE ($1::text IS NULL OR role = $1) AND at >= now() - $2::int8 * interval '1 millisecond'
 ORDER BY id DESC
 LIMIT $3";

/// What an entry records.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HistoryKind {
    /// A term ended.
    Term {
        /// Its token.
        token: i64,
        /// Who held it.
        holder: Option<String>,
        /// When it started.
        acquired_at: Option<SystemTime>,
        /// `completed`, `interrupted`, `lost`, `failed` or `panicked`.
        outcome: String,
        /// Why a lost term was lost (`expired` or `holder_gone` when it was
        /// taken over without a RELEASE).
        reason: Option<String>,
        /// A short summary of the error or panic.
        error: Option<String>,
    },
    /// An operator paused the role.
    Pause {
        /// Who.
        by: String,
        /// Why.
        reason: String,
    },
    /// An operator unpaused it (the database login that did).
    Unpause {
        /// Who.
        by: String,
    },
    /// An operator cleared its cooldown.
    RunNow {
        /// Who.
        by: String,
    },
}

/// One entry of the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// The role.
    pub role: String,
    /// When the term ended or the event happened (database clock).
    pub at: SystemTime,
    /// What happened.
    pub kind: HistoryKind,
}

impl PgStore {
    /// The history of `role` (every role when `None`) over the last `since`,
    /// newest first, at most `limit` entries (1..=[`HISTORY_LIMIT_MAX`]).
    pub async fn history(
        &self,
        role: Option<&Role>,
        since: Duration,
        limit: usize,
    ) -> Result<Vec<HistoryEntry>, StoreError> {
        if !(1..=HISTORY_LIMIT_MAX).contains(&limit) {
            return Err(StoreError::Rejected {
                statement: "HISTORY",
                problem: "limit must be within 1..=10000",
            });
        }
        let role = role.map(Role::as_str);
        let since_ms = i64::try_from(since.as_millis()).unwrap_or(i64::MAX);
        let limit = limit as i64;
        let rows = self
            .query(
                "HISTORY",
                READ,
                &[(&role, Type::TEXT), (&since_ms, Type::INT8), (&limit, Type::INT8)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                let text = |c: &str| r.get::<_, Option<String>>(c).unwrap_or_default();
                let kind = match r.get::<_, &str>("kind") {
                    "pause" => HistoryKind::Pause {
                        by: text("by"),
                        reason: text("reason"),
                    },
                    "unpause" => HistoryKind::Unpause { by: text("by") },
                    "run_now" => HistoryKind::RunNow { by: text("by") },
                    _ => HistoryKind::Term {
                        token: r.get::<_, Option<i64>>("token").unwrap_or_default(),
                        holder: r.get("holder_id"),
                        acquired_at: r.get("acquired_at"),
                        outcome: text("outcome"),
                        reason: r.get("reason"),
                        error: r.get("error"),
                    },
                };
                HistoryEntry {
                    role: r.get("role"),
                    at: r.get("at"),
                    kind,
                }
            })
            .collect())
    }
}

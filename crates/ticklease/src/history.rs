//! The tick history (migration 0005): one entry per term that ended and per
//! operator event, newest first. Written by the lease statements themselves;
//! read here for `ticklease history` and the status page.

use std::time::{Duration, SystemTime};

use tokio_postgres::types::Type;

use crate::error::StoreError;
use crate::role::Role;
use crate::store::PgStore;

/// Reading the history: the Postgres store keeps one (migration 0005).
pub trait HistoryStore: Send + Sync + 'static {
    /// The history of `role` (every role when `None`) over the last `since`,
    /// newest first, at most `limit` entries (1..=[`HISTORY_LIMIT_MAX`]).
    fn history(
        &self,
        role: Option<&Role>,
        since: Duration,
        limit: usize,
    ) -> impl std::future::Future<Output = Result<Vec<HistoryEntry>, StoreError>> + Send;

    /// As [`HistoryStore::history`] for every role, leaving out completed
    /// terms: operator events and terms that did not complete, which a
    /// busy history of completed ticks would otherwise push out of `limit`.
    fn notable(
        &self,
        since: Duration,
        limit: usize,
    ) -> impl std::future::Future<Output = Result<Vec<HistoryEntry>, StoreError>> + Send;

    /// Every role's terms over the last `window`, cut into `buckets` equal
    /// slices (oldest first): per role and slice, how the worst term in it
    /// ended and whether one was taken over. Bounded by roles × buckets,
    /// whatever the number of ticks.
    fn timeline(
        &self,
        window: Duration,
        buckets: u32,
    ) -> impl std::future::Future<Output = Result<Vec<TimelineSlice>, StoreError>> + Send;
}

/// Most slices a timeline is cut into.
pub const TIMELINE_BUCKETS_MAX: u32 = 2_000;

/// One slice of one role's timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineSlice {
    /// The role.
    pub role: String,
    /// The slice, `0..buckets`, oldest first.
    pub bucket: u32,
    /// The worst outcome of a term that ended in it (panicked, failed, lost,
    /// interrupted, completed, in that order).
    pub outcome: String,
    /// Terms that ended in it.
    pub terms: i64,
    /// A term in it was taken over without a RELEASE.
    pub takeover: bool,
}

const TIMELINE: &str = "SELECT role, bucket::int4 AS bucket,
       (ARRAY['completed', 'interrupted', 'lost', 'failed', 'panicked'])[max(rank)] AS outcome,
       count(*) AS terms, bool_or(reason IN ('expired', 'holder_gone')) AS takeover
  FROM (SELECT role, reason,
               least(floor(extract(epoch FROM at - (now() - $1::int8 * interval '1 millisecond'))
                           * 1000 / $1::int8 * $2::int4), $2::int4 - 1) AS bucket,
               CASE outcome WHEN 'completed' THEN 1 WHEN 'interrupted' THEN 2 WHEN 'lost' THEN 3
                            WHEN 'failed' THEN 4 ELSE 5 END AS rank
          FROM leader_history
         WHERE kind = 'term' AND at >= now() - $1::int8 * interval '1 millisecond') AS t
 GROUP BY role, bucket
 ORDER BY role, bucket";

/// Most entries one read returns.
pub const HISTORY_LIMIT_MAX: usize = 10_000;

const READ: &str = "SELECT kind, role, at, token, holder_id, acquired_at, outcome, reason, by, error
  FROM leader_history
 WHERE ($1::text IS NULL OR role = $1) AND at >= now() - $2::int8 * interval '1 millisecond'
   AND (NOT $4::bool OR kind <> 'term' OR outcome <> 'completed')
 ORDER BY id DESC
 LIMIT $3";

/// The longest span a read looks back: older rows are past any retention.
const SINCE_MAX: Duration = Duration::from_secs(3650 * 86_400);

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

impl HistoryStore for PgStore {
    async fn history(
        &self,
        role: Option<&Role>,
        since: Duration,
        limit: usize,
    ) -> Result<Vec<HistoryEntry>, StoreError> {
        self.read_history(role, since, limit, false).await
    }

    async fn notable(&self, since: Duration, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        self.read_history(None, since, limit, true).await
    }

    async fn timeline(&self, window: Duration, buckets: u32) -> Result<Vec<TimelineSlice>, StoreError> {
        if window.is_zero() || window > crate::config::DURATION_MAX * 7 {
            return Err(StoreError::Rejected {
                statement: "TIMELINE",
                problem: "the window must be within 1 ms ..= 7 days",
            });
        }
        if !(1..=TIMELINE_BUCKETS_MAX).contains(&buckets) {
            return Err(StoreError::Rejected {
                statement: "TIMELINE",
                problem: "buckets must be within 1..=2000",
            });
        }
        let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
        let buckets = buckets as i32;
        let rows = self
            .query(
                "TIMELINE",
                TIMELINE,
                &[(&window_ms, Type::INT8), (&buckets, Type::INT4)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| TimelineSlice {
                role: r.get("role"),
                bucket: r.get::<_, i32>("bucket").max(0) as u32,
                outcome: r.get("outcome"),
                terms: r.get("terms"),
                takeover: r.get::<_, Option<bool>>("takeover").unwrap_or(false),
            })
            .collect())
    }
}

impl PgStore {
    async fn read_history(
        &self,
        role: Option<&Role>,
        since: Duration,
        limit: usize,
        notable_only: bool,
    ) -> Result<Vec<HistoryEntry>, StoreError> {
        if !(1..=HISTORY_LIMIT_MAX).contains(&limit) {
            return Err(StoreError::Rejected {
                statement: "HISTORY",
                problem: "limit must be within 1..=10000",
            });
        }
        let role = role.map(Role::as_str);
        let since_ms = i64::try_from(since.min(SINCE_MAX).as_millis()).unwrap_or(i64::MAX);
        let limit = limit as i64;
        let rows = self
            .query(
                "HISTORY",
                READ,
                &[
                    (&role, Type::TEXT),
                    (&since_ms, Type::INT8),
                    (&limit, Type::INT8),
                    (&notable_only, Type::BOOL),
                ],
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

//! The tick history (migration 0005): one entry per term that ended and per
//! operator event, newest first. Written by the lease statements themselves;
//! read here for `ticklease history` and the status page.

use std::time::{Duration, SystemTime};

use tokio_postgres::types::Type;

use crate::error::StoreError;
use crate::store::PgStore;
use crate::term::role::Role;

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
    /// ended and whether one was taken over. Its cost is bounded by roles ×
    /// slices, whatever the number of ticks: it reads at most
    /// [`TimelineSlice::CELLS_MAX`] cells (when roles × `buckets` is more, each
    /// cell spans several adjacent slices, reported once per slice), and
    /// per cell at most [`TimelineSlice::TERMS_READ`] terms and as many that did
    /// not complete, each through an index on (role, end time).
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
    /// interrupted, completed, in that order), among the first
    /// [`TimelineSlice::TERMS_READ`] that did not complete.
    pub outcome: String,
    /// Terms that ended in it, counted up to [`TimelineSlice::TERMS_READ`] per
    /// cell (a cell spanning several slices counts them on its first).
    pub terms: i64,
    /// A term in it was taken over without a RELEASE.
    pub takeover: bool,
}

impl TimelineSlice {
    /// Most cells (role × run of slices) one timeline reads: 100 roles at
    /// 300 slices; 1,000 roles get cells of 10 slices each. At most this
    /// many roles (the first by name) have a timeline.
    pub const CELLS_MAX: u32 = 30_000;

    /// Most terms a timeline reads per cell, and most that did not
    /// complete: [`TimelineSlice::terms`] counts up to this.
    pub const TERMS_READ: u32 = 10;
}

/// The timeline: `leader_timeline` (store/definitions/20_history.sql) does the work.
const TIMELINE: &str = include_str!("../store/timeline.sql");

/// Who paused and why, as every surface shows it: `alice: INC-42`, or
/// `alice` alone when no reason was given (not escaped: escape it for the
/// terminal or page it goes to).
pub fn pause_label(by: &str, reason: Option<&str>) -> String {
    match reason {
        Some(why) if !why.is_empty() => format!("{by}: {why}"),
        _ => by.to_string(),
    }
}

/// Most entries one read returns.
pub const HISTORY_LIMIT_MAX: usize = 10_000;

const READ: &str = "SELECT kind, role, at, token, holder_id, acquired_at, outcome, reason, by, error, output
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
        /// The last part of what its work said ([`Tick::keep_output`](crate::Tick::keep_output)):
        /// a `ticklease run` command's exit status and last output lines.
        output: Option<String>,
        /// A manual run of a cron role (run-now, no occurrence): who asked for it.
        manual_by: Option<String>,
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
    /// Occurrences of a cron schedule passed over, recorded by the term
    /// that ran instead.
    Skipped {
        /// Why: `deadline` (older than the starting deadline), `paused`
        /// (due while the role was paused) or `catch_up` (the catch-up
        /// policy ran a newer one).
        reason: String,
        /// How many, from when to when (UTC).
        summary: String,
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

impl HistoryEntry {
    /// The one escaping rule for text from the database (holder ids, pause
    /// reasons, attributions, error summaries) on every surface: the CLI's
    /// tables and the status page. Control characters (C0, DEL, C1) and the
    /// invisible characters that reorder or hide text (bidi embeddings,
    /// overrides and isolates U+202A..=U+202E and U+2066..=U+2069, the marks
    /// U+061C and U+200E/U+200F, zero-width characters U+200B..=U+200D,
    /// U+2060..=U+2064 and U+FEFF, line and paragraph separators
    /// U+2028/U+2029) are shown as `\u{202e}`, never passed on; everything
    /// else is kept. The result holds no control or bidi character, so a
    /// terminal or browser shows exactly what was stored (HTML markup is
    /// the page's own, further step).
    pub fn escape(text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for c in text.chars() {
            if hidden(c) {
                out.extend(c.escape_unicode());
            } else {
                out.push(c);
            }
        }
        out
    }
}

impl HistoryEntry {
    /// The same rule for JSON text (`--json` output): every character
    /// [`HistoryEntry::escape`] shows escaped is written as a JSON `\uXXXX`
    /// escape, so the bytes a terminal receives hold none of them while a
    /// JSON reader gets the stored value exactly. `json` is serialized JSON
    /// (the control characters in its strings already escaped; the others
    /// can only stand inside its strings).
    pub fn escape_json(json: &str) -> String {
        let mut out = String::with_capacity(json.len());
        for c in json.chars() {
            // JSON's own whitespace stands between values, never in a string.
            if hidden(c) && !matches!(c, '\n' | '\r' | '\t') {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            } else {
                out.push(c);
            }
        }
        out
    }
}

/// A character [`HistoryEntry::escape`] shows escaped.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
        )
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
        let (cells, per_cell) = (TimelineSlice::CELLS_MAX as i32, TimelineSlice::TERMS_READ as i32);
        let rows = self
            .query(
                "TIMELINE",
                TIMELINE,
                &[
                    (&window_ms, Type::INT8),
                    (&buckets, Type::INT4),
                    (&cells, Type::INT4),
                    (&per_cell, Type::INT4),
                ],
            )
            .await?;
        let mut slices = Vec::with_capacity(rows.len());
        for r in &rows {
            let (role, outcome): (String, String) = (r.get("role"), r.get("outcome"));
            let first = r.get::<_, i32>("bucket").max(0) as u32;
            let span = r.get::<_, i32>("span").max(1) as u32;
            // A cell of several slices is reported on each, counted once.
            for bucket in first..(first + span).min(buckets as u32) {
                slices.push(TimelineSlice {
                    role: role.clone(),
                    bucket,
                    outcome: outcome.clone(),
                    terms: if bucket == first { r.get("terms") } else { 0 },
                    takeover: bucket == first && r.get::<_, bool>("takeover"),
                });
            }
        }
        Ok(slices)
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
                    "skipped" => HistoryKind::Skipped {
                        reason: text("reason"),
                        summary: text("error"),
                    },
                    _ => HistoryKind::Term {
                        token: r.get::<_, Option<i64>>("token").unwrap_or_default(),
                        holder: r.get("holder_id"),
                        acquired_at: r.get("acquired_at"),
                        outcome: text("outcome"),
                        reason: r.get("reason"),
                        error: r.get("error"),
                        output: r.get("output"),
                        manual_by: r.get("by"),
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

#[cfg(test)]
mod tests {
    use super::HistoryEntry;

    #[test]
    fn escape_shows_controls_bidi_overrides_isolates_and_zero_width_characters_escaped() {
        assert_eq!(
            HistoryEntry::escape("a\x1b[2Jb\x7f\u{85}"),
            "a\\u{1b}[2Jb\\u{7f}\\u{85}"
        );
        assert_eq!(
            HistoryEntry::escape("x\u{202e}y\u{2066}z\u{2069}\u{200f}\u{200b}\u{feff}\n"),
            "x\\u{202e}y\\u{2066}z\\u{2069}\\u{200f}\\u{200b}\\u{feff}\\u{a}"
        );
        assert_eq!(
            HistoryEntry::escape("plain: ümlaut <b> & 日本"),
            "plain: ümlaut <b> & 日本"
        );
    }
}

//! `ticklease history`: the tick history as a table or JSON, newest first.
//! Pure functions of the entries; text from the database is escaped before
//! it reaches a terminal.

use std::time::SystemTime;

use ticklease::{HistoryEntry, HistoryKind};

use crate::status::{aligned, seconds, short};

/// Terms whose kept output the table prints below it (the newest); the
/// JSON form has every one.
pub const OUTPUTS_SHOWN_MAX: usize = 10;

/// The entries as an aligned table; times relative to `now`. Below it, the
/// kept output of the newest [`OUTPUTS_SHOWN_MAX`] terms that have one,
/// line by line, escaped.
pub fn table(entries: &[HistoryEntry], now: SystemTime) -> String {
    let header = ["WHEN", "ROLE", "WHAT", "TOKEN", "HOLDER", "HELD FOR", "DETAIL"];
    let mut out = aligned(header, entries.iter().map(|e| cells(e, now)));
    let outputs: Vec<(&HistoryEntry, i64, &str)> = entries
        .iter()
        .filter_map(|e| match &e.kind {
            HistoryKind::Term {
                token,
                output: Some(output),
                ..
            } => Some((e, *token, output.as_str())),
            _ => None,
        })
        .collect();
    for (e, token, output) in outputs.iter().take(OUTPUTS_SHOWN_MAX) {
        let role = HistoryEntry::escape(&e.role);
        out.push_str(&format!(
            "\n{role} token {token}, ended {} ago:\n",
            short(seconds(now, e.at))
        ));
        for line in output.lines() {
            out.push_str(&format!("  {}\n", HistoryEntry::escape(line)));
        }
    }
    if outputs.len() > OUTPUTS_SHOWN_MAX {
        let more = outputs.len() - OUTPUTS_SHOWN_MAX;
        out.push_str(&format!(
            "\n(the output of {more} older terms: --json, or ticklease history ROLE --limit N)\n"
        ));
    }
    out
}

fn cells(e: &HistoryEntry, now: SystemTime) -> [String; 7] {
    let ago = format!("{} ago", short(seconds(now, e.at)));
    let dash = || "-".to_string();
    match &e.kind {
        HistoryKind::Term {
            token,
            holder,
            acquired_at,
            outcome,
            reason,
            error,
            manual_by,
            ..
        } => [
            ago,
            e.role.clone(),
            match manual_by {
                Some(by) => format!("{outcome} (manual run by {by})"),
                None => outcome.clone(),
            },
            token.to_string(),
            holder.clone().unwrap_or_else(dash),
            acquired_at.map(|t| short(seconds(e.at, t))).unwrap_or_else(dash),
            [reason.clone(), error.clone()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(": "),
        ],
        HistoryKind::Pause { by, reason } => [
            ago,
            e.role.clone(),
            "paused".into(),
            dash(),
            dash(),
            dash(),
            format!("by {}", ticklease::pause_label(by, Some(reason))),
        ],
        HistoryKind::Unpause { by } => [
            ago,
            e.role.clone(),
            "unpaused".into(),
            dash(),
            dash(),
            dash(),
            format!("by {by}"),
        ],
        HistoryKind::RunNow { by } => [
            ago,
            e.role.clone(),
            "run now".into(),
            dash(),
            dash(),
            dash(),
            format!("by {by}"),
        ],
        HistoryKind::Skipped { reason, summary } => [
            ago,
            e.role.clone(),
            "skipped".into(),
            dash(),
            dash(),
            dash(),
            format!("{reason}: {summary}"),
        ],
        _ => [ago, e.role.clone(), "?".into(), dash(), dash(), dash(), dash()],
    }
}

/// The entries as one JSON array, times in RFC 3339.
pub fn json(entries: &[HistoryEntry]) -> serde_json::Value {
    let time = |t: SystemTime| crate::status::rfc3339(t, true);
    serde_json::Value::Array(
        entries
            .iter()
            .map(|e| match &e.kind {
                HistoryKind::Term {
                    token,
                    holder,
                    acquired_at,
                    outcome,
                    reason,
                    error,
                    output,
                    manual_by,
                } => serde_json::json!({
                    "role": e.role, "at": time(e.at), "kind": "term", "token": token, "holder_id": holder,
                    "acquired_at": acquired_at.map(time), "outcome": outcome, "reason": reason, "error": error,
                    "output": output, "manual_by": manual_by,
                    "held_seconds": acquired_at.map(|t| seconds(e.at, t).max(0.0)),
                }),
                HistoryKind::Pause { by, reason } => {
                    serde_json::json!({ "role": e.role, "at": time(e.at), "kind": "pause", "by": by, "reason": reason })
                }
                HistoryKind::Unpause { by } => {
                    serde_json::json!({ "role": e.role, "at": time(e.at), "kind": "unpause", "by": by })
                }
                HistoryKind::RunNow { by } => {
                    serde_json::json!({ "role": e.role, "at": time(e.at), "kind": "run_now", "by": by })
                }
                HistoryKind::Skipped { reason, summary } => serde_json::json!({
                    "role": e.role, "at": time(e.at), "kind": "skipped", "reason": reason, "summary": summary,
                }),
                _ => serde_json::json!({ "role": e.role, "at": time(e.at), "kind": "unknown" }),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    #[test]
    fn a_term_shows_its_outcome_duration_and_error_escaped() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000);
        let entries = [
            HistoryEntry {
                role: "billing".into(),
                at: now - Duration::from_secs(90),
                kind: HistoryKind::Term {
                    token: 7,
                    holder: Some("h:1:2".into()),
                    acquired_at: Some(now - Duration::from_secs(100)),
                    outcome: "failed".into(),
                    reason: None,
                    error: Some("boom\u{1b}[31m".into()),
                    output: Some("exit 3\nerr: no space left\u{202e}".into()),
                    manual_by: None,
                },
            },
            HistoryEntry {
                role: "billing".into(),
                at: now - Duration::from_secs(3600),
                kind: HistoryKind::Pause {
                    by: "alice".into(),
                    reason: "<script>".into(),
                },
            },
        ];
        let t = table(&entries, now);
        assert!(t.contains("1m30s ago  billing  failed"), "{t}");
        assert!(t.contains("10.0s"), "{t}");
        assert!(
            t.contains("boom\\u{1b}[31m"),
            "control characters are escaped: {t}"
        );
        assert!(t.contains("paused") && t.contains("by alice: <script>"), "{t}");
        assert!(
            t.contains("billing token 7, ended 1m30s ago:\n  exit 3\n  err: no space left\\u{202e}\n"),
            "the kept output, line by line, escaped: {t}"
        );
        let j = json(&entries);
        assert_eq!(j[0]["outcome"], "failed");
        assert_eq!(j[0]["held_seconds"], 10.0);
        assert_eq!(j[1]["kind"], "pause");
    }
}

//! `ticklease status`: the lease rows as a table or JSON. Pure functions of
//! the rows; text from the database is escaped before it reaches a terminal.

use std::time::SystemTime;

use ticklease::LeaseStatus;

/// `later - earlier` in seconds, signed.
pub(crate) fn seconds(later: SystemTime, earlier: SystemTime) -> f64 {
    match later.duration_since(earlier) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// The first instant RFC 3339 cannot write (year 10000).
const RFC3339_END_SECS: u64 = 253_402_300_800;

/// `t` in RFC 3339 UTC (milliseconds when `millis`), or `out of range`
/// before 1970 or from the year 10000: the database holds instants that
/// humantime refuses, and any login may write some (a status never panics).
pub(crate) fn rfc3339(t: SystemTime, millis: bool) -> String {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) if d.as_secs() < RFC3339_END_SECS => match millis {
            true => humantime::format_rfc3339_millis(t).to_string(),
            false => humantime::format_rfc3339_seconds(t).to_string(),
        },
        _ => "out of range".into(),
    }
}

pub(crate) fn short(seconds: f64) -> String {
    let s = seconds.max(0.0);
    match s {
        s if s < 60.0 => format!("{s:.1}s"),
        s if s < 3600.0 => format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64),
        s if s < 86400.0 => format!("{}h{:02}m", (s / 3600.0) as u64, ((s % 3600.0) / 60.0) as u64),
        s => format!("{}d{:02}h", (s / 86400.0) as u64, ((s % 86400.0) / 3600.0) as u64),
    }
}

/// Text from the database, made safe for a terminal by the library's one
/// rule ([`ticklease::HistoryEntry::escape`], the status page's too):
/// control characters and bidirectional overrides are shown escaped
/// (`\u{1b}`), never interpreted.
pub(crate) fn escape(text: &str) -> String {
    ticklease::HistoryEntry::escape(text)
}

/// Most characters a table cell shows; a longer one is cut and ends in `…`
/// (`--json` keeps every value whole).
pub(crate) const CELL_WIDTH_MAX: usize = 120;

/// `text` escaped and cut to [`CELL_WIDTH_MAX`] characters.
pub(crate) fn cell(text: &str) -> String {
    let shown = escape(text);
    match shown.char_indices().nth(CELL_WIDTH_MAX - 1) {
        Some((cut, _)) if shown.chars().count() > CELL_WIDTH_MAX => format!("{}…", &shown[..cut]),
        _ => shown,
    }
}

/// The rows as an aligned table with a header line.
pub fn table(rows: &[LeaseStatus]) -> String {
    let header = [
        "ROLE",
        "HOLDER",
        "TOKEN",
        "HELD FOR",
        "EXPIRES IN",
        "PAUSED BY / WHY",
        "LAST TICK AGE",
        "LAST OUTCOME",
        "NOT BEFORE",
        "SCHEDULE",
        "LAST OCCURRENCE",
        "NEXT OCCURRENCE",
    ];
    aligned(header, rows.iter().map(cells))
}

/// A header and rows as aligned columns, every cell escaped and cut to
/// [`CELL_WIDTH_MAX`] characters.
pub(crate) fn aligned<const N: usize>(header: [&str; N], rows: impl Iterator<Item = [String; N]>) -> String {
    let mut lines: Vec<[String; N]> = vec![header.map(String::from)];
    lines.extend(rows.map(|cells| cells.map(|text| cell(&text))));
    let widths: Vec<usize> = (0..N)
        .map(|i| lines.iter().map(|l| l[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for line in &lines {
        let cells: Vec<String> = line
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// One row's cells, unescaped.
fn cells(r: &LeaseStatus) -> [String; 12] {
    let held = r.held;
    [
        r.role.clone(),
        if held {
            r.holder_id.clone().unwrap_or_default()
        } else {
            "-".into()
        },
        r.token.to_string(),
        r.acquired_at
            .filter(|_| held)
            .map(|t| short(seconds(r.db_now, t)))
            .unwrap_or_else(|| "-".into()),
        r.remaining
            .map(|d| short(d.as_secs_f64()))
            .unwrap_or_else(|| "-".into()),
        match (&r.paused_by, &r.pause_reason) {
            (Some(by), why) => ticklease::pause_label(by, why.as_deref()),
            _ => "-".into(),
        },
        r.last_tick_ended_at
            .map(|t| short(seconds(r.db_now, t)))
            .unwrap_or_else(|| "never".into()),
        r.last_outcome.clone().unwrap_or_else(|| "-".into()),
        r.not_before
            .map(|t| {
                let wait = seconds(t, r.db_now);
                if wait > 0.0 {
                    format!("in {}", short(wait))
                } else {
                    "passed".into()
                }
            })
            .unwrap_or_else(|| "-".into()),
        r.schedule.clone().unwrap_or_else(|| "-".into()),
        r.last_occurrence
            .map(|t| rfc3339(t, false))
            .unwrap_or_else(|| "-".into()),
        r.next_occurrence
            .map(|t| {
                let at = rfc3339(t, false);
                let wait = seconds(t, r.db_now);
                if wait >= 0.0 {
                    format!("{at} (in {})", short(wait))
                } else {
                    format!("{at} (late {})", short(-wait))
                }
            })
            .unwrap_or_else(|| "-".into()),
    ]
}

/// The rows as one JSON array, times in RFC 3339.
pub fn json(rows: &[LeaseStatus]) -> serde_json::Value {
    let time = |t: Option<SystemTime>| t.map(|t| rfc3339(t, true));
    serde_json::Value::Array(
        rows.iter()
            .map(|r| {
                serde_json::json!({
                    "role": r.role,
                    "held": r.held,
                    "holder_id": r.holder_id,
                    "token": r.token.get(),
                    "acquired_at": time(r.acquired_at),
                    "expires_at": time(r.expires_at),
                    "db_now": time(Some(r.db_now)),
                    "remaining_seconds": r.remaining.map(|d| d.as_secs_f64()),
                    "paused_at": time(r.paused_at),
                    "paused_by": r.paused_by,
                    "pause_reason": r.pause_reason,
                    "last_tick_ended_at": time(r.last_tick_ended_at),
                    "last_tick_age_seconds": r.last_tick_ended_at.map(|t| seconds(r.db_now, t).max(0.0)),
                    "last_tick_holder": r.last_tick_holder,
                    "not_before": time(r.not_before),
                    "last_outcome": r.last_outcome,
                    "schedule": r.schedule,
                    "last_occurrence": time(r.last_occurrence),
                    "next_occurrence": time(r.next_occurrence),
                    "occurrence_late_seconds": r.next_occurrence.map(|t| seconds(r.db_now, t).max(0.0)),
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use ticklease::{LeaseStatus, Token};

    use super::{escape, json, short, table, CELL_WIDTH_MAX};

    fn row(role: &str) -> LeaseStatus {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        LeaseStatus {
            role: role.into(),
            held: true,
            holder_id: Some("web-1:42:00c0ffee".into()),
            token: Token(7),
            acquired_at: Some(now - Duration::from_secs(90)),
            expires_at: Some(now + Duration::from_secs(8)),
            db_now: now,
            remaining: Some(Duration::from_millis(8_250)),
            paused_at: None,
            paused_by: None,
            pause_reason: None,
            last_tick_ended_at: None,
            last_tick_holder: None,
            not_before: Some(now + Duration::from_secs(30)),
            last_outcome: None,
            schedule: None,
            last_occurrence: None,
            next_occurrence: None,
            long_lived: false,
            tick_interval: None,
        }
    }

    #[test]
    fn control_characters_and_bidi_overrides_are_shown_escaped() {
        assert_eq!(escape("a\x1b[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(escape("x\u{202e}y\n"), "x\\u{202e}y\\u{a}");
        assert_eq!(escape("plain: ümlaut"), "plain: ümlaut");
    }

    #[test]
    fn short_durations_keep_two_units_and_never_go_negative() {
        assert_eq!(short(-3.0), "0.0s");
        assert_eq!(short(9.25), "9.2s");
        assert_eq!(short(125.0), "2m05s");
        assert_eq!(short(2.0 * 3600.0 + 61.0), "2h01m");
        assert_eq!(short(86400.0 + 3.0 * 3600.0), "1d03h");
    }

    #[test]
    fn the_table_aligns_columns_and_escapes_every_cell() {
        let mut paused = row("email_outbox");
        paused.held = false;
        paused.paused_by = Some("alice".into());
        paused.pause_reason = Some("rotate\x1b]0;pwned\x07".into());
        paused.not_before = None;
        let out = table(&[row("billing"), paused]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[0].starts_with("ROLE          HOLDER"), "{out}");
        assert!(
            lines[1].starts_with("billing       web-1:42:00c0ffee  7      1m30s     8.2s"),
            "{out}"
        );
        assert!(
            lines[1].contains("never          -             in 30.0s"),
            "{out}"
        );
        assert!(lines[2].contains("alice: rotate\\u{1b}]0;pwned\\u{7}"), "{out}");
        assert!(!out.contains('\x1b'), "{out}");
    }

    #[test]
    fn a_100000_character_holder_and_pause_reason_are_cut_with_an_ellipsis() {
        let mut held = row("billing");
        held.holder_id = Some("h".repeat(100_000));
        let mut paused = row("dunning");
        paused.held = false;
        paused.paused_by = Some("b".repeat(100_000));
        paused.pause_reason = Some("\u{202e}".repeat(100_000));
        let out = table(&[held, paused]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out:.500}");
        assert!(
            lines[1].contains(&format!("{}…", "h".repeat(CELL_WIDTH_MAX - 1))),
            "{out:.500}"
        );
        assert!(!lines[1].contains(&"h".repeat(CELL_WIDTH_MAX)), "{out:.500}");
        assert!(
            lines[2].contains(&format!("{}…", "b".repeat(CELL_WIDTH_MAX - 1))),
            "{out:.500}"
        );
        assert!(!out.contains('\u{202e}'), "{out:.500}");
        assert!(
            lines
                .iter()
                .all(|l| l.chars().count() <= 12 * (CELL_WIDTH_MAX + 2)),
            "{out:.500}"
        );
    }

    #[test]
    fn a_cron_role_shows_its_schedule_last_occurrence_and_how_late_the_next_is() {
        let mut billing = row("billing");
        billing.schedule = Some("CRON_TZ=Europe/Berlin 5 0 * * *".into());
        billing.last_occurrence = Some(billing.db_now - Duration::from_secs(86_400));
        billing.next_occurrence = Some(billing.db_now - Duration::from_secs(125));
        let mut outbox = row("outbox");
        outbox.schedule = Some("CRON_TZ=UTC */15 * * * *".into());
        outbox.next_occurrence = Some(outbox.db_now + Duration::from_secs(60));
        let out = table(&[billing.clone(), outbox, row("dunning")]);
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].ends_with("SCHEDULE                         LAST OCCURRENCE       NEXT OCCURRENCE"),
            "{out}"
        );
        assert!(
            lines[1].ends_with(
                "CRON_TZ=Europe/Berlin 5 0 * * *  2023-11-13T22:13:20Z  2023-11-14T22:11:15Z (late 2m05s)"
            ),
            "{out}"
        );
        assert!(
            lines[2].ends_with("-                     2023-11-14T22:14:20Z (in 1m00s)"),
            "{out}"
        );
        assert!(
            lines[3].ends_with("-                                -                     -"),
            "{out}"
        );
        let v = json(&[billing]);
        assert_eq!(v[0]["schedule"], "CRON_TZ=Europe/Berlin 5 0 * * *");
        assert_eq!(v[0]["next_occurrence"], "2023-11-14T22:11:15.000Z");
        assert_eq!(v[0]["occurrence_late_seconds"], 125.0);
    }

    #[test]
    fn instants_rfc3339_cannot_write_are_shown_out_of_range() {
        let mut hostile = row("junk");
        hostile.next_occurrence = Some(SystemTime::UNIX_EPOCH - Duration::from_secs(86_400 * 365 * 70));
        hostile.last_occurrence = Some(SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_800 * 2));
        let out = table(&[hostile.clone()]);
        assert!(out.contains("out of range     out of range (late"), "{out}");
        assert_eq!(json(&[hostile])[0]["last_occurrence"], "out of range");
    }

    #[test]
    fn json_keeps_raw_values_and_times_in_rfc3339() {
        let v = json(&[row("billing")]);
        let r = &v[0];
        assert_eq!(r["role"], "billing");
        assert_eq!(r["token"], 7);
        assert_eq!(r["remaining_seconds"], 8.25);
        assert_eq!(r["db_now"], "2023-11-14T22:13:20.000Z");
        assert_eq!(r["last_tick_age_seconds"], serde_json::Value::Null);
    }
}

//! The read-only status page served at `/` beside `/metrics`: every role's
//! lease row, a timeline of its terms over the last hours (bars coloured by
//! outcome, takeovers and pauses marked) and the recent operator events.
//! Server-rendered HTML with inline SVG and CSS: no script, no external
//! asset. Everything from the database is escaped. Pause and unpause stay in
//! psql and the CLI, where they are attributed.

use std::fmt::Write;
use std::time::{Duration, SystemTime};

use crate::ops::history::{HistoryEntry, HistoryKind, TimelineSlice};
use crate::store::LeaseStatus;

/// Slices the timeline is cut into (one SVG column each at most).
pub(crate) const BUCKETS: u32 = 300;
/// Default and largest window of the timeline, in hours.
pub(crate) const HOURS_DEFAULT: u64 = 6;
pub(crate) const HOURS_MAX: u64 = 168;
/// The windows the page shows: a requested number of hours is rounded up to
/// one of these, so the page's cache (one entry per window) bounds the store
/// reads to one per window and second however the requests vary.
pub(crate) const WINDOWS_HOURS: [u64; 9] = [1, 2, 3, 6, 12, 24, 48, 72, HOURS_MAX];

/// `hours` rounded up to a window of [`WINDOWS_HOURS`]; its index there.
pub(crate) fn window_of(hours: u64) -> Option<(usize, u64)> {
    WINDOWS_HOURS
        .iter()
        .copied()
        .enumerate()
        .find(|(_, w)| *w >= hours)
        .filter(|_| hours >= 1)
}
/// Most operator events and unfinished terms listed and marked.
pub(crate) const EVENTS_MAX: usize = 200;

const LABEL_WIDTH: u32 = 220;
const PLOT_WIDTH: u32 = 900;
const ROW_HEIGHT: u32 = 22;

/// Text made safe inside HTML elements and attribute values: escaped by
/// the library's one rule for text from the database
/// ([`HistoryEntry::escape`]: control and bidi characters shown as
/// `\u{…}`), then markup characters as entities.
pub(crate) fn html(text: &str) -> String {
    let shown = HistoryEntry::escape(text);
    let mut out = String::with_capacity(shown.len());
    for c in shown.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn ago(seconds: f64) -> String {
    let s = seconds.max(0.0);
    match s {
        s if s < 60.0 => format!("{s:.1}s"),
        s if s < 3600.0 => format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64),
        s if s < 86400.0 => format!("{}h{:02}m", (s / 3600.0) as u64, ((s % 3600.0) / 60.0) as u64),
        s => format!("{}d{:02}h", (s / 86400.0) as u64, ((s % 86400.0) / 3600.0) as u64),
    }
}

fn secs(later: SystemTime, earlier: SystemTime) -> f64 {
    match later.duration_since(earlier) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse}th,td{padding:4px 10px;border-bottom:1px solid #ddd;text-align:left}
th{background:#f4f4f4}.paused{color:#a15c00}.muted{color:#888}
svg text{font:12px system-ui,sans-serif}.completed{fill:#3a9d5d}.interrupted{fill:#8aa0b8}
.lost{fill:#e0a030}.failed{fill:#d0453a}.panicked{fill:#7d1fa0}.held{fill:#3a7bd5}
.takeover{stroke:#000;stroke-width:2}.pause{stroke:#a15c00;stroke-width:2}
.legend span{display:inline-block;padding:2px 8px;margin-right:6px;color:#fff;border-radius:3px}";

/// The page. `rows`: the roles shown, of `total`; `now` is the database
/// clock; `window` the timeline's span.
pub(crate) fn render(
    rows: &[LeaseStatus],
    total: u64,
    slices: &[TimelineSlice],
    events: &[HistoryEntry],
    now: SystemTime,
    window: Duration,
) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>ticklease status</title>\
         <style>{STYLE}</style></head><body><h1>ticklease</h1>\
         <p class=\"muted\">database clock {}; this page does not refresh itself</p>",
        html(&humantime::format_rfc3339_seconds(now).to_string())
    );
    roles_table(&mut out, rows);
    left_out(&mut out, rows.len(), total);
    timeline(&mut out, rows, slices, events, now, window);
    recent(&mut out, events, now);
    out.push_str("</body></html>");
    out
}

fn roles_table(out: &mut String, rows: &[LeaseStatus]) {
    out.push_str(
        "<h2>Roles</h2><table id=\"roles\"><thead><tr><th>role</th><th>holder</th><th>token</th>\
         <th>time left</th><th>paused by / why</th><th>last outcome</th><th>cooldown</th></tr></thead><tbody>",
    );
    for r in rows {
        let holder = if r.held {
            r.holder_id.as_deref().unwrap_or("")
        } else {
            "-"
        };
        let left = r
            .remaining
            .map(|d| ago(d.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        let paused = match (&r.paused_by, &r.pause_reason) {
            (Some(by), why) => crate::ops::history::pause_label(by, why.as_deref()),
            _ => "-".into(),
        };
        let cooldown = r
            .not_before
            .map(|t| secs(t, r.db_now))
            .filter(|wait| *wait > 0.0)
            .map(|wait| format!("{} left", ago(wait)))
            .unwrap_or_else(|| "-".into());
        let _ = write!(
            out,
            "<tr data-role=\"{role}\"><td>{role}</td><td class=\"holder\">{holder}</td><td>{token}</td>\
             <td>{left}</td><td class=\"{pclass}\">{paused}</td><td class=\"outcome\">{outcome}</td>\
             <td>{cooldown}</td></tr>",
            role = html(&r.role),
            holder = html(holder),
            token = r.token,
            left = html(&left),
            pclass = if r.paused_by.is_some() { "paused" } else { "" },
            paused = html(&paused),
            outcome = html(r.last_outcome.as_deref().unwrap_or("-")),
            cooldown = html(&cooldown),
        );
    }
    out.push_str("</tbody></table>");
}

/// Where to see the roles a bounded page leaves out.
fn left_out(out: &mut String, shown: usize, total: u64) {
    if total > shown as u64 {
        let _ = write!(
            out,
            "<p id=\"left-out\" class=\"paused\">showing {shown} of {}{total} roles (paused first, then \
             by name); the rest: <code>ticklease status --role NAME</code>, or \
             <code>SELECT * FROM leader_status WHERE role = 'NAME'</code></p>",
            if total >= crate::store::STATUS_COUNTED_MAX {
                "at least "
            } else {
                ""
            }
        );
    }
}

fn timeline(
    out: &mut String,
    rows: &[LeaseStatus],
    slices: &[TimelineSlice],
    events: &[HistoryEntry],
    now: SystemTime,
    window: Duration,
) {
    let hours = window.as_secs_f64() / 3600.0;
    let height = ROW_HEIGHT * (rows.len() as u32 + 1);
    let width = LABEL_WIDTH + PLOT_WIDTH;
    let step = f64::from(PLOT_WIDTH) / f64::from(BUCKETS);
    let x_of = |at: SystemTime| {
        let from_start = window.as_secs_f64() - secs(now, at);
        f64::from(LABEL_WIDTH) + (from_start / window.as_secs_f64()).clamp(0.0, 1.0) * f64::from(PLOT_WIDTH)
    };
    let _ = write!(
        out,
        "<h2>Terms over the last {hours:.0} h</h2><p class=\"legend\">\
         <span class=\"completed\" style=\"background:#3a9d5d\">completed</span>\
         <span style=\"background:#8aa0b8\">interrupted</span><span style=\"background:#e0a030\">lost</span>\
         <span style=\"background:#d0453a\">failed</span><span style=\"background:#7d1fa0\">panicked</span>\
         <span style=\"background:#3a7bd5\">held now</span> black bar: taken over without a release; \
         brown line: paused</p><svg id=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" \
         height=\"{height}\" viewBox=\"0 0 {width} {height}\">"
    );
    let mut by_role: std::collections::HashMap<&str, Vec<&TimelineSlice>> = std::collections::HashMap::new();
    for slice in slices {
        by_role.entry(slice.role.as_str()).or_default().push(slice);
    }
    for (i, r) in rows.iter().enumerate() {
        let y = ROW_HEIGHT * i as u32;
        let _ = write!(
            out,
            "<g class=\"role\" data-role=\"{role}\"><text x=\"0\" y=\"{ty}\">{role}</text>",
            role = html(&r.role),
            ty = y + ROW_HEIGHT - 7
        );
        // Runs of slices with one outcome become one bar.
        let mine = by_role.remove(r.role.as_str()).unwrap_or_default();
        let mut i = 0;
        while i < mine.len() {
            let start = mine[i];
            let mut end = i;
            let mut terms = start.terms;
            while end + 1 < mine.len()
                && mine[end + 1].bucket == mine[end].bucket + 1
                && mine[end + 1].outcome == start.outcome
                && !mine[end + 1].takeover
                && !start.takeover
            {
                end += 1;
                terms += mine[end].terms;
            }
            let x = f64::from(LABEL_WIDTH) + f64::from(start.bucket) * step;
            let w = f64::from(mine[end].bucket - start.bucket + 1) * step;
            let class = if start.takeover {
                format!("term {} takeover", html(&start.outcome))
            } else {
                format!("term {}", html(&start.outcome))
            };
            let _ = write!(
                out,
                "<rect class=\"{class}\" x=\"{x:.1}\" y=\"{}\" width=\"{w:.1}\" height=\"{}\">\
                 <title>{} × {terms}</title></rect>",
                y + 3,
                ROW_HEIGHT - 6,
                html(&start.outcome)
            );
            i = end + 1;
        }
        if let (true, Some(since)) = (r.held, r.acquired_at) {
            let x = x_of(since);
            let _ = write!(
                out,
                "<rect class=\"term held\" x=\"{x:.1}\" y=\"{}\" width=\"{:.1}\" height=\"{}\"><title>held by {}</title></rect>",
                y + 3,
                (x_of(now) - x).max(1.0),
                ROW_HEIGHT - 6,
                html(r.holder_id.as_deref().unwrap_or(""))
            );
        }
        for e in events.iter().filter(|e| e.role == r.role) {
            if let HistoryKind::Pause { by, reason } = &e.kind {
                let x = x_of(e.at);
                let _ = write!(
                    out,
                    "<line class=\"pause\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{y}\" y2=\"{}\"><title>paused by {}</title></line>",
                    y + ROW_HEIGHT,
                    html(&crate::ops::history::pause_label(by, Some(reason)))
                );
            }
        }
        out.push_str("</g>");
    }
    let _ = write!(
        out,
        "<text x=\"{LABEL_WIDTH}\" y=\"{}\">{hours:.0} h ago</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">now</text></svg>",
        height - 6,
        width,
        height - 6
    );
}

/// A term's kept output as a preformatted block, each line escaped.
fn kept_output(kind: &HistoryKind) -> String {
    match kind {
        HistoryKind::Term {
            output: Some(output), ..
        } => {
            let lines: Vec<String> = output.lines().map(html).collect();
            format!("<pre class=\"output\">{}</pre>", lines.join("\n"))
        }
        _ => String::new(),
    }
}

fn recent(out: &mut String, events: &[HistoryEntry], now: SystemTime) {
    out.push_str(
        "<h2>Recent events</h2><p class=\"muted\">pauses, unpauses, run-nows and terms that did not complete</p>\
         <ul id=\"events\">",
    );
    for e in events {
        let what = match &e.kind {
            HistoryKind::Term {
                outcome,
                reason,
                error,
                holder,
                token,
                manual_by,
                ..
            } => format!(
                "{}term {token} of {} ended {outcome}{}{}",
                manual_by
                    .as_deref()
                    .map(|b| format!("manual run by {b}: "))
                    .unwrap_or_default(),
                holder.as_deref().unwrap_or("?"),
                reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default(),
                error.as_deref().map(|e| format!(": {e}")).unwrap_or_default()
            ),
            HistoryKind::Pause { by, reason } => {
                format!("paused by {}", crate::ops::history::pause_label(by, Some(reason)))
            }
            HistoryKind::Unpause { by } => format!("unpaused by {by}"),
            HistoryKind::RunNow { by } => format!("run now by {by}"),
            HistoryKind::Skipped { reason, summary } => format!("skipped ({reason}): {summary}"),
        };
        let _ = write!(
            out,
            "<li><span class=\"muted\">{} ago</span> <b>{}</b> {}{}</li>",
            html(&ago(secs(now, e.at))),
            html(&e.role),
            html(&what),
            kept_output(&e.kind)
        );
    }
    out.push_str("</ul>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hours_are_rounded_up_to_one_of_nine_windows() {
        assert_eq!(window_of(0), None);
        assert_eq!(window_of(1), Some((0, 1)));
        assert_eq!(window_of(23), Some((5, 24)));
        assert_eq!(window_of(24), Some((5, 24)));
        assert_eq!(window_of(100), Some((8, 168)));
        assert_eq!(window_of(168), Some((8, 168)));
        assert_eq!(window_of(169), None);
    }

    #[test]
    fn html_escapes_markup_quotes_control_characters_and_bidi_overrides() {
        assert_eq!(
            html("<script>\"x\" & 'y'\u{1b}\u{202e}"),
            "&lt;script&gt;&quot;x&quot; &amp; &#39;y&#39;\\u{1b}\\u{202e}"
        );
    }
}

//! SVG plots of the benchmarks, written next to their markdown: the failover
//! takeover distribution per scenario and mode (from the published CSVs), the
//! fence's cost (throughput and p99 latency per run), and the chaos run's
//! timeline of terms and faults.

use std::path::{Path, PathBuf};

use anyhow::Context;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::failover::Scenario;

/// One row of a strip plot: a label, a colour group and its samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Strip {
    pub label: String,
    /// Rows of one group share a colour (the failover plot: one per mode).
    pub group: usize,
    pub values: Vec<f64>,
}

/// Colours of the strip plot's groups and the timeline's replicas.
fn colour(i: usize) -> RGBColor {
    const C: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(23, 190, 207),
    ];
    C[i % C.len()]
}

/// The colour of fault lines in the timeline (not one of the replicas').
const FAULT: RGBColor = RGBColor(40, 40, 40);

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("plot: {e}")
}

/// Quartile by linear interpolation over sorted `s`.
fn quantile(s: &[f64], q: f64) -> f64 {
    let pos = q * (s.len() - 1) as f64;
    let (i, f) = (pos.floor() as usize, pos.fract());
    if i + 1 < s.len() {
        s[i] * (1.0 - f) + s[i + 1] * f
    } else {
        s[i]
    }
}

/// A horizontal box-and-strip plot on a log axis: one row per [`Strip`] (top
/// to bottom in order), each sample a dot (one `<circle>`), a box from the
/// first to the third quartile with the median marked, whiskers to min and max.
pub fn strips_svg(path: &Path, title: &str, axis: &str, rows: &[Strip]) -> anyhow::Result<()> {
    panels_svg(path, &[Panel { title, axis, rows }])
}

/// One strip plot of [`panels_svg`]: its caption, its axis and its rows.
#[derive(Debug, Clone, Copy)]
pub struct Panel<'a> {
    pub title: &'a str,
    pub axis: &'a str,
    pub rows: &'a [Strip],
}

/// Strip plots as [`strips_svg`] draws them, side by side, each with its own
/// log axis and row labels (the fence's cost: throughput beside latency).
pub fn panels_svg(path: &Path, panels: &[Panel]) -> anyhow::Result<()> {
    let n = panels.iter().map(|p| p.rows.len()).max().unwrap_or(0).max(1);
    let width = 960 * panels.len().max(1) as u32;
    let root = SVGBackend::new(path, (width, 90 + 26 * n as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    for (area, panel) in root.split_evenly((1, panels.len().max(1))).iter().zip(panels) {
        draw_strips(area, panel, n)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// One panel's strip plot on `area`, with room for `n` rows.
fn draw_strips(area: &Root, panel: &Panel, n: usize) -> anyhow::Result<()> {
    let rows = panel.rows;
    let positive = || {
        rows.iter()
            .flat_map(|r| r.values.iter().copied())
            .filter(|v| *v > 0.0)
    };
    let lo = positive().fold(f64::INFINITY, f64::min);
    let hi = positive().fold(0.0, f64::max);
    let (lo, hi) = if lo.is_finite() {
        (lo / 1.5, hi * 1.5)
    } else {
        (1.0, 10.0)
    };
    // Room for the longest label (13 px sans-serif: about 7 px a character).
    let longest = rows.iter().map(|r| r.label.chars().count()).max().unwrap_or(0);
    let mut chart = ChartBuilder::on(area)
        .caption(panel.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size((7 * longest as u32 + 16).max(170))
        .build_cartesian_2d((lo..hi).log_scale(), -0.5f64..(n as f64 - 0.5))
        .map_err(err)?;
    chart
        .configure_mesh()
        .y_labels(0)
        .disable_y_mesh()
        .x_desc(panel.axis)
        .x_label_formatter(&|v| format!("{v}"))
        .draw()
        .map_err(err)?;
    let label_style =
        TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    // The chart's coordinates are the whole SVG's; the area's text is placed from its own corner.
    let (ox, oy) = area.get_base_pixel();
    for (i, row) in rows.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        let (px, py) = chart.backend_coord(&(lo, y));
        area.draw_text(&row.label, &label_style, (px - 8 - ox, py - oy))
            .map_err(err)?;
        draw_strip(&mut chart, row, lo, y)?;
    }
    Ok(())
}

/// A strip plot's chart: a log axis across, one unit per row.
type Strips<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::combinators::LogCoord<f64>, plotters::coord::types::RangedCoordf64>,
>;

/// One row's box, whiskers, median and dots at height `y` (values below `lo` drawn at `lo`).
fn draw_strip(chart: &mut Strips, row: &Strip, lo: f64, y: f64) -> anyhow::Result<()> {
    let c = colour(row.group);
    let mut s: Vec<f64> = row.values.iter().map(|v| v.max(lo)).collect();
    if s.is_empty() {
        return Ok(());
    }
    s.sort_by(f64::total_cmp);
    let (q1, med, q3) = (quantile(&s, 0.25), quantile(&s, 0.5), quantile(&s, 0.75));
    chart
        .draw_series([
            PathElement::new(vec![(s[0], y), (q1, y)], c.stroke_width(1)),
            PathElement::new(vec![(q3, y), (s[s.len() - 1], y)], c.stroke_width(1)),
            PathElement::new(vec![(med, y - 0.35), (med, y + 0.35)], c.stroke_width(3)),
        ])
        .map_err(err)?;
    chart
        .draw_series([Rectangle::new([(q1, y - 0.3), (q3, y + 0.3)], c.stroke_width(1))])
        .map_err(err)?;
    // A fixed jitter, so a rerun writes the same file.
    chart
        .draw_series(row.values.iter().enumerate().map(|(k, v)| {
            let jitter = ((k as f64 * 0.618_034).fract() - 0.5) * 0.5;
            Circle::new((v.max(lo), y + jitter), 3, c.mix(0.55).filled())
        }))
        .map_err(err)?;
    Ok(())
}

/// The failover CSVs of one timing in `dir`: `failover-<timing>-<mode>.csv`
/// (the issue-12 format, with a `mode` column), in the order direct,
/// pooled-direct, pooled, then any other mode.
fn failover_csvs(dir: &Path, timing: &str) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let prefix = format!("failover-{timing}-");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if let Some(mode) = name.strip_prefix(&prefix).and_then(|m| m.strip_suffix(".csv")) {
            found.push((mode.to_string(), path.clone()));
        }
    }
    let rank = |m: &str| {
        ["direct", "pooled-direct", "pooled", "lease"]
            .iter()
            .position(|k| *k == m)
    };
    found.sort_by(|a, b| rank(&a.0).cmp(&rank(&b.0)).then(a.0.cmp(&b.0)));
    Ok(found)
}

/// `(scenario, fault_to_claim_ms)` of each trial in a failover CSV.
pub fn read_failover_csv(text: &str) -> anyhow::Result<Vec<(String, f64)>> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().context("empty CSV")?.split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .with_context(|| format!("no column {name}"))
    };
    let (scenario, ms) = (col("scenario")?, col("fault_to_claim_ms")?);
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let v = f.get(ms).context("short row")?.parse::<f64>()?;
            Ok((f.get(scenario).context("short row")?.to_string(), v))
        })
        .collect()
}

/// Writes `failover-<timing>.svg` into `dir` from the `failover-<timing>-<mode>.csv`
/// files there: fault → first claim per scenario × mode. `None` when there
/// are no such CSVs.
pub fn failover_svg(dir: &Path, timing: &str) -> anyhow::Result<Option<PathBuf>> {
    let csvs = failover_csvs(dir, timing)?;
    if csvs.is_empty() {
        return Ok(None);
    }
    let mut per_mode = Vec::new();
    for (mode, path) in &csvs {
        let text = std::fs::read_to_string(path)?;
        let trials = read_failover_csv(&text).with_context(|| format!("read {}", path.display()))?;
        per_mode.push((mode.as_str(), trials));
    }
    let mut rows = Vec::new();
    for s in Scenario::ALL {
        let label = match s {
            Scenario::Pause => "unpause",
            other => other.as_str(),
        };
        for (group, (mode, trials)) in per_mode.iter().enumerate() {
            let values: Vec<f64> = trials
                .iter()
                .filter(|(sc, _)| sc == s.as_str())
                .map(|(_, v)| *v)
                .collect();
            if !values.is_empty() {
                rows.push(Strip {
                    label: format!("{label} · {mode}"),
                    group,
                    values,
                });
            }
        }
    }
    let path = dir.join(format!("failover-{timing}.svg"));
    strips_svg(
        &path,
        &format!("Failover, {timing} timings: fault → first claim per trial"),
        "fault → first claim (ms, log scale)",
        &rows,
    )?;
    Ok(Some(path))
}

/// A term on the timeline: its role's row, its start and end (seconds from
/// the run's start) and the replica that held it (`None`: not known).
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub row: usize,
    pub from: f64,
    pub to: f64,
    pub replica: Option<usize>,
}

/// A fault on the timeline: when (seconds from the run's start) and its kind.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultMark {
    pub at: f64,
    pub label: String,
}

/// A timeline: one row per `rows` entry (top to bottom), a filled bar per
/// [`Bar`] coloured by replica (grey when not known), a vertical line per
/// fault labelled by its kind above the rows, and a legend of the replicas.
pub fn timeline_svg(
    path: &Path,
    title: &str,
    rows: &[String],
    replicas: usize,
    bars: &[Bar],
    faults: &[FaultMark],
) -> anyhow::Result<()> {
    let end = bars
        .iter()
        .map(|b| b.to)
        .chain(faults.iter().map(|f| f.at))
        .fold(1.0, f64::max);
    let n = rows.len().max(1) as f64;
    let root = SVGBackend::new(path, (1200, 140 + 40 * rows.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = timeline_chart(&root, title, end, n)?;
    let label_style =
        TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    for (i, role) in rows.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(0.0, row_y(n, i)));
        root.draw_text(role, &label_style, (px - 8, py)).map_err(err)?;
    }
    draw_terms(&mut chart, bars, end, n)?;
    draw_faults(&root, &mut chart, faults, n)?;
    draw_legend(&mut chart, replicas)?;
    root.present().map_err(err)?;
    Ok(())
}

/// A plot's drawing area, and the timeline's chart (seconds across, one unit per row).
type Root<'b> = DrawingArea<SVGBackend<'b>, plotters::coord::Shift>;
type Timeline<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// The y of row `row` of `n`, the first row at the top.
fn row_y(n: f64, row: usize) -> f64 {
    n - 1.0 - row as f64
}

/// The chart with its caption and x axis, and a band above the rows for the fault labels.
fn timeline_chart<'a, 'b>(
    root: &'a Root<'b>,
    title: &str,
    end: f64,
    n: f64,
) -> anyhow::Result<Timeline<'a, 'b>> {
    // The band above the rows holds the fault labels, staggered over three lines.
    let top = n - 0.5 + 1.5;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(190)
        // Room on the right for the legend.
        .build_cartesian_2d(0.0..end * 1.12, -0.5..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .y_labels(0)
        .disable_y_mesh()
        .light_line_style(WHITE)
        .x_desc("seconds since the run started")
        .draw()
        .map_err(err)?;
    Ok(chart)
}

/// A filled bar per term, in its replica's colour.
fn draw_terms(chart: &mut Timeline, bars: &[Bar], end: f64, n: f64) -> anyhow::Result<()> {
    // A term shorter than a pixel or so still shows.
    let min_width = end / 1500.0;
    chart
        .draw_series(bars.iter().map(|b| {
            let y = row_y(n, b.row);
            let fill = b.replica.map_or(RGBColor(170, 170, 170), colour);
            Rectangle::new(
                [(b.from, y - 0.3), (b.to.max(b.from + min_width), y + 0.3)],
                fill.filled(),
            )
        }))
        .map_err(err)?;
    Ok(())
}

/// A vertical line per fault over the rows, its label in the band above them.
fn draw_faults(root: &Root, chart: &mut Timeline, faults: &[FaultMark], n: f64) -> anyhow::Result<()> {
    chart
        .draw_series(
            faults
                .iter()
                .map(|f| PathElement::new(vec![(f.at, -0.5), (f.at, n - 0.5)], FAULT.stroke_width(2))),
        )
        .map_err(err)?;
    let fault_text = TextStyle::from(("sans-serif", 11).into_font())
        .color(&FAULT)
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    for (k, f) in faults.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(f.at, n - 0.5 + 0.45 * (k % 3 + 1) as f64));
        root.draw_text(&f.label, &fault_text, (px, py)).map_err(err)?;
    }
    Ok(())
}

/// The legend of the replicas' colours (none when no replica is known).
fn draw_legend<'a, 'b: 'a>(chart: &mut Timeline<'a, 'b>, replicas: usize) -> anyhow::Result<()> {
    for r in 0..replicas {
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
            .map_err(err)?
            .label(format!("replica {r}"))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour(r).filled()));
    }
    if replicas > 0 {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(svg: &str, needle: &str) -> usize {
        svg.matches(needle).count()
    }

    #[test]
    fn a_strip_plot_has_one_dot_per_sample() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.svg");
        let rows = vec![
            Strip {
                label: "sigkill · direct".into(),
                group: 0,
                values: vec![5.0, 12.0, 30.0],
            },
            Strip {
                label: "sigkill · pooled".into(),
                group: 1,
                values: vec![8000.0, 9500.0],
            },
        ];
        strips_svg(&path, "t", "ms", &rows).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert_eq!(count(&svg, "<circle"), 5, "{svg}");
        assert!(svg.contains("sigkill · pooled"));
    }

    #[test]
    fn panels_sit_side_by_side_each_with_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.svg");
        let row = |label: &str, values: Vec<f64>| Strip {
            label: label.into(),
            group: 0,
            values,
        };
        let tps = vec![row("mpt 0 · one-row · 1 c · fence", vec![2000.0, 2100.0])];
        let p99 = vec![row("mpt 0 · one-row · 1 c · fence", vec![1.5, 1.25])];
        panels_svg(
            &path,
            &[
                Panel {
                    title: "tps",
                    axis: "tx/s",
                    rows: &tps,
                },
                Panel {
                    title: "p99",
                    axis: "ms",
                    rows: &p99,
                },
            ],
        )
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg width=\"1920\""), "{svg}");
        assert_eq!(count(&svg, "<circle"), 4);
        assert_eq!(count(&svg, "mpt 0 · one-row · 1 c · fence"), 2);
        // The second panel's label is drawn in the second panel, not over the first.
        let second = svg.rfind("mpt 0 · one-row").unwrap();
        let x: u32 = svg[..second]
            .rsplit("<text x=\"")
            .next()
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(x > 960, "{x}");
    }

    #[test]
    fn the_failover_plot_reads_every_mode_csv_of_its_timing() {
        let dir = tempfile::tempdir().unwrap();
        let header =
            "mode,scenario,trial,fault_to_claim_ms,takeover_ms,gap_ms,stale_writes,pause_to_cancel_ms\n";
        std::fs::write(
            dir.path().join("failover-default-direct.csv"),
            format!("{header}direct,sigkill,0,11.6,2127.8,99.5,0,\ndirect,pause,0,7.0,,1.0,0,3.0\n"),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("failover-default-pooled.csv"),
            format!("{header}pooled,sigkill,0,8037.3,10003.8,8474.4,0,\n"),
        )
        .unwrap();
        // Another timing and the old format are not read.
        std::fs::write(
            dir.path().join("failover-scaled-direct.csv"),
            format!("{header}direct,sigkill,0,1.0,1.0,1.0,0,\n"),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("failover-default.csv"),
            "scenario,trial,takeover_ms,gap_ms,stale_writes,fault_to_takeover_ms\nsigkill,0,1,1,0,1\n",
        )
        .unwrap();
        let path = failover_svg(dir.path(), "default").unwrap().unwrap();
        assert_eq!(path, dir.path().join("failover-default.svg"));
        let svg = std::fs::read_to_string(&path).unwrap();
        assert_eq!(count(&svg, "<circle"), 3);
        for row in ["sigkill · direct", "sigkill · pooled", "unpause · direct"] {
            assert!(svg.contains(row), "{row}");
        }
        assert!(failover_svg(dir.path(), "long-lease").unwrap().is_none());
    }

    #[test]
    fn a_timeline_has_a_bar_per_term_and_a_line_per_fault() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.svg");
        let bars = vec![
            Bar {
                row: 0,
                from: 0.5,
                to: 2.0,
                replica: Some(0),
            },
            Bar {
                row: 0,
                from: 2.5,
                to: 4.0,
                replica: Some(1),
            },
            Bar {
                row: 1,
                from: 1.0,
                to: 1.0,
                replica: None,
            },
        ];
        let faults = vec![
            FaultMark {
                at: 2.2,
                label: "sigkill".into(),
            },
            FaultMark {
                at: 3.0,
                label: "pg_restart".into(),
            },
        ];
        let rows = vec!["billing".to_string(), "dunning".to_string()];
        timeline_svg(&path, "t", &rows, 2, &bars, &faults).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        // Replica 0 and 1: a bar and a legend swatch each; the unknown holder's grey bar.
        assert_eq!(count(&svg, "fill=\"#1F77B4\""), 2, "{svg}");
        assert_eq!(count(&svg, "fill=\"#2CA02C\""), 2);
        assert_eq!(count(&svg, "fill=\"#AAAAAA\""), 1);
        assert_eq!(count(&svg, "stroke=\"#282828\""), 2);
        assert!(svg.contains("pg_restart") && svg.contains("dunning"), "{svg}");
    }
}

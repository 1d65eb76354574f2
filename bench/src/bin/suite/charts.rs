//! The suite's charts (`--charts DIR`): each section's tables drawn as SVG bar charts with
//! plotters' SVG backend, its text written as SVG `<text>` elements (no font is loaded).
//!
//! The shared rendering code feeds a collector as it writes the tables ([`throughput`],
//! [`contended_latency`], [`memory`]): the section that runs is named by [`begin_section`],
//! and [`write_all`] draws every chart collected, once the markdown is made. Per section, in
//! files named `{section}-{chart}.svg` (`redis-throughput.svg`,
//! `zookeeper-contended-latency.svg`, `postgres-memory.svg`, ...):
//!
//! - `throughput`: one group of bars per row, one bar per peer, each the figure the table's
//!   cell shows (the median run's acquires + releases per second); zklock's bar in orange;
//! - `drain` (sections with drain rows): the drain rows' handoffs per second, the same way;
//! - `contended-latency`: the contended rows' p50 and p99 of one acquire + release and the
//!   longest acquire, per peer (the runs record those three figures, no histogram);
//! - `memory`: the memory rows' peak resident memory per waiting task (or key held) above the
//!   process's base, per peer.
//!
//! Every value axis is logarithmic: the peers' figures on one chart span orders of magnitude
//! (ZooKeeper's inproc row: 300,000/s beside 900/s), and on a log scale equal ratios look
//! equal, as the tables' ratios compare them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::model::{figure, Metric, Outcome, Row, RowRuns};

/// One chart: groups of bars, one bar per series in each group, on a log scale.
#[derive(Clone, Debug)]
pub(crate) struct BarChart {
    /// The chart's part of the file name and alt text, lowercase with dashes
    /// (`throughput`, `contended-latency`, `memory`, `drain`).
    pub(crate) kind: &'static str,
    /// The caption after the section's title.
    pub(crate) caption: String,
    /// The value axis's description, with its unit.
    pub(crate) y_label: String,
    /// The series, in legend order: (key, label). The key `zklock` is drawn in zklock's
    /// colour.
    pub(crate) series: Vec<(String, String)>,
    /// The groups, in order along the axis.
    pub(crate) groups: Vec<Group>,
    /// A line under the chart: where its figures come from.
    pub(crate) note: String,
}

/// One group of bars.
#[derive(Clone, Debug)]
pub(crate) struct Group {
    /// Its label under the axis (wrapped at spaces).
    pub(crate) label: String,
    /// One value per series (`None`: no bar: the peer did not run, or its run failed).
    pub(crate) values: Vec<Option<f64>>,
    /// Whether the group is zklock's (shaded, its label bold): the latency chart's groups are
    /// peers.
    pub(crate) zklock: bool,
}

impl BarChart {
    /// Whether the chart has a bar to draw.
    fn has_bars(&self) -> bool {
        self.groups
            .iter()
            .flat_map(|g| &g.values)
            .any(|v| v.is_some_and(|v| v > 0.0))
    }
}

/// One section's charts.
#[derive(Debug)]
struct SectionData {
    slug: &'static str,
    title: String,
    quick: bool,
    charts: Vec<BarChart>,
}

/// Every section's charts, in the order the sections ran.
static SECTIONS: Mutex<Vec<SectionData>> = Mutex::new(Vec::new());

/// Names the section that runs now: the charts recorded from now on are its (`slug` names its
/// files, `title` heads its captions; `quick` marks them as figures that mean nothing).
pub(crate) fn begin_section(slug: &'static str, title: &str, quick: bool) {
    let mut sections = SECTIONS.lock().unwrap_or_else(|e| e.into_inner());
    sections.push(SectionData {
        slug,
        title: title.to_string(),
        quick,
        charts: vec![],
    });
}

/// Adds `chart` to the section that runs (none outside a section: the unit tests' tables),
/// without the series that have no bar.
fn record(mut chart: BarChart) {
    if !chart.has_bars() {
        return;
    }
    let drawn: Vec<bool> = (0..chart.series.len())
        .map(|i| {
            chart
                .groups
                .iter()
                .any(|g| g.values.get(i).copied().flatten().is_some_and(|v| v > 0.0))
        })
        .collect();
    let keep = |i: &usize| drawn[*i];
    chart.series = (0..chart.series.len())
        .filter(keep)
        .map(|i| chart.series[i].clone())
        .collect();
    for group in &mut chart.groups {
        group.values = (0..group.values.len())
            .filter(keep)
            .map(|i| group.values[i])
            .collect();
    }
    let mut sections = SECTIONS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(section) = sections.last_mut() {
        section.charts.push(chart);
    }
}

/// Records the throughput chart of `rows` (their `Ops` rows) with `columns` (column key,
/// heading) as its bars: each the kept (median) run's throughput, as the table's cell.
pub(crate) fn throughput(
    rows: &[Row],
    results: &[RowRuns],
    columns: &[(&str, &str)],
    rounds: usize,
) {
    record(rows_chart(
        "throughput",
        "throughput per row and peer".into(),
        "acquires + releases per second (log scale)".into(),
        Metric::Ops,
        rows,
        results,
        columns,
        rounds,
    ));
}

/// Records the drain chart of `rows` (their `Drain` rows): each kept run's handoffs per
/// second.
pub(crate) fn drain(rows: &[Row], results: &[RowRuns], columns: &[(&str, &str)], rounds: usize) {
    record(rows_chart(
        "drain",
        "draining N queued waiters".into(),
        "handoffs per second (log scale)".into(),
        Metric::Drain,
        rows,
        results,
        columns,
        rounds,
    ));
}

/// A chart of the `metric` rows of `rows`: a group per row, a bar per column.
#[allow(clippy::too_many_arguments)]
fn rows_chart(
    kind: &'static str,
    caption: String,
    y_label: String,
    metric: Metric,
    rows: &[Row],
    results: &[RowRuns],
    columns: &[(&str, &str)],
    rounds: usize,
) -> BarChart {
    let groups = rows
        .iter()
        .zip(results)
        .filter(|(row, _)| row.metric == metric)
        .map(|(row, runs)| Group {
            label: row.title.clone(),
            values: columns
                .iter()
                .map(|(column, _)| kept(&runs.kept.get(column), |r| figure(metric, r)))
                .collect(),
            zklock: false,
        })
        .collect();
    BarChart {
        kind,
        caption,
        y_label,
        series: series(columns),
        groups,
        note: format!("Each bar: the table's cell, {}.", runs_note(rounds)),
    }
}

/// Records the latency chart of the contended rows (`workload` contended) of `rows`: a group
/// per peer (and row, when several), a bar for p50 and p99 of one acquire + release and the
/// longest acquire of its kept run, in milliseconds.
pub(crate) fn contended_latency(
    rows: &[Row],
    results: &[RowRuns],
    columns: &[(&str, &str)],
    rounds: usize,
) {
    let contended: Vec<(&Row, &RowRuns)> = rows
        .iter()
        .zip(results)
        .filter(|(row, _)| row.contended() && row.workload == "contended")
        .collect();
    let several = contended.len() > 1;
    let mut groups = vec![];
    for (row, runs) in &contended {
        for (column, heading) in columns {
            let Some(Ok(report)) = runs.kept.get(column) else {
                continue;
            };
            let ms = |field: &str| report.number(field).map(|us| us / 1000.0);
            let label = if several {
                format!("{heading}, {}", short_title(&row.title))
            } else {
                heading.to_string()
            };
            groups.push(Group {
                label,
                values: vec![ms("p50_us"), ms("p99_us"), ms("max_wait_us")],
                zklock: *column == "zklock",
            });
        }
    }
    let caption = match contended.as_slice() {
        [(row, _)] => format!("latency, {}", row.title),
        _ => "latency of the contended rows".into(),
    };
    record(BarChart {
        kind: "contended-latency",
        caption,
        y_label: "milliseconds (log scale)".into(),
        series: vec![
            ("p50".into(), "p50 of one acquire + release".into()),
            ("p99".into(), "p99 of one acquire + release".into()),
            ("max".into(), "longest acquire (call to grant)".into()),
        ],
        groups,
        note: format!(
            "Each group: one peer's run kept for the table, {}.",
            runs_note(rounds)
        ),
    });
}

/// Records the memory chart of the `Memory` rows of `rows`, a bar per column in `columns`: the
/// kept run's peak resident memory above the process's base, per task (or key) of the row.
pub(crate) fn memory(rows: &[Row], results: &[RowRuns], columns: &[(&str, &str)]) {
    let groups = rows
        .iter()
        .zip(results)
        .filter(|(row, _)| row.metric == Metric::Memory)
        .map(|(row, runs)| Group {
            label: row.title.clone(),
            values: columns
                .iter()
                .map(|(column, _)| kept(&runs.kept.get(column), |r| r.number("peak_per_task_kb")))
                .collect(),
            zklock: false,
        })
        .collect();
    let per = if rows.iter().any(|row| row.workload == "mem-keys") {
        "waiting task or key held"
    } else {
        "waiting task"
    };
    record(BarChart {
        kind: "memory",
        caption: format!("memory per {per}"),
        y_label: format!("peak KB per {per}, above the base (log scale)"),
        series: series(columns),
        groups,
        note: "Each bar: one run's (peak resident set - resident set once connected) / tasks \
               (or keys held)."
            .into(),
    });
}

/// A kept run's figure, if it ran and has one.
fn kept(
    outcome: &Option<&Outcome>,
    of: impl Fn(&zklock_bench::Report) -> Option<f64>,
) -> Option<f64> {
    outcome.and_then(|o| o.as_ref().ok()).and_then(of)
}

/// The series of a chart whose bars are the table's columns.
fn series(columns: &[(&str, &str)]) -> Vec<(String, String)> {
    columns
        .iter()
        .map(|(key, heading)| (key.to_string(), heading.to_string()))
        .collect()
}

/// How a kept run was chosen.
fn runs_note(rounds: usize) -> String {
    match rounds {
        1 => "one run".into(),
        n => format!("the median of {n} runs, the peers taking turns"),
    }
}

/// `contended, no fencing tokens` of `contended, no fencing tokens (8 managers, 1 key)`.
fn short_title(title: &str) -> &str {
    title.split(" (").next().unwrap_or(title).trim()
}

/// One chart written: its section, its file, and the alt text of its link.
#[derive(Clone, Debug)]
pub(crate) struct Written {
    /// The section's slug (`redis`).
    pub(crate) section: &'static str,
    /// The file's name in the directory (`redis-throughput.svg`).
    pub(crate) file: String,
    /// `Redis throughput`.
    pub(crate) alt: String,
}

/// Draws every chart collected into `dir` (made if missing): the files written, in order.
pub(crate) fn write_all(dir: &Path) -> Result<Vec<Written>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    let sections = SECTIONS.lock().unwrap_or_else(|e| e.into_inner());
    let mut written = vec![];
    for section in sections.iter() {
        let mut taken: Vec<String> = vec![];
        for chart in &section.charts {
            let mut file = format!("{}-{}.svg", section.slug, chart.kind);
            let mut n = 2;
            while taken.contains(&file) {
                file = format!("{}-{}-{n}.svg", section.slug, chart.kind);
                n += 1;
            }
            let path: PathBuf = dir.join(&file);
            draw(&path, &section.title, section.quick, chart)
                .map_err(|e| format!("cannot draw {}: {e}", path.display()))?;
            taken.push(file.clone());
            written.push(Written {
                section: section.slug,
                file,
                alt: format!("{} {}", section.title, chart.kind.replace('-', " ")),
            });
        }
    }
    Ok(written)
}

/// The markdown linking `section`'s charts in `written`, drawn into `dir` (empty when none).
pub(crate) fn links(written: &[Written], section: &str, dir: &Path) -> String {
    let mut md = String::new();
    for w in written.iter().filter(|w| w.section == section) {
        if md.is_empty() {
            md.push_str("\nCharts of the tables above:\n");
        }
        let _ = write!(md, "\n![{}]({})\n", w.alt, dir.join(&w.file).display());
    }
    md
}

/// zklock's colour.
const ZKLOCK: RGBColor = RGBColor(217, 95, 2);
/// The other series' colours, in turn.
const PALETTE: [RGBColor; 6] = [
    RGBColor(69, 117, 180),
    RGBColor(130, 130, 130),
    RGBColor(27, 158, 119),
    RGBColor(117, 112, 179),
    RGBColor(166, 118, 29),
    RGBColor(102, 166, 30),
];
/// The latency chart's series (p50, p99, longest): light to dark.
const SHADES: [RGBColor; 3] = [
    RGBColor(158, 202, 225),
    RGBColor(49, 130, 189),
    RGBColor(8, 48, 107),
];
/// The band behind zklock's group.
const BAND: RGBColor = RGBColor(254, 230, 206);

/// Font sizes as plotters takes them (the SVG backend writes `size / 1.24` px).
const TEXT: f64 = 12.0 * 1.24;
const SMALL: f64 = 10.0 * 1.24;
const CAPTION: f64 = 16.0 * 1.24;
/// Width of one rendered character at 12 px, roughly (sans-serif): for wrapping and layout.
const CHAR_PX: f64 = 6.6;
/// The same for the caption (16 px, bold).
const CAPTION_CHAR_PX: f64 = 9.6;

/// The colour of series `i` of `chart`.
fn colour(chart: &BarChart, i: usize) -> RGBColor {
    if chart.kind == "contended-latency" {
        return SHADES[i % SHADES.len()];
    }
    let others = chart.series[..i]
        .iter()
        .filter(|(key, _)| key != "zklock")
        .count();
    match chart.series[i].0.as_str() {
        "zklock" => ZKLOCK,
        _ => PALETTE[others % PALETTE.len()],
    }
}

/// `text` in lines of at most `width` characters, broken at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = vec![];
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// A value as a bar's label: at most four characters or so (`338k`, `1.8k`, `918`, `12.7`).
fn compact(v: f64) -> String {
    match v {
        v if v >= 1e6 => format!("{:.1}M", v / 1e6),
        v if v >= 1e4 => format!("{:.0}k", v / 1e3),
        v if v >= 1e3 => format!("{:.1}k", v / 1e3),
        v if v >= 100.0 => format!("{v:.0}"),
        v if v >= 10.0 => format!("{v:.1}"),
        v => format!("{v:.2}"),
    }
}

/// An axis label of the log scale: `1`, `10`, `1k`, `0.1`.
fn axis_label(v: f64) -> String {
    match v {
        v if v >= 1e6 => format!("{}M", v / 1e6),
        v if v >= 1e3 => format!("{}k", v / 1e3),
        v => format!("{v}"),
    }
}

/// The log axis's range: powers of ten around the values.
fn range(chart: &BarChart) -> (f64, f64) {
    let values = chart
        .groups
        .iter()
        .flat_map(|g| &g.values)
        .filter_map(|v| v.filter(|v| *v > 0.0));
    let (lo, hi) = values.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let lo = 10f64.powf(lo.log10().floor());
    // Headroom for the bars' labels.
    let hi = 10f64.powf((hi * 2.0).log10().ceil());
    (lo, if hi > lo { hi } else { lo * 10.0 })
}

/// Draws `chart` of the section `title` into `path`.
fn draw(path: &Path, title: &str, quick: bool, chart: &BarChart) -> Result<(), String> {
    let bars = chart.series.len().max(1);
    let bar_px = 28u32;
    let group_px = (bars as u32 * bar_px + 36).max(150);
    let plot_px = group_px * chart.groups.len().max(1) as u32;
    let mut caption = format!("{title}: {}", chart.caption);
    if quick {
        caption.push_str(" (--quick: figures mean nothing)");
    }
    let caption_px = (caption.chars().count() as f64 * CAPTION_CHAR_PX) as u32 + 32;
    let width = (plot_px + 130).max(720).max(caption_px);
    let label_chars = ((group_px as f64 - 8.0) / CHAR_PX).max(8.0) as usize;
    let label_lines = chart
        .groups
        .iter()
        .map(|g| wrap(&g.label, label_chars).len())
        .max()
        .unwrap_or(1);
    let legend = legend_layout(chart, width);
    let top = legend.last().map_or(40, |(_, _, y)| *y + 30);
    let bottom = 18 * label_lines as u32 + 44;
    let height = top + 380 + bottom;

    let root = SVGBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (head, body) = root.split_vertically(top);
    head.draw(&Text::new(
        caption,
        (16, 12),
        ("sans-serif", CAPTION).into_font().style(FontStyle::Bold),
    ))
    .map_err(|e| e.to_string())?;
    draw_legend(&head, chart, &legend)?;

    let (lo, hi) = range(chart);
    // The axis spans as many groups as fit at `group_px` each; the groups sit in its middle.
    let groups = chart.groups.len().max(1) as f64;
    let span = ((width - 96) as f64 / group_px as f64).max(groups);
    let offset = (span - groups) / 2.0;
    let mut plot = ChartBuilder::on(&body)
        .margin_right(20)
        .margin_top(6)
        .x_label_area_size(bottom)
        .y_label_area_size(76)
        .build_cartesian_2d(0.0..span, (lo..hi).log_scale())
        .map_err(|e| e.to_string())?;
    plot.configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_label_formatter(&|_| String::new())
        .y_desc(chart.y_label.as_str())
        .y_label_formatter(&|v| axis_label(*v))
        .axis_desc_style(("sans-serif", TEXT))
        .label_style(("sans-serif", TEXT))
        .y_max_light_lines(1)
        .light_line_style(RGBColor(238, 238, 238))
        .bold_line_style(RGBColor(210, 210, 210))
        .draw()
        .map_err(|e| e.to_string())?;

    // A bar's slot, in groups; the bars sit in the middle of their group.
    let slot = f64::from(bar_px) / f64::from(group_px);
    let first = 0.5 - slot * bars as f64 / 2.0;
    for (g, group) in chart.groups.iter().enumerate() {
        let g0 = offset + g as f64;
        if group.zklock {
            plot.draw_series(std::iter::once(Rectangle::new(
                [(g0 + 0.02, lo), (g0 + 0.98, hi)],
                BAND.filled(),
            )))
            .map_err(|e| e.to_string())?;
        }
        for (i, value) in group.values.iter().enumerate() {
            let Some(v) = value.filter(|v| *v > 0.0) else {
                continue;
            };
            let x0 = g0 + first + slot * (i as f64 + 0.06);
            let x1 = x0 + slot * 0.88;
            plot.draw_series(std::iter::once(Rectangle::new(
                [(x0, lo), (x1, v)],
                colour(chart, i).filled(),
            )))
            .map_err(|e| e.to_string())?;
            let bold = chart.series[i].0 == "zklock" || group.zklock;
            let style = ("sans-serif", SMALL)
                .into_font()
                .style(if bold {
                    FontStyle::Bold
                } else {
                    FontStyle::Normal
                })
                .color(&BLACK)
                .pos(Pos::new(HPos::Center, VPos::Bottom));
            let (px, py) = plot.backend_coord(&((x0 + x1) / 2.0, v));
            root.draw(&Text::new(compact(v), (px, py - 3), style))
                .map_err(|e| e.to_string())?;
        }
        // The group's label, under the axis.
        let (px, py) = plot.backend_coord(&(g0 + 0.5, lo));
        let style = ("sans-serif", TEXT)
            .into_font()
            .style(if group.zklock {
                FontStyle::Bold
            } else {
                FontStyle::Normal
            })
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Top));
        for (l, line) in wrap(&group.label, label_chars).into_iter().enumerate() {
            root.draw(&Text::new(
                line,
                (px, py + 8 + 16 * l as i32),
                style.clone(),
            ))
            .map_err(|e| e.to_string())?;
        }
    }
    root.draw(&Text::new(
        chart.note.clone(),
        (16, height as i32 - 20),
        ("sans-serif", SMALL)
            .into_font()
            .color(&RGBColor(90, 90, 90)),
    ))
    .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

/// Where each series' legend entry goes: (series, x, y) in the head's pixels.
fn legend_layout(chart: &BarChart, width: u32) -> Vec<(usize, i32, u32)> {
    let (mut x, mut y) = (16i32, 40u32);
    let mut out = vec![];
    for (i, (_, label)) in chart.series.iter().enumerate() {
        let w = 22 + (label.chars().count() as f64 * CHAR_PX) as i32 + 18;
        if x > 16 && x + w > width as i32 - 16 {
            x = 16;
            y += 20;
        }
        out.push((i, x, y));
        x += w;
    }
    out
}

/// Draws the legend at `layout`'s places.
fn draw_legend(
    head: &DrawingArea<SVGBackend, Shift>,
    chart: &BarChart,
    layout: &[(usize, i32, u32)],
) -> Result<(), String> {
    for (i, x, y) in layout {
        let y = *y as i32;
        head.draw(&Rectangle::new(
            [(*x, y), (*x + 14, y + 14)],
            colour(chart, *i).filled(),
        ))
        .map_err(|e| e.to_string())?;
        let style = ("sans-serif", TEXT)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Left, VPos::Center));
        head.draw(&Text::new(
            chart.series[*i].1.clone(),
            (*x + 20, y + 7),
            style,
        ))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart() -> BarChart {
        BarChart {
            kind: "throughput",
            caption: "throughput per row and peer".into(),
            y_label: "acquires + releases per second (log scale)".into(),
            series: vec![
                ("zklock".into(), "zklock (Redis)".into()),
                ("floor".into(), "floor: SET NX PX + Lua DEL".into()),
            ],
            groups: vec![
                Group {
                    label: "uncontended (1 connection, 1 key)".into(),
                    values: vec![Some(12_000.0), Some(15_500.0)],
                    zklock: false,
                },
                Group {
                    label: "contended & <8 connections>".into(),
                    values: vec![Some(900.0), None],
                    zklock: false,
                },
            ],
            note: "Each bar: the table's cell, one run.".into(),
        }
    }

    #[test]
    fn a_chart_is_an_svg_with_its_labels_as_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.svg");
        draw(&path, "Redis", true, &chart()).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
        for text in [
            "Redis: throughput per row and peer (--quick: figures mean nothing)",
            "zklock (Redis)",
            "floor: SET NX PX + Lua DEL",
            "acquires + releases per second (log scale)",
            "12k",
            "contended &amp; &lt;8",
        ] {
            assert!(svg.contains(text), "{text} missing: {svg}");
        }
    }

    #[test]
    fn labels_wrap_and_values_stay_short() {
        assert_eq!(
            wrap("uncontended, no fencing tokens (1 connection, 1 key)", 20),
            ["uncontended, no", "fencing tokens (1", "connection, 1 key)"]
        );
        assert_eq!(compact(337_662.5), "338k");
        assert_eq!(compact(1802.1), "1.8k");
        assert_eq!(compact(918.0), "918");
        assert_eq!(compact(12.7), "12.7");
        assert_eq!(compact(0.42), "0.42");
        assert_eq!(range(&chart()), (100.0, 100_000.0));
    }

    #[test]
    fn links_name_each_sections_files() {
        let written = vec![
            Written {
                section: "redis",
                file: "redis-throughput.svg".into(),
                alt: "Redis throughput".into(),
            },
            Written {
                section: "postgres",
                file: "postgres-memory.svg".into(),
                alt: "PostgreSQL memory".into(),
            },
        ];
        let md = links(&written, "redis", Path::new("docs/bench"));
        assert!(
            md.contains("![Redis throughput](docs/bench/redis-throughput.svg)"),
            "{md}"
        );
        assert!(!md.contains("postgres"), "{md}");
        assert_eq!(links(&written, "etcd", Path::new("docs/bench")), "");
    }
}

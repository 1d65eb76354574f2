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
//!
//! Beside each SVG goes the chart's data, `{section}-{chart}.json` ([`ChartFile`]: the chart,
//! the distance it ran at, whether the run was `--quick`). A run at a distance given
//! `--loopback-charts DIR` reads the loopback run's files from `DIR` and draws each chart both
//! runs drew once more with the figures of both, `{section}-{chart}-both.svg` ([`pair`]): per
//! group each series' loopback bar in its colour, its bar at the distance beside it in a
//! lighter tint of that colour, outlined; linked first under the section.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::{Deserialize, Serialize};

use crate::model::{figure, Metric, Outcome, Row, RowRuns};

/// One chart: groups of bars, one bar per series in each group, on a log scale.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct BarChart {
    /// The chart's part of the file name and alt text, lowercase with dashes
    /// (`throughput`, `contended-latency`, `memory`, `drain`).
    pub(crate) kind: String,
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// The first part of its files' names (`redis`).
    slug: &'static str,
    /// Its name (`Redis`).
    name: String,
    /// The distance its runs ran at ([`crate::distance::phrase`]: `loopback`,
    /// `1 ms round trip`).
    distance: String,
    /// What heads its charts' captions (`Redis — 1 ms round trip`).
    title: String,
    /// Whether its figures mean nothing (`--quick`).
    quick: bool,
    /// Its charts, in the order recorded.
    charts: Vec<BarChart>,
}

/// A chart's data file, `{section}-{chart}.json` beside its SVG: what a later run needs to
/// draw the chart beside its own ([`pair`]).
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct ChartFile {
    /// The distance its runs ran at (`loopback`, `1 ms round trip`).
    distance: String,
    /// Whether its figures mean nothing (`--quick`).
    quick: bool,
    /// The chart itself, its fields at the top level of the file.
    #[serde(flatten)]
    chart: BarChart,
}

/// Every section's charts, in the order the sections ran.
static SECTIONS: Mutex<Vec<SectionData>> = Mutex::new(Vec::new());

/// Names the section that runs now: the charts recorded from now on are its (`slug` names its
/// files, `name` and the distance its runs go through, `rtt` (none: loopback), head its
/// captions; `quick` marks them as figures that mean nothing).
pub(crate) fn begin_section(slug: &'static str, name: &str, rtt: Option<Duration>, quick: bool) {
    let mut sections = SECTIONS.lock().unwrap_or_else(|e| e.into_inner());
    sections.push(SectionData {
        slug,
        name: name.to_string(),
        distance: crate::distance::phrase(rtt),
        title: crate::distance::title(name, rtt, true),
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
        "throughput".into(),
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
        "drain".into(),
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
    kind: String,
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
        kind: "contended-latency".into(),
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
        kind: "memory".into(),
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
    /// For a chart of two runs ([`pair`]), their distances: `loopback beside 1 ms round trip`.
    pub(crate) pair: Option<String>,
}

/// Draws every chart collected into `dir` (made if missing), each with its data beside it
/// (`{section}-{chart}.json`). With `beside`, the charts' directory of a run at another
/// distance (`--loopback-charts`: the loopback run's), each chart that run drew too is drawn
/// once more with both runs' figures (`{section}-{chart}-both.svg`). The charts written, in
/// order.
pub(crate) fn write_all(dir: &Path, beside: Option<&Path>) -> Result<Vec<Written>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    let sections = SECTIONS.lock().unwrap_or_else(|e| e.into_inner());
    let mut written = vec![];
    for section in sections.iter() {
        let mut taken: Vec<String> = vec![];
        for chart in &section.charts {
            let stem = free_stem(section.slug, &chart.kind, &taken);
            taken.push(stem.clone());
            let data = ChartFile {
                distance: section.distance.clone(),
                quick: section.quick,
                chart: chart.clone(),
            };
            written.push(write_one(dir, &stem, section, &data)?);
            let Some(other) = beside.and_then(|b| read_beside(b, &stem, &data)) else {
                continue;
            };
            written.push(write_both(dir, &stem, section, &other, &data)?);
        }
    }
    Ok(written)
}

/// `{section}-{kind}`, or `{section}-{kind}-2` (3, ...) when the section has drawn one
/// already: the name of a chart's files without their extension.
fn free_stem(section: &str, kind: &str, taken: &[String]) -> String {
    let mut stem = format!("{section}-{kind}");
    let mut n = 2;
    while taken.contains(&stem) {
        stem = format!("{section}-{kind}-{n}");
        n += 1;
    }
    stem
}

/// Draws `data`'s chart into `dir` as `{stem}.svg` and writes `data` beside it as
/// `{stem}.json`.
fn write_one(
    dir: &Path,
    stem: &str,
    section: &SectionData,
    data: &ChartFile,
) -> Result<Written, String> {
    let file = format!("{stem}.svg");
    let path = dir.join(&file);
    draw(&path, &section.title, section.quick, &data.chart, &[])
        .map_err(|e| format!("cannot draw {}: {e}", path.display()))?;
    let json = dir.join(format!("{stem}.json"));
    let text = serde_json::to_string_pretty(data).map_err(|e| e.to_string())?;
    std::fs::write(&json, text + "\n")
        .map_err(|e| format!("cannot write {}: {e}", json.display()))?;
    Ok(Written {
        section: section.slug,
        file,
        alt: format!("{} {}", section.title, data.chart.kind.replace('-', " ")),
        pair: None,
    })
}

/// The chart `{stem}.json` of the run whose charts are in `dir`, when it ran at another
/// distance than `ours`; none when that run drew no such chart, ran at our distance, or its
/// file does not read (each said on stderr: the chart is then drawn at our distance only).
fn read_beside(dir: &Path, stem: &str, ours: &ChartFile) -> Option<ChartFile> {
    let path = dir.join(format!("{stem}.json"));
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) => {
            eprintln!(
                "chart: no {} ({e}): {stem} at one distance only",
                path.display()
            );
            return None;
        }
    };
    match serde_json::from_str::<ChartFile>(&text) {
        Ok(theirs) if theirs.distance != ours.distance => Some(theirs),
        Ok(_) => {
            eprintln!(
                "chart: {} is at our distance too: not drawn beside",
                path.display()
            );
            None
        }
        Err(e) => {
            eprintln!("chart: cannot read {}: {e}", path.display());
            None
        }
    }
}

/// Draws `near`'s chart and `far`'s (the same chart of two runs) as one into `dir`, as
/// `{stem}-both.svg`, `near`'s bars first in each pair.
fn write_both(
    dir: &Path,
    stem: &str,
    section: &SectionData,
    near: &ChartFile,
    far: &ChartFile,
) -> Result<Written, String> {
    let both = format!("{} beside {}", near.distance, far.distance);
    let title = format!("{} — {both}", section.name);
    let file = format!("{stem}-both.svg");
    let path = dir.join(&file);
    let runs = [near.distance.clone(), far.distance.clone()];
    let chart = pair(&near.chart, &far.chart, &runs);
    draw(&path, &title, near.quick || far.quick, &chart, &runs)
        .map_err(|e| format!("cannot draw {}: {e}", path.display()))?;
    Ok(Written {
        section: section.slug,
        file,
        alt: format!("{} {}, {both}", section.name, chart.kind.replace('-', " ")),
        pair: Some(both),
    })
}

/// One chart of the figures of `near` and `far`, the same chart of two runs (named `runs`):
/// their series matched by key and their groups by label, in `near`'s order (a group only
/// `far` has goes where it is there: before the next group both have, after `near`'s own).
/// Each group holds two values per series, series after series: `near`'s, then `far`'s,
/// `None` where that run has no figure.
fn pair(near: &BarChart, far: &BarChart, runs: &[String; 2]) -> BarChart {
    let mut series = near.series.clone();
    for s in &far.series {
        if !series.iter().any(|(key, _)| *key == s.0) {
            series.push(s.clone());
        }
    }
    let mut labels: Vec<&str> = near.groups.iter().map(|g| g.label.as_str()).collect();
    let mut at = labels.len();
    for group in far.groups.iter().rev() {
        match labels.iter().position(|l| *l == group.label) {
            Some(i) => at = i,
            None => labels.insert(at, &group.label),
        }
    }
    let groups = labels
        .into_iter()
        .map(|label| Group {
            label: label.to_string(),
            values: series
                .iter()
                .flat_map(|(key, _)| [near, far].map(|chart| figure_of(chart, label, key)))
                .collect(),
            zklock: [near, far]
                .iter()
                .any(|c| c.groups.iter().any(|g| g.label == label && g.zklock)),
        })
        .collect();
    let note = if near.note == far.note {
        near.note.clone()
    } else {
        format!("{}: {} {}: {}", runs[0], near.note, runs[1], far.note)
    };
    BarChart {
        kind: far.kind.clone(),
        caption: far.caption.clone(),
        y_label: far.y_label.clone(),
        series,
        groups,
        note,
    }
}

/// `chart`'s figure of the series `key` in the group `label`, if it has one.
fn figure_of(chart: &BarChart, label: &str, key: &str) -> Option<f64> {
    let group = chart.groups.iter().find(|g| g.label == label)?;
    let i = chart.series.iter().position(|(k, _)| k == key)?;
    group.values.get(i).copied().flatten()
}

/// The markdown linking `section`'s charts in `written`, drawn into `dir` (empty when none):
/// the charts of two runs first, then the tables' own.
pub(crate) fn links(written: &[Written], section: &str, dir: &Path) -> String {
    let (pairs, own): (Vec<&Written>, Vec<&Written>) = written
        .iter()
        .filter(|w| w.section == section)
        .partition(|w| w.pair.is_some());
    let mut md = String::new();
    for list in [pairs, own] {
        for (i, w) in list.iter().enumerate() {
            if i == 0 {
                let heading = match &w.pair {
                    Some(both) => format!("Charts, {both}:"),
                    None => "Charts of the tables above:".into(),
                };
                let _ = write!(md, "\n{heading}\n");
            }
            let _ = write!(md, "\n![{}]({})\n", w.alt, dir.join(&w.file).display());
        }
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
/// The latency chart's series on a chart of two runs: a hue each, as a light shade's tint
/// (the distance's bar) would look like a lighter shade's bar of the loopback run.
const PAIRED_SHADES: [RGBColor; 3] = [
    RGBColor(27, 158, 119),
    RGBColor(49, 130, 189),
    RGBColor(84, 39, 143),
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

/// The colour of series `i` of `chart`; `paired`: on a chart of two runs, where the latency
/// chart's series take hues of their own ([`PAIRED_SHADES`]).
fn colour(chart: &BarChart, i: usize, paired: bool) -> RGBColor {
    if chart.kind == "contended-latency" {
        let shades = if paired { PAIRED_SHADES } else { SHADES };
        return shades[i % shades.len()];
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

/// A bar's slot along a group, in pixels: the bar and the space beside it.
const BAR_PX: u32 = 28;
/// The space after each series' pair of bars on a chart of two runs, in pixels.
const PAIR_GAP_PX: u32 = 10;
/// The widest row of groups, in pixels: more groups go on further rows.
const MAX_ROW_PX: u32 = 1700;
/// The swatches of the runs' legend entries on a chart of two runs: a dark neutral grey.
const RUN_KEY: RGBColor = RGBColor(70, 70, 70);

/// Where a chart's bars go along a group.
struct Places {
    /// Bars per series: 1, or, on a chart of two runs, 2 (one per run).
    per: usize,
    /// One series' place, in pixels: its bars, and the gap after them when they are a pair.
    series_px: u32,
    /// One group's width, in pixels.
    group_px: u32,
    /// From the group's left edge to its first bar's slot, in pixels: the bars sit in the
    /// group's middle.
    first_px: f64,
}

impl Places {
    /// The places of `chart`'s bars, one per series and run of `runs` (none named: one).
    fn new(chart: &BarChart, runs: &[String]) -> Places {
        let per = runs.len().max(1);
        let gap_px = if per > 1 { PAIR_GAP_PX } else { 0 };
        let series_px = BAR_PX * per as u32 + gap_px;
        let bars_px = series_px * chart.series.len().max(1) as u32 - gap_px;
        let group_px = (bars_px + 36).max(150);
        Places {
            per,
            series_px,
            group_px,
            first_px: f64::from(group_px - bars_px) / 2.0,
        }
    }

    /// The left and right edges of the bar of a group's value `j` (series `j / per`, run
    /// `j % per`), in groups from the group's left edge.
    fn bar(&self, j: usize) -> (f64, f64) {
        let (series, run) = ((j / self.per) as u32, (j % self.per) as u32);
        let slot = f64::from(self.series_px * series + BAR_PX * run);
        let x0 = self.first_px + slot + 0.06 * f64::from(BAR_PX);
        let group = f64::from(self.group_px);
        (x0 / group, (x0 + 0.88 * f64::from(BAR_PX)) / group)
    }

    /// How many of `groups` groups go on one row: as many as fit in [`MAX_ROW_PX`], the rows
    /// as even as they can be (a chart of two runs with many peers is drawn in rows rather
    /// than too wide to read).
    fn per_row(&self, groups: usize) -> usize {
        let fit = (MAX_ROW_PX / self.group_px).max(1) as usize;
        let rows = groups.div_ceil(fit).max(1);
        groups.div_ceil(rows).max(1)
    }

    /// How many characters a line of a group's label holds.
    fn label_chars(&self) -> usize {
        ((self.group_px as f64 - 8.0) / CHAR_PX).max(8.0) as usize
    }
}

/// What drawing each row of groups needs: where the bars go, the value axis's range, how
/// many characters a group label's lines hold, how many groups the axis spans, and the
/// height under the axis for the labels.
struct Frame {
    places: Places,
    lo: f64,
    hi: f64,
    label_chars: usize,
    span: f64,
    bottom: u32,
}

/// The plot's coordinates: groups along the axis, values on a log scale.
type Plot<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, LogCoord<f64>>>;

/// Draws `chart` of the section `title` into `path`: in each group a bar per series, in the
/// series' colour. With `runs` named (a chart of two runs, from [`pair`]), a bar per series
/// and run, side by side, the first run's in the series' colour, the second's in a lighter
/// tint of it, and the legend names the runs. Groups too many for one row
/// ([`Places::per_row`]) go on further rows, each with its axis.
fn draw(
    path: &Path,
    title: &str,
    quick: bool,
    chart: &BarChart,
    runs: &[String],
) -> Result<(), String> {
    let places = Places::new(chart, runs);
    let group_px = places.group_px;
    let per_row = places.per_row(chart.groups.len());
    let rows = chart.groups.len().div_ceil(per_row).max(1);
    let plot_px = group_px * per_row as u32;
    let mut caption = format!("{title}: {}", chart.caption);
    if quick {
        caption.push_str(" (--quick: figures mean nothing)");
    }
    let caption_px = (caption.chars().count() as f64 * CAPTION_CHAR_PX) as u32 + 32;
    let width = (plot_px + 130).max(720).max(caption_px);
    let label_chars = places.label_chars();
    let label_lines = chart
        .groups
        .iter()
        .map(|g| wrap(&g.label, label_chars).len())
        .max()
        .unwrap_or(1);
    let entries = legend(chart, runs);
    let legend = legend_layout(&entries, width);
    let top = legend.last().map_or(40, |(_, y)| *y + 30);
    let bottom = 18 * label_lines as u32 + 44;
    let plot_height = if rows > 1 { 300 } else { 380 };
    let height = top + rows as u32 * (plot_height + bottom);

    let root = SVGBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (head, body) = root.split_vertically(top);
    head.draw(&Text::new(
        caption,
        (16, 12),
        ("sans-serif", CAPTION).into_font().style(FontStyle::Bold),
    ))
    .map_err(|e| e.to_string())?;
    draw_legend(&head, &entries, &legend)?;

    let (lo, hi) = range(chart);
    let frame = Frame {
        places,
        lo,
        hi,
        label_chars,
        // Every row's axis spans as many groups as fit at `group_px` each.
        span: ((width - 96) as f64 / group_px as f64).max(per_row as f64),
        bottom,
    };
    let areas = body.split_evenly((rows, 1));
    for (area, groups) in areas.iter().zip(chart.groups.chunks(per_row)) {
        draw_row(&root, area, chart, &frame, groups)?;
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

/// Draws `groups`, a row of `chart`'s groups, into `area`: a value axis, and the groups in
/// its middle.
fn draw_row(
    root: &DrawingArea<SVGBackend, Shift>,
    area: &DrawingArea<SVGBackend, Shift>,
    chart: &BarChart,
    frame: &Frame,
    groups: &[Group],
) -> Result<(), String> {
    let (lo, hi) = (frame.lo, frame.hi);
    let mut plot = ChartBuilder::on(area)
        .margin_right(20)
        .margin_top(6)
        .x_label_area_size(frame.bottom)
        .y_label_area_size(76)
        .build_cartesian_2d(0.0..frame.span, (lo..hi).log_scale())
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
    let offset = (frame.span - groups.len() as f64) / 2.0;
    for (g, group) in groups.iter().enumerate() {
        draw_group(root, &mut plot, chart, frame, offset + g as f64, group)?;
    }
    Ok(())
}

/// Draws `group` of `chart` from `g0` along the axis: the band behind zklock's group, its
/// bars with their values above them, its label under the axis.
fn draw_group(
    root: &DrawingArea<SVGBackend, Shift>,
    plot: &mut Plot,
    chart: &BarChart,
    frame: &Frame,
    g0: f64,
    group: &Group,
) -> Result<(), String> {
    let (lo, hi) = (frame.lo, frame.hi);
    if group.zklock {
        plot.draw_series(std::iter::once(Rectangle::new(
            [(g0 + 0.02, lo), (g0 + 0.98, hi)],
            BAND.filled(),
        )))
        .map_err(|e| e.to_string())?;
    }
    for (j, value) in group.values.iter().enumerate() {
        let Some(v) = value.filter(|v| *v > 0.0) else {
            continue;
        };
        let per = frame.places.per;
        let (series, run) = (j / per, j % per);
        let (x0, x1) = frame.places.bar(j);
        let (x0, x1) = (g0 + x0, g0 + x1);
        plot.draw_series(bar((x0, lo), (x1, v), colour(chart, series, per > 1), run))
            .map_err(|e| e.to_string())?;
        let bold = chart.series[series].0 == "zklock" || group.zklock;
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
    for (l, line) in wrap(&group.label, frame.label_chars)
        .into_iter()
        .enumerate()
    {
        root.draw(&Text::new(
            line,
            (px, py + 8 + 16 * l as i32),
            style.clone(),
        ))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// A bar from corner `a` to corner `b` in `colour`: filled with it for the first run; for
/// the second (a chart of two runs: the distance's) filled with a lighter tint of it and
/// outlined in it, so that a light colour's tint still shows.
fn bar<C: Copy>(a: C, b: C, colour: RGBColor, run: usize) -> Vec<Rectangle<C>> {
    if run == 0 {
        return vec![Rectangle::new([a, b], colour.filled())];
    }
    vec![
        Rectangle::new([a, b], tint(colour).filled()),
        Rectangle::new([a, b], colour.stroke_width(1)),
    ]
}

/// `colour` most of the way to white.
fn tint(colour: RGBColor) -> RGBColor {
    let lighter = |c: u8| c + ((255 - c) as f64 * 0.6) as u8;
    RGBColor(lighter(colour.0), lighter(colour.1), lighter(colour.2))
}

/// One legend entry: its swatches (each a series' colour and a run, drawn as that run's bar
/// of the series), then its label; `breaks`: it starts a line.
struct Entry {
    swatches: Vec<(RGBColor, usize)>,
    label: String,
    breaks: bool,
}

/// `chart`'s legend: its series, each with a swatch per run; on a chart of two runs (named
/// `runs`), then the runs, on a line of their own, a swatch each.
fn legend(chart: &BarChart, runs: &[String]) -> Vec<Entry> {
    let per = runs.len().max(1);
    let mut entries: Vec<Entry> = chart
        .series
        .iter()
        .enumerate()
        .map(|(i, (_, label))| Entry {
            swatches: (0..per)
                .map(|run| (colour(chart, i, per > 1), run))
                .collect(),
            label: label.clone(),
            breaks: false,
        })
        .collect();
    if per > 1 {
        entries.push(Entry {
            swatches: vec![],
            label: "bars of each pair:".into(),
            breaks: true,
        });
        entries.extend(runs.iter().enumerate().map(|(run, label)| Entry {
            swatches: vec![(RUN_KEY, run)],
            label: label.clone(),
            breaks: false,
        }));
    }
    entries
}

/// Where each legend entry goes: (x, y) in the head's pixels, line after line within
/// `width`.
fn legend_layout(entries: &[Entry], width: u32) -> Vec<(i32, u32)> {
    let (mut x, mut y) = (16i32, 40u32);
    let mut out = vec![];
    for entry in entries {
        let text = (entry.label.chars().count() as f64 * CHAR_PX) as i32;
        let w = swatches_px(entry) + 4 + text + 18;
        if x > 16 && (entry.breaks || x + w > width as i32 - 16) {
            x = 16;
            y += 20;
        }
        out.push((x, y));
        x += w;
    }
    out
}

/// The width of an entry's swatches, in pixels: 14 each, 4 apart.
fn swatches_px(entry: &Entry) -> i32 {
    18 * entry.swatches.len() as i32
}

/// Draws the legend's entries at `layout`'s places.
fn draw_legend(
    head: &DrawingArea<SVGBackend, Shift>,
    entries: &[Entry],
    layout: &[(i32, u32)],
) -> Result<(), String> {
    for (entry, (x, y)) in entries.iter().zip(layout) {
        let y = *y as i32;
        for (k, (colour, run)) in entry.swatches.iter().enumerate() {
            let x = x + 18 * k as i32;
            for shape in bar((x, y), (x + 14, y + 14), *colour, *run) {
                head.draw(&shape).map_err(|e| e.to_string())?;
            }
        }
        let style = ("sans-serif", TEXT)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Left, VPos::Center));
        head.draw(&Text::new(
            entry.label.clone(),
            (x + swatches_px(entry) + 2, y + 7),
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
            kind: "throughput".into(),
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
        draw(&path, "Redis", true, &chart(), &[]).unwrap();
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
                pair: None,
            },
            Written {
                section: "postgres",
                file: "postgres-memory.svg".into(),
                alt: "PostgreSQL memory".into(),
                pair: None,
            },
            Written {
                section: "redis",
                file: "redis-throughput-both.svg".into(),
                alt: "Redis throughput, loopback beside 1 ms round trip".into(),
                pair: Some("loopback beside 1 ms round trip".into()),
            },
        ];
        let md = links(&written, "redis", Path::new("docs/bench/1ms"));
        let own = md
            .find("![Redis throughput](docs/bench/1ms/redis-throughput.svg)")
            .expect(&md);
        let both = md
            .find("Charts, loopback beside 1 ms round trip:")
            .expect(&md);
        let both_link = md
            .find("(docs/bench/1ms/redis-throughput-both.svg)")
            .expect(&md);
        let heading = md.find("Charts of the tables above:").expect(&md);
        assert!(
            both < both_link && both_link < heading && heading < own,
            "{md}"
        );
        assert!(!md.contains("postgres"), "{md}");
        assert_eq!(links(&written, "etcd", Path::new("docs/bench")), "");
    }

    /// `chart()` at 1 ms: every figure a tenth, the second row missing, a row and a series of
    /// its own.
    fn far_chart() -> BarChart {
        let mut far = chart();
        far.series
            .push(("rslock".into(), "rslock (Redlock, 1 server)".into()));
        far.groups.remove(1);
        far.groups.push(Group {
            label: "inproc (64 tasks)".into(),
            values: vec![Some(700.0), Some(300.0), Some(90.0)],
            zklock: false,
        });
        for group in &mut far.groups {
            group.values.resize(3, Some(40.0));
            for v in group.values.iter_mut().flatten() {
                *v /= 10.0;
            }
        }
        far
    }

    fn runs() -> [String; 2] {
        ["loopback".into(), "1 ms round trip".into()]
    }

    #[test]
    fn a_charts_data_round_trips_through_its_json() {
        let data = ChartFile {
            distance: "loopback".into(),
            quick: false,
            chart: chart(),
        };
        let text = serde_json::to_string_pretty(&data).unwrap();
        for field in [
            "\"caption\"",
            "\"y_label\"",
            "\"series\"",
            "\"groups\"",
            "\"note\"",
        ] {
            assert!(text.contains(field), "{field} missing: {text}");
        }
        let back: ChartFile = serde_json::from_str(&text).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn a_pair_matches_groups_by_label_and_series_by_key() {
        let both = pair(&chart(), &far_chart(), &runs());
        let keys: Vec<&str> = both.series.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["zklock", "floor", "rslock"]);
        let labels: Vec<&str> = both.groups.iter().map(|g| g.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "uncontended (1 connection, 1 key)",
                "contended & <8 connections>",
                "inproc (64 tasks)"
            ]
        );
        // Per series (zklock, floor, rslock): loopback's figure, then 1 ms's.
        assert_eq!(
            both.groups[0].values,
            [
                Some(12_000.0),
                Some(1_200.0),
                Some(15_500.0),
                Some(1_550.0),
                None,
                Some(4.0)
            ]
        );
        assert_eq!(
            both.groups[1].values,
            [Some(900.0), None, None, None, None, None]
        );
        assert_eq!(
            both.groups[2].values,
            [None, Some(70.0), None, Some(30.0), None, Some(9.0)]
        );
    }

    #[test]
    fn a_chart_of_two_runs_names_both_and_every_group() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("both.svg");
        let both = pair(&chart(), &far_chart(), &runs());
        draw(
            &path,
            "Redis — loopback beside 1 ms round trip",
            false,
            &both,
            &runs(),
        )
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
        let mut texts = vec![
            "Redis — loopback beside 1 ms round trip: throughput per row and peer".to_string(),
            // Each a text element's whole text.
            "\nloopback\n".into(),
            "\n1 ms round trip\n".into(),
            "rslock (Redlock, 1 server)".into(),
            // The row only loopback has, and its figure; the series only 1 ms has.
            "900".into(),
            "\n4.00\n".into(),
        ];
        let label_chars = Places::new(&both, &runs()).label_chars();
        for group in &both.groups {
            let label = group.label.replace('&', "&amp;").replace('<', "&lt;");
            let label = label.replace('>', "&gt;");
            texts.extend(wrap(&label, label_chars));
        }
        for text in texts {
            assert!(svg.contains(&text), "{text} missing: {svg}");
        }
    }

    #[test]
    fn a_run_at_a_distance_draws_beside_the_loopback_runs_files() {
        let (near_dir, far_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let section = |distance: &str, chart: BarChart| SectionData {
            slug: "redis",
            name: "Redis".into(),
            distance: distance.into(),
            title: "Redis".into(),
            quick: false,
            charts: vec![chart],
        };
        let near = section("loopback", chart());
        let far = section("1 ms round trip", far_chart());
        let data = |s: &SectionData| ChartFile {
            distance: s.distance.clone(),
            quick: s.quick,
            chart: s.charts[0].clone(),
        };
        write_one(near_dir.path(), "redis-throughput", &near, &data(&near)).unwrap();
        assert!(near_dir.path().join("redis-throughput.json").exists());
        let far_data = data(&far);
        let theirs = read_beside(near_dir.path(), "redis-throughput", &far_data).unwrap();
        assert_eq!(theirs, data(&near));
        let written =
            write_both(far_dir.path(), "redis-throughput", &far, &theirs, &far_data).unwrap();
        assert_eq!(written.file, "redis-throughput-both.svg");
        assert_eq!(
            written.pair.as_deref(),
            Some("loopback beside 1 ms round trip")
        );
        assert!(far_dir.path().join(&written.file).exists());
        // No such chart there, or a run at the same distance: no chart of two runs.
        assert_eq!(read_beside(near_dir.path(), "redis-drain", &far_data), None);
        assert_eq!(
            read_beside(near_dir.path(), "redis-throughput", &data(&near)),
            None
        );
    }
}

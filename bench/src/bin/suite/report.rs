//! Markdown shared by every section: the machine line, cells with zklock's ratio, the
//! contended rows' fairness, and the report lines.

use std::fmt::Write as _;
use std::process::Command;

use crate::model::{figure, Figure, Metric, Outcome, Row, RowRuns};
use crate::verdict::verdict;

/// `Machine: N CPUs (model), M GiB memory; date`.
pub(crate) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "unknown".into());
    let mem_gb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("MemTotal:")?
                    .split_whitespace()
                    .next()?
                    .parse::<f64>()
                    .ok()
            })
        })
        .map(|kb| kb / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    format!("Machine: {nproc} CPUs ({cpu}), {mem_gb:.1} GiB memory; {date}")
}

/// The file system of the temporary directory (where the test kit's data directory lives).
pub(crate) fn disk() -> String {
    let disk = Command::new("sh")
        .args(["-c", "df -T \"${TMPDIR:-/tmp}\" | awk 'NR==2 {print $2}'"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    if disk.is_empty() {
        "?".into()
    } else {
        disk
    }
}

/// ` (--quick: …)` after a section's first line when the sizes are the quick ones.
pub(crate) fn quick_note(quick: bool) -> &'static str {
    if quick {
        " (--quick: sizes too small to mean anything)"
    } else {
        ""
    }
}

/// How each cell was chosen: one run, or the median of the rounds.
pub(crate) fn each_cell(rounds: usize) -> String {
    match rounds {
        1 => "each cell one run".to_string(),
        n => format!("each cell the median of {n} runs, the peers taking turns"),
    }
}

/// A figure as the tables show it.
pub(crate) fn show(metric: Metric, value: f64) -> String {
    match metric {
        Metric::Memory => format!("{:.1} MB", value / 1024.0),
        _ if value >= 100.0 => format!("{value:.0}/s"),
        _ => format!("{value:.1}/s"),
    }
}

/// A peer's cell: its figure and (if known) zklock's ratio to it.
pub(crate) fn cell_text(metric: Metric, ratio: Option<f64>, outcome: Option<&Outcome>) -> String {
    match outcome {
        None => "n/a".into(),
        Some(Err(e)) if e == "timeout" => "timeout".into(),
        Some(Err(_)) => "failed".into(),
        Some(Ok(report)) => match (figure(metric, report), ratio) {
            (Some(v), Some(r)) => format!("{} (×{r:.2})", show(metric, v)),
            (Some(v), _) => show(metric, v),
            (None, _) => "?".into(),
        },
    }
}

/// zklock's own cell: its figure in bold.
pub(crate) fn zklock_cell(metric: Metric, outcome: Option<&Outcome>) -> String {
    match outcome {
        Some(Ok(r)) => figure(metric, r).map_or("?".into(), |v| format!("**{}**", show(metric, v))),
        other => cell_text(metric, None, other),
    }
}

/// A table's heading row and separator for `columns` between `first` and `last` headings.
pub(crate) fn heading(md: &mut String, first: &str, columns: &[(&str, &str)], last: &[&str]) {
    let _ = write!(md, "| {first} |");
    for (_, heading) in columns {
        let _ = write!(md, " {heading} |");
    }
    for heading in last {
        let _ = write!(md, " {heading} |");
    }
    md.push_str("\n|---|");
    for _ in 0..columns.len() + last.len() {
        md.push_str("---|");
    }
    md.push('\n');
}

/// The contended rows' fairness: for every peer, its throughput, how often the lock changed
/// hands per second, and the longest acquire. A peer whose waiters sleep (and let the releaser
/// take the lock again) shows a high throughput with few holder changes and a long wait.
pub(crate) fn contention_table(
    md: &mut String,
    rows: &[Row],
    results: &[RowRuns],
    columns: &[(&str, &str)],
) {
    if !rows.iter().any(Row::contended) {
        return;
    }
    md.push_str(
        "\nContended rows, each peer's acquires + releases per second / holder changes per \
         second (grants to another worker than the last holder) / longest acquire, from the call \
         to the grant:\n\n",
    );
    heading(md, "workload", columns, &[]);
    for (row, runs) in rows.iter().zip(results) {
        if !row.contended() {
            continue;
        }
        let cells = &runs.kept;
        let _ = write!(md, "| {} |", row.title);
        for (column, _) in columns {
            let text = match cells.get(column) {
                Some(Ok(r)) => format!(
                    "{} / {} / {} ms",
                    r.get("ops_per_s").unwrap_or("?"),
                    r.get("holder_changes_per_s").unwrap_or("?"),
                    r.number("max_wait_us")
                        .map_or("?".into(), |us| format!("{:.1}", us / 1000.0))
                ),
                Some(Err(_)) => "—".into(),
                None => "n/a".into(),
            };
            let _ = write!(md, " {text} |");
        }
        md.push('\n');
    }
}

/// Every kept run's output line (a failed one as a comment), under `heading`.
pub(crate) fn lines(md: &mut String, rows: &[Row], results: &[RowRuns], heading: &str) {
    let _ = write!(md, "\n{heading}\n\n```text\n");
    for (row, runs) in rows.iter().zip(results) {
        for (column, outcome) in &runs.kept {
            match outcome {
                Ok(r) => {
                    let _ = writeln!(md, "{r}");
                }
                Err(e) => {
                    let _ = writeln!(md, "# {} / {column}: {e}", row.title);
                }
            }
        }
    }
    md.push_str("```\n");
}

/// The heading of the report lines for `rounds`.
pub(crate) fn lines_heading(rounds: usize) -> &'static str {
    if rounds == 1 {
        "Every run's output line:"
    } else {
        "The median run's output line of each cell (every run's is on stderr):"
    }
}

/// What the CPU figures of a run's line are, for a table's heading.
pub(crate) const CPU_PER_CYCLE: &str = "the CPU time per cycle, in µs, of the benchmark's \
     process (client: every thread, the library's connection tasks included) and of the \
     server's processes (server; from `/proc`, over the timed window; — where the server is not \
     one process of this machine)";

/// A run's CPU time per cycle, client / server (see [`CPU_PER_CYCLE`]).
pub(crate) fn cpu_per_cycle(r: &zklock_bench::Report) -> String {
    format!(
        "CPU {} / {} µs",
        r.get("client_cpu_us_per_cycle").unwrap_or("—"),
        r.get("server_cpu_us_per_cycle").unwrap_or("—")
    )
}

/// What differs between the sections that put zklock's backend beside peers on a server of
/// its own (Redis, PostgreSQL): see [`backend_tables`].
pub(crate) struct BackendTables<'a> {
    /// (column key, heading), in order; `zklock` is the one the others are compared with.
    pub(crate) columns: &'a [(&'static str, &'static str)],
    /// What the latency table's figures per cycle are.
    pub(crate) per_cycle: &'a str,
    /// Each figure per cycle: its field in a report line, and its unit.
    pub(crate) per_cycle_fields: &'a [(&'static str, &'static str)],
    pub(crate) rounds: usize,
}

/// Writes such a section's tables: throughput with targets, the contended rows' fairness,
/// latency with figures per cycle, and the report lines; and records its throughput, drain
/// (if it has drain rows) and contended latency charts ([`crate::charts`]).
pub(crate) fn backend_tables(
    md: &mut String,
    rows: &[Row],
    results: &[RowRuns],
    t: &BackendTables,
) {
    heading(md, "workload", t.columns, &["target", ""]);
    for (row, runs) in rows.iter().zip(results) {
        let cells = &runs.kept;
        let _ = write!(md, "| {} |", row.title);
        for (column, _) in t.columns {
            let text = match *column {
                "zklock" => zklock_cell(row.metric, cells.get(column)),
                _ => cell_text(
                    row.metric,
                    runs.paired(row.metric, Figure::Main, column),
                    cells.get(column),
                ),
            };
            let _ = write!(md, " {text} |");
        }
        let (target, met) = verdict(row, runs);
        let _ = writeln!(md, " {target} | {met} |");
    }
    crate::charts::throughput(rows, results, t.columns, t.rounds);
    crate::charts::drain(rows, results, t.columns, t.rounds);
    crate::charts::contended_latency(rows, results, t.columns, t.rounds);
    contention_table(md, rows, results, t.columns);
    let _ = write!(
        md,
        "\nLatency of one acquire + release, p50 / p99 in µs; {}; and {CPU_PER_CYCLE}:\n\n",
        t.per_cycle
    );
    heading(md, "workload", t.columns, &[]);
    for (row, runs) in rows.iter().zip(results) {
        let _ = write!(md, "| {} |", row.title);
        for (column, _) in t.columns {
            let text = match runs.kept.get(column) {
                Some(Ok(r)) => {
                    let mut text = format!(
                        "{} / {} µs",
                        r.get("p50_us").unwrap_or("?"),
                        r.get("p99_us").unwrap_or("?"),
                    );
                    for (field, unit) in t.per_cycle_fields {
                        let _ = write!(text, ", {} {unit}", r.get(field).unwrap_or("?"));
                    }
                    let _ = write!(text, ", {}", cpu_per_cycle(r));
                    text
                }
                Some(Err(_)) => "—".into(),
                None => "n/a".into(),
            };
            let _ = write!(md, " {text} |");
        }
        md.push('\n');
    }
    crate::cpu_target::table(md, rows, results, t.columns, &[], "");
    lines(md, rows, results, lines_heading(t.rounds));
}

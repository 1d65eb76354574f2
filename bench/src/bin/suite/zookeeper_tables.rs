//! The ZooKeeper section's markdown: throughput with targets, drain scaling, fairness,
//! latency, zklock's requests per cycle, memory, the report lines, and the linger's handover.

use std::fmt::Write as _;
use std::time::Duration;

use crate::model::{figure, value, Cells, Figure, Metric, Outcome, Row, RowRuns};
use crate::report::{
    cell_text, contention_table, cpu_per_cycle, each_cell, heading, lines, lines_heading, machine,
    quick_note, zklock_cell, CPU_PER_CYCLE,
};
use crate::verdict::verdict;

/// The columns of the main table, in order: (column key, heading).
const COLUMNS: [(&str, &str); 6] = [
    ("zklock", "zklock"),
    ("floor", "floor"),
    ("zkclient", "zookeeper-client"),
    ("curator", "Curator"),
    ("kazoo", "kazoo"),
    ("naive", "naive (herd)"),
];

/// The columns of the memory chart: zklock, with the local queue off (`--extended`), Curator.
const MEMORY_COLUMNS: [(&str, &str); 3] = [
    ("zklock", "zklock"),
    ("zklock-noq", "zklock, local queue off"),
    ("curator", "Curator"),
];

/// The whole section (and its charts: [`crate::charts`]).
pub(crate) fn render(
    rows: &[Row],
    results: &[RowRuns],
    handover: &Outcome,
    server_version: &str,
    took: Duration,
    quick: bool,
    rounds: usize,
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "{}; ZooKeeper {server_version}; section took {:.0} s{}.\n",
        machine(),
        took.as_secs_f64(),
        quick_note(quick)
    );
    let _ = writeln!(
        md,
        "Throughput (acquire + release per second; drain: handoffs per second; memory: peak RSS), \
         {}. In parentheses: zklock's ratio to that peer (for memory: the peer's peak over \
         zklock's).\n",
        each_cell(rounds)
    );
    let kept: Vec<Cells> = results.iter().map(|r| r.kept.clone()).collect();
    crate::charts::throughput(rows, results, &COLUMNS, rounds);
    crate::charts::drain(rows, results, &COLUMNS, rounds);
    crate::charts::contended_latency(rows, results, &COLUMNS, rounds);
    crate::charts::memory(rows, results, &MEMORY_COLUMNS);
    throughput(&mut md, rows, results, &kept);
    drain_scaling(&mut md, rows, &kept);
    contention_table(&mut md, rows, results, &COLUMNS);
    latency(&mut md, rows, &kept);
    recipe(&mut md, rows, &kept);
    cpu(&mut md, rows, &kept);
    crate::cpu_target::table(
        &mut md,
        rows,
        results,
        &COLUMNS,
        &["floor"],
        "; nor is the floor, whose bare create and delete of a node of its own excludes nobody",
    );
    memory(&mut md, rows, &kept);
    lines(&mut md, rows, results, lines_heading(rounds));
    render_handover(&mut md, handover);
    md
}

/// A peer's outcome on an earlier row with the same workload and sizes (for rows that vary only
/// zklock's local queue).
fn earlier<'a>(rows: &[Row], results: &'a [Cells], row: &Row, column: &str) -> Option<&'a Outcome> {
    rows.iter()
        .zip(results)
        .take_while(|(r, _)| !std::ptr::eq(*r, row))
        .filter(|(r, _)| {
            r.workload == row.workload
                && r.workers == row.workers
                && r.cycles == row.cycles
                && r.keys == row.keys
        })
        .find_map(|(_, cells)| cells.get(column))
}

/// The main table: every peer's figure, zklock's ratio to it (paired by round), the target.
fn throughput(md: &mut String, rows: &[Row], results: &[RowRuns], kept: &[Cells]) {
    heading(md, "workload", &COLUMNS, &["target", ""]);
    for ((row, runs), cells) in rows.iter().zip(results).zip(kept) {
        let ours = value(row.metric, cells, "zklock");
        let _ = write!(md, "| {} |", row.title);
        for (column, _) in COLUMNS {
            let text = if column == "zklock" {
                zklock_cell(row.metric, cells.get("zklock"))
            } else if let Some(outcome) = cells.get(column) {
                let ratio = runs.paired(row.metric, Figure::Main, column);
                cell_text(row.metric, ratio, Some(outcome))
            } else if let Some(outcome) = earlier(rows, kept, row, column) {
                // Another row's run: the ratio of the kept figures.
                let theirs = outcome.as_ref().ok().and_then(|r| figure(row.metric, r));
                let ratio = match (ours, theirs) {
                    (Some(o), Some(t)) if o > 0.0 && t > 0.0 => Some(o / t),
                    _ => None,
                };
                format!("{}†", cell_text(row.metric, ratio, Some(outcome)))
            } else {
                cell_text(row.metric, None, None)
            };
            let _ = write!(md, " {text} |");
        }
        let (target, met) = verdict(row, runs);
        let _ = writeln!(md, " {target} | {met} |");
    }
    md.push_str(
        "\n† the peer's figure from the row above: the same workload, for a peer without a \
         local queue.\n",
    );
}

/// Drain scaling: cost per waiter at the large size against the small one (target for
/// zklock: within 1.5×).
fn drain_scaling(md: &mut String, rows: &[Row], results: &[Cells]) {
    let per_waiter = |waiters: usize, column: &str| {
        rows.iter().zip(results).find_map(|(row, cells)| {
            (row.metric == Metric::Drain && row.title.starts_with(&format!("drain {waiters} ")))
                .then(|| cells.get(column))
                .flatten()
                .and_then(|o| o.as_ref().ok())
                .and_then(|r| Some(r.number("secs")? / r.number("waiters")?))
        })
    };
    let off: Vec<&Row> = rows
        .iter()
        .filter(|r| r.metric == Metric::Drain && r.title.contains("local queue off"))
        .collect();
    let (Some(small), Some(large)) = (off.first(), off.last()) else {
        return;
    };
    if off.len() < 2 {
        return;
    }
    let _ = writeln!(
        md,
        "\nDrain cost per waiter, local queue off (target for zklock: at {} within 1.5× of that \
         at {}):\n",
        large.workers, small.workers
    );
    md.push_str(
        "| peer | µs/waiter at small | µs/waiter at large | growth | |\n|---|---|---|---|---|\n",
    );
    let us = |v: Option<f64>| v.map_or("—".into(), |v| format!("{:.1}", v * 1e6));
    for column in ["zklock", "zkclient", "curator"] {
        let s = per_waiter(small.workers, column);
        let l = per_waiter(large.workers, column);
        match (s, l) {
            (Some(s), Some(l)) => {
                let growth = l / s;
                let met = match column {
                    "zklock" if growth <= 1.5 => "met",
                    "zklock" => "**missed**",
                    _ => "",
                };
                let _ = writeln!(
                    md,
                    "| {column} | {} | {} | ×{growth:.2} | {met} |",
                    us(Some(s)),
                    us(Some(l))
                );
            }
            (None, None) => {}
            _ => {
                let _ = writeln!(md, "| {column} | {} | {} | | |", us(s), us(l));
            }
        }
    }
}

/// Latency of the throughput rows.
fn latency(md: &mut String, rows: &[Row], results: &[Cells]) {
    md.push_str("\nLatency of one acquire + release, p50 / p99 in µs:\n\n");
    ops_table(md, rows, results, |r| {
        format!(
            "{} / {}",
            r.get("p50_us").unwrap_or("?"),
            r.get("p99_us").unwrap_or("?")
        )
    });
}

/// A table of the throughput rows, one column per peer, each cell `text` of the peer's run
/// ("—" for a run that failed, "n/a" for a peer that does not run the row).
fn ops_table(
    md: &mut String,
    rows: &[Row],
    results: &[Cells],
    text: impl Fn(&zklock_bench::Report) -> String,
) {
    heading(md, "workload", &COLUMNS, &[]);
    for (row, cells) in rows.iter().zip(results) {
        if row.metric != Metric::Ops {
            continue;
        }
        let _ = write!(md, "| {} |", row.title);
        for (column, _) in COLUMNS {
            let cell = match cells.get(column) {
                Some(Ok(r)) => text(r),
                Some(Err(_)) => "—".into(),
                None => "n/a".into(),
            };
            let _ = write!(md, " {cell} |");
        }
        md.push('\n');
    }
}

/// What zklock's recipe costs per cycle, from the manager's counters.
fn recipe(md: &mut String, rows: &[Row], results: &[Cells]) {
    md.push_str(
        "\nzklock's recipe per cycle (per handoff for drain), from `LockManager::stats()`:\n\n\
         | workload | requests | watch events from the nodes ahead |\n|---|---|---|\n",
    );
    for (row, cells) in rows.iter().zip(results) {
        let Some(Ok(r)) = cells.get("zklock") else {
            continue;
        };
        let (req, ev) = match row.metric {
            Metric::Ops => ("requests_per_cycle", "events_per_cycle"),
            Metric::Drain => ("requests_per_handoff", "events_per_handoff"),
            Metric::Memory => continue,
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            row.title,
            r.get(req).unwrap_or("?"),
            r.get(ev).unwrap_or("?")
        );
    }
}

/// What each cycle costs the client's process and the server in CPU time, for the peers run
/// from `zklock-bench` (Curator's and kazoo's runs start a JVM or an interpreter: n/a).
fn cpu(md: &mut String, rows: &[Row], results: &[Cells]) {
    let _ = write!(md, "\nCost of one cycle: {CPU_PER_CYCLE}:\n\n");
    ops_table(md, rows, results, |r| {
        match r.get("client_cpu_us_per_cycle") {
            Some(_) => cpu_per_cycle(r),
            None => "n/a".into(),
        }
    });
}

/// The memory probes in detail.
fn memory(md: &mut String, rows: &[Row], results: &[Cells]) {
    md.push_str(
        "\nMemory (one process; base = resident once connected, held = resident with every \
         task queued or key held, peak = VmHWM):\n\n| probe | peer | base MB | held MB | peak MB \
         | peak KB per task | setup s |\n|---|---|---|---|---|---|---|\n",
    );
    for (row, cells) in rows.iter().zip(results) {
        if row.metric != Metric::Memory {
            continue;
        }
        for (column, outcome) in cells {
            let label = match *column {
                "zklock-noq" => "zklock, local queue off",
                other => other,
            };
            let r = match outcome {
                Ok(r) => r,
                Err(e) => {
                    let _ = writeln!(md, "| {} | {label} | {e} | | | | |", row.title);
                    continue;
                }
            };
            let mb = |k: &str| {
                r.number(k)
                    .map_or("?".into(), |v| format!("{:.1}", v / 1024.0))
            };
            let _ = writeln!(
                md,
                "| {} | {label} | {} | {} | {} | {} | {} |",
                row.title,
                mb("rss_base_kb"),
                mb("rss_kb"),
                mb("peak_kb"),
                r.get("peak_per_task_kb").unwrap_or("?"),
                r.get("secs").unwrap_or("?")
            );
        }
    }
}

/// The linger's cost to the first other process (target: its wait ≤ 1.5× a normal
/// handoff's).
fn render_handover(md: &mut String, outcome: &Outcome) {
    md.push_str(
        "\nThe linger's cost to the first other process (`handover`: a second session's \
         acquire while the first session's node lingers, from its call to its grant; a normal \
         handoff's wait, from the holder's release call to the queued waiter's grant; an \
         acquire of a free key; one run), p50 / p99 in µs:\n\n\
         | lingering key: wait | normal handoff: wait | free key: acquire | target | |\n\
         |---|---|---|---|---|\n",
    );
    let report = match outcome {
        Ok(report) => report,
        Err(e) => {
            let _ = writeln!(md, "| failed: {e} | | | ≤ 1.5× a handoff | no figure |");
            return;
        }
    };
    let pair = |name: &str| {
        format!(
            "{} / {}",
            report.get(&format!("{name}_p50_us")).unwrap_or("?"),
            report.get(&format!("{name}_p99_us")).unwrap_or("?")
        )
    };
    let met = match report.number("wait_ratio") {
        Some(r) if r <= 1.5 => format!("met (×{r:.2})"),
        Some(r) => format!("**missed** (×{r:.2})"),
        None => "no figure".into(),
    };
    let _ = writeln!(
        md,
        "| {} | {} | {} (lingering ×{}) | ≤ 1.5× a handoff | {met} |",
        pair("linger_wait"),
        pair("handoff_wait"),
        pair("free_acquire"),
        report.get("free_ratio").unwrap_or("?"),
    );
}

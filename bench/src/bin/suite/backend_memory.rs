//! The memory rows of the Redis, PostgreSQL and MySQL sections: one process with 10,000 tasks
//! waiting on one key, its resident set beside the target, and the connections it holds on the
//! server meanwhile. One run per row: a resident set does not drift with the machine's load as a
//! throughput does.

use std::fmt::Write as _;

use crate::model::{Metric, Row, RowRuns, Runner, Target};
use crate::report::lines;
use crate::rounds::run_rounds;
use crate::runner::Env;
use crate::verdict::verdict;

/// The most one process with 10,000 waiting tasks may take, on every backend.
const TARGET_MB: f64 = 40.0;

/// The tasks of the full-size rows (the target's size).
const TASKS: usize = 10_000;

/// `10,000`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The rows: the local queue on; with `extended`, also off. The target only at full size.
pub(crate) fn rows(quick: bool, extended: bool) -> Vec<Row> {
    let tasks = if quick { 100 } else { TASKS };
    let mut ways = vec![("", false)];
    if extended {
        ways.push((", local queue off", true));
    }
    ways.into_iter()
        .map(|(suffix, no_queue)| Row {
            title: format!(
                "{} tasks waiting on one key (1 process){suffix}",
                thousands(tasks)
            ),
            workload: "mem-waiters",
            workers: tasks,
            cycles: 0,
            keys: 1,
            metric: Metric::Memory,
            cells: vec![(
                "zklock",
                Runner::Ours {
                    peer: "zklock",
                    no_queue,
                    no_tokens: false,
                },
            )],
            target: (tasks >= TASKS).then_some(Target::PeakMb(TARGET_MB)),
        })
        .collect()
}

/// Runs `rows` once each.
pub(crate) fn run(env: &mut Env, rows: &[Row], section: &str) -> Vec<RowRuns> {
    run_rounds(env, rows, 1, &format!("{section} memory"))
}

/// The memory table, with what the backend's code bounds its connections by (`bound`); and
/// the section's memory chart ([`crate::charts::memory`]).
pub(crate) fn table(md: &mut String, rows: &[Row], results: &[RowRuns], bound: &str) {
    if rows.is_empty() {
        return;
    }
    crate::charts::memory(rows, results, &[("zklock", "zklock")]);
    let _ = write!(
        md,
        "\nMemory of one process, one run per row (base = resident once connected, held = \
         resident with every task waiting, peak = VmHWM; server connections = the process's \
         connections on the server meanwhile, counted by a probe connection of its own; waiting \
         on the server = the waiters the server shows on the lock: with the local queue on, the \
         tasks wait in the process behind its one hold, so none). {bound}\n\n\
         | probe | local queue | peak MB | base MB | held MB | peak KB per task | server \
         connections | waiting on the server | setup s | target | |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for (row, runs) in rows.iter().zip(results) {
        let (target, met) = verdict(row, runs);
        let r = match runs.kept.get("zklock") {
            Some(Ok(r)) => r,
            Some(Err(e)) => {
                let _ = writeln!(
                    md,
                    "| {} | | failed: {e} | | | | | | | {target} | {met} |",
                    row.title
                );
                continue;
            }
            None => continue,
        };
        let mb = |k: &str| {
            r.number(k)
                .map_or("?".into(), |v| format!("{:.1}", v / 1024.0))
        };
        let field = |k: &str| r.get(k).unwrap_or("?").to_string();
        let _ = writeln!(
            md,
            "| {} | {} | **{}** | {} | {} | {} | {} | {} | {} | {target} | {met} |",
            row.title,
            field("local_queue"),
            mb("peak_kb"),
            mb("rss_base_kb"),
            mb("rss_kb"),
            field("peak_per_task_kb"),
            field("server_connections"),
            field("backend_waiters"),
            field("secs"),
        );
    }
    lines(md, rows, results, "The memory runs' output lines:");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_judged_at_full_size_only() {
        let full = rows(false, true);
        assert_eq!(full.len(), 2);
        assert_eq!(full[0].title, "10,000 tasks waiting on one key (1 process)");
        assert!(matches!(full[1].target, Some(Target::PeakMb(mb)) if mb == 40.0));
        assert!(matches!(
            full[1].cells[0].1,
            Runner::Ours { no_queue: true, .. }
        ));
        let quick = rows(true, false);
        assert_eq!(quick.len(), 1);
        assert!(quick[0].target.is_none());
    }

    #[test]
    fn a_row_shows_its_figures_and_verdict() {
        let row = rows(false, false).remove(0);
        let line = "peer=zklock workload=mem-waiters tasks=10000 secs=1.1 rss_base_kb=8000 \
                    rss_kb=41984 peak_kb=41984 peak_per_task_kb=3.40 local_queue=on \
                    backend=redis server_connections=1 backend_waiters=0";
        let runs = RowRuns {
            kept: [("zklock", Ok(zklock_bench::parse_line(line).unwrap()))].into(),
            rounds: vec![],
        };
        let mut md = String::new();
        table(&mut md, &[row], &[runs], "bound");
        assert!(md.contains(
            "| 10,000 tasks waiting on one key (1 process) | on | **41.0** | 7.8 | 41.0 | 3.40 | 1 | 0 | 1.1 | ≤ 40 MB | **missed** (41.0 MB) |"
        ), "{md}");
    }
}

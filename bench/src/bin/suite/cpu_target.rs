//! zklock's client CPU per cycle judged against the cheapest lock peer's, row by row: at most
//! the cheapest peer's where one worker runs alone (uncontended, re-take), at most 1.3× it
//! where workers contend (one key, many keys, the tasks of one process).

use std::fmt::Write as _;

use crate::model::{figure_of, median, Figure, Metric, Row, RowRuns, Runner};

/// The bound on zklock's client CPU over the cheapest peer's for `row`: 1.0 where one worker
/// runs alone, 1.3 where several contend.
pub(crate) fn bound(row: &Row) -> f64 {
    if row.workers > 1 {
        1.3
    } else {
        1.0
    }
}

/// Whether `runner` runs zklock (its own column or a variant of it: the local queue off, no
/// fencing tokens, another address, replica acknowledgements, TLS).
fn is_zklock(runner: &Runner) -> bool {
    match runner {
        Runner::Ours { peer, .. } | Runner::OursAt { peer, .. } => *peer == "zklock",
        Runner::Acked(_) | Runner::On(_) => true,
        Runner::Peer(_) | Runner::CuratorMem => false,
    }
}

/// The median over the rounds of `column`'s client CPU per cycle on a row of `metric`, in µs
/// (rounds in which it failed or gave no figure left out).
fn cpu_of(runs: &RowRuns, metric: Metric, column: &str) -> Option<f64> {
    let mut figures: Vec<f64> = runs
        .rounds
        .iter()
        .filter_map(|round| round.get(column)?.as_ref().ok())
        .filter_map(|r| figure_of(metric, Figure::ClientCpu, r))
        .filter(|v| *v > 0.0)
        .collect();
    figures.sort_by(f64::total_cmp);
    median(&figures)
}

/// One row judged: the cheapest peer (its column, its CPU), zklock's CPU, and zklock's
/// ratio to that peer, paired by round (the median of the rounds' ratios).
pub(crate) struct Judged {
    pub(crate) peer: &'static str,
    pub(crate) peer_cpu: f64,
    pub(crate) zklock_cpu: f64,
    pub(crate) ratio: f64,
}

/// `row`'s judgement, if zklock and at least one lock peer gave client CPU figures. Peers are
/// the row's columns that do not run zklock, but those in `not_locks` (a floor that excludes
/// nobody is no lock to compare with).
pub(crate) fn judge(row: &Row, runs: &RowRuns, not_locks: &[&str]) -> Option<Judged> {
    if row.metric != Metric::Ops {
        return None;
    }
    let zklock_cpu = cpu_of(runs, row.metric, "zklock")?;
    let (peer, peer_cpu) = row
        .cells
        .iter()
        .filter(|(column, runner)| !is_zklock(runner) && !not_locks.contains(column))
        .filter_map(|(column, _)| Some((*column, cpu_of(runs, row.metric, column)?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))?;
    let ratio = runs.paired_between(row.metric, Figure::ClientCpu, "zklock", peer)?;
    Some(Judged {
        peer,
        peer_cpu,
        zklock_cpu,
        ratio,
    })
}

/// Writes the table: per row with figures, zklock's client CPU per cycle, the cheapest lock
/// peer's (named by `columns`' heading), the ratio, the bound and whether it is met.
/// `not_locks`: columns that are no lock (see [`judge`]); `why_not`: why, for the text above
/// the table (empty: none left out).
pub(crate) fn table(
    md: &mut String,
    rows: &[Row],
    results: &[RowRuns],
    columns: &[(&str, &str)],
    not_locks: &[&str],
    why_not: &str,
) {
    let judged: Vec<(&Row, Judged)> = rows
        .iter()
        .zip(results)
        .filter_map(|(row, runs)| Some((row, judge(row, runs, not_locks)?)))
        .collect();
    if judged.is_empty() {
        return;
    }
    let _ = write!(
        md,
        "\nzklock's client CPU per cycle against the cheapest lock peer's (the peer whose \
         median client CPU per cycle is lowest; each figure the median over the rounds, the \
         ratio the median of the rounds' ratios). Target: at most the cheapest peer's where \
         one worker runs alone, at most 1.3× it where workers contend. Peers that give no \
         CPU figure (Curator and kazoo run in a JVM or an interpreter of their own) are not \
         compared{why_not}.\n\n\
         | workload | zklock client CPU | cheapest peer | its client CPU | ratio | target | |\n\
         |---|---|---|---|---|---|---|\n"
    );
    for (row, j) in judged {
        let heading = columns
            .iter()
            .find(|(key, _)| *key == j.peer)
            .map_or(j.peer, |(_, heading)| *heading);
        let max = bound(row);
        let verdict = if j.ratio <= max {
            "met".to_string()
        } else {
            format!("**missed** (×{:.2})", j.ratio)
        };
        let _ = writeln!(
            md,
            "| {} | {:.0} µs | {heading} | {:.0} µs | ×{:.2} | ≤ {max:.1}× | {verdict} |",
            row.title, j.zklock_cpu, j.peer_cpu, j.ratio
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Cells, Outcome};

    fn line(s: &str) -> Outcome {
        Ok(zklock_bench::parse_line(s).unwrap())
    }

    fn round(zklock: u32, floor: u32, rslock: u32) -> Cells {
        Cells::from([
            (
                "zklock",
                line(&format!(
                    "peer=zklock ops_per_s=1 client_cpu_us_per_cycle={zklock}"
                )),
            ),
            (
                "floor",
                line(&format!(
                    "peer=floor ops_per_s=1 client_cpu_us_per_cycle={floor}"
                )),
            ),
            (
                "rslock",
                line(&format!(
                    "peer=rslock ops_per_s=1 client_cpu_us_per_cycle={rslock}"
                )),
            ),
        ])
    }

    fn row(workers: usize) -> Row {
        Row::ops(
            "r",
            "contended",
            workers,
            10,
            vec![
                ("zklock", Runner::ours("zklock")),
                ("floor", Runner::ours("floor")),
                ("rslock", Runner::ours("rslock")),
                ("zklock-noq", Runner::untokened()),
            ],
        )
    }

    #[test]
    fn the_cheapest_lock_peer_is_the_one_judged_and_the_ratio_is_paired_by_round() {
        let runs = RowRuns {
            kept: Cells::new(),
            rounds: vec![round(120, 100, 90), round(60, 100, 50), round(100, 100, 80)],
        };
        let j = judge(&row(1), &runs, &[]).unwrap();
        // rslock: median 80 against the floor's 100. Ratios 1.33, 1.2, 1.25: median 1.25.
        assert_eq!(j.peer, "rslock");
        assert_eq!(j.peer_cpu, 80.0);
        assert_eq!(j.zklock_cpu, 100.0);
        assert!((j.ratio - 1.25).abs() < 1e-9, "{}", j.ratio);
        // A column that is no lock is passed over.
        let j = judge(&row(1), &runs, &["rslock"]).unwrap();
        assert_eq!(j.peer, "floor");
        assert!((j.ratio - 1.0).abs() < 1e-9, "{}", j.ratio);
    }

    #[test]
    fn one_worker_must_cost_no_more_and_contenders_at_most_a_third_more() {
        // The same figures (zklock 125 µs, rslock 100 µs) on a row of `workers`.
        let judged = |workers: usize| {
            let runs = RowRuns {
                kept: Cells::new(),
                rounds: vec![round(125, 200, 100)],
            };
            let mut md = String::new();
            let columns = [("rslock", "rslock")];
            table(&mut md, &[row(workers)], &[runs], &columns, &[], "");
            md
        };
        let md = judged(1);
        assert!(
            md.contains("| r | 125 µs | rslock | 100 µs | ×1.25 | ≤ 1.0× | **missed** (×1.25) |"),
            "{md}"
        );
        let md = judged(8);
        assert!(md.contains("| ×1.25 | ≤ 1.3× | met |"), "{md}");
    }

    #[test]
    fn a_row_without_a_peers_figure_is_left_out() {
        let runs = RowRuns {
            kept: Cells::new(),
            rounds: vec![Cells::from([(
                "zklock",
                line("peer=zklock ops_per_s=1 client_cpu_us_per_cycle=10"),
            )])],
        };
        let mut md = String::new();
        table(&mut md, &[row(1)], &[runs], &[], &[], "");
        assert!(md.is_empty());
    }
}

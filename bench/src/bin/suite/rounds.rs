//! Rounds: every section runs all its cells several times, the peers taking turns (round 1
//! runs every cell once, then round 2, ...), and each cell shows its median run. A run is a
//! few seconds, and a shared machine's speed drifts over minutes (one floor has measured
//! anywhere from 3,000/s to 13,000/s in one afternoon); taking turns keeps that drift out of
//! the ratios, which compare runs of the same round's neighbourhood.

use std::collections::BTreeMap;

use crate::model::{figure_of, Cells, Outcome, Row, RowRuns};
use crate::runner::Env;

/// Runs `rows` `rounds` times in turn: every row's runs, with each cell's median run.
pub(crate) fn run_rounds(
    env: &mut Env,
    rows: &[Row],
    rounds: usize,
    section: &str,
) -> Vec<RowRuns> {
    let mut all = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        eprintln!("{section} rows, round {round} of {rounds}");
        all.push(env.run_rows(rows));
    }
    by_row(rows, all)
}

/// As [`run_rounds`], each row's cells running in reverse order every other round: of a row's
/// two cells, each runs first as often as the other (one more time for the first, in an odd
/// number of rounds), so that neither always meets what the other leaves behind.
pub(crate) fn run_rounds_swapping(
    env: &mut Env,
    rows: &[Row],
    rounds: usize,
    section: &str,
) -> Vec<RowRuns> {
    let swapped: Vec<Row> = rows
        .iter()
        .map(|row| {
            let mut row = row.clone();
            row.cells.reverse();
            row
        })
        .collect();
    let mut all = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        eprintln!("{section} rows, round {round} of {rounds}");
        let order = if round % 2 == 1 { rows } else { &swapped };
        all.push(env.run_rows(order));
    }
    by_row(rows, all)
}

/// Every round's outcomes of `rows` (`all`, round by round), by row, with each cell's median.
fn by_row(rows: &[Row], all: Vec<Vec<Cells>>) -> Vec<RowRuns> {
    let mut each: Vec<RowRuns> = rows.iter().map(|_| RowRuns::default()).collect();
    for round in &all {
        for (runs, cells) in each.iter_mut().zip(round) {
            runs.rounds.push(cells.clone());
        }
    }
    for (runs, kept) in each.iter_mut().zip(medians(rows, all)) {
        runs.kept = kept;
    }
    each
}

/// Each cell's median run among the rounds, by the figure the row ranks by (failed runs count
/// lowest; for p99, the higher the worse, so they count highest).
pub(crate) fn medians(rows: &[Row], rounds: Vec<Vec<Cells>>) -> Vec<Cells> {
    let mut rounds: Vec<_> = rounds.into_iter().map(|r| r.into_iter()).collect();
    rows.iter()
        .map(|row| {
            let mut runs: BTreeMap<&'static str, Vec<Outcome>> = BTreeMap::new();
            for round in &mut rounds {
                for (column, outcome) in round.next().unwrap_or_default() {
                    runs.entry(column).or_default().push(outcome);
                }
            }
            runs.into_iter()
                .map(|(column, outcomes)| (column, median(row, outcomes)))
                .collect()
        })
        .collect()
}

/// The median of one cell's runs.
fn median(row: &Row, mut outcomes: Vec<Outcome>) -> Outcome {
    let by = row.ranked_by();
    let value = |o: &Outcome| {
        o.as_ref()
            .ok()
            .and_then(|r| figure_of(row.metric, by, r))
            .unwrap_or(f64::NEG_INFINITY)
    };
    outcomes.sort_by(|a, b| value(a).total_cmp(&value(b)));
    let mid = outcomes.len() / 2;
    outcomes.swap_remove(mid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Runner;

    fn run(ops: f64) -> Outcome {
        Ok(zklock_bench::parse_line(&format!("peer=x ops_per_s={ops}")).unwrap())
    }

    #[test]
    fn each_cell_keeps_its_median_run() {
        let row = crate::model::Row::ops("r", "uncontended", 1, 1, vec![("a", Runner::ours("a"))]);
        let round = |ops: f64| vec![Cells::from([("a", run(ops))])];
        let kept = medians(
            std::slice::from_ref(&row),
            vec![round(30.0), round(10.0), round(20.0)],
        );
        assert_eq!(
            kept[0]["a"].as_ref().unwrap().number("ops_per_s"),
            Some(20.0)
        );
        // A failed run ranks lowest: the median of {fail, 10, 20} is 10.
        let kept = medians(
            std::slice::from_ref(&row),
            vec![
                vec![Cells::from([("a", Err("x".into()))])],
                round(10.0),
                round(20.0),
            ],
        );
        assert_eq!(
            kept[0]["a"].as_ref().unwrap().number("ops_per_s"),
            Some(10.0)
        );
    }
}

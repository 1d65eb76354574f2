//! Whether a row meets its target, from the figures of the same run.

use crate::model::{value, Figure, Metric, Row, RowRuns, Target, Want};

/// A peer's column key as the verdicts name it.
fn peer_name(column: &str) -> &str {
    match column {
        "curator" => "Curator",
        "zkclient" => "zookeeper-client",
        "lockservice" => "lock service",
        other => other,
    }
}

/// The target's text, e.g. `≥ 2× Curator, ≥ 0.9× floor`.
pub(crate) fn target_text(row: &Row) -> String {
    match &row.target {
        None => "—".into(),
        Some(target) => text_of(row.metric, target),
    }
}

fn text_of(metric: Metric, target: &Target) -> String {
    match target {
        Target::PeakMb(mb) => format!("≤ {mb} MB"),
        Target::PerCycleAtMost { name, max, .. } => format!("≤ {max:.2} {name} per cycle"),
        Target::Ratios(wants) => wants
            .iter()
            .map(|w| want_text(metric, w))
            .collect::<Vec<_>>()
            .join(", "),
        Target::All(parts) => parts
            .iter()
            .map(|t| text_of(metric, t))
            .collect::<Vec<_>>()
            .join("; "),
    }
}

fn want_text(metric: Metric, w: &Want) -> String {
    let peer = peer_name(w.peer);
    match (w.figure, metric) {
        (Figure::Main, Metric::Memory) => format!("≥ {}× less than {peer}", w.ratio),
        (Figure::Main, _) => format!("≥ {}× {peer}", w.ratio),
        (Figure::HolderChanges, _) => format!("holder changes ≥ {}× {peer}", w.ratio),
        (Figure::P99, _) => format!("p99 ≤ {}× {peer}", w.ratio),
        (Figure::ClientCpu, _) => format!("client CPU ≤ {}× {peer}", w.ratio),
    }
}

/// Whether a ratio meets its part of the target.
fn meets(w: &Want, ratio: f64) -> bool {
    match w.figure {
        Figure::P99 | Figure::ClientCpu => ratio <= w.ratio,
        Figure::Main | Figure::HolderChanges => ratio >= w.ratio,
    }
}

/// One target judged: met (with the figures that show it, if any), or missed (with the
/// figures that fall short, or the figures that are missing).
enum Judged {
    Met(Option<String>),
    Missed(String),
}

/// The row's target and its verdict, from the ratios paired by round (see
/// [`RowRuns::paired`]): `met`, or `**missed**` with the ratios that fall short.
pub(crate) fn verdict(row: &Row, runs: &RowRuns) -> (String, String) {
    let text = target_text(row);
    let Some(target) = &row.target else {
        return (text, String::new());
    };
    let verdict = match judge(row.metric, target, runs) {
        Judged::Met(None) => "met".to_string(),
        Judged::Met(Some(shown)) => format!("met ({shown})"),
        Judged::Missed(short) => format!("**missed** ({short})"),
    };
    (text, verdict)
}

fn judge(metric: Metric, target: &Target, runs: &RowRuns) -> Judged {
    match target {
        Target::PeakMb(mb) => match value(metric, &runs.kept, "zklock") {
            Some(kb) if kb / 1024.0 <= *mb => Judged::Met(None),
            Some(kb) => Judged::Missed(format!("{:.1} MB", kb / 1024.0)),
            None => Judged::Missed("no figure".into()),
        },
        Target::PerCycleAtMost { field, name, max } => {
            let figure = runs
                .kept
                .get("zklock")
                .and_then(|o| o.as_ref().ok())
                .and_then(|r| r.number(field));
            match figure {
                Some(n) if n <= *max => Judged::Met(Some(format!("{n:.2} {name}"))),
                Some(n) => Judged::Missed(format!("{n:.2} {name}")),
                None => Judged::Missed(format!("no {name} figure")),
            }
        }
        Target::Ratios(wants) => {
            let mut short = vec![];
            let mut all = vec![];
            for w in wants {
                let label = match w.figure {
                    Figure::Main => peer_name(w.peer).to_string(),
                    Figure::HolderChanges => format!("{} holder changes", peer_name(w.peer)),
                    Figure::P99 => format!("{} p99", peer_name(w.peer)),
                    Figure::ClientCpu => format!("{} client CPU", peer_name(w.peer)),
                };
                match runs.paired(metric, w.figure, w.peer) {
                    Some(r) if meets(w, r) => all.push(format!("×{r:.2} {label}")),
                    Some(r) => {
                        all.push(format!("×{r:.2} {label}"));
                        short.push(format!("×{r:.2} {label}"));
                    }
                    None => short.push(format!("no {label} figure")),
                }
            }
            if short.is_empty() {
                Judged::Met(Some(all.join(", ")))
            } else {
                Judged::Missed(short.join(", "))
            }
        }
        Target::All(parts) => {
            let (mut met, mut short) = (vec![], vec![]);
            for part in parts {
                match judge(metric, part, runs) {
                    Judged::Met(shown) => met.extend(shown),
                    Judged::Missed(s) => short.push(s),
                }
            }
            if short.is_empty() {
                Judged::Met((!met.is_empty()).then(|| met.join("; ")))
            } else {
                Judged::Missed(short.join("; "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Cells, Outcome, Row, Runner};

    fn line(s: &str) -> Outcome {
        Ok(zklock_bench::parse_line(s).unwrap())
    }

    #[test]
    fn every_part_of_a_target_is_judged() {
        let row = Row::ops(
            "c",
            "contended",
            8,
            10,
            vec![("zklock", Runner::ours("zklock"))],
        )
        .with_target(Target::Ratios(vec![
            Want::main("floor", 0.9),
            Want {
                peer: "floor",
                figure: Figure::P99,
                ratio: 2.0,
            },
        ]));
        let round = |ours: &str, floor: &str| {
            Cells::from([
                ("zklock", line(&format!("peer=zklock {ours}"))),
                ("floor", line(&format!("peer=floor {floor}"))),
            ])
        };
        let runs = |rounds: Vec<Cells>| RowRuns {
            kept: Cells::new(),
            rounds,
        };
        let r = runs(vec![round(
            "ops_per_s=95 p99_us=300",
            "ops_per_s=100 p99_us=100",
        )]);
        let (text, met) = verdict(&row, &r);
        assert_eq!(text, "≥ 0.9× floor, p99 ≤ 2× floor");
        assert_eq!(met, "**missed** (×3.00 floor p99)");
        // Paired by round: the median of 0.95, 1.9 and 0.5 is 0.95, whatever each cell's median.
        let r = runs(vec![
            round("ops_per_s=95 p99_us=150", "ops_per_s=100 p99_us=100"),
            round("ops_per_s=95 p99_us=150", "ops_per_s=50 p99_us=100"),
            round("ops_per_s=50 p99_us=150", "ops_per_s=100 p99_us=100"),
        ]);
        assert_eq!(verdict(&row, &r).1, "met (×0.95 floor, ×1.50 floor p99)");
        // A round in which a peer failed does not count.
        let mut failed = round("ops_per_s=1 p99_us=150", "ops_per_s=1");
        failed.insert("floor", Err("timeout".into()));
        let r = runs(vec![
            failed,
            round("ops_per_s=95 p99_us=150", "ops_per_s=100 p99_us=100"),
        ]);
        assert_eq!(verdict(&row, &r).1, "met (×0.95 floor, ×1.50 floor p99)");
    }

    #[test]
    fn every_target_of_an_all_is_judged_and_only_the_short_ones_shown_when_missed() {
        let row = Row::ops(
            "c",
            "contended",
            8,
            10,
            vec![("zklock", Runner::ours("zklock"))],
        )
        .with_target(Target::All(vec![
            Target::PerCycleAtMost {
                field: "requests_per_cycle",
                name: "requests",
                max: 9.8,
            },
            Target::Ratios(vec![Want::main("zkclient", 1.1)]),
        ]));
        let ours = |n: &str, ops: u32| {
            line(&format!(
                "peer=zklock ops_per_s={ops} requests_per_cycle={n}"
            ))
        };
        let runs = |n: &str, ops: u32| RowRuns {
            kept: Cells::from([("zklock", ours(n, ops))]),
            rounds: vec![Cells::from([
                ("zklock", ours(n, ops)),
                ("zkclient", line("peer=zkclient ops_per_s=100")),
            ])],
        };
        assert_eq!(
            target_text(&row),
            "≤ 9.80 requests per cycle; ≥ 1.1× zookeeper-client"
        );
        assert_eq!(
            verdict(&row, &runs("9.62", 120)).1,
            "met (9.62 requests; ×1.20 zookeeper-client)"
        );
        assert_eq!(
            verdict(&row, &runs("9.62", 90)).1,
            "**missed** (×0.90 zookeeper-client)"
        );
        assert_eq!(
            verdict(&row, &runs("10.10", 90)).1,
            "**missed** (10.10 requests; ×0.90 zookeeper-client)"
        );
    }

    #[test]
    fn a_per_cycle_target_reads_zklocks_median_run() {
        let row = Row::ops("r", "reacquire", 1, 10, vec![]).with_target(Target::PerCycleAtMost {
            field: "round_trips_per_cycle",
            name: "round trips",
            max: 1.0,
        });
        let kept = |n: &str| RowRuns {
            kept: Cells::from([(
                "zklock",
                line(&format!(
                    "peer=zklock ops_per_s=9 round_trips_per_cycle={n}"
                )),
            )]),
            rounds: vec![],
        };
        assert_eq!(target_text(&row), "≤ 1.00 round trips per cycle");
        assert_eq!(verdict(&row, &kept("1.00")).1, "met (1.00 round trips)");
        assert_eq!(
            verdict(&row, &kept("2.01")).1,
            "**missed** (2.01 round trips)"
        );
    }
}

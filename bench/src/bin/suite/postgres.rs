//! The PostgreSQL section of the suite (`--only postgres`): zklock's PostgreSQL backend beside
//! a bare `pg_advisory_lock` + `pg_advisory_unlock` floor on a plain client, uncontended and
//! contended, on a durable server of the test kit (`fsync` on, as a production server runs:
//! a reservation of zklock's tokens is a commit, and its cost is part of the figure).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{figure, machine, run_rows, Cli, Env, Metric, Outcome, Row, Runner};

/// The columns of the PostgreSQL table, in order: (column key, heading).
const COLUMNS: [(&str, &str); 2] = [
    ("zklock", "zklock (PostgreSQL)"),
    ("floor", "floor: pg_advisory_lock + unlock"),
];

/// The target uncontended: at least this times the floor.
const FLOOR_TARGET: f64 = 0.85;

/// The rows: zklock and the floor, uncontended and contended.
fn rows(quick: bool) -> Vec<Row> {
    let (uncontended, contended) = if quick { (50, 5) } else { (20000, 400) };
    let cells = || {
        vec![
            (
                "zklock",
                Runner::Ours {
                    peer: "zklock",
                    no_queue: false,
                },
            ),
            (
                "floor",
                Runner::Ours {
                    peer: "floor",
                    no_queue: false,
                },
            ),
        ]
    };
    vec![
        Row {
            title: "uncontended (1 connection, 1 key)".into(),
            workload: "uncontended",
            workers: 1,
            cycles: uncontended,
            keys: 1,
            metric: Metric::Ops,
            cells: cells(),
            target: None,
        },
        Row {
            title: "contended (8 managers / clients, 1 key)".into(),
            workload: "contended",
            workers: 8,
            cycles: contended,
            keys: 1,
            metric: Metric::Ops,
            cells: cells(),
            target: None,
        },
    ]
}

/// The PostgreSQL rows, on a durable PostgreSQL of the test kit.
pub(super) fn section(cli: &Cli) -> Result<String, String> {
    let started = Instant::now();
    eprintln!("starting PostgreSQL (test kit, durable: fsync on)");
    let server = zklock_testkit::PostgresServer::start_durable()
        .map_err(|e| format!("cannot start PostgreSQL: {e}"))?;
    let version = server
        .psql("SHOW server_version")
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let bench = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .with_file_name("zklock-bench");
    let mut env = Env {
        connect: server.url(),
        bench,
        peers_run: PathBuf::new(),
        java_classes: None,
        timeout: Duration::from_secs(cli.run_timeout),
        scratch: tempfile::tempdir().map_err(|e| e.to_string())?,
    };
    let rows = rows(cli.quick);
    let rounds = if cli.quick { 1 } else { ROUNDS };
    let mut all = Vec::new();
    for round in 1..=rounds {
        eprintln!("PostgreSQL rows, round {round} of {rounds}");
        all.push(run_rows(&mut env, &rows));
    }
    let results = medians(&rows, all);
    drop(server);
    Ok(render(
        &rows,
        &results,
        &version,
        started.elapsed(),
        cli.quick,
        rounds,
    ))
}

/// How many times every row runs, its peers taking turns: each cell shows its median run. A
/// run is a few seconds, and this shared machine's speed drifts over that long (the floor
/// alone has measured anywhere from 3,000/s to 13,000/s in one afternoon), so taking turns
/// keeps the drift out of the ratio.
const ROUNDS: usize = 3;

/// Each cell's median run among the rounds (by the row's figure; failed runs count last).
fn medians(
    rows: &[Row],
    rounds: Vec<Vec<BTreeMap<&'static str, Outcome>>>,
) -> Vec<BTreeMap<&'static str, Outcome>> {
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
                .map(|(column, mut outcomes)| {
                    let value = |o: &Outcome| {
                        o.as_ref()
                            .ok()
                            .and_then(|r| figure(row.metric, r))
                            .unwrap_or(f64::NEG_INFINITY)
                    };
                    outcomes.sort_by(|a, b| value(a).total_cmp(&value(b)));
                    let mid = outcomes.len() / 2;
                    (column, outcomes.swap_remove(mid))
                })
                .collect()
        })
        .collect()
}

/// zklock's ratio to the floor on the uncontended row, and whether it meets the target.
fn verdict(row: &Row, cells: &BTreeMap<&'static str, Outcome>) -> (String, String) {
    if row.workload != "uncontended" {
        return (String::new(), String::new());
    }
    let value = |c: &str| {
        cells
            .get(c)
            .and_then(|o| o.as_ref().ok())
            .and_then(|r| figure(row.metric, r))
    };
    let text = format!("≥ {FLOOR_TARGET}× floor");
    match (value("zklock"), value("floor")) {
        (Some(ours), Some(floor)) if ours / floor >= FLOOR_TARGET => (text, "met".into()),
        (Some(_), Some(_)) => (text, "**missed**".into()),
        _ => (text, "no figure".into()),
    }
}

fn render(
    rows: &[Row],
    results: &[BTreeMap<&'static str, Outcome>],
    version: &str,
    took: Duration,
    quick: bool,
    rounds: usize,
) -> String {
    let mut md = String::new();
    let disk = Command::new("sh")
        .args(["-c", "df -T \"${TMPDIR:-/tmp}\" | awk 'NR==2 {print $2}'"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let _ = writeln!(
        md,
        "{}; PostgreSQL {version} (test kit, durable: fsync on, synchronous_commit on; data directory on {}); section took {:.0} s{}.\n",
        machine(),
        if disk.is_empty() { "?" } else { &disk },
        took.as_secs_f64(),
        if quick {
            " (--quick: sizes too small to mean anything)"
        } else {
            ""
        }
    );
    let each_cell = match rounds {
        1 => "each cell one run".to_string(),
        n => format!("each cell the median of {n} runs, the peers taking turns"),
    };
    let _ = writeln!(
        md,
        "Throughput (acquire + release per second), {each_cell}. In parentheses: zklock's ratio to the floor.\n"
    );
    super::backend_tables(
        &mut md,
        rows,
        results,
        &super::BackendTables {
            columns: &COLUMNS,
            verdict,
            per_cycle: "the WAL the server wrote per cycle (`pg_current_wal_lsn()`)",
            per_cycle_field: "wal_bytes_per_cycle",
            per_cycle_unit: "B WAL",
            lines: if rounds == 1 {
                "Every run's output line:"
            } else {
                "The median run's output line of each cell (every run's is on stderr):"
            },
        },
    );
    md
}

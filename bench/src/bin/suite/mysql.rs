//! The MySQL section (`--only mysql`): zklock's MySQL backend beside a bare `GET_LOCK` +
//! `RELEASE_LOCK` floor on plain `mysql_async` sessions, uncontended, contended, over 64 keys,
//! 64 tasks of one process and the drain of a queue of one process, on a durable MariaDB of the
//! test kit (the redo log flushed at every commit, as a production server runs: a grant's
//! token is a commit, and its cost is part of the figure). No throughput row has a target yet:
//! these are the backend's first figures.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::backend_memory;
use crate::cli::{Cli, Section};
use crate::distance;
use crate::model::{BackendSizes as Sizes, Row, RowRuns, Runner};
use crate::report::{backend_tables, disk, each_cell, machine, quick_note, BackendTables};
use crate::rounds::run_rounds;
use crate::runner::Env;

/// The columns of the MySQL table, in order: (column key, heading).
const COLUMNS: [(&str, &str); 2] = [
    ("zklock", "zklock (MySQL)"),
    ("floor", "floor: GET_LOCK + RELEASE_LOCK"),
];

/// The cycles per worker or task of each row, and the drain's waiters.
fn sizes(quick: bool) -> Sizes {
    if quick {
        Sizes {
            uncontended: 50,
            contended: 5,
            keys: 5,
            inproc: 2,
            drain: 20,
        }
    } else {
        // Each run a second or so on 2 cores, the slowest (about 4 s) zklock's uncontended
        // with tokens: a commit, so an fsync, per grant, about 1,000 a second.
        Sizes {
            uncontended: 4_000,
            contended: 400,
            keys: 400,
            inproc: 100,
            drain: 1_000,
        }
    }
}

/// zklock and the floor.
fn cells() -> Vec<(&'static str, Runner)> {
    vec![
        ("zklock", Runner::ours("zklock")),
        ("floor", Runner::ours("floor")),
    ]
}

/// The same, zklock without fencing tokens: what the floor gives (it issues none).
fn untokened() -> Vec<(&'static str, Runner)> {
    vec![
        ("zklock", Runner::untokened()),
        ("floor", Runner::ours("floor")),
    ]
}

/// The rows: zklock (with and without fencing tokens) and the floor, uncontended and
/// contended; over 64 keys, from 64 tasks of one process, and the drain of a queue of one
/// process.
fn rows(quick: bool) -> Vec<Row> {
    let s = sizes(quick);
    let (uncontended, contended) = (s.uncontended, s.contended);
    vec![
        Row::ops(
            "uncontended (1 connection, 1 key)",
            "uncontended",
            1,
            uncontended,
            cells(),
        ),
        Row::ops(
            "uncontended, no fencing tokens (1 connection, 1 key)",
            "uncontended",
            1,
            uncontended,
            untokened(),
        ),
        Row::ops(
            "contended (8 managers / sessions, 1 key)",
            "contended",
            8,
            contended,
            cells(),
        ),
        Row::ops(
            "contended, no fencing tokens (8 managers / sessions, 1 key)",
            "contended",
            8,
            contended,
            untokened(),
        ),
        // 8 managers / sessions, each cycle on a random key of 64: mostly the uncontended
        // cycle, 8 at once.
        Row::ops(
            "keys (8 managers / sessions, 64 keys)",
            "keys",
            8,
            s.keys,
            cells(),
        )
        .over_keys(64),
        // zklock: 64 tasks of one manager, queued in the process behind its one hold. The
        // floor: the same 64 tasks, each on a session of its own from a pool of 64 (a user
        // lock belongs to its session: tasks sharing a session would share the lock), waiting
        // in the server's queue.
        Row::ops(
            "inproc (64 tasks; zklock 1 manager, floor 64 sessions; 1 key)",
            "inproc",
            64,
            s.inproc,
            cells(),
        ),
        // The waiters of one process queued behind a hold of that process: zklock's in its
        // local queue, the floor's on a pool of 64 sessions (63 waiting in the server's queue,
        // the others in the process for their session).
        Row::drain(
            format!("drain {} waiters (1 process, 1 key)", s.drain),
            s.drain,
            cells(),
        ),
    ]
}

/// The MySQL rows, on a durable MariaDB of the test kit.
pub(crate) fn section(cli: &Cli) -> Result<String, String> {
    let started = Instant::now();
    eprintln!("starting MariaDB (test kit, durable: the redo log flushed at every commit)");
    let server = zklock_testkit::MariaDbServer::builder()
        .durable()
        .start()
        .map_err(|e| format!("cannot start MariaDB: {e}"))?;
    let version = server
        .root_sql("SELECT VERSION(), @@max_connections")
        .map(|v| {
            let mut parts = v.trim().split('\t');
            let version = parts.next().unwrap_or("unknown").to_string();
            let max = parts.next().unwrap_or("?");
            format!("{version}, max_connections {max}")
        })
        .unwrap_or_else(|_| "unknown".into());
    let mut distance = cli.distance(Section::Mysql);
    let url = distance.route(&server.url())?;
    let mut env = Env::new(url, Duration::from_secs(cli.run_timeout))?;
    env.server_pid = server.pid();
    env.distance = distance;
    let rows = rows(cli.quick);
    let rounds = cli.rounds(Section::Mysql);
    let results = run_rounds(&mut env, &rows, rounds, "MySQL");
    // The local queue on only: with it off, every one of 10,000 waiting tasks would need a
    // session of its own, far above the server's max_connections.
    let memory_rows = backend_memory::rows(cli.quick, false);
    let memory = backend_memory::run(&mut env, &memory_rows, "MySQL");
    drop(server);
    let md = render(
        &rows,
        &results,
        (&memory_rows, &memory),
        &version,
        started.elapsed(),
        cli.quick,
        rounds,
    );
    Ok(md + &distance::table(&env.distance, &rows, &results))
}

/// The sessions of one manager, as the backend's code bounds them.
const CONNECTION_BOUND: &str = "Sessions (the MySQL backend's code): a manager keeps at most 16 idle sessions, and opens one for every acquire that reaches the server while none is idle; a hold keeps its session until its release, and a waiter blocks in `GET_LOCK` on a session of its own. With the local queue on, the tasks of one process waiting on one key queue in the process behind its one acquire or hold; with it off, every waiting task has a session of its own, so this section has no row with the local queue off (10,000 waiting tasks would need 10,000 sessions, above the server's `max_connections`).";

fn render(
    rows: &[Row],
    results: &[RowRuns],
    memory: (&[Row], &[RowRuns]),
    version: &str,
    took: Duration,
    quick: bool,
    rounds: usize,
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "{}; MariaDB {version} (test kit, durable: innodb_flush_log_at_trx_commit=1, \
         doublewrite on; data directory on {}); section took {:.0} s{}.\n",
        machine(),
        disk(),
        took.as_secs_f64(),
        quick_note(quick)
    );
    let _ = writeln!(
        md,
        "Throughput (acquire + release per second), {}. In parentheses: zklock's ratio to the \
         floor. No throughput row has a target yet. In the inproc and drain rows zklock's tasks share one \
         manager; the floor's tasks take sessions of a pool of 64, task `w` on session \
         `w mod 64`, kept from its `GET_LOCK` to its `RELEASE_LOCK` (a user lock belongs to its \
         session: tasks sharing a session would share the lock), so the inproc row's 64 tasks \
         each have one and the drain's waiters beyond 63 wait in the process for theirs. The \
         drain row is the handoffs per second of a queue of one process passing through once \
         its hold is released; its latency is the gap between successive grants.\n",
        each_cell(rounds)
    );
    backend_tables(
        &mut md,
        rows,
        results,
        &BackendTables {
            columns: &COLUMNS,
            per_cycle: "per cycle, over every client, the redo log InnoDB wrote \
                        (`Innodb_os_log_written`), its fsyncs (`Innodb_data_fsyncs`) and the \
                        statements clients sent (`Questions`)",
            per_cycle_fields: &[
                ("redo_bytes_per_cycle", "B redo"),
                ("fsyncs_per_cycle", "fsyncs"),
                ("statements_per_cycle", "statements"),
            ],
            rounds,
        },
    );
    backend_memory::table(&mut md, memory.0, memory.1, CONNECTION_BOUND);
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_throughput_row_runs_both_peers_with_no_target() {
        for quick in [true, false] {
            let rows = rows(quick);
            assert_eq!(rows.len(), 7);
            for row in &rows {
                assert!(row.target.is_none(), "{}", row.title);
                let columns: Vec<&str> = row.cells.iter().map(|(c, _)| *c).collect();
                assert_eq!(columns, ["zklock", "floor"], "{}", row.title);
            }
        }
    }
}

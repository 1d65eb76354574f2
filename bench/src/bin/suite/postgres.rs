//! The PostgreSQL section (`--only postgres`): zklock's PostgreSQL backend beside a bare
//! `pg_advisory_lock` + `pg_advisory_unlock` floor on plain clients, uncontended, contended,
//! over 64 keys, 64 tasks of one process and the drain of a queue of one process, on a durable
//! server of the test kit (`fsync` on, as a production server runs:
//! a grant's token is a commit, and its cost is part of the figure).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::backend_memory;
use crate::cli::{Cli, Section};
use crate::distance;
use crate::model::{BackendSizes as Sizes, Figure, Row, RowRuns, Runner, Target, Want};
use crate::report::{backend_tables, disk, each_cell, machine, quick_note, BackendTables};
use crate::rounds::run_rounds;
use crate::runner::Env;

/// The columns of the PostgreSQL table, in order: (column key, heading).
const COLUMNS: [(&str, &str); 2] = [
    ("zklock", "zklock (PostgreSQL)"),
    ("floor", "floor: pg_advisory_lock + unlock"),
];

/// The rows: zklock (with and without fencing tokens) and the floor, uncontended and
/// contended; over 64 keys, from 64 tasks of one process, and the drain of a queue of one
/// process.
fn rows(quick: bool) -> Vec<Row> {
    // Full size, each run of the new rows about a second or less on 2 cores.
    let s = if quick {
        Sizes {
            uncontended: 50,
            contended: 5,
            keys: 5,
            inproc: 2,
            drain: 20,
        }
    } else {
        Sizes {
            uncontended: 20_000,
            contended: 400,
            keys: 1_000,
            inproc: 100,
            drain: 1_000,
        }
    };
    let (uncontended, contended) = (s.uncontended, s.contended);
    let cells = || {
        vec![
            ("zklock", Runner::ours("zklock")),
            ("floor", Runner::ours("floor")),
        ]
    };
    // The same, zklock without fencing tokens: what the floor gives (it issues none).
    let untokened = || {
        vec![
            ("zklock", Runner::untokened()),
            ("floor", Runner::ours("floor")),
        ]
    };
    // With tokens a grant is a transaction of its own beside the advisory lock; without, the
    // cycle is the floor's.
    let contended_target = |ratio: f64| {
        Target::Ratios(vec![
            Want::main("floor", ratio),
            Want {
                peer: "floor",
                figure: Figure::P99,
                ratio: 2.0,
            },
        ])
    };
    vec![
        Row::ops(
            "uncontended (1 connection, 1 key)",
            "uncontended",
            1,
            uncontended,
            cells(),
        )
        .with_target(Target::Ratios(vec![Want::main("floor", 0.85)])),
        Row::ops(
            "uncontended, no fencing tokens (1 connection, 1 key)",
            "uncontended",
            1,
            uncontended,
            untokened(),
        )
        .with_target(Target::Ratios(vec![Want::main("floor", 0.9)])),
        Row::ops(
            "contended (8 managers / clients, 1 key)",
            "contended",
            8,
            contended,
            cells(),
        )
        .with_target(contended_target(0.7)),
        Row::ops(
            "contended, no fencing tokens (8 managers / clients, 1 key)",
            "contended",
            8,
            contended,
            untokened(),
        )
        .with_target(contended_target(0.9)),
        // 8 managers / clients, each cycle on a random key of 64: mostly the uncontended
        // cycle, 8 at once.
        Row::ops(
            "keys (8 managers / clients, 64 keys)",
            "keys",
            8,
            s.keys,
            cells(),
        )
        .over_keys(64)
        // The first two full runs (2026-11-27, 3 rounds each, paired medians): ×0.48 and ×0.33
        // floor (rounds ×0.20, ×0.57, ×0.48; ×0.32, ×0.46, ×0.33): each grant commits its
        // token (≈ 120 B of WAL), the floor writes nothing. No lead; a floor not to fall
        // under, a bit below the lower run.
        .with_target(Target::Ratios(vec![Want::main("floor", 0.3)])),
        // zklock: 64 tasks of one manager, queued in the process behind its one hold. The
        // floor: the same 64 tasks, each on a connection of its own from a pool of 64 (an
        // advisory lock belongs to its session: tasks sharing a connection would share the
        // lock), waiting in the server's lock queue.
        Row::ops(
            "inproc (64 tasks; zklock 1 manager, floor 64 connections; 1 key)",
            "inproc",
            64,
            s.inproc,
            cells(),
        )
        // The first two full runs (2026-11-27, 3 rounds each, paired medians): ×1.79 and ×1.78
        // floor (rounds ×1.77, ×2.14, ×1.79; ×1.78, ×1.23, ×2.04); each local handoff still
        // confirms the holding session, one round trip.
        .with_target(Target::Ratios(vec![Want::main("floor", 1.5)])),
        // The waiters of one process queued behind a hold of that process: zklock's in its
        // local queue, the floor's on a pool of 64 connections (63 waiting in the server's
        // lock queue, the others in the process for their connection).
        Row::drain(
            format!("drain {} waiters (1 process, 1 key)", s.drain),
            s.drain,
            cells(),
        )
        // The first two full runs (2026-11-27, 3 rounds each, paired medians): ×0.70 and ×0.50
        // floor (rounds ×0.70, ×0.45, ×0.80; ×0.30, ×0.50, ×0.57). zklock's local handoffs (a confirming round trip each) cost more per
        // waiter the longer the queue (one process's drain, alone: 58 µs per waiter for 64,
        // 108 for 200, 300 for 500, 570–910 for 1,000), so it trails the server's own queue
        // here; a floor not to fall under, a bit below the lower run.
        .with_target(Target::Ratios(vec![Want::main("floor", 0.45)])),
    ]
}

/// The PostgreSQL rows, on a durable PostgreSQL of the test kit.
pub(crate) fn section(cli: &Cli) -> Result<String, String> {
    let started = Instant::now();
    eprintln!("starting PostgreSQL (test kit, durable: fsync on)");
    let server = zklock_testkit::PostgresServer::start_durable()
        .map_err(|e| format!("cannot start PostgreSQL: {e}"))?;
    let version = server
        .psql("SHOW server_version")
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    // Shown beside the version: a manager opens at most 17 connections, well below it.
    let max_connections = server
        .psql("SHOW max_connections")
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let version = format!("{version}, max_connections {max_connections}");
    let mut distance = cli.distance(Section::Postgres);
    let url = distance.route(&server.url())?;
    let mut env = Env::new(url, Duration::from_secs(cli.run_timeout))?;
    env.server_pid = server.pid();
    env.distance = distance;
    let rows = rows(cli.quick);
    let rounds = cli.rounds(Section::Postgres);
    let results = run_rounds(&mut env, &rows, rounds, "PostgreSQL");
    let memory_rows = backend_memory::rows(cli.quick, cli.extended);
    let memory = backend_memory::run(&mut env, &memory_rows, "PostgreSQL");
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

/// The bound on the server connections of one manager, as the backend's code sets it.
const CONNECTION_BOUND: &str = "Bound (the PostgreSQL backend's code): at most 17 connections per manager, whatever the tasks or keys: 1 listening connection, and at most 16 holding connections, kept once opened. An acquire or hold of a lock id takes a connection on which that id is free (different ids share connections), and a wait in the server's lock queue (at most 4 per manager at a time) a connection of its own. With the local queue on, one key costs at most 3 (the listener, one for attempts and holds, one for the key's wait in the server's queue); with it off, or with many readers, every task of one key needs a connection of its own: at most 16 run at once, and the others wait in the process for one.";

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
        "{}; PostgreSQL {version} (test kit, durable: fsync on, synchronous_commit on; data \
         directory on {}); section took {:.0} s{}.\n",
        machine(),
        disk(),
        took.as_secs_f64(),
        quick_note(quick)
    );
    let _ = writeln!(
        md,
        "Throughput (acquire + release per second), {}. In parentheses: zklock's ratio to the \
         floor. In the inproc and drain rows zklock's tasks share one manager; the floor's \
         tasks take connections of a pool of 64, task `w` on connection `w mod 64`, kept from \
         its lock to its unlock (an advisory lock belongs to its session: tasks sharing a \
         connection would share the lock), so the inproc row's 64 tasks each have one and the \
         drain's waiters beyond 63 wait in the process for theirs. The drain row is the \
         handoffs per second of a queue of one process passing through once its hold is \
         released; its latency is the gap between successive grants.\n",
        each_cell(rounds)
    );
    backend_tables(
        &mut md,
        rows,
        results,
        &BackendTables {
            columns: &COLUMNS,
            per_cycle: "the WAL the server wrote per cycle (`pg_current_wal_lsn()`)",
            per_cycle_fields: &[("wal_bytes_per_cycle", "B WAL")],
            rounds,
        },
    );
    backend_memory::table(&mut md, memory.0, memory.1, CONNECTION_BOUND);
    md
}

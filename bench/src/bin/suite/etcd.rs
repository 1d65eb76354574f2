//! The etcd section (`--only etcd`): zklock's etcd backend beside a bare floor (a put of the
//! key on a lease granted up front, and its delete; where workers share a key, a
//! compare-and-put loop) and etcd's own lock service (the `Lock` and `Unlock` RPCs, a lease per
//! worker), on an etcd of the test kit (one member, its data directory on disk: every write is
//! fsynced to its write-ahead log before it is acknowledged).

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::cli::{Cli, Section};
use crate::distance;
use crate::model::{Figure, Row, RowRuns, Runner, Target, Want};
use crate::report::{backend_tables, disk, each_cell, machine, quick_note, BackendTables};
use crate::rounds::run_rounds;
use crate::runner::Env;

/// The columns of the etcd table, in order: (column key, heading).
const COLUMNS: [(&str, &str); 3] = [
    ("zklock", "zklock (etcd)"),
    (
        "floor",
        "floor: put on a lease + delete (shared key: compare-and-put loop)",
    ),
    ("lockservice", "etcd lock service: Lock + Unlock"),
];

/// The sizes of the rows: cycles per worker.
struct Sizes {
    uncontended: usize,
    contended: usize,
    keys: usize,
    inproc: usize,
}

/// The rows: uncontended, contended on one key, over 64 keys, and 64 tasks of one process.
fn rows(quick: bool) -> Vec<Row> {
    // Full size: each run a few seconds at most on 2 cores (the lock service's contended and
    // inproc runs are the slow ones), 5 rounds in about two and a half minutes.
    let s = if quick {
        Sizes {
            uncontended: 20,
            contended: 3,
            keys: 3,
            inproc: 2,
        }
    } else {
        Sizes {
            uncontended: 2_000,
            contended: 50,
            keys: 200,
            inproc: 20,
        }
    };
    let all = || {
        COLUMNS
            .iter()
            .map(|(column, _)| (*column, Runner::ours(column)))
            .collect::<Vec<_>>()
    };
    let mut keys = Row::ops("keys (8 clients, 64 keys)", "keys", 8, s.keys, all());
    keys.keys = 64;
    vec![
        Row::ops(
            "uncontended (1 client, 1 key)",
            "uncontended",
            1,
            s.uncontended,
            all(),
        )
        .with_target(Target::Ratios(vec![
            Want::main("floor", 0.9),
            Want::main("lockservice", 1.2),
        ])),
        // Compared on how often the lock changes hands (every grant of a fair queue does).
        Row::ops(
            "contended (8 managers / clients, 1 key)",
            "contended",
            8,
            s.contended,
            all(),
        )
        .with_target(Target::Ratios(vec![Want {
            peer: "lockservice",
            figure: Figure::HolderChanges,
            ratio: 1.2,
        }])),
        keys,
        // The floor has no local queue either: 64 tasks spinning on one key measure nothing
        // that the contended row does not. The lock service's tasks each have a lease of their
        // own (one lease would make them one re-entrant holder).
        Row::ops(
            "inproc (64 tasks, 1 manager / client, 1 key)",
            "inproc",
            64,
            s.inproc,
            vec![
                ("zklock", Runner::ours("zklock")),
                ("lockservice", Runner::ours("lockservice")),
            ],
        )
        .with_target(Target::Ratios(vec![Want::main("lockservice", 50.0)])),
    ]
}

/// The etcd rows, on an etcd of the test kit.
pub(crate) fn section(cli: &Cli) -> Result<String, String> {
    let started = Instant::now();
    eprintln!("starting etcd (test kit: one member, data on disk, fsync on)");
    let server =
        zklock_testkit::EtcdServer::start().map_err(|e| format!("cannot start etcd: {e}"))?;
    let mut distance = cli.distance(Section::Etcd);
    let url = distance.route(&server.url())?;
    let mut env = Env::new(url, Duration::from_secs(cli.run_timeout))?;
    env.server_pid = server.pid();
    env.distance = distance;
    let rows = rows(cli.quick);
    let rounds = cli.rounds(Section::Etcd);
    let results = run_rounds(&mut env, &rows, rounds, "etcd");
    drop(server);
    let md = render(&rows, &results, started.elapsed(), cli.quick, rounds);
    Ok(md + &distance::table(&env.distance, &rows, &results))
}

/// `etcd --version`'s version (the test kit's binary: `$ZKLOCK_ETCD`, else `etcd`).
pub(crate) fn version() -> String {
    let binary = std::env::var("ZKLOCK_ETCD").unwrap_or_else(|_| "etcd".into());
    Command::new(binary)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout).lines().find_map(|l| {
                l.strip_prefix("etcd Version:")
                    .map(|v| v.trim().to_string())
            })
        })
        .unwrap_or_else(|| "unknown".into())
}

fn render(rows: &[Row], results: &[RowRuns], took: Duration, quick: bool, rounds: usize) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "{}; etcd {} (test kit: one member, data directory on {}, every write fsynced to its \
         log; leases of 10 s); section took {:.0} s{}.\n",
        machine(),
        version(),
        disk(),
        took.as_secs_f64(),
        quick_note(quick)
    );
    let _ = writeln!(
        md,
        "Throughput (acquire + release per second), {}. In parentheses: zklock's ratio to that \
         peer. The floor puts its key on its lease and deletes it (one worker), or, where \
         workers share a key, sends a compare-and-put transaction again at once while the key \
         exists; the lock service's workers (tasks) each have a lease of their own.\n",
        each_cell(rounds)
    );
    backend_tables(
        &mut md,
        rows,
        results,
        &BackendTables {
            columns: &COLUMNS,
            per_cycle: "per cycle, from the server's metrics over all clients: the gRPC \
                        messages it received (`grpc_server_msg_received_total`: requests, \
                        watch and keep-alive messages; not the lock service's own requests \
                        inside the server), the writes it committed through Raft \
                        (`etcd_server_proposals_committed_total`) and its WAL fsyncs \
                        (`etcd_disk_wal_fsync_duration_seconds_count`; writes that arrive \
                        together share one)",
            per_cycle_fields: &[
                ("requests_per_cycle", "requests"),
                ("writes_per_cycle", "writes"),
                ("fsyncs_per_cycle", "fsyncs"),
            ],
            rounds,
        },
    );
    md
}

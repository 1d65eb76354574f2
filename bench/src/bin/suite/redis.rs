//! The Redis section (`--only redis`): zklock's Redis backend beside rslock (Redlock on one
//! server) and a bare `SET NX PX` + Lua compare-and-`DEL` floor, on a redis-server of the test
//! kit (no persistence: the floor's cycle would not wait for `appendfsync everysec` either).

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::backend_memory;
use crate::cli::{Cli, Section};
use crate::model::{contended_against_rslock, Row, RowRuns, Runner, Target, Want};
use crate::report::{backend_tables, each_cell, machine, quick_note, BackendTables};
use crate::rounds::run_rounds;
use crate::runner::Env;

/// The columns of the Redis table, in order: (column key, heading).
const COLUMNS: [(&str, &str); 3] = [
    ("zklock", "zklock (Redis)"),
    ("floor", "floor: SET NX PX + Lua DEL"),
    ("rslock", "rslock (Redlock, 1 server)"),
];

/// The rows: zklock, the floor and rslock, uncontended (zklock with and without fencing
/// tokens) and contended; and the linger's re-acquire.
fn rows(quick: bool) -> Vec<Row> {
    let (uncontended, contended) = if quick { (50, 5) } else { (10_000, 500) };
    let cells = || {
        COLUMNS
            .iter()
            .map(|(column, _)| (*column, Runner::ours(column)))
            .collect::<Vec<_>>()
    };
    // The same, zklock without fencing tokens: what the peers give (neither issues a token).
    let untokened = || {
        let mut cells = cells();
        cells[0].1 = Runner::untokened();
        cells
    };
    // A token costs a script with the server's clock; without one the cycle is the floor's.
    let tokened_target = Target::Ratios(vec![Want::main("floor", 0.85)]);
    let untokened_target =
        Target::Ratios(vec![Want::main("floor", 0.95), Want::main("rslock", 1.0)]);
    vec![
        Row::ops(
            "uncontended (1 connection, 1 key)",
            "uncontended",
            1,
            uncontended,
            cells(),
        )
        .with_target(tokened_target),
        Row::ops(
            "uncontended, no fencing tokens (1 connection, 1 key)",
            "uncontended",
            1,
            uncontended,
            untokened(),
        )
        .with_target(untokened_target),
        contended_against_rslock(contended, cells()),
        // The peers have no linger: they run it as `uncontended`. A re-take of a lingering
        // hold must confirm the key with the server (it may have been lost), so no safe
        // re-take skips the server: one round trip per cycle, where the floor makes two.
        Row::ops(
            "reacquire (1 connection, 1 key, linger 1 s)",
            "reacquire",
            1,
            uncontended,
            cells(),
        )
        .with_target(Target::PerCycleAtMost {
            field: "round_trips_per_cycle",
            name: "round trips",
            max: 1.0,
        }),
    ]
}

/// The Redis rows, on a redis-server of the test kit.
pub(crate) fn section(cli: &Cli) -> Result<String, String> {
    let started = Instant::now();
    eprintln!("starting redis-server (test kit)");
    let server = zklock_testkit::RedisServer::start()
        .map_err(|e| format!("cannot start redis-server: {e}"))?;
    let mut env = Env::new(server.url(), Duration::from_secs(cli.run_timeout))?;
    let rows = rows(cli.quick);
    let rounds = cli.rounds(Section::Redis);
    let results = run_rounds(&mut env, &rows, rounds, "Redis");
    let memory_rows = backend_memory::rows(cli.quick, cli.extended);
    let memory = backend_memory::run(&mut env, &memory_rows, "Redis");
    drop(server);
    Ok(render(
        &rows,
        &results,
        (&memory_rows, &memory),
        started.elapsed(),
        cli.quick,
        rounds,
    ))
}

/// `redis-server --version`'s version.
pub(crate) fn version() -> String {
    Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .find_map(|w| w.strip_prefix("v=").map(str::to_string))
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The bound on the server connections of one manager, as the backend's code sets it.
const CONNECTION_BOUND: &str = "Bound (the Redis backend's code): at most 2 connections per manager, whatever the tasks or keys: one multiplexed command connection (attempts, releases, renewals) and one pub/sub connection for wake-ups, opened once a task waits on the server (with the local queue on and the key held by the same process, none does).";

fn render(
    rows: &[Row],
    results: &[RowRuns],
    memory: (&[Row], &[RowRuns]),
    took: Duration,
    quick: bool,
    rounds: usize,
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "{}; Redis {} (test kit: no persistence); section took {:.0} s{}.\n",
        machine(),
        version(),
        took.as_secs_f64(),
        quick_note(quick)
    );
    let _ = writeln!(
        md,
        "Throughput (acquire + release per second), {}. In parentheses: zklock's ratio to that \
         peer.\n",
        each_cell(rounds)
    );
    backend_tables(
        &mut md,
        rows,
        results,
        &BackendTables {
            columns: &COLUMNS,
            per_cycle: "per cycle, the round trips on the wire (the server's reads from \
                        clients, `total_reads_processed`: one per request a client waits for) \
                        and the commands the server ran (`total_commands_processed`: those sent \
                        and those run inside scripts), over all clients, watchdog renewals \
                        included",
            per_cycle_fields: &[
                ("round_trips_per_cycle", "round trips"),
                ("commands_per_cycle", "commands"),
            ],
            rounds,
        },
    );
    backend_memory::table(&mut md, memory.0, memory.1, CONNECTION_BOUND);
    md
}

//! The Redis section (`--only redis`): zklock's Redis backend beside rslock (Redlock on one
//! server) and a bare `SET NX PX` + Lua compare-and-`DEL` floor, on a redis-server of the test
//! kit (no persistence: the floor's cycle would not wait for `appendfsync everysec` either):
//! uncontended, contended, over 64 keys, 64 tasks of one process, the drain of a queue of one
//! process, and the linger's re-acquire.

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::backend_memory;
use crate::cli::{Cli, Section};
use crate::distance;
use crate::model::{
    contended_against_rslock, BackendSizes as Sizes, Figure, Row, RowRuns, Runner, Target, Want,
};
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
/// tokens), contended, over 64 keys, from 64 tasks of one process and the drain of a queue of
/// one process; and the linger's re-acquire.
fn rows(quick: bool) -> Vec<Row> {
    // Full size, each run of the new rows a few seconds at most on 2 cores: the floor's
    // inproc (≈ 3 s) and drain (≈ 3.5 s: its waiters spin, O(waiters²) commands) are the slow
    // ones.
    let s = if quick {
        Sizes {
            uncontended: 50,
            contended: 5,
            keys: 20,
            inproc: 2,
            drain: 20,
        }
    } else {
        Sizes {
            uncontended: 10_000,
            contended: 500,
            keys: 2_000,
            inproc: 100,
            drain: 1_000,
        }
    };
    let (uncontended, contended) = (s.uncontended, s.contended);
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
        // Each cycle on a random key of 64, for every peer: collisions are rare, so this is
        // mostly the uncontended cycle, 8 at once; where two collide rslock's refused one
        // sleeps 0–200 ms.
        Row::ops("keys (8 connections, 64 keys)", "keys", 8, s.keys, cells())
            .over_keys(64)
            // The first two full runs (2026-11-27, 3 rounds each, paired medians): ×0.78 and
            // ×0.99 rslock (rounds ×1.32, ×0.63, ×0.78; ×0.99, ×1.37, ×0.96), ×0.48 and ×0.52
            // floor. zklock's tokened cycle (a script with the server's clock, 9 commands
            // against the peers' 4) costs here as uncontended: no lead, a floor not to fall
            // under, a bit below the lower run.
            .with_target(Target::Ratios(vec![
                Want::main("rslock", 0.7),
                Want::main("floor", 0.4),
            ])),
        // Every peer: the floor's 64 tasks share one connection and spin on `SET NX`
        // (yielding between tries), rslock's share one manager and retry with its own policy
        // (3 tries 0–200 ms apart, then again); zklock's queue in the process behind the one
        // hold. rslock's releasing task mostly takes the lock again while the others sleep,
        // so its holder changes are judged beside its cycles.
        Row::ops(
            "inproc (64 tasks, 1 manager / connection, 1 key)",
            "inproc",
            64,
            s.inproc,
            cells(),
        )
        // The first two full runs (2026-11-27, 3 rounds each, paired medians): ×12.35 and
        // ×11.35 floor (rounds ×12.35, ×9.72, ×15.75; ×11.35, ×11.07, ×13.46), ×5.02 and ×3.41
        // rslock, ×178.8 and ×163.1 rslock's holder changes (one round trip per handoff,
        // against the floor's 64 commands per cycle); each target a bit below the lower run.
        .with_target(Target::Ratios(vec![
            Want::main("floor", 10.0),
            Want::main("rslock", 3.0),
            Want {
                peer: "rslock",
                figure: Figure::HolderChanges,
                ratio: 140.0,
            },
        ])),
        // The same peers, each waiter a task of one process queued behind a hold of that
        // process: the floor's spin on `SET NX`, rslock's retry, zklock's wait in its local
        // queue and are handed the lock in turn.
        Row::drain(
            format!("drain {} waiters (1 process, 1 key)", s.drain),
            s.drain,
            cells(),
        )
        // The first two full runs (2026-11-27, 3 rounds each, paired medians): ×69.7 and ×30.8
        // floor (rounds ×122.8, ×43.3, ×69.7; ×17.5, ×30.8, ×78.7), ×16.1 and ×7.4 rslock
        // (×17.1, ×14.3, ×16.1; ×3.8, ×7.4, ×16.1): zklock's queue passes in 30–60 ms, so
        // one hiccup of the machine moves its figure; each target a bit below the lower run.
        .with_target(Target::Ratios(vec![
            Want::main("floor", 25.0),
            Want::main("rslock", 6.0),
        ])),
    ]
}

/// The Redis rows, on a redis-server of the test kit.
pub(crate) fn section(cli: &Cli) -> Result<String, String> {
    let started = Instant::now();
    eprintln!("starting redis-server (test kit)");
    let server = zklock_testkit::RedisServer::start()
        .map_err(|e| format!("cannot start redis-server: {e}"))?;
    let mut distance = cli.distance(Section::Redis);
    let url = distance.route(&server.url())?;
    let mut env = Env::new(url, Duration::from_secs(cli.run_timeout))?;
    env.server_pid = server.pid();
    env.distance = distance;
    let rows = rows(cli.quick);
    let rounds = cli.rounds(Section::Redis);
    let results = run_rounds(&mut env, &rows, rounds, "Redis");
    let memory_rows = backend_memory::rows(cli.quick, cli.extended);
    let memory = backend_memory::run(&mut env, &memory_rows, "Redis");
    drop(server);
    let md = render(
        &rows,
        &results,
        (&memory_rows, &memory),
        started.elapsed(),
        cli.quick,
        rounds,
    );
    Ok(md + &distance::table(&env.distance, &rows, &results))
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
         peer. Every peer runs every row: in the inproc and drain rows the tasks of one \
         process share zklock's one manager, the floor's one connection (they spin on `SET \
         NX`, yielding between tries) or rslock's one manager (they retry with its own policy: \
         3 tries 0–200 ms apart, then again). The drain row is the handoffs per second of a \
         queue of one process passing through once its hold is released; its latency is the \
         gap between successive grants.\n",
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

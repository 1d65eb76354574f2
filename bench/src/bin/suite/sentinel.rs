//! The Redis under Sentinel section (`--only sentinel`): zklock connected through the
//! Sentinels (`redis+sentinel://`) beside zklock and rslock (Redlock on one server) on the
//! primary's own address (`redis://`), all on one deployment of the test kit: a primary, 2
//! replicas and 3 Sentinels (no persistence, as in the Redis section).
//!
//! What Sentinel adds to zklock's cycle is nothing per request: the backend asks the Sentinels
//! for the primary and the primary for its `ROLE` once per new connection, and listens to every
//! Sentinel's `+switch-master` on connections of their own; every acquire and release goes to
//! the primary as on one server. The `direct` column (zklock on the primary's address) shows
//! what that costs against the same server; `rslock` is the peer, as in the Redis section. The
//! `acked` column is zklock through the Sentinels with `replica_acks(1, 1 s)`: what waiting for
//! one replica's `WAIT` after each grant and renewal costs.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::cli::{Cli, Section};
use crate::model::{rslock_rows, Row, RowRuns, Runner};
use crate::redis::version;
use crate::report::{backend_tables, each_cell, machine, quick_note, BackendTables};
use crate::rounds::run_rounds;
use crate::runner::Env;

/// The columns of the table, in order: (column key, heading).
const COLUMNS: [(&str, &str); 4] = [
    ("zklock", "zklock (Sentinel)"),
    ("acked", "zklock (Sentinel, replica_acks 1)"),
    ("direct", "zklock (primary, redis://)"),
    ("rslock", "rslock (Redlock, primary)"),
];

/// The rows (see [`rslock_rows`]), each by zklock through the Sentinels (without and with one
/// replica's acknowledgement of each grant and renewal), zklock on the primary's address and
/// rslock on it.
fn rows(quick: bool, primary: &str) -> Vec<Row> {
    rslock_rows(quick, || {
        vec![
            ("zklock", Runner::ours("zklock")),
            ("acked", Runner::Acked(1)),
            (
                "direct",
                Runner::OursAt {
                    peer: "zklock",
                    connect: primary.to_string(),
                },
            ),
            (
                "rslock",
                Runner::OursAt {
                    peer: "rslock",
                    connect: primary.to_string(),
                },
            ),
        ]
    })
}

/// The Sentinel rows, on a primary with 2 replicas and 3 Sentinels of the test kit.
pub(crate) fn section(cli: &Cli) -> Result<String, String> {
    let started = Instant::now();
    eprintln!("starting Redis with 2 replicas and 3 Sentinels (test kit)");
    let redis = zklock_testkit::RedisSentinel::start()
        .map_err(|e| format!("cannot start Redis with Sentinels: {e}"))?;
    let url = format!(
        "redis+sentinel://{}/{}",
        redis.sentinel_addrs().join(","),
        redis.master_name()
    );
    let primary_addr = redis
        .primary_addr()
        .map_err(|e| format!("no primary: {e}"))?;
    let primary = format!("redis://{primary_addr}/");
    let mut env = Env::new(url.clone(), Duration::from_secs(cli.run_timeout))?;
    let rows = rows(cli.quick, &primary);
    let rounds = cli.rounds(Section::Sentinel);
    let results = run_rounds(&mut env, &rows, rounds, "Sentinel");
    // A failover during the rows would have moved the primary under the direct columns.
    let after = redis.primary_addr().unwrap_or_default();
    drop(redis);
    let mut md = render(&rows, &results, started.elapsed(), cli.quick, rounds);
    if after != primary_addr {
        let _ = writeln!(
            md,
            "\n**The primary moved during the rows ({primary_addr} -> {after}): the figures \
             are not comparable.**"
        );
    }
    Ok(md)
}

fn render(rows: &[Row], results: &[RowRuns], took: Duration, quick: bool, rounds: usize) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "{}; Redis {} (test kit: a primary, 2 replicas, 3 Sentinels; no persistence); section \
         took {:.0} s{}.\n",
        machine(),
        version(),
        took.as_secs_f64(),
        quick_note(quick)
    );
    let _ = writeln!(
        md,
        "Throughput (acquire + release per second), {}. zklock (Sentinel) connects with \
         `redis+sentinel://` (the three Sentinels, the master name), and with `replica_acks(1, \
         1 s)` counts each grant and renewal once one replica acknowledged it (`WAIT 1 1000` \
         after it); the other columns connect to the primary's own address. In parentheses: \
         zklock (Sentinel)'s ratio to that column.\n",
        each_cell(rounds)
    );
    backend_tables(
        &mut md,
        rows,
        results,
        &BackendTables {
            columns: &COLUMNS,
            per_cycle: "per cycle, the round trips on the primary's wire (its reads from \
                        clients, `total_reads_processed`) and the commands it ran \
                        (`total_commands_processed`), over all clients, watchdog renewals, \
                        the replicas' acknowledgements and the Sentinels' probes included",
            per_cycle_fields: &[
                ("round_trips_per_cycle", "round trips"),
                ("commands_per_cycle", "commands"),
            ],
            rounds,
        },
    );
    md
}

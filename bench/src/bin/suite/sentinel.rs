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

use zklock_testkit::RedisSentinel;

use crate::cli::{Cli, Section};
use crate::distance::{self, Distance};
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
    let redis =
        RedisSentinel::start().map_err(|e| format!("cannot start Redis with Sentinels: {e}"))?;
    let mut distance = cli.distance(Section::Sentinel);
    let (url, primary_addr) = reach(&redis, &mut distance)?;
    let primary = format!("redis://{primary_addr}/");
    let mut env = Env::new(url, Duration::from_secs(cli.run_timeout))?;
    env.distance = distance;
    let rows = rows(cli.quick, &primary);
    let rounds = cli.rounds(Section::Sentinel);
    let results = run_rounds(&mut env, &rows, rounds, "Sentinel");
    // A failover during the rows would have moved the primary under the direct columns.
    let after = redis.primary_addr().unwrap_or_default();
    drop(redis);
    let mut md = render(&rows, &results, started.elapsed(), cli.quick, rounds);
    md.push_str(&distance::table(&env.distance, &rows, &results));
    if after != primary_addr {
        let _ = writeln!(
            md,
            "\n**The primary moved during the rows ({primary_addr} -> {after}): the figures \
             are not comparable.**"
        );
    }
    Ok(md)
}

/// The Sentinels' URL and the primary's address as the clients reach them. On loopback, the
/// servers' own. At a distance, relays in front of the Sentinels and the primary, and the
/// Sentinels monitoring the primary through its relay: they name the relay's address to
/// zklock, so no client reaches the primary directly. (The replicas replicate from the
/// primary's own port, as before.)
fn reach(redis: &RedisSentinel, distance: &mut Distance) -> Result<(String, String), String> {
    let sentinels = redis
        .sentinel_addrs()
        .iter()
        .map(|addr| distance.front(addr))
        .collect::<Result<Vec<_>, _>>()?;
    let url = format!(
        "redis+sentinel://{}/{}",
        sentinels.join(","),
        redis.master_name()
    );
    let primary = redis
        .primary_addr()
        .map_err(|e| format!("no primary: {e}"))?;
    if !distance.is_far() {
        return Ok((url, primary));
    }
    let relay = distance.front(&primary)?;
    monitor_through(redis, &relay)?;
    Ok((url, relay))
}

/// How long the Sentinels may take to monitor the primary at its relay's address.
const MONITORED_WITHIN: Duration = Duration::from_secs(20);

/// Every Sentinel forgets the primary and monitors it again at `relay` (`127.0.0.1:PORT`),
/// with the test kit's settings; returns once each names `relay` as the primary and sees it
/// up.
fn monitor_through(redis: &RedisSentinel, relay: &str) -> Result<(), String> {
    let name = redis.master_name();
    let port = relay.rsplit(':').next().unwrap_or_default();
    let quorum = (redis.sentinel_addrs().len() / 2 + 1).to_string();
    let (down, failover) = (
        redis.down_after().as_millis().to_string(),
        redis.failover_timeout().as_millis().to_string(),
    );
    let each = |args: &[&str]| -> Result<(), String> {
        (0..redis.sentinel_addrs().len()).try_for_each(|j| {
            redis
                .sentinel_command(j, args)
                .map(drop)
                .map_err(|e| format!("{args:?} on Sentinel {j}: {e}"))
        })
    };
    // All forget it first, so that none tells the others of the old address.
    each(&["SENTINEL", "REMOVE", name])?;
    each(&["SENTINEL", "MONITOR", name, "127.0.0.1", port, &quorum])?;
    each(&[
        "SENTINEL",
        "SET",
        name,
        "down-after-milliseconds",
        &down,
        "failover-timeout",
        &failover,
        "parallel-syncs",
        "1",
    ])?;
    let since = Instant::now();
    while !(0..redis.sentinel_addrs().len()).all(|j| names_up(redis, j, port)) {
        if since.elapsed() > MONITORED_WITHIN {
            return Err(format!(
                "the Sentinels do not all monitor the primary at its relay {relay} within \
                 {MONITORED_WITHIN:?}: look at their logs (the test kit's directory)"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Whether Sentinel `j` names the primary at `port` and sees it up (its flags are `master`
/// alone: no `s_down`, no `disconnected`).
fn names_up(redis: &RedisSentinel, j: usize, port: &str) -> bool {
    let name = redis.master_name();
    let named = redis
        .sentinel_command(j, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", name])
        .ok()
        .and_then(|r| r.array()?.get(1)?.text());
    let flags = redis
        .sentinel_command(j, &["SENTINEL", "MASTER", name])
        .ok()
        .and_then(|r| {
            let items = r.array()?;
            let at = items
                .iter()
                .position(|i| i.text().as_deref() == Some("flags"))?;
            items.get(at + 1)?.text()
        });
    named.as_deref() == Some(port) && flags.as_deref() == Some("master")
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

//! The Redis Cluster section (`--only cluster`): zklock on `redis+cluster://` beside rslock
//! (Redlock on one server per key) on the same Cluster of the test kit: 3 primaries with a
//! replica each, no persistence.
//!
//! zklock routes every request by its key's slot (all of a lock's keys carry one hash tag) to
//! a connection per primary, and hears wake-ups with ordinary pub/sub, which the Cluster bus
//! carries to every node. rslock is routed by hand, as a user of its plain `LockManager` on a
//! Cluster would: one manager per primary, each key's chosen from a slot map asked before the
//! timed window (`CLUSTER SLOTS`, `CLUSTER KEYSLOT`). The server's counters are summed over
//! every primary.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::cli::{Cli, Section};
use crate::model::{rslock_rows, Row, RowRuns, Runner};
use crate::redis::version;
use crate::report::{backend_tables, each_cell, machine, quick_note, BackendTables};
use crate::rounds::run_rounds;
use crate::runner::Env;

/// The columns of the table, in order: (column key, heading).
const COLUMNS: [(&str, &str); 2] = [
    ("zklock", "zklock (redis+cluster://)"),
    (
        "rslock",
        "rslock (a manager per primary, keys routed by slot)",
    ),
];

/// The number of keys of the keys row.
const KEYS: usize = 64;

/// The rows (see [`rslock_rows`]), each by zklock and by rslock, on the Cluster.
fn rows(quick: bool) -> Vec<Row> {
    rslock_rows(quick, || {
        vec![
            ("zklock", Runner::ours("zklock")),
            ("rslock", Runner::ours("rslock")),
        ]
    })
}

/// The Cluster rows, on 3 primaries with a replica each (test kit).
pub(crate) fn section(cli: &Cli) -> Result<String, String> {
    let started = Instant::now();
    eprintln!("starting a Redis Cluster: 3 primaries, 1 replica each (test kit)");
    let cluster = zklock_testkit::RedisCluster::builder()
        .replicas(1)
        .start()
        .map_err(|e| format!("cannot start a Redis Cluster: {e}"))?;
    let url = format!("redis+cluster://{}", cluster.addrs().join(","));
    let primaries = cluster
        .primaries()
        .map_err(|e| format!("no primaries: {e}"))?;
    let coverage = coverage(&cluster, &primaries)?;
    let mut env = Env::new(url, Duration::from_secs(cli.run_timeout))?;
    let rows = rows(cli.quick);
    let rounds = cli.rounds(Section::Cluster);
    let results = run_rounds(&mut env, &rows, rounds, "Cluster");
    // A failover during the rows would have moved slots under rslock's routes.
    let after = cluster.primaries().unwrap_or_default();
    drop(cluster);
    let mut md = render(&rows, &results, started.elapsed(), cli.quick, rounds);
    let _ = writeln!(md, "\n{coverage}");
    let _ = writeln!(md, "\n{}", spreads(&rows, &results, primaries.len()));
    if after != primaries {
        let _ = writeln!(
            md,
            "\n**The primaries changed during the rows ({primaries:?} -> {after:?}): the \
             figures are not comparable.**"
        );
    }
    Ok(md)
}

/// Checks with the test kit (`node_for_key`, `CLUSTER KEYSLOT` and `CLUSTER NODES`) that 64
/// keys named as the bench names rslock's (`bench:/bench/rslock-<nanos>-<pid>:k<i>`, one
/// sample root) land on every primary, and says how they spread. Each run names its keys
/// afresh; its own spread is in its line (`keys_per_primary`).
fn coverage(cluster: &zklock_testkit::RedisCluster, primaries: &[usize]) -> Result<String, String> {
    let root = format!("/bench/rslock-0-{}", std::process::id());
    let mut counts = vec![0usize; primaries.len()];
    for k in 0..KEYS {
        let node = cluster
            .node_for_key(&format!("bench:{root}:k{k}"))
            .map_err(|e| format!("node_for_key: {e}"))?;
        let i = primaries
            .iter()
            .position(|&p| p == node)
            .ok_or_else(|| format!("node {node} owns a key but is no primary"))?;
        counts[i] += 1;
    }
    if counts.contains(&0) {
        return Err(format!(
            "64 sample keys leave a primary without a key ({counts:?}): the keys row would not \
             cover the Cluster"
        ));
    }
    Ok(format!(
        "Checked at setup with the test kit's `node_for_key`: 64 sample keys named as rslock's \
         spread {} over the {} primaries (nodes {:?}).",
        counts
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(" / "),
        primaries.len(),
        primaries
    ))
}

/// How the keys row's keys spread over the primaries in every run (`keys_per_primary`), and
/// whether each run's reached every primary.
fn spreads(rows: &[Row], results: &[RowRuns], primaries: usize) -> String {
    let Some(at) = rows.iter().position(|r| r.workload == "keys") else {
        return String::new();
    };
    let mut text = String::from(
        "The keys row's 64 keys over the primaries (ordered by port), each run its own names, \
         from `CLUSTER KEYSLOT` in the run:",
    );
    let mut every = true;
    for (column, heading) in COLUMNS {
        let seen: Vec<String> = results[at]
            .rounds
            .iter()
            .filter_map(|round| round.get(column)?.as_ref().ok()?.get("keys_per_primary"))
            .map(str::to_string)
            .collect();
        every &= seen.iter().all(|s| {
            let n: Vec<usize> = s.split('/').filter_map(|c| c.parse().ok()).collect();
            n.len() == primaries && !n.contains(&0)
        });
        let _ = write!(text, " {heading}: {};", seen.join(", "));
    }
    text.pop();
    text.push('.');
    if !every {
        text.push_str(" **A run left a primary without a key.**");
    }
    text
}

fn render(rows: &[Row], results: &[RowRuns], took: Duration, quick: bool, rounds: usize) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "{}; Redis {} (test kit: a Cluster of 3 primaries with a replica each; no \
         persistence); section took {:.0} s{}.\n",
        machine(),
        version(),
        took.as_secs_f64(),
        quick_note(quick)
    );
    let _ = writeln!(
        md,
        "Throughput (acquire + release per second), {}. zklock connects with \
         `redis+cluster://` (every node); rslock runs a plain manager per primary, each key \
         sent to its slot's primary by a map asked before the timed window. In parentheses: \
         zklock's ratio to that column.\n",
        each_cell(rounds)
    );
    backend_tables(
        &mut md,
        rows,
        results,
        &BackendTables {
            columns: &COLUMNS,
            per_cycle: "per cycle, the round trips on the primaries' wires (their reads from \
                        clients, `total_reads_processed`) and the commands they ran \
                        (`total_commands_processed`), summed over the 3 primaries and all \
                        clients, watchdog renewals and the replicas' acknowledgements included",
            per_cycle_fields: &[
                ("round_trips_per_cycle", "round trips"),
                ("commands_per_cycle", "commands"),
            ],
            rounds,
        },
    );
    md
}

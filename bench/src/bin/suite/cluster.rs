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

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use zklock_testkit::RedisCluster;

use crate::cli::{Cli, Section};
use crate::distance::{self, Distance};
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
    let cluster = RedisCluster::builder()
        .replicas(1)
        .start()
        .map_err(|e| format!("cannot start a Redis Cluster: {e}"))?;
    let mut distance = cli.distance(Section::Cluster);
    let url = reach(&cluster, &mut distance)?;
    let primaries = cluster
        .primaries()
        .map_err(|e| format!("no primaries: {e}"))?;
    let coverage = coverage(&cluster, &primaries)?;
    let mut env = Env::new(url, Duration::from_secs(cli.run_timeout))?;
    env.distance = distance;
    let rows = rows(cli.quick);
    let rounds = cli.rounds(Section::Cluster);
    let results = run_rounds(&mut env, &rows, rounds, "Cluster");
    // A failover during the rows would have moved slots under rslock's routes.
    let after = cluster.primaries().unwrap_or_default();
    drop(cluster);
    let mut md = render(&rows, &results, started.elapsed(), cli.quick, rounds);
    md.push_str(&distance::table(&env.distance, &rows, &results));
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

/// The `redis+cluster://` URL as the clients reach the Cluster. On loopback, every node's own
/// address. At a distance, a relay in front of every node, primaries and replicas, each node
/// announcing its relay's port (`cluster-announce-port`; the cluster bus stays direct): every
/// `CLUSTER SLOTS` and `-MOVED` names relays only, so no client reaches a node directly.
fn reach(cluster: &RedisCluster, distance: &mut Distance) -> Result<String, String> {
    let seeds = cluster
        .addrs()
        .iter()
        .map(|addr| distance.front(addr))
        .collect::<Result<Vec<_>, _>>()?;
    if distance.is_far() {
        announce(cluster, &seeds)?;
    }
    Ok(format!("redis+cluster://{}", seeds.join(",")))
}

/// How long the nodes may take to learn the ports the others announce (gossip: each node
/// pings each other at least every half node timeout).
const ANNOUNCED_WITHIN: Duration = Duration::from_secs(20);

/// Node `i` announces the port of `relays[i]` (`127.0.0.1:PORT`); returns once every node's
/// `CLUSTER SLOTS` names those ports and no other.
fn announce(cluster: &RedisCluster, relays: &[String]) -> Result<(), String> {
    let ports: Vec<&str> = relays
        .iter()
        .map(|r| r.rsplit(':').next().unwrap_or_default())
        .collect();
    for (i, port) in ports.iter().enumerate() {
        cluster
            .command(i, &["CONFIG", "SET", "cluster-announce-port", port])
            .map_err(|e| format!("CONFIG SET cluster-announce-port on node {i}: {e}"))?;
    }
    let want: BTreeSet<i64> = ports.iter().filter_map(|p| p.parse().ok()).collect();
    let since = Instant::now();
    loop {
        let seen: Vec<_> = (0..cluster.len()).map(|i| slot_ports(cluster, i)).collect();
        if seen.iter().all(|s| s.as_ref() == Some(&want)) {
            return Ok(());
        }
        if since.elapsed() > ANNOUNCED_WITHIN {
            return Err(format!(
                "the nodes do not all name the relays {want:?} in CLUSTER SLOTS within \
                 {ANNOUNCED_WITHIN:?}: {seen:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every port node `i`'s `CLUSTER SLOTS` names, primaries and replicas (`None`: no answer).
fn slot_ports(cluster: &RedisCluster, i: usize) -> Option<BTreeSet<i64>> {
    let reply = cluster.command(i, &["CLUSTER", "SLOTS"]).ok()?;
    let mut ports = BTreeSet::new();
    for range in reply.array()? {
        // [first slot, last slot, primary, replica...], each node [ip, port, id, ...].
        for node in range.array()?.iter().skip(2) {
            ports.insert(node.array()?.get(1)?.int()?);
        }
    }
    Some(ports)
}

/// Checks with the test kit (`node_for_key`, `CLUSTER KEYSLOT` and `CLUSTER NODES`) that 64
/// keys named as the bench names rslock's (`bench:/bench/rslock-<nanos>-<pid>:k<i>`, one
/// sample root) land on every primary, and says how they spread. Each run names its keys
/// afresh; its own spread is in its line (`keys_per_primary`).
fn coverage(cluster: &RedisCluster, primaries: &[usize]) -> Result<String, String> {
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

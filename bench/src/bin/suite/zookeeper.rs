//! The ZooKeeper section: zklock beside the floor (bare create + delete), zookeeper-client's
//! recipe, Curator, kazoo and the naive herd, on one ZooKeeper of the test kit (or
//! `--connect`'s), fsyncing its log as production servers do.

use std::time::{Duration, Instant};

use crate::cli::{Cli, Section};
use crate::distance;
use crate::model::{Metric, Outcome, Row, Runner, Target, Want};
use crate::rounds::run_rounds;
use crate::runner::Env;
use crate::zookeeper_tables::render;

/// The sizes of the rows (cycles per worker, waiters, tasks).
struct Sizes {
    uncontended: usize,
    contended: usize,
    keys: usize,
    inproc: usize,
    drain_small: usize,
    drain_large: usize,
    herd: usize,
    memory: usize,
    /// Samples of the `handover` run (each three acquires).
    handover: usize,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                uncontended: 50,
                contended: 10,
                keys: 10,
                inproc: 2,
                drain_small: 20,
                drain_large: 40,
                herd: 10,
                memory: 100,
                handover: 5,
            }
        } else {
            Sizes {
                uncontended: 2000,
                contended: 250,
                keys: 250,
                inproc: 40,
                drain_small: 1000,
                drain_large: 8000,
                herd: 200,
                memory: 10_000,
                handover: 100,
            }
        }
    }
}

/// Every peer's cell, with zklock run as `zk`.
fn every(zk: &Runner) -> Vec<(&'static str, Runner)> {
    vec![
        ("zklock", zk.clone()),
        ("floor", Runner::ours("floor")),
        ("zkclient", Runner::ours("zkclient")),
        ("curator", Runner::Peer("curator")),
        ("kazoo", Runner::Peer("kazoo")),
        ("naive", Runner::ours("naive")),
    ]
}

/// zklock with the local queue off.
fn zk_noq() -> Runner {
    Runner::Ours {
        peer: "zklock",
        no_queue: true,
        no_tokens: false,
    }
}

/// A lead of at least these ratios over these peers.
fn ratios(wants: &[(&'static str, f64)]) -> Target {
    Target::Ratios(wants.iter().map(|(peer, r)| Want::main(peer, *r)).collect())
}

/// What a row's protocol costs at most per cycle (`field`: `requests_per_cycle`, or
/// `requests_per_handoff` for a drain) and its lead over the peers that run it: the targets
/// of every ZooKeeper row. The counts are what the recipe needs (3 requests uncontended: the
/// create and the listing pipelined, the delete; a contended cycle adds the watches of its
/// window; a drain's handoff is one delete), and where it stands against the peers: on
/// loopback, where every message costs CPU on two shared cores, not behind any of them (see
/// [`NOT_BEHIND`]); ahead where a hand-over sends nothing (the drains, the local queue).
fn costs_and_leads(field: &'static str, max: f64, wants: &[(&'static str, f64)]) -> Target {
    let cost = Target::PerCycleAtMost {
        field,
        name: "requests",
        max,
    };
    if wants.is_empty() {
        return cost;
    }
    Target::All(vec![cost, ratios(wants)])
}

/// Not behind any lock peer that runs the row: at least 0.97× each (the median of the rounds'
/// paired ratios; 3% is within a round's noise). The floor is no lock: its bare create and
/// delete exclude nobody.
const NOT_BEHIND: [(&str, f64); 4] = [
    ("zkclient", 0.97),
    ("curator", 0.97),
    ("kazoo", 0.97),
    ("naive", 0.97),
];

/// The throughput rows: uncontended, contended, keys, inproc, reacquire.
fn ops_rows(s: &Sizes) -> Vec<Row> {
    let zk = Runner::ours("zklock");
    let mut keys = Row::ops("keys (8 sessions, 64 keys)", "keys", 8, s.keys, every(&zk));
    keys.keys = 64;
    // kazoo_bench has no shared-client mode; the naive herd with 64 tasks on one session
    // costs O(tasks) requests per handoff (see the drain rows) and minutes.
    let inproc_cells = every(&zk)
        .into_iter()
        .filter(|(c, _)| *c != "kazoo" && *c != "naive")
        .collect();
    vec![
        Row::ops(
            "uncontended (1 session, 1 key)",
            "uncontended",
            1,
            s.uncontended,
            every(&zk),
        )
        .with_target(costs_and_leads("requests_per_cycle", 3.0, &NOT_BEHIND)),
        Row::ops(
            "contended (8 sessions, 1 key)",
            "contended",
            8,
            s.contended,
            every(&zk),
        )
        .with_target(costs_and_leads("requests_per_cycle", 9.8, &NOT_BEHIND)),
        keys.with_target(costs_and_leads("requests_per_cycle", 3.3, &NOT_BEHIND)),
        Row::ops(
            "inproc (64 tasks, 1 session, 1 key)",
            "inproc",
            64,
            s.inproc,
            inproc_cells,
        )
        // 64 tasks share one node while no other process waits: no request per cycle.
        .with_target(costs_and_leads(
            "requests_per_cycle",
            0.0,
            &[("curator", 100.0), ("zkclient", 100.0)],
        )),
        // The peers have no linger: they run it as `uncontended`. Re-acquire without a round
        // trip.
        Row::ops(
            "reacquire (1 session, 1 key, linger 1 s)",
            "reacquire",
            1,
            s.uncontended,
            vec![("zklock", zk), ("floor", Runner::ours("floor"))],
        )
        .with_target(costs_and_leads(
            "requests_per_cycle",
            0.0,
            &[("floor", 100.0)],
        )),
        // The peers' figures are those of the row above (they have no local queue).
        Row::ops(
            "inproc (64 tasks), local queue off",
            "inproc",
            64,
            s.inproc,
            vec![("zklock", zk_noq())],
        ),
    ]
}

/// The drain rows: the herd baseline, then the large drains with the local queue off and on.
fn drain_rows(s: &Sizes) -> Vec<Row> {
    let ours = Runner::ours;
    let curator = || ("curator", Runner::Peer("curator"));
    vec![
        Row::drain(
            format!("drain {} waiters (herd baseline)", s.herd),
            s.herd,
            vec![
                ("zklock", zk_noq()),
                ("zkclient", ours("zkclient")),
                curator(),
                ("naive", ours("naive")),
            ],
        )
        .with_target(costs_and_leads(
            "requests_per_handoff",
            1.0,
            &[("curator", 1.0), ("zkclient", 1.0)],
        )),
        Row::drain(
            format!("drain {} waiters, local queue off", s.drain_small),
            s.drain_small,
            vec![
                ("zklock", zk_noq()),
                ("zkclient", ours("zkclient")),
                curator(),
            ],
        )
        .with_target(costs_and_leads(
            "requests_per_handoff",
            1.0,
            &[("curator", 1.0), ("zkclient", 1.0)],
        )),
        Row::drain(
            format!("drain {} waiters, local queue off", s.drain_large),
            s.drain_large,
            vec![("zklock", zk_noq()), curator()],
        )
        .with_target(costs_and_leads(
            "requests_per_handoff",
            1.0,
            &[("curator", 1.0)],
        )),
        // The waiters of one process pass through its local queue: no request per handoff.
        Row::drain(
            format!("drain {} waiters, local queue on", s.drain_large),
            s.drain_large,
            vec![("zklock", ours("zklock"))],
        )
        .with_target(costs_and_leads("requests_per_handoff", 0.0, &[])),
    ]
}

/// The memory probes: waiters on one key, distinct keys held.
fn memory_rows(s: &Sizes, extended: bool) -> Vec<Row> {
    let mut rows = vec![];
    for workload in ["mem-waiters", "mem-keys"] {
        let mut cells = vec![
            ("zklock", Runner::ours("zklock")),
            ("curator", Runner::CuratorMem),
        ];
        if workload == "mem-waiters" && extended {
            cells.insert(1, ("zklock-noq", zk_noq()));
        }
        let what = if workload == "mem-waiters" {
            "tasks waiting on one key"
        } else {
            "distinct keys held"
        };
        let target = match workload {
            // Keep 10,000 waiters in about 30 MB (the full size only).
            "mem-waiters" => (s.memory >= 10_000).then_some(Target::PeakMb(33.0)),
            _ => Some(ratios(&[("curator", 3.40)])),
        };
        rows.push(Row {
            title: format!("{workload}: {} {what}", s.memory),
            workload,
            workers: s.memory,
            cycles: 0,
            keys: 1,
            metric: Metric::Memory,
            cells,
            target,
        });
    }
    rows
}

fn rows(s: &Sizes, extended: bool) -> Vec<Row> {
    let mut rows = ops_rows(s);
    rows.extend(drain_rows(s));
    rows.extend(memory_rows(s, extended));
    rows
}

/// Serves one ZooKeeper until stdin closes.
pub(crate) fn serve(fsync: bool) -> Result<(), String> {
    let server = bench_server(fsync)?;
    println!("{}", server.connect_string());
    let mut sink = String::new();
    while std::io::stdin()
        .read_line(&mut sink)
        .map_err(|e| e.to_string())?
        > 0
    {}
    drop(server);
    Ok(())
}

/// The server of a run: the test kit's, with room for 10,000-child listings in flight, and
/// fsyncing its log before it acknowledges a write (`forceSync=yes`, as production servers
/// run) unless `fsync` is off.
fn bench_server(fsync: bool) -> Result<zklock_testkit::ZkServer, String> {
    zklock_testkit::ZkServer::builder()
        .heap_mb(1024)
        .config("forceSync", if fsync { "yes" } else { "no" })
        .start()
        .map_err(|e| format!("cannot start ZooKeeper: {e}"))
}

/// How the test kit's server writes its log.
fn fsync_note(fsync: bool) -> &'static str {
    if fsync {
        "forceSync=yes: fsyncs its log, as in production"
    } else {
        "--no-fsync: forceSync=no, figures for quick checks only"
    }
}

/// The release in `srvr`'s version line: `3.8.0` of `3.8.0-${mvngit.commit.id}, built on …` (a
/// distribution's build leaves that placeholder where the commit id belongs).
fn release_of(version: &str) -> String {
    let version = version.split(',').next().unwrap_or(version);
    version
        .split_once("-${")
        .map_or(version, |(release, _)| release)
        .trim()
        .to_string()
}

/// The ZooKeeper rows, on the test kit's ZooKeeper (or `--connect`'s).
pub(crate) fn section(cli: &Cli) -> Result<String, String> {
    let started = Instant::now();
    let fsync = !cli.no_fsync;
    let server = match &cli.connect {
        Some(_) => None,
        None => {
            eprintln!("starting ZooKeeper (test kit, {})", fsync_note(fsync));
            Some(bench_server(fsync)?)
        }
    };
    let (connect, server_version) = match (&cli.connect, &server) {
        (Some(c), _) => (c.clone(), "unknown (external server)".to_string()),
        (None, Some(s)) => (s.connect_string(), version(s, fsync)),
        (None, None) => unreachable!("a server is started without --connect"),
    };
    let mut distance = cli.distance(Section::Zookeeper);
    let connect = distance.route(&connect)?;
    let mut env = Env::new(connect, Duration::from_secs(cli.run_timeout))?;
    env.peers_run = zklock_testkit::peers_dir().join("run");
    env.server_pid = server.as_ref().and_then(|s| s.pid());
    env.distance = distance;
    let sizes = Sizes::new(cli.quick);
    let rows = rows(&sizes, cli.extended);
    warm_up(&env, cli.quick);
    let rounds = cli.rounds(Section::Zookeeper);
    let results = run_rounds(&mut env, &rows, rounds, "ZooKeeper");
    let handover = handover(&mut env, sizes.handover);
    drop(server);
    let md = render(
        &rows,
        &results,
        &handover,
        &server_version,
        started.elapsed(),
        cli.quick,
        rounds,
    );
    Ok(md + &distance::table(&env.distance, &rows, &results))
}

/// The server's release and how it writes its log.
pub(crate) fn version(server: &zklock_testkit::ZkServer, fsync: bool) -> String {
    server
        .four_letter("srvr")
        .ok()
        .and_then(|srvr| {
            srvr.lines()
                .find_map(|l| l.strip_prefix("Zookeeper version: "))
                .map(release_of)
        })
        .map_or_else(
            || "unknown".into(),
            |v| format!("{v} ({})", fsync_note(fsync)),
        )
}

/// Warms the server's JIT with a throwaway run, so that the first row is not penalized.
fn warm_up(env: &Env, quick: bool) {
    let warm = Row::ops(
        "warm-up",
        "contended",
        4,
        if quick { 10 } else { 1000 },
        vec![],
    );
    let _ = env.run(&warm, &Runner::ours("floor"));
}

/// The linger's cost to the first other process: one `handover` run of zklock.
fn handover(env: &mut Env, samples: usize) -> Outcome {
    let row = Row::ops(
        "first other process on a lingering key",
        "handover",
        1,
        samples,
        vec![],
    );
    env.run_shown(&row, "zklock", &Runner::ours("zklock"))
}

#[cfg(test)]
mod tests {
    use super::release_of;

    #[test]
    fn the_server_release_drops_the_build_placeholder_and_date() {
        assert_eq!(
            release_of("3.8.0-${mvngit.commit.id}, built on 2024-12-29 17:54 UTC"),
            "3.8.0"
        );
        assert_eq!(
            release_of("3.9.2-e454e8c7283100c7caec6dcae2bc82aaecb63023, built on 2024-02-12"),
            "3.9.2-e454e8c7283100c7caec6dcae2bc82aaecb63023"
        );
    }
}

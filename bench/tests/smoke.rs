//! Smoke test of the `zklock-bench` binary against a real ZooKeeper: every workload and peer
//! runs with tiny sizes and prints a line in the peers' format, with no exclusion violation.
//! No figure is asserted: speed is compared side by side by `scripts/bench`, never here.

use std::process::Command;

use zklock_bench::{parse_line, Report};
use zklock_testkit::ZkServer;

fn bench(connect: &str, args: &[&str]) -> Report {
    let out = Command::new(env!("CARGO_BIN_EXE_zklock-bench"))
        .args(["--connect", connect, "--warmup", "5"])
        .args(args)
        .output()
        .expect("run zklock-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "zklock-bench {args:?} failed: {stderr}"
    );
    let line = stdout.lines().last().unwrap_or_default();
    eprintln!("{line}");
    parse_line(line).unwrap_or_else(|| panic!("not an output line: {line:?} (stderr: {stderr})"))
}

/// The heading of each section's table that judges zklock's client CPU per cycle.
const CPU_TABLE: &str = "zklock's client CPU per cycle against the cheapest lock peer's";

/// The markdown before the client CPU table: the throughput table and its verdicts (the CPU
/// table's rows carry verdicts of their own).
fn before_cpu_table(stdout: &str) -> &str {
    stdout.split(CPU_TABLE).next().unwrap_or(stdout)
}

/// How many verdicts ("met", "met (…)", "**missed**") the throughput table's rows print:
/// those before the client CPU table, whose rows carry verdicts of their own.
fn throughput_verdicts(stdout: &str) -> usize {
    before_cpu_table(stdout)
        .lines()
        .filter(|l| l.ends_with("| met |") || l.contains("| met (") || l.contains("**missed**"))
        .count()
}

/// The client CPU table's rows, each with its verdict: as many as the rows whose zklock and
/// some lock peer gave a figure (every row of `rows` that starts with one of them).
fn cpu_verdicts(stdout: &str, rows: &[&str]) -> usize {
    let Some((_, table)) = stdout.split_once(CPU_TABLE) else {
        return 0;
    };
    table
        .lines()
        .take_while(|l| !l.starts_with("Every run") && !l.starts_with("The median run"))
        .filter(|l| rows.iter().any(|r| l.starts_with(&format!("| {r}"))))
        .filter(|l| l.ends_with("| met |") || l.contains("**missed**"))
        .count()
}

/// What `zklock-bench-suite --quick --only <section>` with `extra` arguments prints (stdout:
/// the markdown; stderr: every run's line), which must succeed (it starts the section's
/// servers from the test kit).
fn quick_section(section: &str, extra: &[&std::ffi::OsStr]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_zklock-bench-suite"))
        .args(["--quick", "--only", section])
        .args(extra)
        .output()
        .expect("run zklock-bench-suite");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "zklock-bench-suite --quick --only {section} failed: {stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}");
    (stdout, stderr)
}

fn assert_ops(r: &Report, peer: &str, workload: &str, cycles: f64) {
    assert_eq!(r.get("peer"), Some(peer), "{r}");
    assert_eq!(r.get("workload"), Some(workload), "{r}");
    assert_eq!(r.number("cycles"), Some(cycles), "{r}");
    for field in ["workers", "secs", "ops_per_s", "p50_us", "p99_us"] {
        assert!(r.number(field).is_some(), "{field} missing: {r}");
    }
    if peer != "floor" {
        assert_eq!(r.number("violations"), Some(0.0), "{r}");
    }
}

#[test]
fn every_workload_prints_the_peers_line() {
    let server = ZkServer::start().expect("start ZooKeeper");
    let c = server.connect_string();

    let r = bench(&c, &["--workload", "uncontended", "--cycles", "20"]);
    assert_ops(&r, "zklock", "uncontended", 20.0);
    assert_eq!(r.get("local_queue"), Some("on"));
    assert!(r.number("requests_per_cycle").is_some(), "{r}");

    let r = bench(
        &c,
        &["--workload", "contended", "--workers", "3", "--cycles", "5"],
    );
    assert_ops(&r, "zklock", "contended", 15.0);
    // A mutex hands over: every grant goes to another worker than the last holder, or the
    // same one again; never more changes than cycles, and some wait was measured.
    let changes =
        r.number("holder_changes_per_s").expect("holder changes") * r.number("secs").unwrap();
    assert!(changes > 0.0 && changes <= 15.0 * 1.01, "{r}");
    assert!(r.number("max_wait_us").is_some_and(|w| w > 0.0), "{r}");
    let r = bench(&c, &["--workload", "uncontended", "--cycles", "5"]);
    assert!(r.get("holder_changes_per_s").is_none(), "one worker: {r}");

    let r = bench(
        &c,
        &[
            "--workload",
            "keys",
            "--workers",
            "3",
            "--cycles",
            "5",
            "--keys",
            "4",
        ],
    );
    assert_ops(&r, "zklock", "keys", 15.0);

    for queue in [&[][..], &["--no-local-queue"][..]] {
        let mut args = vec!["--workload", "inproc", "--workers", "8", "--cycles", "5"];
        args.extend_from_slice(queue);
        let r = bench(&c, &args);
        assert_ops(&r, "zklock", "inproc", 40.0);

        let mut args = vec!["--workload", "drain", "--workers", "20"];
        args.extend_from_slice(queue);
        let r = bench(&c, &args);
        assert_eq!(r.get("workload"), Some("drain"), "{r}");
        assert_eq!(r.number("waiters"), Some(20.0), "{r}");
        assert!(r.number("handoffs_per_s").is_some(), "{r}");
        assert_eq!(r.number("violations"), Some(0.0), "{r}");
        let expected = if queue.is_empty() { "on" } else { "off" };
        assert_eq!(r.get("local_queue"), Some(expected), "{r}");
    }

    for peer in ["floor", "zkclient", "naive"] {
        let r = bench(
            &c,
            &[
                "--peer",
                peer,
                "--workload",
                "contended",
                "--workers",
                "2",
                "--cycles",
                "5",
            ],
        );
        assert_ops(&r, peer, "contended", 10.0);
    }
    for peer in ["zkclient", "naive"] {
        let r = bench(
            &c,
            &["--peer", peer, "--workload", "drain", "--workers", "10"],
        );
        assert_eq!(r.get("peer"), Some(peer), "{r}");
        assert_eq!(r.number("violations"), Some(0.0), "{r}");
    }
    let r = bench(
        &c,
        &["--peer", "naive", "--workload", "drain", "--workers", "5"],
    );
    assert!(r.number("events_per_release").is_some(), "{r}");

    for workload in ["mem-waiters", "mem-keys"] {
        let r = bench(&c, &["--workload", workload, "--workers", "50"]);
        assert_eq!(r.number("tasks"), Some(50.0), "{r}");
        assert!(r.number("peak_kb").unwrap_or(0.0) > 0.0, "{r}");
    }
}

#[test]
fn the_floor_has_nothing_to_drain() {
    let out = Command::new(env!("CARGO_BIN_EXE_zklock-bench"))
        .args(["--connect", "127.0.0.1:1", "--workload", "drain"])
        .args(["--peer", "floor", "--session-timeout", "1"])
        .output()
        .expect("run zklock-bench");
    assert!(!out.status.success());
}

/// The memory probes on Redis and PostgreSQL: the line carries the process's connections on
/// the server and the waiters the server shows, which the backends' code bounds (Redis: a
/// command connection and a pub/sub one per manager; PostgreSQL with the local queue off: the
/// listener's and at most 16 holding connections, however many tasks wait; at most 4 in the
/// server's queue).
#[test]
fn the_memory_probes_count_server_connections_on_redis_and_postgres() {
    let redis = zklock_testkit::RedisServer::start().expect("start redis-server");
    let postgres = zklock_testkit::PostgresServer::start().expect("start PostgreSQL");
    let probe = |url: &str, workload: &str, queue: bool| {
        let mut args = vec!["--workload", workload, "--workers", "30"];
        if !queue {
            args.push("--no-local-queue");
        }
        let r = bench(url, &args);
        assert_eq!(r.number("tasks"), Some(30.0), "{r}");
        assert!(r.number("peak_kb").unwrap_or(0.0) > 0.0, "{r}");
        r
    };
    let field = |r: &Report, name: &str| r.number(name).unwrap_or_else(|| panic!("{name}: {r}"));

    // Redis: the holder's process waits in its local queue (no pub/sub connection needed)...
    let r = probe(&redis.url(), "mem-waiters", true);
    assert_eq!(r.get("backend"), Some("redis"), "{r}");
    assert_eq!(field(&r, "server_connections"), 1.0, "{r}");
    assert_eq!(field(&r, "backend_waiters"), 0.0, "{r}");
    // ...or, without it, every task queues on the server, on the same two connections.
    let r = probe(&redis.url(), "mem-waiters", false);
    assert_eq!(field(&r, "server_connections"), 2.0, "{r}");
    assert_eq!(field(&r, "backend_waiters"), 30.0, "{r}");
    let r = probe(&redis.url(), "mem-keys", true);
    assert!(field(&r, "server_connections") <= 2.0, "{r}");

    // PostgreSQL: the listener and the holding connection...
    let r = probe(&postgres.url(), "mem-waiters", true);
    assert_eq!(r.get("backend"), Some("postgres"), "{r}");
    assert_eq!(field(&r, "server_connections"), 2.0, "{r}");
    assert_eq!(field(&r, "backend_waiters"), 0.0, "{r}");
    // ...and without the local queue a connection per waiting task up to the bound of 16 (the
    // 30 tasks need more), 4 of them in the lock queue.
    let r = probe(&postgres.url(), "mem-waiters", false);
    assert_eq!(field(&r, "server_connections"), 17.0, "{r}");
    assert_eq!(field(&r, "backend_waiters"), 4.0, "{r}");
    let r = probe(&postgres.url(), "mem-keys", true);
    assert!(field(&r, "server_connections") >= 2.0, "{r}");
}

/// The soak's bounded sample: a few seconds of mixed traffic with faults on each backend
/// prints its growth figures, and once drained leaves no hold on any server (no ephemeral
/// node, no lock key or shared set, no advisory lock). No figure is asserted.
#[test]
fn the_soak_prints_growth_and_leaves_no_hold_once_drained() {
    let out = Command::new(env!("CARGO_BIN_EXE_zklock-soak"))
        .args(["--seconds", "6", "--sample-secs", "1", "--fault-secs", "3"])
        .output()
        .expect("run zklock-soak");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "zklock-soak failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Vec<std::collections::HashMap<&str, &str>> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("soak-result "))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|f| f.split_once('='))
                .collect()
        })
        .collect();
    assert_eq!(results.len(), 3, "one result per backend: {stdout}");
    for (r, held) in results
        .iter()
        .zip(["drained_ephemerals", "drained_held", "drained_locks"])
    {
        let number = |k: &str| r.get(k).and_then(|v| v.parse::<f64>().ok());
        assert!(number("cycles").is_some_and(|c| c > 0.0), "{r:?}");
        assert!(number("rss_mb_per_million").is_some(), "{r:?}");
        assert!(number("longest_cycle_ms").is_some(), "{r:?}");
        assert_eq!(number(held), Some(0.0), "a hold left once drained: {r:?}");
    }
}

/// The suite's etcd section in quick mode (`zklock-bench-suite --quick --only etcd --charts
/// DIR`, which starts the test kit's etcd): every row runs for zklock, the floor and etcd's
/// lock service (the floor sits out the inproc row), every run prints its line with no
/// exclusion violation, and every row with a target prints its verdict; its throughput and
/// contended latency charts are written as well-formed SVG and linked under the section. No
/// figure is asserted.
#[test]
fn the_etcd_section_runs_every_peer_in_quick_mode() {
    let charts = tempfile::tempdir().expect("a directory for the charts");
    let (stdout, stderr) = quick_section("etcd", &["--charts".as_ref(), charts.path().as_os_str()]);
    let runs: Vec<Report> = stdout.lines().filter_map(parse_line).collect();
    for (workload, peers) in [
        ("uncontended", &["zklock", "floor", "lockservice"][..]),
        ("contended", &["zklock", "floor", "lockservice"][..]),
        ("keys", &["zklock", "floor", "lockservice"][..]),
        ("inproc", &["zklock", "lockservice"][..]),
    ] {
        for peer in peers {
            let r = runs
                .iter()
                .find(|r| r.get("peer") == Some(peer) && r.get("workload") == Some(workload))
                .unwrap_or_else(|| panic!("no {peer} {workload} run in:\n{stdout}\n{stderr}"));
            assert_eq!(r.get("backend"), Some("etcd"), "{r}");
            assert_eq!(r.number("violations"), Some(0.0), "{r}");
            for field in ["ops_per_s", "requests_per_cycle", "writes_per_cycle"] {
                assert!(r.number(field).is_some(), "{field} missing: {r}");
            }
        }
    }
    assert_eq!(runs.len(), 11, "{stdout}");
    assert!(
        !stdout.contains("failed") && !stdout.contains("timeout"),
        "{stdout}"
    );
    // The three rows with a target print "met" or "missed", whatever the figures.
    assert_eq!(throughput_verdicts(&stdout), 3, "{stdout}");
    // Every row's client CPU is judged against the cheapest lock peer's.
    assert_eq!(
        cpu_verdicts(&stdout, &["uncontended", "contended", "keys"]),
        3,
        "{stdout}"
    );

    for (file, alt) in [
        ("etcd-throughput.svg", "etcd throughput"),
        ("etcd-contended-latency.svg", "etcd contended latency"),
    ] {
        let path = charts.path().join(file);
        let svg = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (stderr: {stderr})", path.display()));
        assert_well_formed_svg(&svg, file);
        assert!(
            svg.contains("zklock (etcd)"),
            "{file} has no zklock label: {svg}"
        );
        assert!(
            stdout.contains(&format!("![{alt}]({})", path.display())),
            "no link to {file}: {stdout}"
        );
    }
    // No chart without figures: the etcd section has no memory rows.
    assert!(!charts.path().join("etcd-memory.svg").exists());
}

/// Checks that `svg` is a non-empty SVG document whose tags nest (every element closed, in
/// order, under one `<svg>` root) and that it has text.
fn assert_well_formed_svg(svg: &str, name: &str) {
    let body = svg.trim();
    assert!(body.starts_with("<svg"), "{name} is no SVG: {svg}");
    assert!(body.contains("<text"), "{name} has no text: {svg}");
    let mut open: Vec<&str> = vec![];
    let mut rest = body;
    let mut elements = 0;
    while let Some(start) = rest.find('<') {
        let end = rest[start..]
            .find('>')
            .unwrap_or_else(|| panic!("{name}: an unclosed tag: {}", &rest[start..]));
        let tag = &rest[start + 1..start + end];
        rest = &rest[start + end + 1..];
        if tag.starts_with('?') || tag.starts_with('!') {
            continue;
        }
        if let Some(closing) = tag.strip_prefix('/') {
            assert_eq!(
                open.pop(),
                Some(closing.trim()),
                "{name}: </{closing}> out of order"
            );
            continue;
        }
        let element = tag.split_whitespace().next().unwrap_or_default();
        assert!(
            !element.is_empty() && element.chars().all(|c| c.is_ascii_alphanumeric()),
            "{name}: a bad tag <{tag}>"
        );
        elements += 1;
        if open.is_empty() {
            assert!(
                elements == 1 && element == "svg",
                "{name}: more than one root"
            );
        }
        if !tag.ends_with('/') {
            open.push(element);
        }
    }
    assert!(open.is_empty(), "{name}: unclosed {open:?}");
    assert!(rest.trim().is_empty(), "{name}: text after the root");
    assert!(elements > 10, "{name}: nearly empty: {svg}");
}

/// The suite's Redis under Sentinel section in quick mode (`zklock-bench-suite --quick --only
/// sentinel`, which starts the test kit's primary, 2 replicas and 3 Sentinels): every row runs
/// for zklock through the Sentinels (with and without `replica_acks 1`), zklock on the
/// primary's address and rslock on it, with no exclusion violation, and every row prints its
/// verdict. No figure is asserted.
#[test]
fn the_sentinel_section_runs_every_peer_in_quick_mode() {
    let (stdout, stderr) = quick_section("sentinel", &[]);
    let runs: Vec<Report> = stdout.lines().filter_map(parse_line).collect();
    for workload in ["uncontended", "contended", "keys"] {
        for (peer, backend) in [
            ("zklock", "redis-sentinel"),
            ("zklock", "redis"),
            ("rslock", "redis"),
        ] {
            let r = runs
                .iter()
                .find(|r| {
                    r.get("peer") == Some(peer)
                        && r.get("workload") == Some(workload)
                        && r.get("backend") == Some(backend)
                })
                .unwrap_or_else(|| {
                    panic!("no {peer} {workload} run on {backend} in:\n{stdout}\n{stderr}")
                });
            assert_eq!(r.number("violations"), Some(0.0), "{r}");
            for field in ["ops_per_s", "round_trips_per_cycle", "commands_per_cycle"] {
                assert!(r.number(field).is_some(), "{field} missing: {r}");
            }
        }
    }
    // And zklock through the Sentinels with one replica's acknowledgement.
    for workload in ["uncontended", "contended", "keys"] {
        let acked = runs
            .iter()
            .find(|r| {
                r.get("workload") == Some(workload)
                    && r.get("backend") == Some("redis-sentinel")
                    && r.get("replica_acks") == Some("1")
            })
            .unwrap_or_else(|| panic!("no {workload} run with replica_acks=1 in:\n{stdout}"));
        assert_eq!(acked.number("violations"), Some(0.0), "{acked}");
    }
    assert_eq!(runs.len(), 12, "{stdout}");
    assert!(
        !stdout.contains("FAILED") && !stdout.contains("timeout"),
        "{stdout}"
    );
    assert_eq!(throughput_verdicts(&stdout), 3, "{stdout}");
    // Every row's client CPU is judged against the cheapest lock peer's.
    assert_eq!(
        cpu_verdicts(&stdout, &["uncontended", "contended", "keys"]),
        3,
        "{stdout}"
    );
}

/// The suite's Redis Cluster section in quick mode (`zklock-bench-suite --quick --only
/// cluster`, which starts the test kit's Cluster of 3 primaries with a replica each): every row
/// runs for zklock on `redis+cluster://` and for rslock routed by slot to a manager per
/// primary, with no exclusion violation; the keys row's keys reach every primary; every row
/// prints its verdict. No figure is asserted.
#[test]
fn the_cluster_section_runs_every_peer_in_quick_mode() {
    let (stdout, stderr) = quick_section("cluster", &[]);
    let runs: Vec<Report> = stdout.lines().filter_map(parse_line).collect();
    for workload in ["uncontended", "contended", "keys"] {
        for peer in ["zklock", "rslock"] {
            let r = runs
                .iter()
                .find(|r| r.get("peer") == Some(peer) && r.get("workload") == Some(workload))
                .unwrap_or_else(|| panic!("no {peer} {workload} run in:\n{stdout}\n{stderr}"));
            assert_eq!(r.get("backend"), Some("redis-cluster"), "{r}");
            assert_eq!(r.number("violations"), Some(0.0), "{r}");
            for field in ["ops_per_s", "round_trips_per_cycle", "commands_per_cycle"] {
                assert!(r.number(field).is_some(), "{field} missing: {r}");
            }
            assert_eq!(r.number("primaries"), Some(3.0), "{r}");
            if workload == "keys" {
                let spread: Vec<usize> = r
                    .get("keys_per_primary")
                    .unwrap_or_default()
                    .split('/')
                    .filter_map(|n| n.parse().ok())
                    .collect();
                assert_eq!(spread.len(), 3, "{r}");
                assert_eq!(spread.iter().sum::<usize>(), 64, "{r}");
                assert!(!spread.contains(&0), "a primary without a key: {r}");
            }
        }
    }
    assert_eq!(runs.len(), 6, "{stdout}");
    assert!(
        !stdout.contains("FAILED") && !stdout.contains("timeout"),
        "{stdout}"
    );
    assert!(stdout.contains("`node_for_key`"), "{stdout}");
    assert_eq!(throughput_verdicts(&stdout), 3, "{stdout}");
    // Every row's client CPU is judged against the cheapest lock peer's.
    assert_eq!(
        cpu_verdicts(&stdout, &["uncontended", "contended", "keys"]),
        3,
        "{stdout}"
    );
}

/// The suite's Redis and PostgreSQL sections in quick mode (`zklock-bench-suite --quick --only
/// redis`, `--only postgres`, each on a server of the test kit): every throughput row runs for
/// every peer (Redis: zklock, the floor, rslock; PostgreSQL: zklock, the floor), the keys,
/// inproc and drain rows among them, with no exclusion violation and the server's figures per
/// cycle, and those three rows print their verdicts. No figure is asserted.
#[test]
fn the_redis_and_postgres_sections_run_every_row_in_quick_mode() {
    for (section, peers, per_cycle, rows) in [
        (
            "redis",
            &["zklock", "floor", "rslock"][..],
            "round_trips_per_cycle",
            7,
        ),
        (
            "postgres",
            &["zklock", "floor"][..],
            "wal_bytes_per_cycle",
            7,
        ),
    ] {
        let (stdout, stderr) = quick_section(section, &[]);
        let runs: Vec<Report> = stdout
            .lines()
            .filter_map(parse_line)
            .filter(|r| !r.get("workload").unwrap_or_default().starts_with("mem-"))
            .collect();
        for workload in ["keys", "inproc", "drain"] {
            for peer in peers {
                let r = runs
                    .iter()
                    .find(|r| r.get("peer") == Some(peer) && r.get("workload") == Some(workload))
                    .unwrap_or_else(|| panic!("no {peer} {workload} run in:\n{stdout}\n{stderr}"));
                assert_eq!(r.get("backend"), Some(section), "{r}");
                if *peer != "floor" || workload == "drain" {
                    assert_eq!(r.number("violations"), Some(0.0), "{r}");
                }
                for field in [per_cycle, "p50_us", "p99_us"] {
                    assert!(r.number(field).is_some(), "{field} missing: {r}");
                }
            }
        }
        assert_eq!(runs.len(), rows * peers.len(), "{stdout}");
        assert!(
            !stdout.contains("FAILED") && !stdout.contains("timeout"),
            "{stdout}"
        );
        let verdicts = before_cpu_table(&stdout)
            .lines()
            .filter(|l| {
                ["| keys", "| inproc", "| drain"]
                    .iter()
                    .any(|p| l.starts_with(p))
            })
            .filter(|l| l.contains("| met (") || l.contains("**missed**"))
            .count();
        assert_eq!(verdicts, 3, "{stdout}");
    }
}

/// The suite's TLS section in quick mode (`zklock-bench-suite --quick --only tls`, which starts
/// the test kit's servers with and without TLS): on every backend, zklock runs uncontended and
/// contended in plaintext and with mutual TLS, with no exclusion violation, and every row of
/// the table has both figures and their ratio. No figure is asserted.
#[test]
fn the_tls_section_runs_every_backend_in_quick_mode() {
    let (stdout, stderr) = quick_section("tls", &[]);
    let runs: Vec<Report> = stdout.lines().filter_map(parse_line).collect();
    assert_eq!(runs.len(), 16, "{stdout}\n{stderr}");
    for backend in [None, Some("redis"), Some("postgres"), Some("etcd")] {
        for workload in ["uncontended", "contended"] {
            for tls in [None, Some("on")] {
                let r = runs
                    .iter()
                    .find(|r| {
                        r.get("backend") == backend
                            && r.get("workload") == Some(workload)
                            && r.get("tls") == tls
                    })
                    .unwrap_or_else(|| {
                        panic!("no {backend:?} {workload} run with tls {tls:?} in:\n{stdout}")
                    });
                assert_ops(
                    r,
                    "zklock",
                    workload,
                    if workload == "contended" { 24.0 } else { 20.0 },
                );
                assert!(r.number("client_cpu_us_per_cycle").is_some(), "{r}");
            }
        }
    }
    let rows = stdout
        .lines()
        .filter(|l| l.contains("| uncontended (") || l.contains("| contended ("))
        .collect::<Vec<_>>();
    assert_eq!(rows.len(), 8, "{stdout}");
    for row in rows {
        assert!(row.contains("/s | ") && row.contains("| ×"), "{row}");
    }
    assert!(
        !stdout.contains("failed") && !stdout.contains("timeout"),
        "{stdout}"
    );
}

/// The suite's MySQL section in quick mode (`zklock-bench-suite --quick --only mysql`, on a
/// durable MariaDB of the test kit): every throughput row runs for zklock and the floor (zklock
/// also without fencing tokens), with no exclusion violation (the floor's user locks exclude
/// too) and the server's figures per cycle; the memory row counts the process's sessions on
/// the server. No figure is asserted.
#[test]
fn the_mysql_section_runs_every_row_in_quick_mode() {
    let (stdout, stderr) = quick_section("mysql", &[]);
    let runs: Vec<Report> = stdout.lines().filter_map(parse_line).collect();
    let (memory, ops): (Vec<&Report>, Vec<&Report>) = runs
        .iter()
        .partition(|r| r.get("workload").unwrap_or_default().starts_with("mem-"));
    for workload in ["uncontended", "contended", "keys", "inproc", "drain"] {
        for peer in ["zklock", "floor"] {
            let r = ops
                .iter()
                .find(|r| r.get("peer") == Some(peer) && r.get("workload") == Some(workload))
                .unwrap_or_else(|| panic!("no {peer} {workload} run in:\n{stdout}\n{stderr}"));
            assert_eq!(r.get("backend"), Some("mysql"), "{r}");
            assert_eq!(r.number("violations"), Some(0.0), "{r}");
            for field in [
                "redo_bytes_per_cycle",
                "fsyncs_per_cycle",
                "statements_per_cycle",
                "p50_us",
                "p99_us",
            ] {
                assert!(r.number(field).is_some(), "{field} missing: {r}");
            }
        }
    }
    assert_eq!(ops.len(), 7 * 2, "{stdout}");
    let untokened = ops
        .iter()
        .filter(|r| r.get("fencing_tokens") == Some("off"))
        .count();
    assert_eq!(untokened, 2, "{stdout}");
    assert_eq!(memory.len(), 1, "{stdout}");
    assert_eq!(memory[0].get("backend"), Some("mysql"), "{}", memory[0]);
    assert!(
        memory[0]
            .number("server_connections")
            .is_some_and(|n| n >= 1.0),
        "{}",
        memory[0]
    );
    assert!(
        !stdout.contains("FAILED") && !stdout.contains("failed") && !stdout.contains("timeout"),
        "{stdout}"
    );
}

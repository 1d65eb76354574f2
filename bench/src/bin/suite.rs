//! `zklock-bench-suite`: every workload for zklock and its peers, side by side on one ZooKeeper,
//! printed as markdown with zklock's ratio to each peer and each row's target ("met" or
//! "missed" from the ratios of the same run); then zklock's Redis backend beside rslock and a
//! bare `SET NX PX` floor on one Redis; then zklock's PostgreSQL backend beside a bare
//! `pg_advisory_lock` floor on a durable PostgreSQL, each with its targets.
//!
//! ```text
//! zklock-bench-suite [--connect HOSTS] [--quick] [--no-fsync] [--out FILE]
//!                    [--only zookeeper|redis|postgres]
//! ```
//!
//! Without `--connect` it starts one ZooKeeper through the test kit (a real server on a free
//! loopback port, stopped at exit) that fsyncs its log as production servers do (`--no-fsync`
//! for quick runs). Every run is a child process: `zklock-bench` (next to this
//! binary) for zklock, the floor, zookeeper-client's recipe and the naive herd;
//! the test kit's `peers/run` for Curator and kazoo; `java CuratorMem` (this crate's `java/`) for
//! Curator's memory.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use zklock_bench::{parse_line, Report};

#[path = "suite/postgres.rs"]
mod postgres;

/// Runs every benchmark and prints the markdown tables.
#[derive(Parser, Debug)]
#[command(name = "zklock-bench-suite")]
struct Cli {
    /// Use this ZooKeeper instead of starting one.
    #[arg(long)]
    connect: Option<String>,
    /// Tiny sizes: checks that every peer runs, figures mean nothing.
    #[arg(long)]
    quick: bool,
    /// Also run the slow probes no target needs: zklock's memory with 10,000 waiters and the
    /// local queue off (each waiter lists 10,000 siblings: about a minute).
    #[arg(long)]
    extended: bool,
    /// Also write the markdown to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Seconds one run may take before it is killed (its cell then says "timeout").
    #[arg(long, default_value_t = 300)]
    run_timeout: u64,
    /// Only start the server, print its connect string, and serve until stdin closes (for
    /// running `zklock-bench` and `peers/run` by hand).
    #[arg(long)]
    serve: bool,
    /// ZooKeeper without fsync (`forceSync=no`): quick runs only. By default the suite's server
    /// fsyncs its log before it acknowledges a write, as production servers do.
    #[arg(long)]
    no_fsync: bool,
    /// Run one backend's section only: `zookeeper`, `redis` or `postgres`.
    #[arg(long)]
    only: Option<Section>,
}

/// A section of the suite: the backend its rows run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Section {
    Zookeeper,
    Redis,
    Postgres,
}

/// The columns of the Redis table, in order: (column key, heading).
const REDIS_COLUMNS: [(&str, &str); 3] = [
    ("zklock", "zklock (Redis)"),
    ("floor", "floor: SET NX PX + Lua DEL"),
    ("rslock", "rslock (Redlock, 1 server)"),
];

/// The columns of the main table, in order: (column key, heading).
const COLUMNS: [(&str, &str); 6] = [
    ("zklock", "zklock"),
    ("floor", "floor"),
    ("zkclient", "zookeeper-client"),
    ("curator", "Curator"),
    ("kazoo", "kazoo"),
    ("naive", "naive (herd)"),
];

#[derive(Clone, Copy, PartialEq)]
enum Metric {
    /// ops_per_s, with p50/p99.
    Ops,
    /// handoffs_per_s.
    Drain,
    /// peak_kb (lower is better).
    Memory,
}

/// One way of running one peer on one row.
#[derive(Clone)]
enum Runner {
    /// `zklock-bench --peer <peer>`, optionally `--no-local-queue`.
    Ours { peer: &'static str, no_queue: bool },
    /// The test kit's `peers/run <curator|kazoo>`.
    Peer(&'static str),
    /// `java CuratorMem`.
    CuratorMem,
}

struct Row {
    title: String,
    workload: &'static str,
    workers: usize,
    cycles: usize,
    keys: usize,
    metric: Metric,
    cells: Vec<(&'static str, Runner)>,
    target: Option<Target>,
}

#[derive(Clone, Copy)]
enum Target {
    /// At least `curator`x Curator, and (if set) at least `floor`x the floor and `zkclient`x
    /// zookeeper-client's recipe.
    Ratios {
        curator: f64,
        floor: Option<f64>,
        zkclient: Option<f64>,
    },
    /// A peak of at most `mb` MB (memory rows).
    PeakMb { mb: f64 },
    /// Redis: at least `rslock`x rslock, and (if set) at least `floor`x the floor.
    Redis { rslock: f64, floor: Option<f64> },
    /// At least `floor`x the floor (the linger's re-acquire).
    Floor { floor: f64 },
}

struct Sizes {
    uncontended: usize,
    contended: usize,
    keys: usize,
    inproc: usize,
    drain_small: usize,
    drain_large: usize,
    herd: usize,
    memory: usize,
    /// Also the slow probes that no target needs (zklock's memory with the local queue off).
    extended: bool,
    /// Samples of the `handover` run (each three acquires).
    handover: usize,
    /// Redis rows: cycles of the uncontended run, and of each of the 8 contended workers.
    redis_uncontended: usize,
    redis_contended: usize,
}

/// The Redis rows: zklock, the floor and rslock, uncontended and contended; and the linger's
/// re-acquire.
fn redis_rows(sizes: &Sizes) -> Vec<Row> {
    let ours = |peer| Runner::Ours {
        peer,
        no_queue: false,
    };
    let cells = || {
        vec![
            ("zklock", ours("zklock")),
            ("floor", ours("floor")),
            ("rslock", ours("rslock")),
        ]
    };
    vec![
        Row {
            title: "uncontended (1 connection, 1 key)".into(),
            workload: "uncontended",
            workers: 1,
            cycles: sizes.redis_uncontended,
            keys: 1,
            metric: Metric::Ops,
            cells: cells(),
            target: Some(Target::Redis {
                rslock: 1.5,
                floor: Some(0.85),
            }),
        },
        Row {
            title: "contended (8 connections, 1 key)".into(),
            workload: "contended",
            workers: 8,
            cycles: sizes.redis_contended,
            keys: 1,
            metric: Metric::Ops,
            cells: cells(),
            target: Some(Target::Redis {
                rslock: 1.5,
                floor: None,
            }),
        },
        Row {
            title: "reacquire (1 connection, 1 key, linger 1 s)".into(),
            workload: "reacquire",
            workers: 1,
            cycles: sizes.redis_uncontended,
            keys: 1,
            metric: Metric::Ops,
            // The peers have no linger: they run it as `uncontended`.
            cells: cells(),
            // As on ZooKeeper: re-acquire without a round trip.
            target: Some(Target::Floor { floor: 10.0 }),
        },
    ]
}

fn rows(sizes: &Sizes) -> Vec<Row> {
    use Runner::*;
    let zk = Ours {
        peer: "zklock",
        no_queue: false,
    };
    let zk_noq = Ours {
        peer: "zklock",
        no_queue: true,
    };
    let ours = |peer| Ours {
        peer,
        no_queue: false,
    };
    let every = |zk: &Runner| {
        vec![
            ("zklock", zk.clone()),
            ("floor", ours("floor")),
            ("zkclient", ours("zkclient")),
            ("curator", Peer("curator")),
            ("kazoo", Peer("kazoo")),
            ("naive", ours("naive")),
        ]
    };
    let mut rows = vec![
        Row {
            title: "uncontended (1 session, 1 key)".into(),
            workload: "uncontended",
            workers: 1,
            cycles: sizes.uncontended,
            keys: 1,
            metric: Metric::Ops,
            cells: every(&zk),
            target: Some(Target::Ratios {
                curator: 2.0,
                floor: Some(0.9),
                zkclient: None,
            }),
        },
        Row {
            title: "contended (8 sessions, 1 key)".into(),
            workload: "contended",
            workers: 8,
            cycles: sizes.contended,
            keys: 1,
            metric: Metric::Ops,
            cells: every(&zk),
            target: Some(Target::Ratios {
                curator: 2.0,
                floor: None,
                zkclient: Some(1.3),
            }),
        },
        Row {
            title: "keys (8 sessions, 64 keys)".into(),
            workload: "keys",
            workers: 8,
            cycles: sizes.keys,
            keys: 64,
            metric: Metric::Ops,
            cells: every(&zk),
            target: Some(Target::Ratios {
                curator: 2.5,
                floor: Some(0.85),
                zkclient: None,
            }),
        },
        Row {
            title: "inproc (64 tasks, 1 session, 1 key)".into(),
            workload: "inproc",
            workers: 64,
            cycles: sizes.inproc,
            keys: 1,
            metric: Metric::Ops,
            // kazoo_bench has no shared-client mode; the naive herd with 64 tasks on one
            // session costs O(tasks) requests per handoff (see the drain rows) and minutes.
            cells: every(&zk)
                .into_iter()
                .filter(|(c, _)| *c != "kazoo" && *c != "naive")
                .collect(),
            target: Some(Target::Ratios {
                curator: 100.0,
                floor: None,
                zkclient: None,
            }),
        },
        Row {
            title: "reacquire (1 session, 1 key, linger 1 s)".into(),
            workload: "reacquire",
            workers: 1,
            cycles: sizes.uncontended,
            keys: 1,
            metric: Metric::Ops,
            // The peers have no linger: they run it as `uncontended`.
            cells: vec![("zklock", zk.clone()), ("floor", ours("floor"))],
            // Re-acquire without a round trip.
            target: Some(Target::Floor { floor: 10.0 }),
        },
    ];
    rows.push(Row {
        title: "inproc (64 tasks), local queue off".into(),
        workload: "inproc",
        workers: 64,
        cycles: sizes.inproc,
        keys: 1,
        metric: Metric::Ops,
        // The peers' figures are those of the row above (they have no local queue).
        cells: vec![("zklock", zk_noq.clone())],
        target: None,
    });
    rows.push(Row {
        title: format!("drain {} waiters (herd baseline)", sizes.herd),
        workload: "drain",
        workers: sizes.herd,
        cycles: 0,
        keys: 1,
        metric: Metric::Drain,
        cells: vec![
            ("zklock", zk_noq.clone()),
            ("zkclient", ours("zkclient")),
            ("curator", Peer("curator")),
            ("naive", ours("naive")),
        ],
        target: None,
    });
    rows.push(Row {
        title: format!("drain {} waiters, local queue off", sizes.drain_small),
        workload: "drain",
        workers: sizes.drain_small,
        cycles: 0,
        keys: 1,
        metric: Metric::Drain,
        cells: vec![
            ("zklock", zk_noq.clone()),
            ("zkclient", ours("zkclient")),
            ("curator", Peer("curator")),
        ],
        target: None,
    });
    rows.push(Row {
        title: format!("drain {} waiters, local queue off", sizes.drain_large),
        workload: "drain",
        workers: sizes.drain_large,
        cycles: 0,
        keys: 1,
        metric: Metric::Drain,
        cells: vec![("zklock", zk_noq.clone()), ("curator", Peer("curator"))],
        target: Some(Target::Ratios {
            curator: 10.0,
            floor: None,
            zkclient: None,
        }),
    });
    rows.push(Row {
        title: format!("drain {} waiters, local queue on", sizes.drain_large),
        workload: "drain",
        workers: sizes.drain_large,
        cycles: 0,
        keys: 1,
        metric: Metric::Drain,
        cells: vec![("zklock", zk.clone())],
        target: None,
    });
    for workload in ["mem-waiters", "mem-keys"] {
        let mut cells = vec![("zklock", zk.clone()), ("curator", CuratorMem)];
        if workload == "mem-waiters" && sizes.extended {
            cells.insert(1, ("zklock-noq", zk_noq.clone()));
        }
        rows.push(Row {
            title: format!(
                "{workload}: {} {}",
                sizes.memory,
                if workload == "mem-waiters" {
                    "tasks waiting on one key"
                } else {
                    "distinct keys held"
                }
            ),
            workload,
            workers: sizes.memory,
            cycles: 0,
            keys: 1,
            metric: Metric::Memory,
            cells,
            // Keep 10,000 waiters in about 30 MB (the full size only).
            target: (workload == "mem-waiters" && sizes.memory >= 10_000)
                .then_some(Target::PeakMb { mb: 33.0 }),
        });
    }
    rows
}

struct Env {
    connect: String,
    bench: PathBuf,
    peers_run: PathBuf,
    java_classes: Option<PathBuf>,
    timeout: Duration,
    scratch: tempfile::TempDir,
}

/// What one run gave: its line, or why there is none.
type Outcome = Result<Report, String>;

impl Env {
    fn command(&self, row: &Row, runner: &Runner) -> Result<Command, String> {
        let (n, m) = (row.workers.to_string(), row.cycles.to_string());
        Ok(match runner {
            Runner::Ours { peer, no_queue } => {
                let mut cmd = Command::new(&self.bench);
                cmd.args(["--connect", &self.connect, "--workload", row.workload])
                    .args(["--workers", &n, "--cycles", &m, "--peer", peer])
                    .args(["--keys", &row.keys.to_string()]);
                if *no_queue {
                    cmd.arg("--no-local-queue");
                }
                cmd
            }
            Runner::Peer(which) => {
                let mut cmd = Command::new(&self.peers_run);
                cmd.args([which, self.connect.as_str(), row.workload, &n, &m]);
                if row.workload == "keys" {
                    cmd.arg(row.keys.to_string());
                }
                cmd
            }
            Runner::CuratorMem => {
                let classes = self
                    .java_classes
                    .as_ref()
                    .ok_or("CuratorMem did not compile")?;
                let mut cmd = Command::new("java");
                cmd.arg("-Xss256k")
                    .arg("-cp")
                    .arg(format!("{CURATOR_CP}:{}", classes.display()))
                    .args(["CuratorMem", &self.connect, row.workload, &n]);
                cmd
            }
        })
    }

    fn run(&self, row: &Row, runner: &Runner) -> Outcome {
        let mut cmd = self.command(row, runner)?;
        let out_path = self.scratch.path().join("stdout");
        let err_path = self.scratch.path().join("stderr");
        let out = std::fs::File::create(&out_path).map_err(|e| e.to_string())?;
        let err = std::fs::File::create(&err_path).map_err(|e| e.to_string())?;
        let shown = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("{shown}: {e}"))?;
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err("timeout".into());
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => return Err(e.to_string()),
            }
        };
        let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        match stdout.lines().rev().find_map(parse_line) {
            Some(report) if status.success() => Ok(report),
            _ => {
                let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
                Err(format!(
                    "{status}: {}",
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                ))
            }
        }
    }
}

const CURATOR_CP: &str = "/usr/share/java/curator-recipes.jar:/usr/share/java/curator-framework.jar:/usr/share/java/curator-client.jar:/usr/share/java/zookeeper.jar:/usr/share/java/zookeeper-jute.jar:/usr/share/java/guava.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/netty-all.jar";

fn compile_curator_mem(into: &Path) -> Result<PathBuf, String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("java/CuratorMem.java");
    let classes = into.join("classes");
    std::fs::create_dir_all(&classes).map_err(|e| e.to_string())?;
    let out = Command::new("javac")
        .arg("-d")
        .arg(&classes)
        .args(["-cp", CURATOR_CP])
        .arg(&source)
        .output()
        .map_err(|e| format!("javac: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(classes)
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if cli.serve {
        return match serve(!cli.no_fsync) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("zklock-bench-suite: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    match suite(&cli) {
        Ok(markdown) => {
            print!("{markdown}");
            if let Some(path) = &cli.out {
                if let Err(e) = std::fs::write(path, &markdown) {
                    eprintln!("zklock-bench-suite: cannot write {}: {e}", path.display());
                    return std::process::ExitCode::FAILURE;
                }
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("zklock-bench-suite: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Serves one ZooKeeper until stdin closes.
fn serve(fsync: bool) -> Result<(), String> {
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

fn suite(cli: &Cli) -> Result<String, String> {
    let started = Instant::now();
    let sizes = if cli.quick {
        Sizes {
            uncontended: 50,
            handover: 5,
            contended: 10,
            keys: 10,
            inproc: 2,
            drain_small: 20,
            drain_large: 40,
            herd: 10,
            memory: 100,
            extended: cli.extended,
            redis_uncontended: 50,
            redis_contended: 5,
        }
    } else {
        Sizes {
            uncontended: 2000,
            handover: 100,
            contended: 250,
            keys: 250,
            inproc: 40,
            drain_small: 1000,
            drain_large: 8000,
            herd: 200,
            memory: 10_000,
            extended: cli.extended,
            redis_uncontended: 20_000,
            redis_contended: 500,
        }
    };
    let mut markdown = String::new();
    let runs = |section| cli.only.is_none_or(|only| only == section);
    if runs(Section::Zookeeper) {
        markdown.push_str(&zookeeper_section(cli, &sizes, started)?);
    }
    if runs(Section::Redis) {
        if !markdown.is_empty() {
            markdown.push_str("\n## Redis\n\n");
        }
        markdown.push_str(&redis_section(cli, &sizes)?);
    }
    if runs(Section::Postgres) {
        if !markdown.is_empty() {
            markdown.push_str("\n## PostgreSQL\n\n");
        }
        markdown.push_str(&postgres::section(cli)?);
    }
    Ok(markdown)
}

/// The ZooKeeper rows, on the test kit's ZooKeeper (or `--connect`'s).
fn zookeeper_section(cli: &Cli, sizes: &Sizes, started: Instant) -> Result<String, String> {
    let server = match &cli.connect {
        Some(_) => None,
        None => {
            eprintln!(
                "starting ZooKeeper (test kit, {})",
                fsync_note(!cli.no_fsync)
            );
            Some(bench_server(!cli.no_fsync)?)
        }
    };
    let connect = match (&cli.connect, &server) {
        (Some(c), _) => c.clone(),
        (None, Some(s)) => s.connect_string(),
        (None, None) => unreachable!(),
    };
    let server_version = server
        .as_ref()
        .and_then(|s| s.four_letter("srvr").ok())
        .and_then(|srvr| {
            srvr.lines()
                .find_map(|l| l.strip_prefix("Zookeeper version: "))
                .map(release_of)
        })
        .map(|v| format!("{v} ({})", fsync_note(!cli.no_fsync)))
        .unwrap_or_else(|| "unknown (external server)".into());
    let bench = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .with_file_name("zklock-bench");
    if !bench.exists() {
        return Err(format!("{} is missing: build the crate", bench.display()));
    }
    let peers_run = zklock_testkit::peers_dir().join("run");
    let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut env = Env {
        connect,
        bench,
        peers_run,
        java_classes: None,
        timeout: Duration::from_secs(cli.run_timeout),
        scratch,
    };
    let rows = rows(sizes);

    // Warm the server's JIT with a throwaway run, so that the first row is not penalized.
    let warm = Row {
        title: "warm-up".into(),
        workload: "contended",
        workers: 4,
        cycles: if cli.quick { 10 } else { 1000 },
        keys: 1,
        metric: Metric::Ops,
        cells: vec![],
        target: None,
    };
    let _ = env.run(
        &warm,
        &Runner::Ours {
            peer: "floor",
            no_queue: false,
        },
    );

    let results = run_rows(&mut env, &rows);
    let handover = Row {
        title: "first other process on a lingering key".into(),
        workload: "handover",
        workers: 1,
        cycles: sizes.handover,
        keys: 1,
        metric: Metric::Ops,
        cells: vec![],
        target: None,
    };
    let zk = Runner::Ours {
        peer: "zklock",
        no_queue: false,
    };
    let t0 = Instant::now();
    let handover = env.run(&handover, &zk);
    match &handover {
        Ok(report) => eprintln!("[{:>5.1}s] {report}", t0.elapsed().as_secs_f64()),
        Err(e) => eprintln!(
            "[{:>5.1}s] handover: FAILED {e}",
            t0.elapsed().as_secs_f64()
        ),
    }
    drop(server);
    let mut md = render(
        &rows,
        &results,
        &server_version,
        started.elapsed(),
        cli.quick,
    );
    render_handover(&mut md, &handover);
    Ok(md)
}

/// The linger's cost to the first other process (target: its wait ≤ 1.5× a normal
/// handoff's).
fn render_handover(md: &mut String, outcome: &Outcome) {
    let _ = writeln!(
        md,
        "\nThe linger's cost to the first other process (`handover`: a second session's \
         acquire while the first session's node lingers, from its call to its grant; a normal \
         handoff's wait, from the holder's release call to the queued waiter's grant; an \
         acquire of a free key), p50 / p99 in µs:\n"
    );
    md.push_str("| lingering key: wait | normal handoff: wait | free key: acquire | target | |\n");
    md.push_str("|---|---|---|---|---|\n");
    let report = match outcome {
        Ok(report) => report,
        Err(e) => {
            let _ = writeln!(md, "| failed: {e} | | | ≤ 1.5× a handoff | no figure |");
            return;
        }
    };
    let pair = |name: &str| {
        format!(
            "{} / {}",
            report.get(&format!("{name}_p50_us")).unwrap_or("?"),
            report.get(&format!("{name}_p99_us")).unwrap_or("?")
        )
    };
    let ratio = report.number("wait_ratio");
    let met = match ratio {
        Some(r) if r <= 1.5 => format!("met (×{r:.2})"),
        Some(r) => format!("**missed** (×{r:.2})"),
        None => "no figure".into(),
    };
    let _ = writeln!(
        md,
        "| {} | {} | {} (lingering ×{}) | ≤ 1.5× a handoff | {met} |",
        pair("linger_wait"),
        pair("handoff_wait"),
        pair("free_acquire"),
        report.get("free_ratio").unwrap_or("?"),
    );
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

/// Runs every cell of `rows`, one at a time, printing each line to stderr.
fn run_rows(env: &mut Env, rows: &[Row]) -> Vec<BTreeMap<&'static str, Outcome>> {
    let mut results: Vec<BTreeMap<&'static str, Outcome>> = Vec::new();
    for row in rows {
        let mut cells = BTreeMap::new();
        for (column, runner) in &row.cells {
            if matches!(runner, Runner::CuratorMem) && env.java_classes.is_none() {
                // peers/run has installed the Curator jars by now.
                match compile_curator_mem(env.scratch.path()) {
                    Ok(classes) => env.java_classes = Some(classes),
                    Err(e) => eprintln!("CuratorMem: {e}"),
                }
            }
            let t0 = Instant::now();
            let outcome = env.run(row, runner);
            match &outcome {
                Ok(report) => eprintln!("[{:>5.1}s] {report}", t0.elapsed().as_secs_f64()),
                Err(e) => eprintln!(
                    "[{:>5.1}s] {} / {column}: FAILED {e}",
                    t0.elapsed().as_secs_f64(),
                    row.title
                ),
            }
            cells.insert(*column, outcome);
        }
        results.push(cells);
    }
    results
}

/// The Redis rows, on a redis-server of the test kit (no persistence: the ZooKeeper rows'
/// server fsyncs, Redis' default `appendfsync everysec` would not be in the cycle either).
fn redis_section(cli: &Cli, sizes: &Sizes) -> Result<String, String> {
    let started = Instant::now();
    eprintln!("starting redis-server (test kit)");
    let server = zklock_testkit::RedisServer::start()
        .map_err(|e| format!("cannot start redis-server: {e}"))?;
    let version = Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .find_map(|w| w.strip_prefix("v=").map(str::to_string))
        })
        .unwrap_or_else(|| "unknown".into());
    let bench = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .with_file_name("zklock-bench");
    let mut env = Env {
        connect: server.url(),
        bench,
        peers_run: PathBuf::new(),
        java_classes: None,
        timeout: Duration::from_secs(cli.run_timeout),
        scratch: tempfile::tempdir().map_err(|e| e.to_string())?,
    };
    let rows = redis_rows(sizes);
    let results = run_rows(&mut env, &rows);
    drop(server);
    Ok(render_redis(
        &rows,
        &results,
        &version,
        started.elapsed(),
        cli.quick,
    ))
}

/// The Redis table: zklock beside the floor and rslock, with the targets, the latencies, the
/// server's commands per cycle, and every output line.
fn render_redis(
    rows: &[Row],
    results: &[BTreeMap<&'static str, Outcome>],
    version: &str,
    took: Duration,
    quick: bool,
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "{}; Redis {version} (test kit: no persistence); section took {:.0} s{}.\n",
        machine(),
        took.as_secs_f64(),
        if quick {
            " (--quick: sizes too small to mean anything)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        md,
        "Throughput (acquire + release per second). In parentheses: zklock's ratio to that peer.\n"
    );
    backend_tables(
        &mut md,
        rows,
        results,
        &BackendTables {
            columns: &REDIS_COLUMNS,
            verdict,
            per_cycle:
                "the commands the server processed per cycle (all clients, from `INFO stats`)",
            per_cycle_field: "commands_per_cycle",
            per_cycle_unit: "cmd",
            lines: "Every run's output line:",
        },
    );
    md
}

/// What differs between the sections that put zklock's backend beside peers on a server of
/// its own (Redis, PostgreSQL): see [`backend_tables`].
struct BackendTables<'a> {
    /// (column key, heading), in order; `zklock` is the one the others are compared with.
    columns: &'a [(&'static str, &'static str)],
    /// A row's target and whether it is met.
    verdict: fn(&Row, &BTreeMap<&'static str, Outcome>) -> (String, String),
    /// What the latency table's third figure is, and its field and unit in a report line.
    per_cycle: &'a str,
    per_cycle_field: &'a str,
    per_cycle_unit: &'a str,
    /// The heading of the report lines.
    lines: &'a str,
}

/// Writes such a section's tables: throughput with targets, latency with a figure per cycle,
/// and the report lines.
fn backend_tables(
    md: &mut String,
    rows: &[Row],
    results: &[BTreeMap<&'static str, Outcome>],
    t: &BackendTables,
) {
    md.push_str("| workload |");
    for (_, heading) in t.columns {
        let _ = write!(md, " {heading} |");
    }
    md.push_str(" target | |\n|---|");
    for _ in t.columns {
        md.push_str("---|");
    }
    md.push_str("---|---|\n");
    for (row, cells) in rows.iter().zip(results) {
        let ours = cells
            .get("zklock")
            .and_then(|o| o.as_ref().ok())
            .and_then(|r| figure(row.metric, r));
        let _ = write!(md, "| {} |", row.title);
        for (column, _) in t.columns {
            let text = match (*column, cells.get(column)) {
                ("zklock", Some(Ok(_))) => {
                    ours.map_or("?".into(), |v| format!("**{}**", show(row.metric, v)))
                }
                ("zklock", other) => cell_text(row.metric, None, other),
                (_, other) => cell_text(row.metric, ours, other),
            };
            let _ = write!(md, " {text} |");
        }
        let (target, met) = (t.verdict)(row, cells);
        let _ = writeln!(md, " {target} | {met} |");
    }
    let _ = write!(
        md,
        "\nLatency of one acquire + release, p50 / p99 in µs; and {}:\n\n| workload |",
        t.per_cycle
    );
    for (_, heading) in t.columns {
        let _ = write!(md, " {heading} |");
    }
    md.push_str("\n|---|");
    for _ in t.columns {
        md.push_str("---|");
    }
    md.push('\n');
    for (row, cells) in rows.iter().zip(results) {
        let _ = write!(md, "| {} |", row.title);
        for (column, _) in t.columns {
            let text = match cells.get(column) {
                Some(Ok(r)) => format!(
                    "{} / {} µs, {} {}",
                    r.get("p50_us").unwrap_or("?"),
                    r.get("p99_us").unwrap_or("?"),
                    r.get(t.per_cycle_field).unwrap_or("?"),
                    t.per_cycle_unit
                ),
                Some(Err(_)) => "—".into(),
                None => "n/a".into(),
            };
            let _ = write!(md, " {text} |");
        }
        md.push('\n');
    }
    let _ = write!(md, "\n{}\n\n```text\n", t.lines);
    for (row, cells) in rows.iter().zip(results) {
        for (column, outcome) in cells {
            match outcome {
                Ok(r) => {
                    let _ = writeln!(md, "{r}");
                }
                Err(e) => {
                    let _ = writeln!(md, "# {} / {column}: {e}", row.title);
                }
            }
        }
    }
    md.push_str("```\n");
}

/// A peer's outcome on an earlier row with the same workload and sizes (for rows that vary only
/// zklock's local queue).
fn earlier<'a>(
    rows: &[Row],
    results: &'a [BTreeMap<&'static str, Outcome>],
    row: &Row,
    column: &str,
) -> Option<&'a Outcome> {
    rows.iter()
        .zip(results)
        .take_while(|(r, _)| !std::ptr::eq(*r, row))
        .filter(|(r, _)| {
            r.workload == row.workload
                && r.workers == row.workers
                && r.cycles == row.cycles
                && r.keys == row.keys
        })
        .find_map(|(_, cells)| cells.get(column))
}

fn figure(metric: Metric, report: &Report) -> Option<f64> {
    match metric {
        Metric::Ops => report.number("ops_per_s"),
        Metric::Drain => report.number("handoffs_per_s"),
        Metric::Memory => report.number("peak_kb"),
    }
}

/// zklock's ratio to a peer: throughput over throughput, or the peer's memory over zklock's.
fn ratio(metric: Metric, ours: f64, theirs: f64) -> f64 {
    match metric {
        Metric::Memory => theirs / ours,
        _ => ours / theirs,
    }
}

fn show(metric: Metric, value: f64) -> String {
    match metric {
        Metric::Memory => format!("{:.1} MB", value / 1024.0),
        _ if value >= 100.0 => format!("{value:.0}/s"),
        _ => format!("{value:.1}/s"),
    }
}

fn cell_text(metric: Metric, ours: Option<f64>, outcome: Option<&Outcome>) -> String {
    match outcome {
        None => "n/a".into(),
        Some(Err(e)) if e == "timeout" => "timeout".into(),
        Some(Err(_)) => "failed".into(),
        Some(Ok(report)) => match (figure(metric, report), ours) {
            (Some(v), Some(o)) if o > 0.0 && v > 0.0 => {
                format!("{} (×{:.2})", show(metric, v), ratio(metric, o, v))
            }
            (Some(v), _) => show(metric, v),
            (None, _) => "?".into(),
        },
    }
}

fn verdict(row: &Row, cells: &BTreeMap<&str, Outcome>) -> (String, String) {
    let value = |c: &str| {
        cells
            .get(c)
            .and_then(|o| o.as_ref().ok())
            .and_then(|r| figure(row.metric, r))
    };
    let (curator, floor, zkclient) = match row.target {
        None => return ("—".into(), String::new()),
        Some(Target::Ratios {
            curator,
            floor,
            zkclient,
        }) => (curator, floor, zkclient),
        Some(Target::PeakMb { mb }) => {
            let text = format!("≤ {mb} MB");
            return match value("zklock") {
                Some(kb) => (
                    text,
                    if kb / 1024.0 <= mb {
                        "met"
                    } else {
                        "**missed**"
                    }
                    .into(),
                ),
                None => (text, "no figure".into()),
            };
        }
        Some(Target::Floor { floor }) => {
            let text = format!("≥ {floor}× floor");
            return match (value("zklock"), value("floor")) {
                (Some(ours), Some(fl)) if ours / fl >= floor => (text, "met".into()),
                (Some(ours), Some(fl)) => (text, format!("**missed** (×{:.2} floor)", ours / fl)),
                _ => (text, "no figure".into()),
            };
        }
        Some(Target::Redis { rslock, floor }) => {
            let mut text = format!("≥ {rslock}× rslock");
            if let Some(f) = floor {
                text.push_str(&format!(", ≥ {f}× floor"));
            }
            let Some(ours) = value("zklock") else {
                return (text, "no figure".into());
            };
            let Some(theirs) = value("rslock") else {
                return (text, "no rslock figure".into());
            };
            let mut met = ours / theirs >= rslock;
            if let Some(f) = floor {
                met &= value("floor").is_some_and(|fl| ours / fl >= f);
            }
            return (text, if met { "met" } else { "**missed**" }.into());
        }
    };
    let mut text = format!("≥ {curator}× Curator");
    if let Some(f) = floor {
        text.push_str(&format!(", ≥ {f}× floor"));
    }
    if let Some(z) = zkclient {
        text.push_str(&format!(", ≥ {z}× zookeeper-client"));
    }
    let Some(ours) = value("zklock") else {
        return (text, "no figure".into());
    };
    // Every ratio of the target, from this run's figures; a missing figure misses.
    let wanted = [
        ("curator", Some(curator)),
        ("floor", floor),
        ("zkclient", zkclient),
    ];
    let mut short = vec![];
    for (column, at_least) in wanted {
        let Some(at_least) = at_least else { continue };
        match value(column) {
            Some(theirs) if ours / theirs >= at_least => {}
            Some(theirs) => short.push(format!("×{:.2} {column}", ours / theirs)),
            None => short.push(format!("no {column} figure")),
        }
    }
    if short.is_empty() {
        (text, "met".into())
    } else {
        (text, format!("**missed** ({})", short.join(", ")))
    }
}

fn render(
    rows: &[Row],
    results: &[BTreeMap<&'static str, Outcome>],
    server_version: &str,
    took: Duration,
    quick: bool,
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "{}; ZooKeeper {server_version}; suite took {:.0} s{}.\n",
        machine(),
        took.as_secs_f64(),
        if quick {
            " (--quick: sizes too small to mean anything)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        md,
        "Throughput (acquire + release per second; drain: handoffs per second; memory: peak RSS). \
         In parentheses: zklock's ratio to that peer (for memory: the peer's peak over zklock's).\n"
    );
    render_zookeeper_tables(&mut md, rows, results);
    md
}

/// `Machine: N CPUs (model), M GiB memory; date`.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "unknown".into());
    let mem_gb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("MemTotal:")?
                    .split_whitespace()
                    .next()?
                    .parse::<f64>()
                    .ok()
            })
        })
        .map(|kb| kb / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    format!("Machine: {nproc} CPUs ({cpu}), {mem_gb:.1} GiB memory; {date}")
}

/// The ZooKeeper section's tables.
fn render_zookeeper_tables(
    md: &mut String,
    rows: &[Row],
    results: &[BTreeMap<&'static str, Outcome>],
) {
    md.push_str("| workload |");
    for (_, heading) in COLUMNS {
        let _ = write!(md, " {heading} |");
    }
    md.push_str(" target | |\n|---|");
    for _ in COLUMNS {
        md.push_str("---|");
    }
    md.push_str("---|---|\n");
    for (row, cells) in rows.iter().zip(results) {
        let ours = cells
            .get("zklock")
            .and_then(|o| o.as_ref().ok())
            .and_then(|r| figure(row.metric, r));
        let _ = write!(md, "| {} |", row.title);
        for (column, _) in COLUMNS {
            let text = if column == "zklock" {
                match cells.get("zklock") {
                    Some(Ok(_)) => {
                        ours.map_or("?".into(), |v| format!("**{}**", show(row.metric, v)))
                    }
                    other => cell_text(row.metric, None, other),
                }
            } else if let Some(outcome) = cells.get(column) {
                cell_text(row.metric, ours, Some(outcome))
            } else if let Some(outcome) = earlier(rows, results, row, column) {
                format!("{}†", cell_text(row.metric, ours, Some(outcome)))
            } else {
                cell_text(row.metric, ours, None)
            };
            let _ = write!(md, " {text} |");
        }
        let (target, met) = verdict(row, cells);
        let _ = writeln!(md, " {target} | {met} |");
    }

    md.push_str("\n† the peer's figure from the row above: the same workload, for a peer without a local queue.\n");

    // Drain scaling: cost per waiter at the large size against the small one.
    let per_waiter = |title_part: &str, column: &str| {
        rows.iter().zip(results).find_map(|(row, cells)| {
            (row.metric == Metric::Drain && row.title.contains(title_part))
                .then(|| cells.get(column))
                .flatten()
                .and_then(|o| o.as_ref().ok())
                .and_then(|r| Some(r.number("secs")? / r.number("waiters")?))
        })
    };
    let drain_rows: Vec<&Row> = rows
        .iter()
        .filter(|r| r.metric == Metric::Drain && r.title.contains("local queue off"))
        .collect();
    if drain_rows.len() >= 2 {
        let (small, large) = (&drain_rows[0], &drain_rows[drain_rows.len() - 1]);
        let _ = writeln!(md, "\nDrain cost per waiter, local queue off (target for zklock: at {} within 1.5× of that at {}):\n", large.workers, small.workers);
        md.push_str("| peer | µs/waiter at small | µs/waiter at large | growth | |\n|---|---|---|---|---|\n");
        for column in ["zklock", "zkclient", "curator"] {
            let s = per_waiter(&format!("drain {} ", small.workers), column);
            let l = per_waiter(&format!("drain {} ", large.workers), column);
            if let (Some(s), Some(l)) = (s, l) {
                let growth = l / s;
                let met = if column == "zklock" {
                    if growth <= 1.5 {
                        "met"
                    } else {
                        "**missed**"
                    }
                } else {
                    ""
                };
                let _ = writeln!(
                    md,
                    "| {column} | {:.1} | {:.1} | ×{growth:.2} | {met} |",
                    s * 1e6,
                    l * 1e6
                );
            } else if s.is_some() || l.is_some() {
                let _ = writeln!(
                    md,
                    "| {column} | {} | {} | | |",
                    s.map_or("—".into(), |v| format!("{:.1}", v * 1e6)),
                    l.map_or("—".into(), |v| format!("{:.1}", v * 1e6))
                );
            }
        }
    }

    // Latency.
    md.push_str("\nLatency of one acquire + release, p50 / p99 in µs:\n\n| workload |");
    for (_, heading) in COLUMNS {
        let _ = write!(md, " {heading} |");
    }
    md.push_str("\n|---|");
    for _ in COLUMNS {
        md.push_str("---|");
    }
    md.push('\n');
    for (row, cells) in rows.iter().zip(results) {
        if row.metric != Metric::Ops {
            continue;
        }
        let _ = write!(md, "| {} |", row.title);
        for (column, _) in COLUMNS {
            let text = match cells.get(column) {
                Some(Ok(r)) => format!(
                    "{} / {}",
                    r.get("p50_us").unwrap_or("?"),
                    r.get("p99_us").unwrap_or("?")
                ),
                Some(Err(_)) => "—".into(),
                None => "n/a".into(),
            };
            let _ = write!(md, " {text} |");
        }
        md.push('\n');
    }

    // What zklock's recipe costs per cycle, from the manager's counters.
    md.push_str("\nzklock's recipe per cycle (per handoff for drain), from `LockManager::stats()`:\n\n| workload | requests | watch events from the nodes ahead |\n|---|---|---|\n");
    for (row, cells) in rows.iter().zip(results) {
        if let Some(Ok(r)) = cells.get("zklock") {
            let (req, ev) = match row.metric {
                Metric::Ops => ("requests_per_cycle", "events_per_cycle"),
                Metric::Drain => ("requests_per_handoff", "events_per_handoff"),
                Metric::Memory => continue,
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} |",
                row.title,
                r.get(req).unwrap_or("?"),
                r.get(ev).unwrap_or("?")
            );
        }
    }

    // Memory detail.
    md.push_str("\nMemory (one process; base = resident once connected, held = resident with every task queued or key held, peak = VmHWM):\n\n| probe | peer | base MB | held MB | peak MB | peak KB per task | setup s |\n|---|---|---|---|---|---|---|\n");
    for (row, cells) in rows.iter().zip(results) {
        if row.metric != Metric::Memory {
            continue;
        }
        for (column, outcome) in cells {
            let label = match *column {
                "zklock-noq" => "zklock, local queue off",
                other => other,
            };
            match outcome {
                Ok(r) => {
                    let mb = |k: &str| {
                        r.number(k)
                            .map_or("?".into(), |v| format!("{:.1}", v / 1024.0))
                    };
                    let _ = writeln!(
                        md,
                        "| {} | {label} | {} | {} | {} | {} | {} |",
                        row.title,
                        mb("rss_base_kb"),
                        mb("rss_kb"),
                        mb("peak_kb"),
                        r.get("peak_per_task_kb").unwrap_or("?"),
                        r.get("secs").unwrap_or("?")
                    );
                }
                Err(e) => {
                    let _ = writeln!(md, "| {} | {label} | {e} | | | | |", row.title);
                }
            }
        }
    }

    // Every line, for the record.
    md.push_str("\nEvery run's output line:\n\n```text\n");
    for (row, cells) in rows.iter().zip(results) {
        for (column, outcome) in cells {
            match outcome {
                Ok(r) => {
                    let _ = writeln!(md, "{r}");
                }
                Err(e) => {
                    let _ = writeln!(md, "# {} / {column}: {e}", row.title);
                }
            }
        }
    }
    md.push_str("```\n");
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

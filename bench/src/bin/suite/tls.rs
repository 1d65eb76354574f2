//! The TLS section (`--only tls`): what encryption costs. zklock with mutual TLS (the test
//! kit's CA, a server certificate for 127.0.0.1, a client certificate) beside zklock in
//! plaintext, uncontended and contended, on each of ZooKeeper, Redis, PostgreSQL and etcd; the
//! two take turns in every round, on servers started as the backends' own sections start them
//! (ZooKeeper fsyncing its log, PostgreSQL durable, etcd's data on disk, Redis without
//! persistence). ZooKeeper serves both on one server (its client and secure ports); a Redis,
//! PostgreSQL or etcd server with TLS refuses plaintext, so each runs two servers alike but
//! for TLS. Every worker connects and acquires once before the timed window, so the handshake
//! is not timed: the figures are the cost of encrypting every request and reply.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use zklock_testkit::{Certs, ClientAuth, EtcdServer, PostgresServer, RedisServer, ZkServer};

use crate::cli::{Cli, Section};
use crate::model::{median, ClientTls, Figure, Row, RowRuns, Runner, Server};
use crate::report::{
    cell_text, cpu_per_cycle, each_cell, lines, lines_heading, machine, quick_note, CPU_PER_CYCLE,
};
use crate::rounds::run_rounds_swapping;
use crate::runner::Env;
use crate::verdict::target_text;

/// The column of zklock in plaintext.
const PLAIN: &str = "plain";
/// The column of zklock with mutual TLS.
const TLS: &str = "tls";

/// A backend's part of the section: its name, and its rows' cycles per worker.
struct Backend {
    name: &'static str,
    uncontended: usize,
    contended: usize,
}

// Full sizes: each run about a second on 2 cores (from the backends' own sections' figures:
// ZooKeeper ≈ 800 and 1,000 cycles/s, Redis ≈ 9,000 and 10,000, PostgreSQL ≈ 7,000 and
// 5,000, etcd ≈ 850 and 350), 16 runs a round, 7 rounds in about three minutes.
const ZOOKEEPER: Backend = Backend {
    name: "ZooKeeper",
    uncontended: 800,
    contended: 125,
};
const REDIS: Backend = Backend {
    name: "Redis",
    uncontended: 8_000,
    contended: 1_000,
};
const POSTGRES: Backend = Backend {
    name: "PostgreSQL",
    uncontended: 6_000,
    contended: 600,
};
const ETCD: Backend = Backend {
    name: "etcd",
    uncontended: 800,
    contended: 40,
};

/// One backend's rows, their runs, and what its servers were.
struct Part {
    backend: &'static str,
    servers: String,
    rows: Vec<Row>,
    results: Vec<RowRuns>,
}

/// The TLS rows of every backend, each on servers of the test kit.
pub(crate) fn section(cli: &Cli) -> Result<String, String> {
    let started = Instant::now();
    let certs = Certs::mint().map_err(|e| format!("cannot mint the certificates: {e}"))?;
    let parts = vec![
        zookeeper(cli, &certs)?,
        redis(cli, &certs)?,
        postgres(cli, &certs)?,
        etcd(cli, &certs)?,
    ];
    Ok(render(parts, started.elapsed(), cli))
}

/// ZooKeeper: one server, plaintext on its client port and TLS on its secure port.
fn zookeeper(cli: &Cli, certs: &Certs) -> Result<Part, String> {
    let fsync = !cli.no_fsync;
    eprintln!("starting ZooKeeper (test kit: a client port and a TLS port)");
    let server = ZkServer::builder()
        .config("forceSync", if fsync { "yes" } else { "no" })
        .tls_with(certs, ClientAuth::Required)
        .start()
        .map_err(|e| format!("cannot start ZooKeeper: {e}"))?;
    let secure = server
        .secure_connect_string()
        .ok_or("ZooKeeper has no TLS port")?;
    let servers = format!(
        "ZooKeeper {}: one server, plaintext on its client port and TLS on its secure port, \
         both served by Netty (which ZooKeeper's TLS needs), client certificates required \
         (`ssl.clientAuth=need`)",
        crate::zookeeper::version(&server, fsync)
    );
    let pid = server.pid();
    run_part(
        cli,
        &ZOOKEEPER,
        on(server.connect_string(), pid, None),
        on(secure, pid, Some(certs)),
        servers,
    )
}

/// Redis: a plaintext server and a TLS-only one, without persistence as in the Redis section.
fn redis(cli: &Cli, certs: &Certs) -> Result<Part, String> {
    eprintln!("starting two redis-servers (test kit: plaintext, TLS)");
    let fail = |e| format!("cannot start redis-server: {e}");
    let plain = RedisServer::start().map_err(fail)?;
    let tls = RedisServer::builder()
        .tls(certs, ClientAuth::Required)
        .start()
        .map_err(fail)?;
    let servers = format!(
        "Redis {}: two servers alike (no persistence, as in the Redis section), one plaintext, \
         one TLS only with client certificates required (`tls-auth-clients yes`)",
        crate::redis::version()
    );
    run_part(
        cli,
        &REDIS,
        on(plain.url(), plain.pid(), None),
        on(tls.url(), tls.pid(), Some(certs)),
        servers,
    )
}

/// PostgreSQL: a durable plaintext server and a durable TLS-only one.
fn postgres(cli: &Cli, certs: &Certs) -> Result<Part, String> {
    eprintln!("starting two PostgreSQL servers (test kit, durable: plaintext, TLS)");
    let fail = |e| format!("cannot start PostgreSQL: {e}");
    let plain = PostgresServer::start_durable().map_err(fail)?;
    let tls = PostgresServer::builder()
        .durable()
        .tls(certs, ClientAuth::Required)
        .start()
        .map_err(fail)?;
    let version = plain
        .psql("SHOW server_version")
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let servers = format!(
        "PostgreSQL {version}: two servers alike (durable: fsync on, synchronous_commit on), \
         one plaintext, one TLS only on TCP with certificate authentication (`hostssl … cert`)"
    );
    run_part(
        cli,
        &POSTGRES,
        on(plain.url(), plain.pid(), None),
        on(tls.url(), tls.pid(), Some(certs)),
        servers,
    )
}

/// etcd: a plaintext member and a TLS-only one, each with its data on disk.
fn etcd(cli: &Cli, certs: &Certs) -> Result<Part, String> {
    eprintln!("starting two etcd members (test kit, data on disk: plaintext, TLS)");
    let fail = |e| format!("cannot start etcd: {e}");
    let plain = EtcdServer::start().map_err(fail)?;
    let tls = EtcdServer::builder()
        .tls(certs, ClientAuth::Required)
        .start()
        .map_err(fail)?;
    let servers = format!(
        "etcd {}: two one-member clusters alike (data on disk, every write fsynced to its \
         log), one plaintext, one TLS only with client certificates required \
         (`--client-cert-auth`)",
        crate::etcd::version()
    );
    run_part(
        cli,
        &ETCD,
        on(plain.url(), plain.pid(), None),
        on(tls.url(), tls.pid(), Some(certs)),
        servers,
    )
}

/// zklock's server at `connect` (process `pid`), with mutual TLS by `certs` if given.
fn on(connect: String, pid: Option<u32>, certs: Option<&Certs>) -> Server {
    Server {
        connect,
        pid,
        tls: certs.map(|c| ClientTls {
            ca: c.ca_path().to_path_buf(),
            cert: c.client_cert_path().to_path_buf(),
            key: c.client_key_path().to_path_buf(),
        }),
    }
}

/// Runs `backend`'s two rows on `plain` and `tls` in rounds, plaintext and TLS taking turns.
fn run_part(
    cli: &Cli,
    backend: &Backend,
    plain: Server,
    tls: Server,
    servers: String,
) -> Result<Part, String> {
    let (uncontended, contended) = if cli.quick {
        (20, 3)
    } else {
        (backend.uncontended, backend.contended)
    };
    let cells = || {
        vec![
            (PLAIN, Runner::On(plain.clone())),
            (TLS, Runner::On(tls.clone())),
        ]
    };
    let rows = vec![
        Row::ops(
            "uncontended (1 manager, 1 key)",
            "uncontended",
            1,
            uncontended,
            cells(),
        ),
        Row::ops(
            "contended (8 managers, 1 key)",
            "contended",
            8,
            contended,
            cells(),
        ),
    ];
    let mut env = Env::new(plain.connect.clone(), Duration::from_secs(cli.run_timeout))?;
    if backend.name == ZOOKEEPER.name && !cli.quick {
        // The server's JIT warms on both ports before the first round, as the ZooKeeper
        // section's warm-up does.
        let warm = Row::ops("warm-up", "contended", 8, 50, cells());
        eprintln!("TLS on ZooKeeper: warming the server");
        env.run_rows(std::slice::from_ref(&warm));
    }
    let rounds = cli.rounds(Section::Tls);
    let section = format!("TLS on {}", backend.name);
    let results = run_rounds_swapping(&mut env, &rows, rounds, &section);
    Ok(Part {
        backend: backend.name,
        servers,
        rows,
        results,
    })
}

/// The CPU time TLS adds to a cycle, client / server: for each, the median over the rounds of
/// the TLS run's figure less the plaintext run's.
fn cpu_added(runs: &RowRuns) -> String {
    let added = |field: &str| {
        let mut added: Vec<f64> = runs
            .rounds
            .iter()
            .filter_map(|round| {
                let of = |column: &str| round.get(column)?.as_ref().ok()?.number(field);
                Some(of(TLS)? - of(PLAIN)?)
            })
            .collect();
        added.sort_by(f64::total_cmp);
        median(&added)
    };
    match (
        added("client_cpu_us_per_cycle"),
        added("server_cpu_us_per_cycle"),
    ) {
        (Some(client), Some(server)) => format!("{client:+.0} / {server:+.0} µs"),
        (Some(client), None) => format!("{client:+.0} / — µs"),
        _ => "—".into(),
    }
}

fn render(parts: Vec<Part>, took: Duration, cli: &Cli) -> String {
    let rounds = cli.rounds(Section::Tls);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "{}; loopback; section took {:.0} s{}.\n",
        machine(),
        took.as_secs_f64(),
        quick_note(cli.quick)
    );
    for part in &parts {
        let _ = writeln!(md, "- {}", part.servers);
    }
    let _ = writeln!(
        md,
        "\nzklock's acquires + releases per second in plaintext and with mutual TLS (the server \
         checks the client's certificate, the client the server's against the test kit's CA), \
         {}, plaintext running first in odd rounds and TLS in even ones; TLS / plaintext: the \
         median over the rounds of the ratio within a round, with the lowest and highest \
         round's in parentheses; CPU added by TLS: the median over the rounds of the TLS run's \
         CPU time per cycle less the plaintext run's. Every \
         worker connects and acquires once before the timed window: the handshake is per \
         connection, not per lock, so these are the cost of encrypting every request and \
         reply. CPU: {CPU_PER_CYCLE}.\n",
        each_cell(rounds)
    );
    md.push_str(
        "| backend | workload | plaintext | mutual TLS | TLS / plaintext (rounds' range) | CPU \
         per cycle, plaintext | CPU per cycle, TLS | CPU added by TLS | target |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for part in &parts {
        for (row, runs) in part.rows.iter().zip(&part.results) {
            let ratio = match (
                runs.paired_between(row.metric, Figure::Main, TLS, PLAIN),
                &runs.ratios_between(row.metric, Figure::Main, TLS, PLAIN)[..],
            ) {
                (Some(ratio), [lowest, .., highest]) => {
                    format!("×{ratio:.2} ({lowest:.2}–{highest:.2})")
                }
                (Some(ratio), _) => format!("×{ratio:.2}"),
                (None, _) => "—".into(),
            };
            let cpu = |column: &str| match runs.kept.get(column) {
                Some(Ok(r)) => cpu_per_cycle(r),
                _ => "—".into(),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {ratio} | {} | {} | {} | {} |",
                part.backend,
                row.title,
                cell_text(row.metric, None, runs.kept.get(PLAIN)),
                cell_text(row.metric, None, runs.kept.get(TLS)),
                cpu(PLAIN),
                cpu(TLS),
                cpu_added(runs),
                target_text(row),
            );
        }
    }
    // The report lines, each row named with its backend.
    let (mut rows, mut results) = (vec![], vec![]);
    for part in parts {
        rows.extend(part.rows.into_iter().map(|mut row| {
            row.title = format!("{}, {}", part.backend, row.title);
            row
        }));
        results.extend(part.results);
    }
    lines(&mut md, &rows, &results, lines_heading(rounds));
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Cells, Outcome};

    fn line(s: &str) -> Outcome {
        Ok(zklock_bench::parse_line(s).unwrap())
    }

    #[test]
    fn the_cpu_tls_adds_is_the_median_of_the_rounds_differences() {
        let round = |plain: (u32, u32), tls: (u32, u32)| {
            let run = |(client, server): (u32, u32)| {
                line(&format!(
                    "peer=zklock client_cpu_us_per_cycle={client} \
                     server_cpu_us_per_cycle={server}"
                ))
            };
            Cells::from([(PLAIN, run(plain)), (TLS, run(tls))])
        };
        let mut failed = round((1, 1), (900, 900));
        failed.insert(TLS, Err("timeout".into()));
        let runs = RowRuns {
            kept: Cells::new(),
            rounds: vec![
                round((40, 50), (50, 70)),
                round((40, 50), (30, 40)),
                round((60, 50), (90, 130)),
                failed,
            ],
        };
        // Client: +10, -10, +30; server: +20, -10, +80. The failed round does not count.
        assert_eq!(cpu_added(&runs), "+10 / +20 µs");
        assert_eq!(cpu_added(&RowRuns::default()), "—");
    }
}

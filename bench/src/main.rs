//! `zklock-bench`: one benchmark run against a running ZooKeeper (or Redis, PostgreSQL, MySQL /
//! MariaDB, etcd: given its URL), printing one line in the format of the test kit's
//! `peers/run` (CuratorBench, kazoo_bench).
//!
//! ```text
//! zklock-bench --connect 127.0.0.1:2181 --workload contended --workers 8 --cycles 500
//! peer=zklock workload=contended workers=8 cycles=4000 secs=... ops_per_s=... p50_us=... p99_us=... violations=0 ...
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use zklock_bench::{Options, Peer, Workload};
use zklock_core::Tls;

/// Benchmarks zklock (or an in-project peer) on a running ZooKeeper.
#[derive(Parser, Debug)]
#[command(name = "zklock-bench", version)]
struct Cli {
    /// ZooKeeper connect string, host:port[,host:port...]; or a Redis URL, redis://host:port/
    /// (peers zklock, floor, rslock; every workload but handover); or a PostgreSQL URL,
    /// postgres://user@host:port/db (peers zklock, floor; workloads uncontended, contended,
    /// keys, inproc, drain; zklock also mem-waiters, mem-keys); or a MySQL / MariaDB URL,
    /// mysql://user:password@host:port/db (peers zklock, floor; the same workloads; mem-keys
    /// holds a session per key, within the server's max_connections); or
    /// an etcd URL, etcd://host:port (peers zklock, floor, lockservice; workloads uncontended,
    /// contended, keys, inproc).
    #[arg(long, env = "ZKLOCK_CONNECT")]
    connect: String,
    /// uncontended | contended | keys | inproc | drain | reacquire | handover | mem-waiters |
    /// mem-keys
    #[arg(long)]
    workload: Workload,
    /// Sessions (uncontended, contended, keys), tasks on one session (inproc; on etcd, the lock
    /// service's tasks each have a lease of their own; on PostgreSQL and MySQL, the floor's
    /// tasks share a pool of at most 64 connections, one task per connection at a time),
    /// waiters (drain), tasks (mem-waiters, mem-keys).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Acquire + release cycles per worker.
    #[arg(long, default_value_t = 1000)]
    cycles: usize,
    /// Keys of the `keys` workload.
    #[arg(long, default_value_t = 64)]
    keys: usize,
    /// zklock | floor (bare create + delete; on Redis: SET NX PX + compare-and-DEL; on
    /// PostgreSQL: pg_advisory_lock + pg_advisory_unlock; on MySQL: GET_LOCK + RELEASE_LOCK;
    /// on etcd: put on a lease + delete, a compare-and-put loop where workers share a key) |
    /// zkclient
    /// (zookeeper-client's Client::lock) | naive (every waiter watches one fixed node) | rslock
    /// (Redis only: the rslock crate's Redlock) | lockservice (etcd only: etcd's Lock and
    /// Unlock RPCs, a lease per worker or task).
    #[arg(long, default_value = "zklock")]
    peer: Peer,
    /// zklock: give every task its own znode instead of queueing the tasks of this process
    /// locally behind one (the manager's `local_queue(false)`).
    #[arg(long)]
    no_local_queue: bool,
    /// zklock: holds without fencing tokens (the manager's `fencing_tokens(false)`): on Redis
    /// an uncontended acquire is a bare `SET NX PX`, on PostgreSQL and MySQL a grant writes
    /// nothing.
    #[arg(long)]
    no_fencing_tokens: bool,
    /// zklock on Redis: count a grant or renewal only once this many replicas acknowledged it
    /// (the backend's `replica_acks`, `WAIT` after each, 1 s at most); 0: none asked.
    #[arg(long, default_value_t = 0)]
    replica_acks: u32,
    /// Warm-up cycles on a separate key before measuring.
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    /// Session timeout, in seconds, of every session opened.
    #[arg(long, default_value_t = 30)]
    session_timeout: u64,
    /// zklock: the manager's linger in ms (default: 1000 for reacquire and handover, else 0).
    #[arg(long)]
    linger_ms: Option<u64>,
    /// The server's process id, when it runs on this machine: the line then gives the server's
    /// CPU time per cycle (`server_cpu_us_per_cycle`, with its child processes') beside this
    /// process's (`client_cpu_us_per_cycle`, always given).
    #[arg(long)]
    server_pid: Option<u32>,
    /// zklock: speak TLS to the server, trusting this CA (PEM): on Redis with a `rediss://`
    /// URL, on etcd with `etcds://`, on ZooKeeper with its secure port, on PostgreSQL and
    /// MySQL through the backend's `tls` setting. The run then reads no server counters that
    /// need a connection of the bench's own (Redis's INFO, PostgreSQL's WAL position, MySQL's
    /// status counters, etcd's /metrics); the line says `tls=on`.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// zklock with --tls-ca: present this client certificate (PEM), with --tls-key (mutual
    /// TLS).
    #[arg(long, value_name = "FILE", requires_all = ["tls_ca", "tls_key"])]
    tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

impl Cli {
    /// The TLS settings of --tls-ca, --tls-cert and --tls-key, if given.
    fn tls(&self) -> Option<Tls> {
        let tls = Tls::new().ca_file(self.tls_ca.as_ref()?);
        Some(match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => tls.client_cert_files(cert, key),
            _ => tls,
        })
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let tls = cli.tls();
    let mut options = Options::new(cli.connect, cli.workload);
    options.workers = cli.workers;
    options.cycles = cli.cycles;
    options.keys = cli.keys;
    options.peer = cli.peer;
    options.local_queue = !cli.no_local_queue;
    options.fencing_tokens = !cli.no_fencing_tokens;
    options.replica_acks = cli.replica_acks;
    options.warmup = cli.warmup;
    options.session_timeout = Duration::from_secs(cli.session_timeout);
    options.server_pid = cli.server_pid;
    options.tls = tls;
    if let Some(ms) = cli.linger_ms {
        options.linger = Duration::from_millis(ms);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("zklock-bench: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(zklock_bench::run(&options));
    // Do not wait for lingering background tasks of dropped sessions.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("zklock-bench: {err}");
            ExitCode::FAILURE
        }
    }
}

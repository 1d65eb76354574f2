//! # zklock-bench
//!
//! Benchmarks of zklock's mutex beside the peers it is measured against, on one real ZooKeeper
//! or (given its URL) one real Redis, PostgreSQL, MySQL / MariaDB or etcd:
//!
//! - `zklock`: the project's recipe ([`zklock_core::LockManager`]).
//! - `floor`: a bare create of an EPHEMERAL_SEQUENTIAL node and its delete, with no recipe around
//!   it: what the server costs at the least for one acquire and release.
//! - `zkclient`: zookeeper-client's own `Client::lock` recipe (Curator-style nodes; it lists the
//!   children again on every wake).
//! - `naive`: every waiter creates one fixed ephemeral node and watches it when it exists: the herd
//!   baseline (every release wakes every waiter).
//!
//! Curator and kazoo run from the test kit's `peers/run` with the same workloads and output line.
//!
//! On Redis: `zklock` (its Redis backend), `floor` (`SET key id NX PX ttl`, released by a Lua
//! compare-and-`DEL`; on a taken key it asks again at once) and `rslock` (the `rslock` crate's
//! Redlock, on the one server, retrying with its own policy: up to 3 tries 0–200 ms apart,
//! then again), every workload but `handover`; in `inproc` and `drain` the floor's and
//! rslock's tasks share one connection or manager, as zklock's share one manager. Under Sentinel (a `redis+sentinel://` connect string) zklock
//! follows the primary the Sentinels name, and the other peers and the server's counters use
//! that primary's address. On a Redis Cluster (a `redis+cluster://` connect string) zklock
//! routes by slot itself; rslock runs a plain manager per primary, each key sent to its slot's
//! primary by a map asked before the timed window (`CLUSTER SLOTS`, `CLUSTER KEYSLOT`), and the
//! counters are summed over every primary (the lines also carry `primaries` and how the run's
//! keys spread over them, `keys_per_primary`). Their lines carry `backend=redis`
//! (`redis-sentinel` for zklock under Sentinel, `redis-cluster` on a Cluster), the round trips
//! per cycle
//! (`round_trips_per_cycle`, from the server's `total_reads_processed`: one per request a client
//! sent and waited for) and the commands the server ran per cycle (`commands_per_cycle`, from
//! `total_commands_processed`: those sent and those run inside scripts), over every client,
//! watchdog renewals and retries included.
//!
//! Every run opens its connections and gives each worker one untimed acquire before the timed
//! window opens. Runs with more than one worker also report `holder_changes_per_s` (grants to
//! another worker than the key's last holder) and `max_wait_us` (the longest acquire), so that a
//! lock whose waiters sleep while the releaser takes it again shows as such.
//!
//! On PostgreSQL (a `postgres://` connect string): `zklock` (its PostgreSQL backend) and `floor`
//! (`pg_advisory_lock` + `pg_advisory_unlock` on a plain client), uncontended, contended, over
//! many keys, from many tasks of one process and the drain of a queue (the floor's tasks on
//! connections of a pool of at most 64, one task per connection at a time: an advisory lock
//! belongs to its session); their lines carry `backend=postgres` and the WAL written per cycle
//! (see the `postgres` module).
//!
//! On MySQL / MariaDB (a `mysql://` or `mariadb://` connect string): `zklock` (its MySQL
//! backend) and `floor` (`GET_LOCK` + `RELEASE_LOCK` on a plain `mysql_async` session, a
//! waiter blocking in the server), uncontended, contended, over many keys, from many tasks of
//! one process and the drain of a queue (the floor's tasks on sessions of a pool of at most
//! 64, one task per session at a time: a user lock belongs to its session); their lines carry
//! `backend=mysql` and the redo log written, the fsyncs and the statements per cycle (see the
//! `mysql` module).
//!
//! On etcd (an `etcd://` connect string): `zklock` (its etcd backend), `floor` (a put of the key
//! on a lease granted up front, and its delete; a compare-and-put loop where workers share a
//! key) and `lockservice` (etcd's own lock service, the `Lock` and `Unlock` RPCs), uncontended,
//! contended, over many keys and from many tasks of one process; their lines carry
//! `backend=etcd` and the server's gRPC requests, Raft writes and WAL fsyncs per cycle (see the
//! `etcd` module).
//!
//! zklock speaks TLS when given [`Options::tls`] (a `rediss://` or `etcds://` URL, libpq's
//! `sslmode`, MySQL's TLS settings or a ZooKeeper secure port): its line then says `tls=on`
//! and carries no server counters that need a connection of the bench's own, which speaks
//! plain TCP.
//!
//! The memory probes run for zklock on ZooKeeper, Redis, PostgreSQL and MySQL; on Redis,
//! PostgreSQL and MySQL their lines also carry the connections the process holds on the server
//! (`server_connections`).
//!
//! Workloads (see [`Workload`]): `uncontended`, `contended`, `keys`, `inproc`, `drain`, the
//! linger's `reacquire` and `handover`, and the memory probes `mem-waiters` and `mem-keys`. Each run prints one line of `key=value` fields,
//! the format of the peers' benches ([`Report`], [`parse_line`]).
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use zklock_bench::{Options, Peer, Workload};
//!
//! let mut options = Options::new("127.0.0.1:2181", Workload::Contended);
//! options.workers = 8;
//! options.cycles = 500;
//! options.peer = Peer::Zklock;
//! let report = zklock_bench::run(&options).await?;
//! println!("{report}");
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod cpu;
mod drain;
mod etcd;
mod linger;
mod memory;
mod mysql;
mod ops;
mod peer;
mod postgres;
mod report;
mod server;
mod window;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub use memory::status_kb;
pub use report::{parse_line, Report};

/// What a benchmark run does; the names match the test kit's `peers/run`'s workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// One session, one key, acquire + release in a loop (with more workers: one session each).
    Uncontended,
    /// `workers` sessions, one key.
    Contended,
    /// `workers` sessions over `keys` keys, each cycle on a random key.
    Keys,
    /// `workers` tasks sharing one session (one manager), one key.
    Inproc,
    /// `workers` waiters queued in one process behind a held lock, then released: the time for
    /// the queue to pass through.
    Drain,
    /// Peak RSS of one process with `workers` tasks waiting on one key.
    MemWaiters,
    /// Peak RSS of one process holding `workers` distinct keys.
    MemKeys,
    /// One session re-acquiring one key, with zklock's linger on ([`Options::linger`]); the
    /// other peers run it as `uncontended`.
    Reacquire,
    /// zklock only: the wait of a second session's acquire while the first session's node
    /// lingers, beside a normal handoff's wait (from the holder's release to the waiter's
    /// grant) and an acquire of a free key, each `cycles` times.
    Handover,
}

impl Workload {
    /// The workload's name on the command line and in the output line.
    ///
    /// ```
    /// assert_eq!(zklock_bench::Workload::MemKeys.name(), "mem-keys");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Workload::Uncontended => "uncontended",
            Workload::Contended => "contended",
            Workload::Keys => "keys",
            Workload::Inproc => "inproc",
            Workload::Drain => "drain",
            Workload::MemWaiters => "mem-waiters",
            Workload::MemKeys => "mem-keys",
            Workload::Reacquire => "reacquire",
            Workload::Handover => "handover",
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = String;

    fn from_str(s: &str) -> Result<Workload, String> {
        Ok(match s {
            "uncontended" => Workload::Uncontended,
            "contended" => Workload::Contended,
            "keys" => Workload::Keys,
            "inproc" => Workload::Inproc,
            "drain" => Workload::Drain,
            "mem-waiters" => Workload::MemWaiters,
            "mem-keys" => Workload::MemKeys,
            "reacquire" => Workload::Reacquire,
            "handover" => Workload::Handover,
            other => {
                return Err(format!(
                    "unknown workload {other:?}: uncontended | contended | keys | inproc | drain | mem-waiters | mem-keys"
                ))
            }
        })
    }
}

/// Which lock implementation a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// zklock's mutex through a [`zklock_core::LockManager`].
    Zklock,
    /// A bare ephemeral sequential create and its delete: no recipe, no exclusion.
    Floor,
    /// zookeeper-client 0.11's `Client::lock` recipe.
    Zkclient,
    /// One fixed ephemeral node that every waiter watches: the herd baseline.
    Naive,
    /// The `rslock` crate's Redlock on one Redis server (Redis only).
    Rslock,
    /// etcd's lock service, the `Lock` and `Unlock` RPCs, with a lease per worker (etcd only).
    LockService,
}

impl Peer {
    /// The peer's name on the command line and in the output line.
    ///
    /// ```
    /// assert_eq!(zklock_bench::Peer::Zkclient.name(), "zkclient");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Peer::Zklock => "zklock",
            Peer::Floor => "floor",
            Peer::Zkclient => "zkclient",
            Peer::Naive => "naive",
            Peer::Rslock => "rslock",
            Peer::LockService => "lockservice",
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Peer {
    type Err = String;

    fn from_str(s: &str) -> Result<Peer, String> {
        Ok(match s {
            "zklock" => Peer::Zklock,
            "floor" => Peer::Floor,
            "zkclient" => Peer::Zkclient,
            "naive" => Peer::Naive,
            "rslock" => Peer::Rslock,
            "lockservice" => Peer::LockService,
            other => {
                return Err(format!(
                "unknown peer {other:?}: zklock | floor | zkclient | naive | rslock | lockservice"
            ))
            }
        })
    }
}

/// One benchmark run.
#[derive(Debug, Clone)]
pub struct Options {
    /// ZooKeeper connect string (`host:port[,host:port...]`), or a Redis URL (`redis://...`), a
    /// PostgreSQL URL (`postgres://...`), a MySQL / MariaDB URL (`mysql://...`) or an etcd URL
    /// (`etcd://host:port[,...]`).
    pub connect: String,
    /// What to run.
    pub workload: Workload,
    /// Sessions (or tasks, for `inproc`; waiters, for `drain`; tasks, for the memory probes).
    pub workers: usize,
    /// Acquire + release cycles per worker.
    pub cycles: usize,
    /// Keys for the `keys` workload.
    pub keys: usize,
    /// The implementation measured.
    pub peer: Peer,
    /// zklock only: queue the tasks of this process locally behind one znode per key (the
    /// manager's default); `false` gives every task its own znode.
    pub local_queue: bool,
    /// zklock only: whether holds carry fencing tokens (the manager's
    /// [`fencing_tokens`](zklock_core::Builder::fencing_tokens), on by default).
    pub fencing_tokens: bool,
    /// zklock on Redis only: the replicas that must acknowledge each grant and renewal (the
    /// backend's `replica_acks`, waiting at most [`REPLICA_ACK_TIMEOUT`]); 0 (the default):
    /// none asked.
    pub replica_acks: u32,
    /// Warm-up cycles on a separate key before measuring.
    pub warmup: usize,
    /// Session timeout of every session the run opens.
    pub session_timeout: Duration,
    /// zklock only: the manager's linger ([`zklock_core::Builder::linger`]); 1 s for the
    /// `reacquire` and `handover` workloads, else zero.
    pub linger: Duration,
    /// The server's process id, when it runs on this machine: the run then reports the
    /// server's CPU time per cycle (with its child processes') beside its own.
    pub server_pid: Option<u32>,
    /// zklock only: speak TLS to the server with these settings (the backend's `tls`; on
    /// ZooKeeper `tls_settings`; see [`zklock_core::Tls`]). The line then says `tls=on`, and
    /// the run reads none of the server's counters that need a connection of their own
    /// (Redis's `INFO`, PostgreSQL's WAL position, MySQL's status counters, etcd's `/metrics`):
    /// its CPU time is all it gives beside the throughput and latency.
    pub tls: Option<zklock_core::Tls>,
}

/// How long a run with [`Options::replica_acks`] waits for the replicas' acknowledgements.
pub const REPLICA_ACK_TIMEOUT: Duration = Duration::from_secs(1);

impl Options {
    /// Defaults: one worker, 1,000 cycles, one key, peer zklock, local queue on, 200 warm-up
    /// cycles (as CuratorBench).
    ///
    /// ```
    /// let o = zklock_bench::Options::new("127.0.0.1:2181", zklock_bench::Workload::Uncontended);
    /// assert_eq!(o.workers, 1);
    /// ```
    pub fn new(connect: impl Into<String>, workload: Workload) -> Options {
        Options {
            connect: connect.into(),
            workload,
            workers: 1,
            cycles: 1000,
            keys: 1,
            peer: Peer::Zklock,
            local_queue: true,
            fencing_tokens: true,
            replica_acks: 0,
            warmup: 200,
            session_timeout: Duration::from_secs(30),
            linger: match workload {
                Workload::Reacquire | Workload::Handover => Duration::from_secs(1),
                _ => Duration::ZERO,
            },
            server_pid: None,
            tls: None,
        }
    }
}

/// A failed benchmark run.
#[derive(Debug)]
pub struct BenchError(pub String);

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BenchError {}

impl From<zklock_core::Error> for BenchError {
    fn from(e: zklock_core::Error) -> BenchError {
        BenchError(format!("zklock: {e}"))
    }
}

impl From<zookeeper_client::Error> for BenchError {
    fn from(e: zookeeper_client::Error) -> BenchError {
        BenchError(format!("zookeeper: {e}"))
    }
}

/// Result of a benchmark step.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// Runs one benchmark and returns its output line.
///
/// Must run inside a multi-threaded tokio runtime.
///
/// # Errors
/// When a session cannot be opened, a lock operation fails, or the options make no sense for
/// the peer (e.g. `floor` has no waiters to drain).
pub async fn run(options: &Options) -> Result<Report> {
    if options.workers == 0 {
        return Err(BenchError("--workers must be at least 1".into()));
    }
    if options.tls.is_some() && options.peer != Peer::Zklock {
        return Err(BenchError(format!(
            "TLS settings are zklock's only, not {}'s",
            options.peer
        )));
    }
    let mut report = run_workload(options).await?;
    if options.tls.is_some() {
        report.push("tls", "on");
    }
    Ok(report)
}

/// The run of `options`' workload on its backend.
async fn run_workload(options: &Options) -> Result<Report> {
    if etcd::is_etcd(&options.connect) {
        return etcd::run(options).await;
    }
    if matches!(options.workload, Workload::MemWaiters | Workload::MemKeys) {
        return memory::run(options).await;
    }
    if peer::is_postgres(&options.connect) {
        return postgres::run(options).await;
    }
    if peer::is_mysql(&options.connect) {
        return mysql::run(options).await;
    }
    match options.workload {
        Workload::Uncontended
        | Workload::Contended
        | Workload::Keys
        | Workload::Inproc
        | Workload::Reacquire => ops::run(options).await,
        Workload::Drain => drain::run(options).await,
        other if peer::is_redis(&options.connect) => Err(BenchError(format!(
            "{other} runs on ZooKeeper only; on Redis: uncontended, contended, keys, inproc, \
             drain, reacquire, mem-waiters, mem-keys"
        ))),
        Workload::Handover => linger::handover(options).await,
        Workload::MemWaiters | Workload::MemKeys => unreachable!("run above"),
    }
}

/// A fresh, unique root path for one run's nodes.
pub(crate) fn run_root(peer: Peer) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("/bench/{}-{nanos}-{}", peer.name(), std::process::id())
}

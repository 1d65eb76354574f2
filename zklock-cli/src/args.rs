//! The command line: the global options (where to connect, namespace, each backend's own) and
//! each command's arguments, as clap parses them, with the job rules clap cannot say.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// The exit codes of `exec` and `elect`, shown after their help.
const EXIT_CODES: &str = "\
EXIT CODES (exec, elect):
  CMD's own exit code when CMD ran (128+N when signal N ended it)
  64   bad usage, invalid key or option
  69   the server unreachable (ZooKeeper, Redis, PostgreSQL, etcd or MySQL), a TLS handshake
       refused, or the manager's session or connection failed before CMD ran
  75   timed out waiting for the lock (--timeout)
  76   the lock (or leadership) was lost while CMD ran; CMD was sent SIGTERM (or, on
       ZooKeeper, the waiting node was deleted by someone else, and CMD never ran)
  124  a job's CMD ran past --at-most; it was sent SIGTERM, then SIGKILL after --kill-after
  126  CMD could not be executed
  127  CMD not found";

#[derive(Parser, Debug)]
#[command(name = "zklock", version, about = "Distributed locks on ZooKeeper, Redis, PostgreSQL, etcd or MySQL, from the shell (like flock(1) across machines)", after_help = EXIT_CODES)]
pub(crate) struct Cli {
    /// ZooKeeper servers, host:port[,host:port...], a Redis URL, redis://host:port[/db], a PostgreSQL URL, postgres://user@host/db, etcd members, etcd://host:2379[,host:2379...], or a MySQL / MariaDB URL, mysql://user:password@host/db
    #[arg(
        long,
        global = true,
        env = "ZKLOCK_CONNECT",
        default_value = "127.0.0.1:2181"
    )]
    pub(crate) connect: String,
    /// Namespace under which keys live (a znode path on ZooKeeper, a key prefix on etcd; on Redis
    /// PostgreSQL and MySQL, the start of every lock's name)
    #[arg(long, global = true, env = "ZKLOCK_NAMESPACE", default_value = zklock_core::DEFAULT_NAMESPACE)]
    pub(crate) namespace: String,
    /// How long a holder may go silent before it loses the lock: the session timeout asked of
    /// the ZooKeeper servers (default 10s; e.g. 4s, 1500ms)
    #[arg(long, global = true, value_parser = parse_duration, help_heading = "ZooKeeper")]
    pub(crate) session_timeout: Option<Duration>,
    /// How long a holder may go silent before it loses the lock: its lease on Redis, its
    /// sessions' idle_session_timeout on PostgreSQL, its lease's TTL on etcd, its sessions'
    /// wait_timeout on MySQL, in whole seconds on etcd and MySQL (default 10s; e.g. 4s, 1500ms)
    #[arg(long, global = true, value_parser = parse_duration, help_heading = "Redis, PostgreSQL, etcd and MySQL")]
    pub(crate) lease: Option<Duration>,
    /// The password the Sentinels of a redis+sentinel:// address ask for (their own; the
    /// address's user:password@ are the data nodes'). Best given in the environment, which
    /// `ps` does not show
    #[arg(
        long,
        global = true,
        env = "ZKLOCK_SENTINEL_PASSWORD",
        hide_env_values = true,
        help_heading = "Redis, PostgreSQL and etcd"
    )]
    pub(crate) sentinel_password: Option<String>,
    /// Trust the certificate authorities in this PEM file to verify the servers' certificates
    /// (a private CA), instead of the system's roots. Asks for TLS (on ZooKeeper: give the servers'
    /// secureClientPort)
    #[arg(
        long,
        global = true,
        env = "ZKLOCK_TLS_CA",
        value_name = "FILE",
        help_heading = "TLS"
    )]
    pub(crate) tls_ca: Option<PathBuf>,
    /// Present this client certificate (PEM) to servers that ask for one; needs --tls-key
    #[arg(
        long,
        global = true,
        env = "ZKLOCK_TLS_CERT",
        value_name = "FILE",
        help_heading = "TLS"
    )]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert
    #[arg(
        long,
        global = true,
        env = "ZKLOCK_TLS_KEY",
        value_name = "FILE",
        help_heading = "TLS"
    )]
    pub(crate) tls_key: Option<PathBuf>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run CMD while holding the exclusive lock on KEY; exit with CMD's exit code.
    ///
    /// CMD gets ZKLOCK_FENCING_TOKEN (strictly increasing across holders: pass it to the store
    /// you write to) and ZKLOCK_LOCK_PATH in its environment.
    ///
    /// With --skip-if-locked, --at-least or --at-most, KEY is a scheduled job (a cron entry
    /// that every host runs, and one runs at a time). One name is one lock: the job's lock is
    /// the lock of KEY itself, the one a plain `zklock exec KEY`, `LockManager::lock(KEY)`,
    /// `LockManager::job(KEY)` and #[distributed_lock(KEY, ...)] take, so they all exclude each
    /// other; the job's run record (its --at-least window) sits beside that lock. A skipped run
    /// prints one line on stderr and exits 0, or --skipped-exit-code. Jobs work on every
    /// backend (ZooKeeper, Redis, PostgreSQL); --at-least is measured by the server's clock.
    #[command(after_help = EXIT_CODES)]
    Exec(ExecArgs),
    /// List locks that have holders or waiters: key, kind, holders, waiters, age, token.
    Ls(LsArgs),
    /// The lock table refreshed live, like top(1): holders, waiters, the longest wait, how long
    /// the lock has been held, and the holder's token; the locks waited for longest first.
    Top(TopArgs),
    /// Show one lock in detail: every holder and waiter with who, since when, and token.
    Status(TargetArgs),
    /// Ask the holder(s) of a lock to let go (ZooKeeper only: Curator's revocation). Holders
    /// that opted in are told their hold is lost; others are not forced. Redis, PostgreSQL and
    /// etcd refuse it.
    Revoke(TargetArgs),
    /// Run CMD while this process leads the election NAME (on ZooKeeper, Curator's LeaderLatch
    /// on the wire); exit with CMD's exit code.
    ///
    /// Waits to be elected, then runs CMD with ZKLOCK_LEADER_EPOCH (strictly increasing across
    /// leaders: fence what the leader writes with it). If leadership is lost while CMD runs,
    /// CMD gets SIGTERM, then SIGKILL after --kill-after, and zklock exits 76; a supervisor can
    /// start it again to queue for the next election.
    #[command(after_help = EXIT_CODES)]
    Elect(ElectArgs),
    /// Print what an administrator runs once so that a narrow account can use the backend of
    /// --connect: on PostgreSQL, the SQL that creates zklock's table and grants --grant-to
    /// exactly what zklock uses (run it with psql as the table's owner). Connects to nothing.
    Setup(SetupArgs),
}

#[derive(Args, Debug)]
pub(crate) struct SetupArgs {
    /// The role (PostgreSQL) the service connects as
    #[arg(long, value_name = "ROLE")]
    pub(crate) grant_to: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct ElectArgs {
    /// Election name (any text; encoded into one name under the namespace)
    #[arg(required_unless_present = "path", conflicts_with = "path")]
    pub(crate) name: Option<String>,
    /// A raw election path instead of a name (on ZooKeeper a znode path, e.g. one that
    /// Curator's LeaderLatch uses)
    #[arg(long, value_name = "PATH")]
    pub(crate) path: Option<String>,
    /// This participant's id, shown to the others (default: host:pid)
    #[arg(long)]
    pub(crate) id: Option<String>,
    /// How long CMD gets to stop after SIGTERM when leadership is lost, before SIGKILL
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) kill_after: Duration,
    /// The command to run, after `--`
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
}

#[derive(Args, Debug)]
pub(crate) struct LsArgs {
    /// Only keys that start with this
    #[arg(default_value = "")]
    pub(crate) prefix: String,
}

#[derive(Args, Debug)]
pub(crate) struct TopArgs {
    /// Only keys that start with this
    #[arg(default_value = "")]
    pub(crate) prefix: String,
    /// Time between refreshes
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub(crate) interval: Duration,
    /// Show the table this many times, then exit (default: until interrupted)
    #[arg(long, short = 'n', value_name = "N")]
    pub(crate) iterations: Option<u64>,
    /// Show the table once and exit (as --iterations 1)
    #[arg(long, conflicts_with = "iterations")]
    pub(crate) once: bool,
}

#[derive(Args, Debug)]
pub(crate) struct TargetArgs {
    /// Lock key
    #[arg(required_unless_present = "path", conflicts_with = "path")]
    pub(crate) key: Option<String>,
    /// A raw lock path instead of a key (on ZooKeeper a znode path)
    #[arg(long, value_name = "PATH")]
    pub(crate) path: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct ExecArgs {
    /// Lock key (any text; it is encoded into one name under the namespace)
    #[arg(required_unless_present = "path", conflicts_with = "path")]
    pub(crate) key: Option<String>,
    /// Lock a raw path instead of a key (on ZooKeeper a znode path, e.g. one that Curator
    /// services also lock)
    #[arg(long, value_name = "PATH")]
    pub(crate) path: Option<String>,
    /// Give up waiting after this long (exit 75; a job run skips instead); default: wait
    /// forever
    #[arg(long, value_parser = parse_duration)]
    pub(crate) timeout: Option<Duration>,
    /// Take the read side of a read/write lock (shared with other readers)
    #[arg(long, conflicts_with_all = ["write", "semaphore"])]
    pub(crate) read: bool,
    /// Take the write side of a read/write lock
    #[arg(long, conflicts_with_all = ["read", "semaphore"])]
    pub(crate) write: bool,
    /// Take one lease of a semaphore with N leases (at most N commands run at once; on
    /// ZooKeeper and Redis, PostgreSQL refuses semaphores)
    #[arg(long, value_name = "N", conflicts_with_all = ["read", "write"])]
    pub(crate) semaphore: Option<u32>,
    /// Job: skip the run (do not wait) when another host holds KEY or ran it within its
    /// --at-least window
    #[arg(long, conflicts_with_all = ["timeout", "read", "write", "semaphore"])]
    pub(crate) skip_if_locked: bool,
    /// Job: no other run starts within this long of this run's start, even after this one
    /// ended (by the server's clock), e.g. 30s
    #[arg(long, value_name = "DUR", value_parser = parse_duration, conflicts_with_all = ["read", "write", "semaphore"])]
    pub(crate) at_least: Option<Duration>,
    /// Job: stop CMD if it still runs after this long (SIGTERM to its process group, SIGKILL
    /// after --kill-after) and exit 124, e.g. 10m
    #[arg(long, value_name = "DUR", value_parser = parse_duration, conflicts_with_all = ["read", "write", "semaphore"])]
    pub(crate) at_most: Option<Duration>,
    /// Job: the exit code of a skipped run (default 0, so that cron stays quiet)
    #[arg(long, value_name = "N")]
    pub(crate) skipped_exit_code: Option<u8>,
    /// Job: how long CMD gets to stop after SIGTERM (past --at-most or on a lost lock) before
    /// SIGKILL
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub(crate) kill_after: Option<Duration>,
    /// The command to run, after `--`
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
}

impl ExecArgs {
    /// Whether KEY runs as a scheduled job.
    pub(crate) fn is_job(&self) -> bool {
        self.skip_if_locked || self.at_least.is_some() || self.at_most.is_some()
    }

    /// The rules for job options that clap cannot say, as one message for the user.
    pub(crate) fn check_job(&self) -> Result<(), String> {
        if !self.is_job() {
            return self.check_no_job_options();
        }
        if !self.skip_if_locked && self.timeout.is_none() {
            let flag = if self.at_least.is_some() {
                "--at-least"
            } else {
                "--at-most"
            };
            return Err(format!(
                "{flag} makes this a job run: say what it does when another host holds it, with --skip-if-locked (skip at once) or --timeout DUR (wait that long, then skip)"
            ));
        }
        for (flag, value) in [("--at-least", self.at_least), ("--at-most", self.at_most)] {
            if value == Some(Duration::ZERO) {
                return Err(format!(
                    "{flag} 0 is no bound: give a duration longer than zero, or leave it out"
                ));
            }
        }
        Ok(())
    }

    /// A plain `exec` takes none of the options that only a job run has.
    fn check_no_job_options(&self) -> Result<(), String> {
        let stray = [
            ("--skipped-exit-code", self.skipped_exit_code.is_some()),
            ("--kill-after", self.kill_after.is_some()),
        ];
        match stray.iter().find(|(_, given)| *given) {
            Some((flag, _)) => Err(format!(
                "{flag} is an option of a job run: add --skip-if-locked (or --at-least/--at-most with --timeout)"
            )),
            None => Ok(()),
        }
    }
}

/// A duration as humans write it (`10s`, `500ms`, `2m`), with a hint when it is not one.
fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 10s, 500ms, 2m)"))
}

/// The lock a command names: by key, or by a raw path.
pub(crate) enum Target<'a> {
    /// A key, encoded into one node name under the namespace.
    Key(&'a str),
    /// A raw path (e.g. one a Curator service also uses).
    Path(&'a str),
}

/// KEY or `--path`, which clap requires exactly one of.
pub(crate) fn target<'a>(key: &'a Option<String>, path: &'a Option<String>) -> Target<'a> {
    match (key, path) {
        (Some(key), _) => Target::Key(key),
        (None, Some(path)) => Target::Path(path),
        (None, None) => unreachable!("clap requires KEY or --path"),
    }
}

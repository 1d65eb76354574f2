//! `zklock`: the shell's entry to zklock, like flock(1) across machines.
//!
//! ```text
//! zklock [--connect HOSTS|REDIS_URL|POSTGRES_URL] [--namespace NS] [--session-timeout DUR] \
//!        exec (KEY | --path ZNODE_PATH) [--timeout DUR] -- CMD [ARGS...]
//! zklock exec (KEY | --path ZNODE_PATH) --skip-if-locked [--at-least DUR] [--at-most DUR] \
//!        [--skipped-exit-code N] [--kill-after DUR] -- CMD [ARGS...]
//! zklock elect (NAME | --path ZNODE_PATH) [--id ID] [--kill-after DUR] -- CMD [ARGS...]
//! zklock ls [PREFIX] | status KEY | revoke KEY
//! zklock top [PREFIX] [--interval DUR] [--once | --iterations N]
//! ```
//!
//! `--connect redis://host:port[/db]` runs on the Redis backend: `exec` works the same (the
//! session timeout is then the lease), `ls`, `status` and `revoke` say they are unsupported.
//! `--connect postgres://user@host/db` does the same on PostgreSQL's advisory locks (the
//! session timeout is the lease: the server ends a holding session silent this long).
//!
//! Exit codes of `exec`: CMD's own code when it ran (128+N when a signal N ended it);
//! 64 bad usage or key; 69 ZooKeeper unreachable or the session failed; 75 timed out waiting
//! for the lock; 76 the lock was lost while CMD ran (CMD got SIGTERM), or the waiting node was
//! deleted by someone else before CMD ran; 124 a job's CMD ran past
//! `--at-most` and was stopped; 126 CMD could not run; 127 CMD not found. A skipped job exits 0
//! (or `--skipped-exit-code`).

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use std::future::Future;
use std::pin::Pin;

use std::cell::{Cell, RefCell};

use zklock_core::{
    Contender, Error, FencingToken, Lease, LockGuard, LockInfo, LockManager, LossReason, Ran,
};

/// Exit code: bad usage, bad key or bad option.
const EXIT_USAGE: u8 = 64;
/// Exit code: ZooKeeper unreachable, or the session failed before CMD ran.
const EXIT_UNAVAILABLE: u8 = 69;
/// Exit code: the lock was not acquired within `--timeout`.
const EXIT_TIMEOUT: u8 = 75;
/// Exit code: the hold was lost while CMD ran; CMD was sent SIGTERM.
const EXIT_LOST: u8 = 76;
/// Exit code: a job's CMD ran past `--at-most` and was stopped (SIGTERM, then SIGKILL), as
/// timeout(1) exits.
const EXIT_AT_MOST: u8 = 124;
/// Exit code: CMD exists but could not be executed.
const EXIT_CANNOT_RUN: u8 = 126;
/// Exit code: CMD was not found.
const EXIT_NOT_FOUND: u8 = 127;

const EXIT_CODES: &str = "\
EXIT CODES (exec, elect):
  CMD's own exit code when CMD ran (128+N when signal N ended it)
  64   bad usage, invalid key or option
  69   ZooKeeper unreachable, or the session failed before CMD ran
  75   timed out waiting for the lock (--timeout)
  76   the lock (or leadership) was lost while CMD ran; CMD was sent SIGTERM (or the
       waiting node was deleted by someone else, and CMD never ran)
  124  a job's CMD ran past --at-most; it was sent SIGTERM, then SIGKILL after --kill-after
  126  CMD could not be executed
  127  CMD not found";

#[derive(Parser, Debug)]
#[command(name = "zklock", version, about = "Distributed locks on ZooKeeper, from the shell (like flock(1) across machines)", after_help = EXIT_CODES)]
struct Cli {
    /// ZooKeeper servers, host:port[,host:port...], a Redis URL, redis://host:port[/db], or a PostgreSQL URL, postgres://user@host/db
    #[arg(
        long,
        global = true,
        env = "ZKLOCK_CONNECT",
        default_value = "127.0.0.1:2181"
    )]
    connect: String,
    /// Namespace znode under which keys live
    #[arg(long, global = true, env = "ZKLOCK_NAMESPACE", default_value = zklock_core::DEFAULT_NAMESPACE)]
    namespace: String,
    /// ZooKeeper session timeout, or lease on Redis and PostgreSQL (e.g. 10s, 1500ms): a holder silent this long loses the lock
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    session_timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run CMD while holding the exclusive lock on KEY; exit with CMD's exit code.
    ///
    /// CMD gets ZKLOCK_FENCING_TOKEN (strictly increasing across holders: pass it to the store
    /// you write to) and ZKLOCK_LOCK_PATH in its environment.
    ///
    /// With --skip-if-locked, --at-least or --at-most, KEY is a scheduled job (a cron entry
    /// that every host runs, and one runs at a time): the lock of the job KEY, apart from the
    /// plain lock KEY, shared with `LockManager::job(KEY)` and #[distributed_lock(KEY,
    /// skip_if_locked)]. A skipped run prints one line on stderr and exits 0, or
    /// --skipped-exit-code. Works on ZooKeeper and Redis; --at-least is measured by the
    /// server's clock.
    #[command(after_help = EXIT_CODES)]
    Exec(ExecArgs),
    /// List locks that have holders or waiters: key, kind, holders, waiters, age, token.
    Ls(LsArgs),
    /// The lock table refreshed live, like top(1): holders, waiters, the longest wait, how long
    /// the lock has been held, and the holder's token; the locks waited for longest first.
    Top(TopArgs),
    /// Show one lock in detail: every holder and waiter with who, since when, and token.
    Status(TargetArgs),
    /// Ask the holder(s) of a lock to let go (Curator's revocation). Holders that opted in
    /// are told their hold is lost; others are not forced.
    Revoke(TargetArgs),
    /// Run CMD while this process leads the election NAME (Curator's LeaderLatch); exit with
    /// CMD's exit code.
    ///
    /// Waits to be elected, then runs CMD with ZKLOCK_LEADER_EPOCH (strictly increasing across
    /// leaders: fence what the leader writes with it). If leadership is lost while CMD runs,
    /// CMD gets SIGTERM, then SIGKILL after --kill-after, and zklock exits 76; a supervisor can
    /// start it again to queue for the next election.
    #[command(after_help = EXIT_CODES)]
    Elect(ElectArgs),
}

#[derive(Args, Debug)]
struct ElectArgs {
    /// Election name (any text; encoded into one znode name under the namespace)
    #[arg(required_unless_present = "path", conflicts_with = "path")]
    name: Option<String>,
    /// A raw znode election path instead of a name, e.g. one that Curator's LeaderLatch uses
    #[arg(long, value_name = "ZNODE_PATH")]
    path: Option<String>,
    /// This participant's id, shown to the others (default: host:pid)
    #[arg(long)]
    id: Option<String>,
    /// How long CMD gets to stop after SIGTERM when leadership is lost, before SIGKILL
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    kill_after: Duration,
    /// The command to run, after `--`
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Args, Debug)]
struct LsArgs {
    /// Only keys that start with this
    #[arg(default_value = "")]
    prefix: String,
}

#[derive(Args, Debug)]
struct TopArgs {
    /// Only keys that start with this
    #[arg(default_value = "")]
    prefix: String,
    /// Time between refreshes
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    interval: Duration,
    /// Show the table this many times, then exit (default: until interrupted)
    #[arg(long, short = 'n', value_name = "N")]
    iterations: Option<u64>,
    /// Show the table once and exit (as --iterations 1)
    #[arg(long, conflicts_with = "iterations")]
    once: bool,
}

#[derive(Args, Debug)]
struct TargetArgs {
    /// Lock key
    #[arg(required_unless_present = "path", conflicts_with = "path")]
    key: Option<String>,
    /// A raw znode lock path instead of a key
    #[arg(long, value_name = "ZNODE_PATH")]
    path: Option<String>,
}

#[derive(Args, Debug)]
struct ExecArgs {
    /// Lock key (any text; it is encoded into one znode name under the namespace)
    #[arg(required_unless_present = "path", conflicts_with = "path")]
    key: Option<String>,
    /// Lock a raw znode path instead of a key, e.g. a path that Curator services also lock
    #[arg(long, value_name = "ZNODE_PATH")]
    path: Option<String>,
    /// Give up waiting after this long (exit 75; a job run skips instead); default: wait
    /// forever
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Take the read side of a read/write lock (shared with other readers)
    #[arg(long, conflicts_with_all = ["write", "semaphore"])]
    read: bool,
    /// Take the write side of a read/write lock
    #[arg(long, conflicts_with_all = ["read", "semaphore"])]
    write: bool,
    /// Take one lease of a semaphore with N leases (at most N commands run at once)
    #[arg(long, value_name = "N", conflicts_with_all = ["read", "write"])]
    semaphore: Option<u32>,
    /// Job: skip the run (do not wait) when another host holds KEY or ran it within its
    /// --at-least window
    #[arg(long, conflicts_with_all = ["timeout", "read", "write", "semaphore"])]
    skip_if_locked: bool,
    /// Job: no other run starts within this long of this run's start, even after this one
    /// ended (by the server's clock), e.g. 30s
    #[arg(long, value_name = "DUR", value_parser = parse_duration, conflicts_with_all = ["read", "write", "semaphore"])]
    at_least: Option<Duration>,
    /// Job: stop CMD if it still runs after this long (SIGTERM to its process group, SIGKILL
    /// after --kill-after) and exit 124, e.g. 10m
    #[arg(long, value_name = "DUR", value_parser = parse_duration, conflicts_with_all = ["read", "write", "semaphore"])]
    at_most: Option<Duration>,
    /// Job: the exit code of a skipped run (default 0, so that cron stays quiet)
    #[arg(long, value_name = "N")]
    skipped_exit_code: Option<u8>,
    /// Job: how long CMD gets to stop after SIGTERM (past --at-most or on a lost lock) before
    /// SIGKILL
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    kill_after: Option<Duration>,
    /// The command to run, after `--`
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

impl ExecArgs {
    /// Whether KEY runs as a scheduled job.
    fn is_job(&self) -> bool {
        self.skip_if_locked || self.at_least.is_some() || self.at_most.is_some()
    }

    /// The rules for job options that clap cannot say, as one message for the user.
    fn check_job(&self) -> Result<(), String> {
        if !self.is_job() {
            let stray = [
                ("--skipped-exit-code", self.skipped_exit_code.is_some()),
                ("--kill-after", self.kill_after.is_some()),
            ];
            if let Some((flag, _)) = stray.iter().find(|(_, given)| *given) {
                return Err(format!(
                    "{flag} is an option of a job run: add --skip-if-locked (or --at-least/--at-most with --timeout)"
                ));
            }
            return Ok(());
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
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 10s, 500ms, 2m)"))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { 0 });
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("zklock: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_UNAVAILABLE);
        }
    };
    let code = runtime.block_on(run(cli));
    runtime.shutdown_timeout(Duration::from_secs(1));
    ExitCode::from(code)
}

async fn run(cli: Cli) -> u8 {
    match cli.command {
        Command::Exec(ref args) => exec(&cli, args).await,
        Command::Ls(ref args) => operate(&cli, |m| async move { ls(&m, &args.prefix).await }).await,
        Command::Top(ref args) => operate(&cli, |m| async move { top(&m, args).await }).await,
        Command::Status(ref args) => operate(&cli, |m| async move { status(&m, args).await }).await,
        Command::Revoke(ref args) => operate(&cli, |m| async move { revoke(&m, args).await }).await,
        Command::Elect(ref args) => elect(&cli, args).await,
    }
}

fn fail(err: &Error) -> u8 {
    eprintln!("zklock: {err}");
    match err {
        Error::InvalidKey { .. } | Error::Config(_) | Error::InvalidArgument(_) => EXIT_USAGE,
        Error::Timeout { .. } => EXIT_TIMEOUT,
        Error::LockLost { .. } | Error::Dequeued { .. } => EXIT_LOST,
        _ => EXIT_UNAVAILABLE,
    }
}

async fn exec(cli: &Cli, args: &ExecArgs) -> u8 {
    if let Err(msg) = args.check_job() {
        eprintln!("zklock: {msg}");
        return EXIT_USAGE;
    }
    let manager = match connect(cli).await {
        Ok(m) => m,
        Err(e) => return fail(&e),
    };
    let code = exec_with(&manager, args).await;
    // Let background releases and cleanups reach the server before the process exits.
    let _ = tokio::time::timeout(Duration::from_secs(5), manager.flush()).await;
    code
}

async fn connect(cli: &Cli) -> zklock_core::Result<LockManager> {
    LockManager::builder(&cli.connect)
        .namespace(&cli.namespace)
        .session_timeout(cli.session_timeout)
        .lease(cli.session_timeout)
        .connect()
        .await
}

async fn exec_with(manager: &LockManager, args: &ExecArgs) -> u8 {
    if args.is_job() {
        return exec_job(manager, args).await;
    }
    let (lock_path, acquire) = match start_acquire(manager, args) {
        Ok(started) => started,
        Err(e) => return fail(&e),
    };
    let acquired = {
        let mut term = signal(libc::SIGTERM);
        let mut int = signal(libc::SIGINT);
        tokio::select! {
            g = acquire => g,
            _ = term.recv() => return 128 + libc::SIGTERM as u8,
            _ = int.recv() => return 128 + libc::SIGINT as u8,
        }
    };
    let guard = match acquired {
        Ok(g) => g,
        Err(e) => return fail(&e),
    };

    let (program, rest) = args.command.split_first().expect("clap requires CMD");
    let mut child = match tokio::process::Command::new(program)
        .args(rest)
        .env("ZKLOCK_FENCING_TOKEN", guard.fencing_token().to_string())
        .env("ZKLOCK_LOCK_PATH", &lock_path)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("zklock: cannot run {program:?}: {e}");
            drop(guard);
            return if e.kind() == std::io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_RUN
            };
        }
    };
    let pid = child.id().map(|p| p as libc::pid_t);
    let mut term = signal(libc::SIGTERM);
    let mut int = signal(libc::SIGINT);
    let mut hup = signal(libc::SIGHUP);
    let mut lost = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            reason = guard.lost(), if lost.is_none() => {
                eprintln!("zklock: lost the lock on {lock_path} while the command ran ({reason}); sending it SIGTERM");
                lost = Some(reason);
                forward(pid, libc::SIGTERM);
            }
            _ = term.recv() => forward(pid, libc::SIGTERM),
            _ = int.recv() => forward(pid, libc::SIGINT),
            _ = hup.recv() => forward(pid, libc::SIGHUP),
        }
    };
    let released = guard.release().await;
    if let (Err(e), None) = (&released, lost) {
        eprintln!("zklock: warning: {e}");
    }
    if lost.is_some() {
        return EXIT_LOST;
    }
    exit_code(status)
}

/// `exec` of a scheduled job: [`Job::run`](zklock_core::Job::run) runs CMD, or skips.
async fn exec_job(manager: &LockManager, args: &ExecArgs) -> u8 {
    let started = match (&args.key, &args.path) {
        (Some(key), _) => manager
            .job(key)
            .and_then(|job| Ok((job, manager.path_of(key)?))),
        (None, Some(path)) => manager.job_at_path(path).map(|job| (job, path.clone())),
        (None, None) => unreachable!("clap requires KEY or --path"),
    };
    let (mut job, lock_path) = match started {
        Ok(started) => started,
        Err(e) => return fail(&e),
    };
    let name = args.key.as_deref().unwrap_or(&lock_path);
    if let Some(timeout) = args.timeout {
        job = job.wait(timeout);
    }
    if let Some(at_least) = args.at_least {
        job = job.at_least(at_least);
    }
    if let Some(at_most) = args.at_most {
        job = job.at_most(at_most);
    }

    // The body spawns CMD once the job is this host's, and waits for it. However the body
    // ends, the child comes back here (`Running`), so that CMD can still be stopped and reaped
    // after the job has dropped the body (past --at-most, or on a lost lock); `pid` tells the
    // signal forwarding below.
    let child: RefCell<Option<tokio::process::Child>> = RefCell::new(None);
    let pid: Cell<Option<libc::pid_t>> = Cell::new(None);
    let body = async {
        let (program, rest) = args.command.split_first().expect("clap requires CMD");
        let token = zklock_core::current_fencing_token().expect("a job's body runs in its frame");
        let spawned = tokio::process::Command::new(program)
            .args(rest)
            .env("ZKLOCK_FENCING_TOKEN", token.to_string())
            .env("ZKLOCK_LOCK_PATH", &lock_path)
            // Its own process group: a run stopped past --at-most stops all that CMD started.
            .process_group(0)
            .spawn();
        let mut running = Running {
            child: Some(spawned.map_err(|e| (program, e))?),
            slot: &child,
        };
        let cmd = running.child.as_mut().expect("set above");
        pid.set(cmd.id().map(|p| -(p as libc::pid_t)));
        Ok(cmd.wait().await)
    };
    let mut term = signal(libc::SIGTERM);
    let mut int = signal(libc::SIGINT);
    let mut hup = signal(libc::SIGHUP);
    let mut run = Box::pin(job.run(body));
    let outcome = loop {
        tokio::select! {
            outcome = &mut run => break outcome,
            // Before CMD runs, a signal ends the wait (the job future is dropped: nothing is
            // left behind); while it runs, it goes to CMD.
            _ = term.recv() => match pid.get() {
                Some(_) => forward(pid.get(), libc::SIGTERM),
                None => return 128 + libc::SIGTERM as u8,
            },
            _ = int.recv() => match pid.get() {
                Some(_) => forward(pid.get(), libc::SIGINT),
                None => return 128 + libc::SIGINT as u8,
            },
            _ = hup.recv() => match pid.get() {
                Some(_) => forward(pid.get(), libc::SIGHUP),
                None => return 128 + libc::SIGHUP as u8,
            },
        }
    };
    // The body ends with the run, and gives the child back.
    drop(run);
    match outcome {
        Ok(Ran::Ran(Ok(status))) => exit_code(status),
        Ok(Ran::Ran(Err((program, e)))) => {
            eprintln!("zklock: cannot run {program:?}: {e}");
            if e.kind() == std::io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_RUN
            }
        }
        Ok(Ran::Skipped) => {
            eprintln!("zklock: skipped {name}: another host runs it, or ran it within its --at-least window");
            args.skipped_exit_code.unwrap_or(0)
        }
        Err(Error::LockLost { reason, .. }) => {
            let code = if reason == LossReason::HoldLimit {
                eprintln!(
                    "zklock: the command ran past --at-most {}; stopping it",
                    humantime::format_duration(args.at_most.unwrap_or_default())
                );
                EXIT_AT_MOST
            } else {
                eprintln!("zklock: lost the lock on {lock_path} while the command ran ({reason}); stopping it");
                EXIT_LOST
            };
            let running = child.borrow_mut().take();
            if let Some(running) = running {
                stop(
                    running,
                    pid.get(),
                    args.kill_after.unwrap_or(DEFAULT_KILL_AFTER),
                )
                .await;
            }
            code
        }
        Err(e) => fail(&e),
    }
}

/// A job's CMD while its body waits for it: when the body ends or is dropped, the child goes
/// back to `slot`.
struct Running<'a> {
    child: Option<tokio::process::Child>,
    slot: &'a RefCell<Option<tokio::process::Child>>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        *self.slot.borrow_mut() = self.child.take();
    }
}

/// How long a stopped command gets between SIGTERM and SIGKILL, unless `--kill-after` says.
const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(10);

/// Stops a command's process group `pid`: SIGTERM, then SIGKILL if it still runs after
/// `grace`; returns once it has exited.
async fn stop(mut child: tokio::process::Child, pid: Option<libc::pid_t>, grace: Duration) {
    forward(pid, libc::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        eprintln!(
            "zklock: the command did not stop within {}; sending it SIGKILL",
            humantime::format_duration(grace)
        );
        forward(pid, libc::SIGKILL);
        let _ = child.wait().await;
    }
}

async fn elect(cli: &Cli, args: &ElectArgs) -> u8 {
    let manager = match connect(cli).await {
        Ok(m) => m,
        Err(e) => return fail(&e),
    };
    let code = elect_with(&manager, args).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), manager.flush()).await;
    code
}

async fn elect_with(manager: &LockManager, args: &ElectArgs) -> u8 {
    let id = args.id.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        format!("{host}:{}", std::process::id())
    });
    let latch = match (&args.name, &args.path) {
        (_, Some(path)) => manager.leader_latch_at_path(path, &id),
        (Some(name), None) => manager.leader_latch(name, &id),
        (None, None) => unreachable!("clap requires NAME or --path"),
    };
    let latch = match latch {
        Ok(latch) => latch,
        Err(e) => return fail(&e),
    };
    let elected = {
        let mut term = signal(libc::SIGTERM);
        let mut int = signal(libc::SIGINT);
        tokio::select! {
            l = latch.lead() => l,
            _ = term.recv() => return 128 + libc::SIGTERM as u8,
            _ = int.recv() => return 128 + libc::SIGINT as u8,
        }
    };
    let leadership = match elected {
        Ok(l) => l,
        Err(e) => return fail(&e),
    };
    eprintln!(
        "zklock: {id} leads {} (epoch {})",
        latch.path(),
        leadership.epoch()
    );
    let (program, rest) = args.command.split_first().expect("clap requires CMD");
    let mut child = match tokio::process::Command::new(program)
        .args(rest)
        .env("ZKLOCK_LEADER_EPOCH", leadership.epoch().to_string())
        .env("ZKLOCK_ELECTION_PATH", latch.path())
        // Its own process group: a lost leadership stops CMD and everything it started.
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("zklock: cannot run {program:?}: {e}");
            return if e.kind() == std::io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_RUN
            };
        }
    };
    // Signals go to CMD's whole process group.
    let pid = child.id().map(|p| -(p as libc::pid_t));
    let mut term = signal(libc::SIGTERM);
    let mut int = signal(libc::SIGINT);
    let mut lost = false;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            reason = leadership.lost(), if !lost => {
                eprintln!("zklock: lost the leadership of {} ({reason}); sending the command SIGTERM", latch.path());
                lost = true;
                forward(pid, libc::SIGTERM);
                kill_at = Some(tokio::time::Instant::now() + args.kill_after);
            }
            _ = async { tokio::time::sleep_until(kill_at.unwrap()).await }, if kill_at.is_some() => {
                eprintln!("zklock: the command did not stop within {:?}; sending it SIGKILL", args.kill_after);
                kill_at = None;
                forward(pid, libc::SIGKILL);
            }
            _ = term.recv() => forward(pid, libc::SIGTERM),
            _ = int.recv() => forward(pid, libc::SIGINT),
        }
    };
    let _ = leadership.leave().await;
    if lost {
        return EXIT_LOST;
    }
    exit_code(status)
}

/// Our exit code for how CMD ended: its own code, 128+N for signal N.
fn exit_code(status: std::io::Result<std::process::ExitStatus>) -> u8 {
    match status {
        Ok(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
            (Some(code), _) => code as u8,
            (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
            _ => 1,
        },
        Err(e) => {
            eprintln!("zklock: lost track of the command: {e}");
            EXIT_CANNOT_RUN
        }
    }
}

fn signal(sig: libc::c_int) -> tokio::signal::unix::Signal {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(sig))
        .expect("installing a signal handler")
}

/// Sends `sig` to `pid` (a negative pid: to that process group).
fn forward(pid: Option<libc::pid_t>, sig: libc::c_int) {
    if let Some(pid) = pid {
        // SAFETY: kill(2) with a pid we spawned and still wait for; it has no memory effects.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// What `exec` holds while the command runs.
enum Held {
    Lock(LockGuard),
    Lease(Lease),
}

impl Held {
    fn fencing_token(&self) -> FencingToken {
        match self {
            Held::Lock(g) => g.fencing_token(),
            Held::Lease(l) => l.fencing_token(),
        }
    }

    async fn lost(&self) -> LossReason {
        match self {
            Held::Lock(g) => g.lost().await,
            Held::Lease(l) => l.lost().await,
        }
    }

    async fn release(self) -> zklock_core::Result<()> {
        match self {
            Held::Lock(g) => g.release().await,
            Held::Lease(l) => l.release().await,
        }
    }
}

type Acquire = Pin<Box<dyn Future<Output = zklock_core::Result<Held>> + Send>>;

/// The lock path `exec` takes, and the future that takes it.
fn start_acquire(manager: &LockManager, args: &ExecArgs) -> zklock_core::Result<(String, Acquire)> {
    let timeout = args.timeout;
    if let Some(n) = args.semaphore {
        let sem = match (&args.key, &args.path) {
            (Some(key), _) => manager.semaphore(key, n)?,
            (None, Some(path)) => manager.semaphore_at_path(path, n)?,
            (None, None) => unreachable!("clap requires KEY or --path"),
        };
        let path = match (&args.key, &args.path) {
            (_, Some(p)) => p.clone(),
            _ => format!(
                "{}/%SEM/{}",
                manager.namespace(),
                zklock_core::Key::new(args.key.as_deref().unwrap_or_default())?.encoded()
            ),
        };
        return Ok((
            path,
            Box::pin(async move {
                match timeout {
                    Some(t) => sem.acquire_timeout(t).await,
                    None => sem.acquire().await,
                }
                .map(Held::Lease)
            }),
        ));
    }
    if args.read || args.write {
        let rw = match (&args.key, &args.path) {
            (Some(key), _) => manager.rwlock(key)?,
            (None, Some(path)) => manager.rwlock_at_path(path)?,
            (None, None) => unreachable!("clap requires KEY or --path"),
        };
        let write = args.write;
        return Ok((
            rw.path().to_string(),
            Box::pin(async move {
                let guard = match (timeout, write) {
                    (Some(t), true) => rw.write_timeout(t).await,
                    (Some(t), false) => rw.read_timeout(t).await,
                    (None, true) => rw.write().await,
                    (None, false) => rw.read().await,
                };
                guard.map(Held::Lock)
            }),
        ));
    }
    let mutex = match (&args.key, &args.path) {
        (Some(key), _) => manager.mutex(key)?,
        (None, Some(path)) => manager.mutex_at_path(path)?,
        (None, None) => unreachable!("clap requires KEY or --path"),
    };
    Ok((
        mutex.path().to_string(),
        Box::pin(async move {
            match timeout {
                Some(t) => mutex.lock_timeout(t).await,
                None => mutex.lock().await,
            }
            .map(Held::Lock)
        }),
    ))
}

/// Connects, runs an operator command, and maps its error to an exit code.
async fn operate<F, Fut>(cli: &Cli, op: F) -> u8
where
    F: FnOnce(LockManager) -> Fut,
    Fut: Future<Output = zklock_core::Result<u8>>,
{
    let manager = match connect(cli).await {
        Ok(m) => m,
        Err(e) => return fail(&e),
    };
    match op(manager).await {
        Ok(code) => code,
        Err(e) => fail(&e),
    }
}

fn age(c: &Contender) -> String {
    let secs = c.age().as_secs();
    match secs {
        0..=119 => format!("{secs}s"),
        120..=7199 => format!("{}m", secs / 60),
        _ => format!("{}h", secs / 3600),
    }
}

async fn ls(manager: &LockManager, prefix: &str) -> zklock_core::Result<u8> {
    let locks = manager.list(prefix).await?;
    if locks.is_empty() {
        println!(
            "no locks held or waited for under {}{}",
            manager.namespace(),
            if prefix.is_empty() {
                String::new()
            } else {
                format!(" with prefix {prefix:?}")
            }
        );
        return Ok(0);
    }
    println!(
        "{:<32} {:<9} {:<40} {:>7} {:>6} {:>14}",
        "KEY", "KIND", "HOLDERS", "WAITERS", "AGE", "TOKEN"
    );
    for lock in locks {
        let holders: Vec<String> = lock.holders.iter().map(|h| h.owner.to_string()).collect();
        let (held_for, token) = match lock.holders.first() {
            Some(h) => (age(h), h.token.to_string()),
            None => ("-".into(), "-".into()),
        };
        let holders = if holders.is_empty() {
            "-".to_string()
        } else {
            holders.join(", ")
        };
        println!(
            "{:<32} {:<9} {:<40} {:>7} {:>6} {:>14}",
            lock.key,
            lock.kind,
            holders,
            lock.waiters.len(),
            held_for,
            token
        );
    }
    Ok(0)
}

/// One line of `zklock top`.
struct TopRow {
    key: String,
    kind: String,
    holders: String,
    waiters: usize,
    /// How long the longest waiter has waited.
    longest_wait: Option<Duration>,
    /// How long the first holder has held it.
    held: Option<Duration>,
    token: String,
}

/// The lines of `zklock top` for `locks`: the longest wait first, then the longest hold.
fn top_rows(locks: &[LockInfo]) -> Vec<TopRow> {
    let mut rows: Vec<TopRow> = locks
        .iter()
        .map(|lock| {
            let holders: Vec<String> = lock.holders.iter().map(|h| h.owner.to_string()).collect();
            TopRow {
                key: lock.key.clone(),
                kind: lock.kind.to_string(),
                holders: if holders.is_empty() {
                    "-".into()
                } else {
                    holders.join(", ")
                },
                waiters: lock.waiters.len(),
                longest_wait: lock.waiters.iter().map(Contender::age).max(),
                held: lock.holders.iter().map(Contender::age).max(),
                token: lock
                    .holders
                    .first()
                    .map_or_else(|| "-".into(), |h| h.token.to_string()),
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        (b.longest_wait, b.held)
            .cmp(&(a.longest_wait, a.held))
            .then_with(|| a.key.cmp(&b.key))
    });
    rows
}

fn short(d: Option<Duration>) -> String {
    let Some(d) = d else { return "-".into() };
    let ms = d.as_millis();
    match ms {
        0..=9_999 => format!("{:.1}s", d.as_secs_f64()),
        10_000..=119_999 => format!("{}s", ms / 1000),
        120_000..=7_199_999 => format!("{}m", ms / 60_000),
        _ => format!("{}h", ms / 3_600_000),
    }
}

/// `zklock top`: the lock table every `--interval`, `--iterations` times (or until Ctrl-C).
async fn top(manager: &LockManager, args: &TopArgs) -> zklock_core::Result<u8> {
    use std::io::{IsTerminal, Write};
    let frames = if args.once { Some(1) } else { args.iterations };
    let terminal = std::io::stdout().is_terminal();
    let mut int = signal(libc::SIGINT);
    let mut shown = 0u64;
    loop {
        let locks = manager.list(&args.prefix).await?;
        let rows = top_rows(&locks);
        let mut out = String::new();
        if terminal {
            // Home and clear, as top(1) redraws.
            out.push_str("\x1b[H\x1b[2J");
        } else if shown > 0 {
            out.push('\n');
        }
        let waiting: usize = rows.iter().map(|r| r.waiters).sum();
        out.push_str(&format!(
            "zklock top: {} locks, {} waiters under {}{} at {}\n",
            rows.len(),
            waiting,
            manager.namespace(),
            if args.prefix.is_empty() {
                String::new()
            } else {
                format!(" (prefix {:?})", args.prefix)
            },
            humantime::format_rfc3339_seconds(std::time::SystemTime::now()),
        ));
        out.push_str(&format!(
            "{:<32} {:<9} {:<36} {:>7} {:>12} {:>8} {:>14}\n",
            "KEY", "KIND", "HOLDERS", "WAITERS", "LONGEST WAIT", "HELD", "TOKEN"
        ));
        for r in &rows {
            out.push_str(&format!(
                "{:<32} {:<9} {:<36} {:>7} {:>12} {:>8} {:>14}\n",
                r.key,
                r.kind,
                r.holders,
                r.waiters,
                short(r.longest_wait),
                short(r.held),
                r.token
            ));
        }
        let mut stdout = std::io::stdout().lock();
        // A closed pipe (`zklock top | head`) ends the watch quietly.
        if stdout
            .write_all(out.as_bytes())
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return Ok(0);
        }
        drop(stdout);
        shown += 1;
        if frames.is_some_and(|n| shown >= n) {
            return Ok(0);
        }
        tokio::select! {
            _ = tokio::time::sleep(args.interval) => {}
            _ = int.recv() => return Ok(0),
        }
    }
}

async fn inspect_target(manager: &LockManager, args: &TargetArgs) -> zklock_core::Result<LockInfo> {
    match (&args.key, &args.path) {
        (Some(key), _) => manager.inspect(key).await,
        (None, Some(path)) => manager.inspect_path(path).await,
        (None, None) => unreachable!("clap requires KEY or --path"),
    }
}

async fn status(manager: &LockManager, args: &TargetArgs) -> zklock_core::Result<u8> {
    let info = inspect_target(manager, args).await?;
    println!(
        "key:  {}\npath: {}\nkind: {}",
        info.key, info.path, info.kind
    );
    if info.holders.is_empty() && info.waiters.is_empty() {
        println!("free: no holder, no waiter");
        return Ok(0);
    }
    for (role, list) in [("holder", &info.holders), ("waiter", &info.waiters)] {
        for c in list.iter() {
            println!(
                "{role:<7} {:<6} {:<36} age {:>6}  token {}  session 0x{:x}  node {}",
                c.mode,
                c.owner.to_string(),
                age(c),
                c.token,
                c.session,
                c.node
            );
        }
    }
    Ok(0)
}

async fn revoke(manager: &LockManager, args: &TargetArgs) -> zklock_core::Result<u8> {
    let asked = match (&args.key, &args.path) {
        (Some(key), _) => manager.revoke(key).await?,
        (None, Some(path)) => manager.revoke_path(path).await?,
        (None, None) => unreachable!("clap requires KEY or --path"),
    };
    if asked.is_empty() {
        println!("nobody holds it: nothing to revoke");
        return Ok(1);
    }
    for node in asked {
        println!("asked the holder of {node} to let go (holders that opted in will release)");
    }
    Ok(0)
}

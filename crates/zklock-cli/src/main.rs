//! `zklock`: the shell's entry to zklock, like flock(1) across machines.
//!
//! ```text
//! zklock [--connect HOSTS] [--namespace NS] [--session-timeout DUR] \
//!        exec (KEY | --path ZNODE_PATH) [--timeout DUR] -- CMD [ARGS...]
//! ```
//!
//! Exit codes of `exec`: CMD's own code when it ran (128+N when a signal N ended it);
//! 64 bad usage or key; 69 ZooKeeper unreachable or the session failed; 75 timed out waiting
//! for the lock; 76 the lock was lost while CMD ran (CMD got SIGTERM); 126 CMD could not run;
//! 127 CMD not found.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use zklock_core::{Error, LockManager};

/// Exit code: bad usage, bad key or bad option.
const EXIT_USAGE: u8 = 64;
/// Exit code: ZooKeeper unreachable, or the session failed before CMD ran.
const EXIT_UNAVAILABLE: u8 = 69;
/// Exit code: the lock was not acquired within `--timeout`.
const EXIT_TIMEOUT: u8 = 75;
/// Exit code: the hold was lost while CMD ran; CMD was sent SIGTERM.
const EXIT_LOST: u8 = 76;
/// Exit code: CMD exists but could not be executed.
const EXIT_CANNOT_RUN: u8 = 126;
/// Exit code: CMD was not found.
const EXIT_NOT_FOUND: u8 = 127;

const EXIT_CODES: &str = "\
EXIT CODES (exec):
  CMD's own exit code when CMD ran (128+N when signal N ended it)
  64   bad usage, invalid key or option
  69   ZooKeeper unreachable, or the session failed before CMD ran
  75   timed out waiting for the lock (--timeout)
  76   the lock was lost while CMD ran; CMD was sent SIGTERM
  126  CMD could not be executed
  127  CMD not found";

#[derive(Parser, Debug)]
#[command(name = "zklock", version, about = "Distributed locks on ZooKeeper, from the shell (like flock(1) across machines)", after_help = EXIT_CODES)]
struct Cli {
    /// ZooKeeper servers, host:port[,host:port...]
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
    /// ZooKeeper session timeout (e.g. 10s, 1500ms): a holder silent this long loses the lock
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
    #[command(after_help = EXIT_CODES)]
    Exec(ExecArgs),
}

#[derive(Args, Debug)]
struct ExecArgs {
    /// Lock key (any text; it is encoded into one znode name under the namespace)
    #[arg(required_unless_present = "path", conflicts_with = "path")]
    key: Option<String>,
    /// Lock a raw znode path instead of a key, e.g. a path that Curator services also lock
    #[arg(long, value_name = "ZNODE_PATH")]
    path: Option<String>,
    /// Give up waiting after this long (exit 75); default: wait forever
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// The command to run, after `--`
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
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
    }
}

fn fail(err: &Error) -> u8 {
    eprintln!("zklock: {err}");
    match err {
        Error::InvalidKey { .. } | Error::Config(_) => EXIT_USAGE,
        Error::Timeout { .. } => EXIT_TIMEOUT,
        Error::LockLost { .. } => EXIT_LOST,
        _ => EXIT_UNAVAILABLE,
    }
}

async fn exec(cli: &Cli, args: &ExecArgs) -> u8 {
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
        .connect()
        .await
}

async fn exec_with(manager: &LockManager, args: &ExecArgs) -> u8 {
    let mutex = match (&args.key, &args.path) {
        (Some(key), _) => manager.mutex(key),
        (None, Some(path)) => manager.mutex_at_path(path),
        (None, None) => unreachable!("clap requires KEY or --path"),
    };
    let mutex = match mutex {
        Ok(m) => m,
        Err(e) => return fail(&e),
    };
    let acquired = match args.timeout {
        Some(t) => mutex.lock_timeout(t).await,
        None => {
            let mut term = signal(libc::SIGTERM);
            let mut int = signal(libc::SIGINT);
            tokio::select! {
                g = mutex.lock() => g,
                _ = term.recv() => return 128 + libc::SIGTERM as u8,
                _ = int.recv() => return 128 + libc::SIGINT as u8,
            }
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
        .env("ZKLOCK_LOCK_PATH", mutex.path())
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
                eprintln!("zklock: lost the lock on {} while the command ran ({reason}); sending it SIGTERM", mutex.path());
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

fn forward(pid: Option<libc::pid_t>, sig: libc::c_int) {
    if let Some(pid) = pid {
        // SAFETY: kill(2) with a pid we spawned and still wait for; it has no memory effects.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

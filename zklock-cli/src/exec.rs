//! `zklock exec`: run CMD while holding a lock (a mutex, one side of a read/write lock, or a
//! semaphore lease); a job run goes to [`crate::job`].

use std::future::Future;
use std::pin::Pin;

use zklock_core::{FencingToken, Lease, LockGuard, LockManager, LossReason};

use crate::args::{target, Cli, ExecArgs, Target};
use crate::connect::{connect, flush};
use crate::exit::{fail, EXIT_LOST, EXIT_USAGE};
use crate::supervise::{cannot_run, command, exit_code, forward, signal, unless_signalled};

/// `zklock exec`: checks the options, connects, runs CMD under the lock (or as a job), and
/// flushes before the exit.
pub(crate) async fn exec(cli: &Cli, args: &ExecArgs) -> u8 {
    if let Err(msg) = args.check_job() {
        eprintln!("zklock: {msg}");
        return EXIT_USAGE;
    }
    let manager = match connect(cli).await {
        Ok(m) => m,
        Err(e) => return fail(&e),
    };
    let code = if args.is_job() {
        crate::job::exec_job(&manager, args).await
    } else {
        exec_with(&manager, args).await
    };
    flush(&manager).await;
    code
}

/// Takes the lock (a signal while waiting ends the wait), then runs CMD holding it.
async fn exec_with(manager: &LockManager, args: &ExecArgs) -> u8 {
    let (lock_path, acquire) = match start_acquire(manager, args) {
        Ok(started) => started,
        Err(e) => return fail(&e),
    };
    let guard = match unless_signalled(acquire).await {
        Ok(Ok(g)) => g,
        Ok(Err(e)) => return fail(&e),
        Err(signalled) => return signalled,
    };
    let child = command(&args.command)
        .env("ZKLOCK_FENCING_TOKEN", guard.fencing_token().to_string())
        .env("ZKLOCK_LOCK_PATH", &lock_path)
        .spawn();
    match child {
        Ok(child) => run_held(child, guard, &lock_path).await,
        Err(e) => {
            let code = cannot_run(&args.command[0], &e);
            drop(guard);
            code
        }
    }
}

/// Waits for CMD while holding `guard`: signals go to CMD, a lost hold sends it SIGTERM (and
/// the exit is 76); the hold is released once CMD has ended.
async fn run_held(mut child: tokio::process::Child, guard: Held, lock_path: &str) -> u8 {
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

/// The future that takes the lock of `exec`.
type Acquire = Pin<Box<dyn Future<Output = zklock_core::Result<Held>> + Send>>;

/// The lock path `exec` takes, and the future that takes it.
fn start_acquire(manager: &LockManager, args: &ExecArgs) -> zklock_core::Result<(String, Acquire)> {
    let at = target(&args.key, &args.path);
    if let Some(n) = args.semaphore {
        return acquire_semaphore(manager, at, n, args);
    }
    if args.read || args.write {
        return acquire_rwlock(manager, at, args);
    }
    acquire_mutex(manager, at, args)
}

/// One lease of the semaphore with `n` leases.
fn acquire_semaphore(
    manager: &LockManager,
    at: Target<'_>,
    n: u32,
    args: &ExecArgs,
) -> zklock_core::Result<(String, Acquire)> {
    let timeout = args.timeout;
    let (sem, path) = match at {
        Target::Key(key) => {
            let sem = manager.semaphore(key, n)?;
            let path = sem.path().to_string();
            (sem, path)
        }
        Target::Path(path) => (manager.semaphore_at_path(path, n)?, path.to_string()),
    };
    let acquire = async move {
        match timeout {
            Some(t) => sem.acquire_timeout(t).await,
            None => sem.acquire().await,
        }
        .map(Held::Lease)
    };
    Ok((path, Box::pin(acquire)))
}

/// The read side (`--read`) or the write side (`--write`) of a read/write lock.
fn acquire_rwlock(
    manager: &LockManager,
    at: Target<'_>,
    args: &ExecArgs,
) -> zklock_core::Result<(String, Acquire)> {
    let (timeout, write) = (args.timeout, args.write);
    let rw = match at {
        Target::Key(key) => manager.rwlock(key)?,
        Target::Path(path) => manager.rwlock_at_path(path)?,
    };
    let path = rw.path().to_string();
    let acquire = async move {
        let guard = match (timeout, write) {
            (Some(t), true) => rw.write_timeout(t).await,
            (Some(t), false) => rw.read_timeout(t).await,
            (None, true) => rw.write().await,
            (None, false) => rw.read().await,
        };
        guard.map(Held::Lock)
    };
    Ok((path, Box::pin(acquire)))
}

/// The exclusive lock.
fn acquire_mutex(
    manager: &LockManager,
    at: Target<'_>,
    args: &ExecArgs,
) -> zklock_core::Result<(String, Acquire)> {
    let timeout = args.timeout;
    let mutex = match at {
        Target::Key(key) => manager.mutex(key)?,
        Target::Path(path) => manager.mutex_at_path(path)?,
    };
    let path = mutex.path().to_string();
    let acquire = async move {
        match timeout {
            Some(t) => mutex.lock_timeout(t).await,
            None => mutex.lock().await,
        }
        .map(Held::Lock)
    };
    Ok((path, Box::pin(acquire)))
}

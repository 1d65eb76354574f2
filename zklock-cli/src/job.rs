//! `zklock exec` of a scheduled job (`--skip-if-locked`, `--at-least`, `--at-most`):
//! [`Job::run`](zklock_core::Job::run) runs CMD, or skips; CMD past `--at-most` or on a lost
//! lock is stopped.

use std::cell::{Cell, RefCell};

use zklock_core::{Error, Job, LockManager, LossReason, Ran};

use crate::args::{target, ExecArgs, Target};
use crate::exit::{fail, EXIT_AT_MOST, EXIT_LOST};
use crate::supervise::{
    cannot_run, command, exit_code, forward, group_of, signal, stop, DEFAULT_KILL_AFTER,
};

/// How the job's body ended: CMD's status, or the program that could not be spawned.
type BodyEnd<'a> = Result<std::io::Result<std::process::ExitStatus>, (&'a str, std::io::Error)>;

/// Runs CMD as the job KEY (or `--path`), or skips it; returns the exit code.
pub(crate) async fn exec_job(manager: &LockManager, args: &ExecArgs) -> u8 {
    let (job, lock_path) = match job_of(manager, args) {
        Ok(started) => started,
        Err(e) => return fail(&e),
    };

    // The body spawns CMD once the job is this host's, and waits for it. However the body
    // ends, the child comes back here (`Running`), so that CMD can still be stopped and reaped
    // after the job has dropped the body (past --at-most, or on a lost lock); `pid` tells the
    // signal forwarding below.
    let child: RefCell<Option<tokio::process::Child>> = RefCell::new(None);
    let pid: Cell<Option<libc::pid_t>> = Cell::new(None);
    let body = async {
        let token = zklock_core::current_fencing_token().expect("a job's body runs in its frame");
        let spawned = command(&args.command)
            .env("ZKLOCK_FENCING_TOKEN", token.to_string())
            .env("ZKLOCK_LOCK_PATH", &lock_path)
            // Its own process group: a run stopped past --at-most stops all that CMD started.
            .process_group(0)
            .spawn();
        let mut running = Running {
            child: Some(spawned.map_err(|e| (args.command[0].as_str(), e))?),
            slot: &child,
        };
        let cmd = running.child.as_mut().expect("set above");
        pid.set(group_of(cmd));
        Ok(cmd.wait().await)
    };
    let mut term = signal(libc::SIGTERM);
    let mut int = signal(libc::SIGINT);
    let mut hup = signal(libc::SIGHUP);
    let mut run = Box::pin(job.run(body));
    let outcome = loop {
        let sig = tokio::select! {
            outcome = &mut run => break outcome,
            _ = term.recv() => libc::SIGTERM,
            _ = int.recv() => libc::SIGINT,
            _ = hup.recv() => libc::SIGHUP,
        };
        // Before CMD runs, a signal ends the wait (the job future is dropped: nothing is left
        // behind); while it runs, it goes to CMD.
        match pid.get() {
            Some(_) => forward(pid.get(), sig),
            None => return 128 + sig as u8,
        }
    };
    // The body ends with the run, and gives the child back.
    drop(run);
    match outcome {
        Ok(ran) => ran_code(ran, args, &lock_path),
        Err(Error::LockLost { reason, .. }) => {
            let code = lost_code(reason, args, &lock_path);
            let running = child.borrow_mut().take();
            if let Some(running) = running {
                let grace = args.kill_after.unwrap_or(DEFAULT_KILL_AFTER);
                stop(running, pid.get(), grace).await;
            }
            code
        }
        Err(e) => fail(&e),
    }
}

/// The job for KEY (or `--path`) with the options of the command line, and its lock path.
fn job_of(manager: &LockManager, args: &ExecArgs) -> zklock_core::Result<(Job, String)> {
    let (mut job, lock_path) = match target(&args.key, &args.path) {
        Target::Key(key) => (manager.job(key)?, manager.path_of(key)?),
        Target::Path(path) => (manager.job_at_path(path)?, path.to_string()),
    };
    if let Some(timeout) = args.timeout {
        job = job.wait(timeout);
    }
    if let Some(at_least) = args.at_least {
        job = job.at_least(at_least);
    }
    if let Some(at_most) = args.at_most {
        job = job.at_most(at_most);
    }
    Ok((job, lock_path))
}

/// The exit code of a run that ended by itself: CMD's own, or that of a skip.
fn ran_code(ran: Ran<BodyEnd<'_>>, args: &ExecArgs, lock_path: &str) -> u8 {
    match ran {
        Ran::Ran(Ok(status)) => exit_code(status),
        Ran::Ran(Err((program, e))) => cannot_run(program, &e),
        Ran::Skipped => {
            let name = args.key.as_deref().unwrap_or(lock_path);
            eprintln!("zklock: skipped {name}: another host runs it, or ran it within its --at-least window");
            args.skipped_exit_code.unwrap_or(0)
        }
    }
}

/// Says why a running CMD is being stopped, and returns the exit code: 124 past `--at-most`,
/// 76 on a lost lock.
fn lost_code(reason: LossReason, args: &ExecArgs, lock_path: &str) -> u8 {
    if reason == LossReason::HoldLimit {
        eprintln!(
            "zklock: the command ran past --at-most {}; stopping it",
            humantime::format_duration(args.at_most.unwrap_or_default())
        );
        EXIT_AT_MOST
    } else {
        eprintln!(
            "zklock: lost the lock on {lock_path} while the command ran ({reason}); stopping it"
        );
        EXIT_LOST
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

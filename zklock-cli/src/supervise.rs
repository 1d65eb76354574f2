//! The child process CMD: spawning it, forwarding signals to it, stopping it (SIGTERM, then
//! SIGKILL after a grace), and the exit code for how it ended.

use std::future::Future;
use std::time::Duration;

use crate::exit::{EXIT_CANNOT_RUN, EXIT_NOT_FOUND};

/// How long a stopped command gets between SIGTERM and SIGKILL, unless `--kill-after` says.
pub(crate) const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(10);

/// `CMD [ARGS...]` as a command to spawn.
pub(crate) fn command(cmd: &[String]) -> tokio::process::Command {
    let (program, rest) = cmd.split_first().expect("clap requires CMD");
    let mut command = tokio::process::Command::new(program);
    command.args(rest);
    command
}

/// Says on stderr that `program` could not be spawned, and returns the exit code for it
/// (127 not found, 126 otherwise).
pub(crate) fn cannot_run(program: &str, e: &std::io::Error) -> u8 {
    eprintln!("zklock: cannot run {program:?}: {e}");
    if e.kind() == std::io::ErrorKind::NotFound {
        EXIT_NOT_FOUND
    } else {
        EXIT_CANNOT_RUN
    }
}

/// Our exit code for how CMD ended: its own code, 128+N for signal N.
pub(crate) fn exit_code(status: std::io::Result<std::process::ExitStatus>) -> u8 {
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

/// A stream of the signal `sig` delivered to this process.
pub(crate) fn signal(sig: libc::c_int) -> tokio::signal::unix::Signal {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(sig))
        .expect("installing a signal handler")
}

/// Waits for `wait` (a lock, an election) unless SIGTERM or SIGINT comes first: then the wait
/// is dropped (nothing is left behind) and the error is the exit code 128+N for signal N.
pub(crate) async fn unless_signalled<T>(wait: impl Future<Output = T>) -> Result<T, u8> {
    let mut term = signal(libc::SIGTERM);
    let mut int = signal(libc::SIGINT);
    tokio::select! {
        done = wait => Ok(done),
        _ = term.recv() => Err(128 + libc::SIGTERM as u8),
        _ = int.recv() => Err(128 + libc::SIGINT as u8),
    }
}

/// Sends `sig` to `pid` (a negative pid: to that process group).
pub(crate) fn forward(pid: Option<libc::pid_t>, sig: libc::c_int) {
    if let Some(pid) = pid {
        // SAFETY: kill(2) with a pid we spawned and still wait for; it has no memory effects.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// The process group of a child spawned with `process_group(0)`, as kill(2) names it.
pub(crate) fn group_of(child: &tokio::process::Child) -> Option<libc::pid_t> {
    child.id().map(|p| -(p as libc::pid_t))
}

/// Stops a command's process group `pid`: SIGTERM, then SIGKILL if it still runs after
/// `grace`; returns once it has exited.
pub(crate) async fn stop(
    mut child: tokio::process::Child,
    pid: Option<libc::pid_t>,
    grace: Duration,
) {
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

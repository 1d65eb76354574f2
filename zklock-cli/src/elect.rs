//! `zklock elect`: run CMD while this process leads an election (Curator's LeaderLatch); a
//! lost leadership stops CMD (SIGTERM, then SIGKILL after `--kill-after`) and exits 76.

use zklock_core::{LeaderLatch, Leadership, LockManager};

use crate::args::{target, Cli, ElectArgs, Target};
use crate::connect::{connect, flush};
use crate::exit::{fail, EXIT_LOST};
use crate::supervise::{
    cannot_run, command, exit_code, forward, group_of, signal, unless_signalled,
};

/// `zklock elect`: connects, leads, runs CMD, and flushes before the exit.
pub(crate) async fn elect(cli: &Cli, args: &ElectArgs) -> u8 {
    let manager = match connect(cli).await {
        Ok(m) => m,
        Err(e) => return fail(&e),
    };
    let code = elect_with(&manager, args).await;
    flush(&manager).await;
    code
}

/// Waits to be elected (a signal while waiting ends the wait), then runs CMD as the leader.
async fn elect_with(manager: &LockManager, args: &ElectArgs) -> u8 {
    let id = args.id.clone().unwrap_or_else(default_id);
    let latch = match target(&args.name, &args.path) {
        Target::Path(path) => manager.leader_latch_at_path(path, &id),
        Target::Key(name) => manager.leader_latch(name, &id),
    };
    let latch = match latch {
        Ok(latch) => latch,
        Err(e) => return fail(&e),
    };
    let leadership = match unless_signalled(latch.lead()).await {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => return fail(&e),
        Err(signalled) => return signalled,
    };
    eprintln!(
        "zklock: {id} leads {} (epoch {})",
        latch.path(),
        leadership.epoch()
    );
    let child = command(&args.command)
        .env("ZKLOCK_LEADER_EPOCH", leadership.epoch().to_string())
        .env("ZKLOCK_ELECTION_PATH", latch.path())
        // Its own process group: a lost leadership stops CMD and everything it started.
        .process_group(0)
        .spawn();
    match child {
        Ok(child) => lead(child, &latch, leadership, args).await,
        Err(e) => cannot_run(&args.command[0], &e),
    }
}

/// This participant's id when `--id` is not given: host:pid.
fn default_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    format!("{host}:{}", std::process::id())
}

/// Waits for CMD while leading: signals go to its process group; a lost leadership sends it
/// SIGTERM, then SIGKILL after `--kill-after`, and the exit is 76. Leaves the election once
/// CMD has ended.
async fn lead(
    mut child: tokio::process::Child,
    latch: &LeaderLatch,
    leadership: Leadership,
    args: &ElectArgs,
) -> u8 {
    // Signals go to CMD's whole process group.
    let pid = group_of(&child);
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

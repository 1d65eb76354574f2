//! `zklock`: the shell's entry to zklock, like flock(1) across machines.
//!
//! ```text
//! zklock [--connect HOSTS|REDIS_URL|POSTGRES_URL|ETCD_URL] [--namespace NS] [--session-timeout DUR | --lease DUR] \
//!        exec (KEY | --path PATH) [--timeout DUR] -- CMD [ARGS...]
//! zklock exec (KEY | --path PATH) --skip-if-locked [--at-least DUR] [--at-most DUR] \
//!        [--skipped-exit-code N] [--kill-after DUR] -- CMD [ARGS...]
//! zklock elect (NAME | --path PATH) [--id ID] [--kill-after DUR] -- CMD [ARGS...]
//! zklock ls [PREFIX] | status KEY | revoke KEY
//! zklock top [PREFIX] [--interval DUR] [--once | --iterations N]
//! ```
//!
//! `--connect redis://host:port[/db]` runs on the Redis backend, `--connect
//! postgres://user@host/db` on PostgreSQL's advisory locks, `--connect etcd://host:2379` on etcd
//! (in etcd's own format: `etcdctl lock` and `etcdctl elect` take part), `--connect
//! mysql://user:password@host/db` on MySQL or MariaDB (`GET_LOCK`): `exec` (jobs included), `elect`,
//! `ls`, `status` and `top` work the same, `--lease` (instead of ZooKeeper's
//! `--session-timeout`) says how long a silent holder keeps its locks (on PostgreSQL the
//! server ends a holding session silent this long; on etcd, the TTL of the lease, whole seconds;
//! on MySQL, the sessions' wait_timeout, whole seconds), and `revoke` says it is unsupported
//! (revocation is ZooKeeper's).
//!
//! Exit codes of `exec`: CMD's own code when it ran (128+N when a signal N ended it);
//! 64 bad usage or key; 69 the server unreachable or the session failed; 75 timed out waiting
//! for the lock; 76 the lock was lost while CMD ran (CMD got SIGTERM), or (ZooKeeper) the
//! waiting node was deleted by someone else before CMD ran; 124 a job's CMD ran past
//! `--at-most` and was stopped; 126 CMD could not run; 127 CMD not found. A skipped job exits 0
//! (or `--skipped-exit-code`).

mod args;
mod connect;
mod durations;
mod elect;
mod exec;
mod exit;
mod job;
mod ls;
mod revoke;
mod status;
mod supervise;
mod top;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::args::{Cli, Command};
use crate::connect::operate;
use crate::exit::{EXIT_UNAVAILABLE, EXIT_USAGE};

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

/// Runs the command of the command line; returns the exit code.
async fn run(cli: Cli) -> u8 {
    match cli.command {
        Command::Exec(ref args) => exec::exec(&cli, args).await,
        Command::Ls(ref args) => {
            operate(&cli, |m| async move { ls::ls(&m, &args.prefix).await }).await
        }
        Command::Top(ref args) => operate(&cli, |m| async move { top::top(&m, args).await }).await,
        Command::Status(ref args) => {
            operate(&cli, |m| async move { status::status(&m, args).await }).await
        }
        Command::Revoke(ref args) => {
            operate(&cli, |m| async move { revoke::revoke(&m, args).await }).await
        }
        Command::Elect(ref args) => elect::elect(&cli, args).await,
        Command::Setup(ref args) => setup(&cli, args),
    }
}

/// `zklock setup`: prints the backend's set-up, or says there is none.
fn setup(cli: &Cli, args: &args::SetupArgs) -> u8 {
    let kind = match zklock_core::BackendKind::of(&cli.connect) {
        Ok(kind) => kind,
        Err(e) => return exit::fail(&e),
    };
    match zklock_core::LockManager::builder(&cli.connect).setup_sql(args.grant_to.as_deref()) {
        Ok(Some(sql)) => {
            print!("{sql}");
            0
        }
        Ok(None) => {
            eprintln!(
                "zklock: {} needs no set-up; the account it needs is in the security guide",
                kind.name()
            );
            0
        }
        Err(e) => exit::fail(&e),
    }
}

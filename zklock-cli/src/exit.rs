//! The exit codes of `zklock`, and how an error of zklock becomes one.

use zklock_core::Error;

/// Exit code: bad usage, bad key or bad option.
pub(crate) const EXIT_USAGE: u8 = 64;
/// Exit code: the server (ZooKeeper, Redis, PostgreSQL) unreachable, or the session failed
/// before CMD ran.
pub(crate) const EXIT_UNAVAILABLE: u8 = 69;
/// Exit code: the lock was not acquired within `--timeout`.
pub(crate) const EXIT_TIMEOUT: u8 = 75;
/// Exit code: the hold was lost while CMD ran; CMD was sent SIGTERM.
pub(crate) const EXIT_LOST: u8 = 76;
/// Exit code: a job's CMD ran past `--at-most` and was stopped (SIGTERM, then SIGKILL), as
/// timeout(1) exits.
pub(crate) const EXIT_AT_MOST: u8 = 124;
/// Exit code: CMD exists but could not be executed.
pub(crate) const EXIT_CANNOT_RUN: u8 = 126;
/// Exit code: CMD was not found.
pub(crate) const EXIT_NOT_FOUND: u8 = 127;

/// Says what went wrong on stderr, and returns the exit code for it.
pub(crate) fn fail(err: &Error) -> u8 {
    eprintln!("zklock: {err}");
    match err {
        Error::InvalidKey { .. } | Error::Config(_) | Error::InvalidArgument(_) => EXIT_USAGE,
        Error::Timeout { .. } => EXIT_TIMEOUT,
        Error::LockLost { .. } | Error::Dequeued { .. } => EXIT_LOST,
        _ => EXIT_UNAVAILABLE,
    }
}

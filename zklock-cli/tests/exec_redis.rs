//! `zklock --connect redis://... exec` against a real redis-server: the command runs with a
//! fencing token, concurrent execs exclude each other, a timeout exits 75, a holder paused past
//! its lease exits 76, and the operator commands say they are unsupported.

mod common;

use common::*;
use zklock_testkit::RedisServer;

#[test]
fn runs_the_command_with_the_token_and_returns_its_exit_code() {
    let redis = RedisServer::start().unwrap();
    let (token, path) = exec_token_and_path(&redis.url(), &[]);
    // The fence counter starts at the server's time in µs.
    assert!(token > 1_600_000_000_000_000, "{token}");
    assert_eq!(path, "/zklock/locks/job%2F1");
}

#[test]
fn concurrent_execs_never_overlap_and_tokens_increase() {
    let redis = RedisServer::start().unwrap();
    concurrent_exec_tokens(&redis.url());
}

#[test]
fn timeout_exits_75_and_a_lost_lease_exits_76() {
    let redis = RedisServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let holder = spawn_holder(&redis.url(), &[], "busy", dir.path());
    let out = zklock(&redis.url())
        .args(["exec", "busy", "--timeout", "300ms", "--", "true"])
        .output()
        .unwrap();
    assert_exit(&out, 75);
    // SIGTERM: zklock forwards it to its command and exits.
    // SAFETY: kill(2) on a child we spawned and have not reaped; no memory effects.
    unsafe { libc::kill(holder.id() as libc::pid_t, libc::SIGTERM) };
    holder.wait_with_output().unwrap();

    // The server stops answering past the holder's 1 s lease: the holder loses the lock, sends
    // its command SIGTERM and exits 76.
    let holder = spawn_holder(&redis.url(), &["--lease", "1s"], "paused", dir.path());
    redis.pause().unwrap();
    let out = holder.wait_with_output().unwrap();
    redis.resume().unwrap();
    assert_exit(&out, 76);
    assert!(String::from_utf8_lossy(&out.stderr).contains("lease"));
}

#[test]
fn only_revoke_is_unsupported_on_redis() {
    let redis = RedisServer::start().unwrap();
    only_revoke_is_unsupported(&redis.url(), "redis");
}

//! `zklock --connect postgres://... exec` against a real PostgreSQL: the command runs with a
//! fencing token, concurrent execs exclude each other, a timeout exits 75, a holder whose
//! connection the server ends exits 76, and the operator commands say they are unsupported.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use zklock_testkit::PostgresServer;

#[test]
fn runs_the_command_with_the_token_and_returns_its_exit_code() {
    let pg = PostgresServer::start().unwrap();
    let (token, path) = exec_token_and_path(&pg.url(), &[]);
    // The fence row is raised to at least the server's time in µs.
    assert!(token > 1_600_000_000_000_000, "{token}");
    assert_eq!(path, "/zklock/locks/job%2F1");
    // The grant raised the row's fence to its token.
    let fence = pg
        .psql("SELECT fence FROM zklock_keys WHERE path = '/zklock/locks/job%2F1'")
        .unwrap();
    assert_eq!(fence.trim(), token.to_string());
}

#[test]
fn concurrent_execs_never_overlap_and_tokens_increase() {
    let pg = PostgresServer::start().unwrap();
    concurrent_exec_tokens(&pg.url());
}

#[test]
fn timeout_exits_75_and_a_terminated_holder_exits_76() {
    let pg = PostgresServer::start().unwrap();
    let holder = zklock(&pg.url())
        .args(["exec", "busy", "--", "sleep", "60"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The holder's lock shows on the server once granted (object id 0, which the schema's
    // creation takes for a moment, is no lock path's).
    let held =
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 2053852235 \
                AND objid > 0 AND granted";
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while pg.psql(held).unwrap().trim() != "1" {
        assert!(std::time::Instant::now() < deadline, "never held");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = zklock(&pg.url())
        .args(["exec", "busy", "--timeout", "300ms", "--", "true"])
        .output()
        .unwrap();
    assert_exit(&out, 75);

    // The server ends the holding session: the holder loses the lock, sends its command
    // SIGTERM and exits 76.
    pg.psql(
        "SELECT pg_terminate_backend(pid) FROM pg_locks \
         WHERE locktype = 'advisory' AND classid = 2053852235 AND objid > 0 AND granted",
    )
    .unwrap();
    let out = holder.wait_with_output().unwrap();
    assert_exit(&out, 76);
    assert!(String::from_utf8_lossy(&out.stderr).contains("lost"));
}

#[test]
fn only_revoke_is_unsupported_on_postgres() {
    let pg = PostgresServer::start().unwrap();
    only_revoke_is_unsupported(&pg.url(), "postgres");
}

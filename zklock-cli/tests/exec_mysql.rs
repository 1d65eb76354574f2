//! `zklock --connect mysql://... exec` against a real MariaDB: the command runs with a
//! fencing token, concurrent execs exclude each other and a bare `GET_LOCK` holder of the
//! documented name, a timeout exits 75, a holder whose session the server ends exits 76, and
//! the operator commands say what they support.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use zklock_testkit::MariaDbServer;

/// The user-lock name of `zklock exec job/1`'s lock (the documented name of its path).
const JOB_PATH: &str = "/zklock/locks/job%2F1";

/// The session that holds the user lock of `path`, as the server says (`NULL`: none).
fn holder(db: &MariaDbServer, path: &str) -> String {
    let name = zklock_core::mysql_lock_name(path);
    db.root_sql(&format!("SELECT IS_USED_LOCK('{name}')"))
        .unwrap()
}

/// Waits until the lock of `path` is held.
fn until_held(db: &MariaDbServer, path: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let h = holder(db, path);
        if h != "NULL" {
            return h;
        }
        assert!(std::time::Instant::now() < deadline, "never held");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn runs_the_command_with_the_token_and_returns_its_exit_code() {
    let db = MariaDbServer::start().unwrap();
    let (token, path) = exec_token_and_path(&db.url(), &[]);
    // The fence is raised to at least the server's time in µs.
    assert!(token > 1_600_000_000_000_000, "{token}");
    assert_eq!(path, JOB_PATH);
    let name = zklock_core::mysql_lock_name(&path);
    let fence = db
        .root_sql(&format!(
            "SELECT fence FROM zklock.zklock_locks WHERE name = '{name}'"
        ))
        .unwrap();
    assert_eq!(fence, token.to_string());
}

#[test]
fn concurrent_execs_never_overlap_and_tokens_increase() {
    let db = MariaDbServer::start().unwrap();
    concurrent_exec_tokens(&db.url());
}

/// A bare client holding the documented name keeps `zklock exec` out (it times out, 75);
/// once the client lets go, the exec runs.
#[test]
fn a_bare_get_lock_holder_keeps_exec_out() {
    let db = MariaDbServer::start().unwrap();
    let name = zklock_core::mysql_lock_name(JOB_PATH);
    // The client's session holds the name for 3 s, then ends (which frees it).
    let bare = std::process::Command::new("mariadb")
        .args([
            "--no-defaults",
            "--protocol=TCP",
            "-h127.0.0.1",
            &format!("-P{}", db.port()),
            "-uzklock",
            "-pzklock",
            "zklock",
            "-e",
            &format!("SELECT GET_LOCK('{name}', 0); DO SLEEP(3);"),
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    until_held(&db, JOB_PATH);
    let out = zklock(&db.url())
        .args(["exec", "job/1", "--timeout", "500ms", "--", "true"])
        .output()
        .unwrap();
    assert_exit(&out, 75);
    let out = zklock(&db.url())
        .args(["exec", "job/1", "--timeout", "20s", "--", "true"])
        .output()
        .unwrap();
    assert_exit(&out, 0);
    let mut bare = bare;
    bare.wait().unwrap();
}

#[test]
fn timeout_exits_75_and_a_killed_holder_exits_76() {
    let db = MariaDbServer::start().unwrap();
    let holder_exec = zklock(&db.url())
        .args(["exec", "busy", "--", "sleep", "60"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let session = until_held(&db, "/zklock/locks/busy");
    let out = zklock(&db.url())
        .args(["exec", "busy", "--timeout", "300ms", "--", "true"])
        .output()
        .unwrap();
    assert_exit(&out, 75);

    // The server ends the holding session: the holder loses the lock, sends its command
    // SIGTERM and exits 76.
    db.kill_connection(session.parse().unwrap()).unwrap();
    let out = holder_exec.wait_with_output().unwrap();
    assert_exit(&out, 76);
    assert!(String::from_utf8_lossy(&out.stderr).contains("lost"));
}

#[test]
fn only_revoke_is_unsupported_on_mysql() {
    let db = MariaDbServer::start().unwrap();
    only_revoke_is_unsupported(&db.url(), "mysql");
}

//! `zklock --connect postgres://... exec` against a real PostgreSQL: the command runs with a
//! fencing token, concurrent execs exclude each other, a timeout exits 75, a holder whose
//! connection the server ends exits 76, and the operator commands say they are unsupported.

use std::process::{Command, Stdio};
use std::time::Duration;

use zklock_testkit::PostgresServer;

fn zklock(url: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zklock"));
    c.args(["--connect", url]);
    c
}

#[test]
fn runs_the_command_with_the_token_and_returns_its_exit_code() {
    let pg = PostgresServer::start().unwrap();
    let out = zklock(&pg.url())
        .args([
            "exec",
            "job/1",
            "--",
            "sh",
            "-c",
            "echo $ZKLOCK_FENCING_TOKEN $ZKLOCK_LOCK_PATH; exit 7",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let (token, path) = stdout.trim().split_once(' ').unwrap();
    // The fence row is raised to at least the server's time in µs.
    assert!(
        token.parse::<i64>().unwrap() > 1_600_000_000_000_000,
        "{stdout}"
    );
    assert_eq!(path, "/zklock/locks/job%2F1");
    // A fresh process reserved a block of tokens ending at the row's fence, and got its first.
    let first = pg
        .psql("SELECT fence - 1048575 FROM zklock_keys WHERE path = '/zklock/locks/job%2F1'")
        .unwrap();
    assert_eq!(first.trim(), token);
}

#[test]
fn concurrent_execs_never_overlap_and_tokens_increase() {
    let pg = PostgresServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("held");
    let log = dir.path().join("log");
    // mkdir is atomic: a second holder inside the critical section would fail it (exit 99).
    let script = format!(
        "mkdir {f} || exit 99; echo $ZKLOCK_FENCING_TOKEN >> {l}; sleep 0.2; rmdir {f}",
        f = flag.display(),
        l = log.display()
    );
    let children: Vec<_> = (0..4)
        .map(|_| {
            zklock(&pg.url())
                .args(["exec", "shared", "--", "sh", "-c", &script])
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert_eq!(c.wait().unwrap().code(), Some(0), "two holders at once");
    }
    let tokens: Vec<i64> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(tokens.len(), 4);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
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
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The server ends the holding session: the holder loses the lock, sends its command
    // SIGTERM and exits 76.
    pg.psql(
        "SELECT pg_terminate_backend(pid) FROM pg_locks \
         WHERE locktype = 'advisory' AND classid = 2053852235 AND objid > 0 AND granted",
    )
    .unwrap();
    let out = holder.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(76),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("lost"));
}

#[test]
fn operator_commands_are_unsupported_on_postgres() {
    let pg = PostgresServer::start().unwrap();
    for args in [&["ls"][..], &["status", "k"], &["revoke", "k"]] {
        let out = zklock(&pg.url()).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(69), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("postgres backend does not support"),
            "{stderr}"
        );
    }
}

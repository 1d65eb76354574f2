//! What the CLI's tests share across backends: the binary, and the checks every backend's
//! `exec` must pass the same way.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `zklock` binary, pointed at `connect` (a ZooKeeper connect string, or a Redis or
/// PostgreSQL URL).
pub fn zklock(connect: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zklock"));
    c.args(["--connect", connect]);
    c
}

/// Checks that the command exited with `code`, showing its stderr if not.
pub fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `zklock [global...] exec job/1 -- sh -c '...; exit 7'`, checks that the exit code is
/// the command's, and returns the token and lock path the command was given.
pub fn exec_token_and_path(connect: &str, global: &[&str]) -> (i64, String) {
    let out = zklock(connect)
        .args(global)
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
    assert_exit(&out, 7);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let (token, path) = stdout.trim().split_once(' ').unwrap();
    (
        token
            .parse()
            .unwrap_or_else(|_| panic!("a token: {stdout}")),
        path.to_string(),
    )
}

/// Runs four `zklock exec shared` at once, each command checking that it is alone in its
/// critical section, and returns the tokens in the order the commands ran: they must all
/// succeed, and the tokens must increase.
pub fn concurrent_exec_tokens(connect: &str) -> Vec<i64> {
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
            zklock(connect)
                .args(["exec", "shared", "--", "sh", "-c", &script])
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert_eq!(
            c.wait().unwrap().code(),
            Some(0),
            "two holders at once (or a failure)"
        );
    }
    let tokens: Vec<i64> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(tokens.len(), 4);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must increase: {tokens:?}"
    );
    tokens
}

/// Starts `zklock [global...] exec KEY -- sh -c 'touch MARK; exec sleep 60'` and returns once
/// its command runs (so the lock is held), with stderr piped for the caller's checks.
pub fn spawn_holder(connect: &str, global: &[&str], key: &str, dir: &Path) -> Child {
    let mark = dir.join(format!("holding-{}", key.replace('/', "_")));
    let script = format!("touch {}; exec sleep 60", mark.display());
    let mut holder = zklock(connect)
        .args(global)
        .args(["exec", key, "--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !mark.exists() {
        if let Some(status) = holder.try_wait().unwrap() {
            panic!("the holder exited ({status}) before its command ran");
        }
        assert!(Instant::now() < deadline, "the holder never held {key}");
        std::thread::sleep(Duration::from_millis(20));
    }
    holder
}

/// Checks that `ls` and `status` answer on `backend`, and that `revoke` exits 69 saying that
/// `backend` does not support revocation, and why.
pub fn only_revoke_is_unsupported(connect: &str, backend: &str) {
    for args in [&["ls"][..], &["status", "k"]] {
        let out = zklock(connect).args(args).output().unwrap();
        assert_exit(&out, 0);
    }
    let out = zklock(connect).args(["revoke", "k"]).output().unwrap();
    assert_eq!(out.status.code(), Some(69));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!("{backend} backend does not support revocation (");
    assert!(stderr.contains(&expected), "{stderr}");
}

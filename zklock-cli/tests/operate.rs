//! The operator's side of `zklock`: ls, status, revoke, and exec with --read, --write and
//! --semaphore, against a real server.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::zklock;
use zklock_core::{LockManager, LossReason};
use zklock_testkit::ZkServer;

fn run(connect: &str, args: &[&str]) -> (i32, String, String) {
    let out = zklock(connect).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_status_and_revoke_show_and_move_holders() {
    let zk = ZkServer::start().unwrap();
    let c = zk.connect_string();
    let m = LockManager::builder(&c)
        .identity("billing-1")
        .connect()
        .await
        .unwrap();
    let (code, out, _) = run(&c, &["ls"]);
    assert_eq!(code, 0);
    assert!(out.contains("no locks"), "{out}");

    let held = m.lock("invoice/7").await.unwrap();
    held.make_revocable();
    let rw = m.rwlock("catalog").unwrap().read().await.unwrap();
    let (code, out, err) = run(&c, &["ls"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("invoice/7") && out.contains("mutex") && out.contains("billing-1"),
        "{out}"
    );
    assert!(out.contains("catalog") && out.contains("rwlock"), "{out}");
    assert!(out.contains(&held.fencing_token().to_string()), "{out}");
    let (_, out, _) = run(&c, &["ls", "inv"]);
    assert!(
        out.contains("invoice/7") && !out.contains("catalog"),
        "{out}"
    );

    let (code, out, _) = run(&c, &["status", "invoice/7"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("holder")
            && out.contains("billing-1")
            && out.contains("/zklock/locks/invoice%2F7"),
        "{out}"
    );

    let (code, out, _) = run(&c, &["revoke", "invoice/7"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("asked the holder"), "{out}");
    let reason = tokio::time::timeout(Duration::from_secs(10), held.lost())
        .await
        .unwrap();
    assert_eq!(reason, LossReason::Revoked);
    drop((held, rw));
    m.flush().await;
    let (code, out, _) = run(&c, &["revoke", "invoice/7"]);
    assert_eq!(code, 1);
    assert!(out.contains("nothing to revoke"), "{out}");
    let (code, _, err) = run(&c, &["status", ""]);
    assert_eq!(code, 64, "{err}");
}

/// Polls `zklock status` (bounded) until `key` has `n` holders.
fn until_holders(connect: &str, key: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, out, _) = run(connect, &["status", key]);
        if out.lines().filter(|l| l.starts_with("holder")).count() == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key} never had {n} holders: {out}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn exec_read_shares_write_excludes_and_semaphore_counts() {
    let zk = ZkServer::start().unwrap();
    let c = zk.connect_string();
    // Two readers at once: the second finishes while the first still runs.
    let mut first = zklock(&c)
        .args(["exec", "doc", "--read", "--", "sleep", "3"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let (code, _, err) = run(
        &c,
        &["exec", "doc", "--read", "--timeout", "2s", "--", "true"],
    );
    assert_eq!(code, 0, "readers share: {err}");
    assert!(
        first.try_wait().unwrap().is_none(),
        "the second reader ran while the first held"
    );
    // A writer cannot get in while the reader runs.
    let (code, _, _) = run(
        &c,
        &["exec", "doc", "--write", "--timeout", "300ms", "--", "true"],
    );
    assert_eq!(code, 75);
    assert!(first.wait().unwrap().success());

    // A semaphore of 2: two holders at once, a third times out.
    let spawn = || {
        zklock(&c)
            .args(["exec", "slots", "--semaphore", "2", "--", "sleep", "3"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    let (mut a, mut b) = (spawn(), spawn());
    until_holders(&c, "slots", 2);
    let (code, _, err) = run(
        &c,
        &[
            "exec",
            "slots",
            "--semaphore",
            "2",
            "--timeout",
            "300ms",
            "--",
            "true",
        ],
    );
    assert_eq!(code, 75, "{err}");
    assert!(a.wait().unwrap().success() && b.wait().unwrap().success());
    let (code, _, _) = run(&c, &["exec", "slots", "--semaphore", "2", "--", "true"]);
    assert_eq!(code, 0);
    let (code, _, err) = run(&c, &["exec", "doc", "--read", "--write", "--", "true"]);
    assert_eq!(code, 64, "conflicting modes are a usage error: {err}");
}

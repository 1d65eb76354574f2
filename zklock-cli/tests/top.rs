//! `zklock top`: the lock table, refreshed, against a real server: holders, waiters, the
//! longest wait first.

use std::process::Command;
use std::time::Duration;

use zklock_core::LockManager;
use zklock_testkit::ZkServer;

fn top(connect: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_zklock"))
        .args(["--connect", connect, "top"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits (bounded) until `key` has `n` waiters.
async fn until_waiters(m: &LockManager, key: &str, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while m.inspect(key).await.unwrap().waiters.len() != n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key} never had {n} waiters"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_shows_holders_and_waiters_longest_wait_first() {
    let zk = ZkServer::start().unwrap();
    let c = zk.connect_string();
    let holder = LockManager::builder(&c)
        .identity("holder-1")
        .connect()
        .await
        .unwrap();
    let other = LockManager::builder(&c)
        .identity("waiter-2")
        .connect()
        .await
        .unwrap();

    let (code, out, err) = top(&c, &["--once"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("0 locks, 0 waiters"), "{out}");

    // "alpha" is held with nobody waiting; "beta" is held and waited for.
    let alpha = holder.lock("alpha").await.unwrap();
    let beta = holder.lock("beta").await.unwrap();
    let waiting = tokio::spawn({
        let other = other.clone();
        async move { other.lock("beta").await.unwrap() }
    });
    until_waiters(&holder, "beta", 1).await;

    let (code, out, err) = top(&c, &["--once"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].contains("2 locks, 1 waiters under /zklock/locks"),
        "{out}"
    );
    assert!(lines[1].contains("LONGEST WAIT"), "{out}");
    // The lock waited for comes first, whatever the keys' order.
    assert!(lines[2].starts_with("beta "), "{out}");
    assert!(lines[3].starts_with("alpha "), "{out}");
    let beta_row: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(beta_row[1], "mutex", "{out}");
    assert!(lines[2].contains("holder-1"), "{out}");
    assert_eq!(beta_row[beta_row.len() - 4], "1", "one waiter: {out}");
    assert_eq!(
        beta_row[beta_row.len() - 1],
        beta.fencing_token().to_string(),
        "{out}"
    );
    assert!(
        lines[3].contains(&alpha.fencing_token().to_string()),
        "{out}"
    );
    assert_eq!(lines.len(), 4, "{out}");

    // Refreshed: as many tables as iterations; a prefix narrows them.
    let (code, out, err) = top(&c, &["al", "--iterations", "2", "--interval", "50ms"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.matches("zklock top:").count(), 2, "{out}");
    assert_eq!(out.matches("\nalpha ").count(), 2, "{out}");
    assert!(!out.contains("beta"), "{out}");

    // Once the holder lets go, the waiter holds and nobody waits.
    drop(beta);
    let got = waiting.await.unwrap();
    let (_, out, _) = top(&c, &["beta", "--once"]);
    assert!(out.contains("1 locks, 0 waiters"), "{out}");
    assert!(out.contains("waiter-2"), "{out}");
    drop((alpha, got));
}

//! `zklock ls`, `status` and `top` on Redis and PostgreSQL, against real servers: the holder
//! and a waiter from another process, as the server has them; and `revoke`, which those
//! backends cannot carry, refused with the reason.

mod common;

use std::time::Duration;

use common::zklock;
use zklock_core::LockManager;
use zklock_testkit::{PostgresServer, RedisServer};

fn run(connect: &str, args: &[&str]) -> (i32, String, String) {
    let out = zklock(connect).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn shows_holder_and_waiter(url: &str) {
    let (code, out, err) = run(url, &["ls"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("no locks"), "{out}");

    let holder = LockManager::builder(url)
        .identity("billing-1")
        .connect()
        .await
        .unwrap();
    let other = LockManager::builder(url)
        .identity("billing-2")
        .connect()
        .await
        .unwrap();
    let held = holder.lock("invoice/7").await.unwrap();
    let waiting = tokio::spawn({
        let other = other.clone();
        async move { other.lock("invoice/7").await.unwrap() }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while holder.inspect("invoice/7").await.unwrap().waiters.len() != 1 {
        assert!(tokio::time::Instant::now() < deadline, "no waiter shown");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let token = held.fencing_token().to_string();

    let (code, out, err) = run(url, &["ls"]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("invoice/7 "))
        .unwrap_or_else(|| panic!("a row for invoice/7: {out}"));
    let row: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(row[1], "mutex", "{out}");
    assert!(
        line.contains("billing-1") && !line.contains("billing-2"),
        "{out}"
    );
    assert_eq!(row[row.len() - 3], "1", "one waiter: {out}");
    assert_eq!(row[row.len() - 1], token, "{out}");

    let (code, out, err) = run(url, &["status", "invoice/7"]);
    assert_eq!(code, 0, "{err}");
    let holder_line = out.lines().find(|l| l.starts_with("holder")).unwrap_or("");
    let waiter_line = out.lines().find(|l| l.starts_with("waiter")).unwrap_or("");
    assert!(
        holder_line.contains("billing-1") && holder_line.contains(&token),
        "{out}"
    );
    assert!(waiter_line.contains("billing-2"), "{out}");

    let (code, out, err) = run(url, &["top", "--once"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 locks, 1 waiters"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("invoice/7 ") && l.contains("billing-1")),
        "{out}"
    );

    let (code, _, err) = run(url, &["revoke", "invoice/7"]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("revocation"), "{err}");

    drop(held);
    let next = waiting.await.unwrap();
    next.release().await.unwrap();
    holder.flush().await;
    other.flush().await;
    let (_, out, _) = run(url, &["ls"]);
    assert!(out.contains("no locks"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_ls_status_and_top_show_the_holder_and_a_waiter() {
    let redis = RedisServer::start().unwrap();
    shows_holder_and_waiter(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_ls_status_and_top_show_the_holder_and_a_waiter() {
    let pg = PostgresServer::start().unwrap();
    shows_holder_and_waiter(&pg.url()).await;
}

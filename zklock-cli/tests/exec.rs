//! `zklock exec` against a real server: exit codes, the fencing token, exclusion between
//! processes, timeouts, a lost hold, and a holder killed with SIGKILL.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use zklock_core::LockManager;
use zklock_testkit::ZkServer;

async fn children(m: &LockManager, path: &str) -> Vec<String> {
    m.client::<zklock_core::zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .list_children(path)
        .await
        .unwrap_or_default()
}

async fn until_children(m: &LockManager, path: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while children(m, path).await.len() != n {
        assert!(
            Instant::now() < deadline,
            "{path} never reached {n} children"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn runs_the_command_with_the_token_and_returns_its_exit_code() {
    let zk = ZkServer::start().unwrap();
    let (token, path) = exec_token_and_path(&zk.connect_string(), &["--session-timeout", "3s"]);
    assert!(token > 0, "{token}");
    assert_eq!(path, "/zklock/locks/job%2F1");
}

#[test]
fn concurrent_execs_never_overlap() {
    let zk = ZkServer::start().unwrap();
    concurrent_exec_tokens(&zk.connect_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_exits_75_and_lost_hold_exits_76() {
    let zk = ZkServer::start().unwrap();
    let m = LockManager::connect(zk.connect_string()).await.unwrap();
    let path = m.path_of("busy").unwrap();

    let held = m.lock("busy").await.unwrap();
    let out = zklock(&zk.connect_string())
        .args(["exec", "busy", "--timeout", "300ms", "--", "true"])
        .output()
        .unwrap();
    assert_exit(&out, 75);
    assert!(String::from_utf8_lossy(&out.stderr).contains("timed out"));
    held.release().await.unwrap();
    assert!(
        children(&m, &path).await.is_empty(),
        "the timed-out exec left its node behind"
    );

    // The hold is lost while the command runs (its node is deleted): SIGTERM, exit 76.
    let child = zklock(&zk.connect_string())
        .args(["exec", "busy", "--", "sleep", "60"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    until_children(&m, &path, 1).await;
    let node = children(&m, &path).await.pop().unwrap();
    let started = Instant::now();
    m.client::<zklock_core::zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .delete(&format!("{path}/{node}"), None)
        .await
        .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    assert_eq!(
        status.status.code(),
        Some(76),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the command was not stopped"
    );
    assert!(String::from_utf8_lossy(&status.stderr).contains("lost the lock"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_with_sigkill_frees_the_lock_after_its_session_timeout() {
    let zk = ZkServer::start().unwrap();
    let m = LockManager::connect(zk.connect_string()).await.unwrap();
    let path = m.path_of("killed").unwrap();
    let mut holder = zklock(&zk.connect_string())
        .args([
            "--session-timeout",
            "2s",
            "exec",
            "killed",
            "--",
            "sleep",
            "600",
        ])
        .spawn()
        .unwrap();
    until_children(&m, &path, 1).await;
    assert!(
        m.try_lock("killed").await.unwrap().is_none(),
        "the lock is held by the other process"
    );
    let killed_at = Instant::now();
    holder.kill().unwrap(); // SIGKILL: no release, the session just stops
    holder.wait().unwrap();
    let _ = Command::new("pkill").args(["-f", "^sleep 600$"]).status();
    let g = m
        .lock_timeout("killed", Duration::from_secs(30))
        .await
        .expect("freed by session expiry");
    assert!(g.is_held());
    assert!(
        killed_at.elapsed() >= Duration::from_millis(1500),
        "freed before the session could expire"
    );
}

#[test]
fn clear_errors_for_bad_input_and_unreachable_servers() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = zklock(&format!("127.0.0.1:{port}"))
        .args(["--session-timeout", "1s", "exec", "k", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    // Nothing listens there: said at once, with the same exit code as a server that is down.
    assert!(String::from_utf8_lossy(&out.stderr).contains("refused the connection"));

    let zk = ZkServer::start().unwrap();
    let out = zklock(&zk.connect_string())
        .args(["exec", "", "--", "true"])
        .output()
        .unwrap();
    assert_exit(&out, 64);
    assert!(String::from_utf8_lossy(&out.stderr).contains("empty"));
    let out = zklock(&zk.connect_string())
        .args(["exec", "--path", "relative", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let out = zklock(&zk.connect_string())
        .args(["exec", "k", "--", "/nonexistent/cmd"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
}

//! Bad input and misuse: hostile keys at every entry point, oversized node data and paths, an
//! unreachable or wrong connect string, a wrong chroot, an ACL-protected path the client may not
//! write. Each is a clear error in bounded time, nothing is created outside the namespace, and
//! nothing is left behind.

use crate::common;
use crate::faults;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::*;
use faults::*;
use zklock::{zookeeper_client, Error, LockManager, MAX_KEY_LEN};

/// Every znode path, with nothing under `/zookeeper`.
async fn everything(m: &LockManager) -> Vec<String> {
    tree(m, "/").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_are_refused_by_every_entry_point_and_create_nothing() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let before = everything(&m).await;
    let too_long = "k".repeat(MAX_KEY_LEN + 1);
    for bad in [
        "",
        "nul\0byte",
        "new\nline",
        "tab\there",
        "\u{7f}",
        "\u{85}",
        &too_long,
    ] {
        let results: Vec<(&str, Result<(), Error>)> = vec![
            ("lock", m.lock(bad).await.map(drop)),
            ("try_lock", m.try_lock(bad).await.map(drop)),
            (
                "lock_timeout",
                m.lock_timeout(bad, Duration::from_secs(1)).await.map(drop),
            ),
            ("with_lock", m.with_lock(bad, async {}).await),
            ("mutex", m.mutex(bad).map(drop)),
            ("rwlock", m.rwlock(bad).map(drop)),
            ("semaphore", m.semaphore(bad, 2).map(drop)),
            ("path_of", m.path_of(bad).map(drop)),
        ];
        for (entry, result) in results {
            match result {
                Err(e @ Error::InvalidKey { .. }) => {
                    let text = e.to_string();
                    assert!(text.starts_with("invalid lock key"), "{entry}: {text}");
                    assert!(text.len() < 400, "{entry}: the message stays short: {text}");
                }
                other => panic!("{entry}({bad:?}) was not refused: {other:?}"),
            }
        }
    }
    for (what, result) in [
        ("relative", m.mutex_at_path("relative").map(drop)),
        ("reserved", m.rwlock_at_path("/zookeeper/x").map(drop)),
        ("empty component", m.semaphore_at_path("/a//b", 1).map(drop)),
        ("dot-dot", m.mutex_at_path("/a/../b").map(drop)),
    ] {
        assert!(
            matches!(result, Err(Error::InvalidArgument(_))),
            "{what}: {result:?}"
        );
    }
    assert_eq!(everything(&m).await, before, "nothing was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_node_data_and_paths_are_refused_before_they_reach_the_server() {
    let zk = server();
    let c = zk.connect_string();
    let m = manager(&c).await;
    // A hold of the same session must not be disturbed by any of it (an oversized request
    // makes the server drop the whole connection).
    let held = m.lock("bystander").await.unwrap();
    let before = everything(&m).await;

    let started = Instant::now();
    let huge_identity = LockManager::builder(&c)
        .identity("x".repeat(2 << 20))
        .connect()
        .await;
    match huge_identity {
        Err(Error::Config(msg)) => assert!(msg.contains("identity"), "{msg}"),
        other => panic!("an oversized identity must be refused: {other:?}"),
    }
    let huge_namespace = LockManager::builder(&c)
        .namespace(format!("/{}", "n".repeat(5000)))
        .connect()
        .await;
    assert!(
        matches!(&huge_namespace, Err(Error::Config(msg)) if msg.contains("bytes")),
        "{huge_namespace:?}"
    );
    let huge_path = format!("/{}", "p".repeat(1_200_000));
    for result in [
        m.mutex_at_path(&huge_path).map(drop),
        m.rwlock_at_path(&huge_path).map(drop),
        m.semaphore_at_path(&huge_path, 3).map(drop),
    ] {
        match result {
            Err(e @ Error::InvalidArgument(_)) => assert!(e.to_string().len() < 400, "{e}"),
            other => panic!("an oversized path must be refused: {other:?}"),
        }
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    // The largest key, every byte of it encoded, is fine.
    let largest = "/".repeat(MAX_KEY_LEN);
    let guard = m.lock(&largest).await.unwrap();
    guard.release().await.unwrap();
    assert!(held.is_held(), "{:?}", held.loss_reason());
    held.release().await.unwrap();
    m.flush().await;
    let after = everything(&m).await;
    assert!(
        after
            .iter()
            .all(|p| before.contains(p) || p.starts_with("/zklock/")),
        "{after:?}"
    );
    assert_no_contenders(
        &m.client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        "/",
        Duration::from_secs(5),
    )
    .await;
}

/// A TCP server that is not ZooKeeper: it answers anything with an HTTP error and hangs up.
fn not_zookeeper() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(20) {
            let Ok(mut s) = stream else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
            let _ = s.read(&mut [0u8; 1024]);
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_and_wrong_connect_strings_are_clear_errors_in_bounded_time() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let http = not_zookeeper();
    let connect_timeout = Duration::from_secs(1);
    for connect in [
        "",
        "   ",
        closed.as_str(),
        http.as_str(),
        "no-such-host.invalid:2181",
        "not a connect string",
        "127.0.0.1:notaport",
        "127.0.0.1:99999",
        ":2181",
        "127.0.0.1:1,",
    ] {
        let started = Instant::now();
        let result = LockManager::builder(connect)
            .zookeeper(|zk| zk.session_timeout(Duration::from_secs(2)))
            .connect_timeout(connect_timeout)
            .connect()
            .await;
        let took = started.elapsed();
        match result {
            Err(e @ Error::Unreachable { .. }) => {
                assert!(e.to_string().contains("check the connect string"), "{e}")
            }
            Err(e @ Error::Refused { .. }) => {
                assert!(e.to_string().contains("check the ports"), "{e}")
            }
            Err(Error::Config(msg)) => assert!(msg.contains("connect string"), "{msg}"),
            other => panic!("{connect:?} must fail clearly: {other:?}"),
        }
        assert!(
            took < connect_timeout + Duration::from_secs(3),
            "{connect:?} took {took:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chroot_is_honoured_and_a_missing_one_is_a_clear_error() {
    let zk = server();
    let c = zk.connect_string();
    let admin = manager(&c).await;
    let before = everything(&admin).await;

    let wrong = LockManager::builder(format!("{c}/does/not/exist"))
        .connect()
        .await
        .unwrap();
    let started = Instant::now();
    match wrong.lock("k").await {
        Err(Error::Config(msg)) => assert!(msg.contains("chroot"), "{msg}"),
        other => panic!("a missing chroot must be a clear error: {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(everything(&admin).await, before, "nothing was created");

    admin
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .mkdir(
            "/tenant_a",
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .unwrap();
    let chrooted = LockManager::builder(format!("{c}/tenant_a"))
        .connect()
        .await
        .unwrap();
    let guard = chrooted.lock("k").await.unwrap();
    assert!(
        guard.node_path().starts_with("/zklock/locks/k/"),
        "{}",
        guard.node_path()
    );
    let seen = children(&admin, "/tenant_a/zklock/locks/k").await;
    assert_eq!(seen.len(), 1, "the node lives under the chroot");
    guard.release().await.unwrap();
    chrooted.flush().await;
    for p in everything(&admin).await {
        assert!(
            before.contains(&p) || p.starts_with("/tenant_a"),
            "created outside the chroot: {p}"
        );
    }
    assert_no_contenders(
        &admin
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        "/",
        Duration::from_secs(5),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_the_client_may_not_write_is_a_clear_error_and_leaves_nothing() {
    let zk = server();
    let c = zk.connect_string();
    let owner = zookeeper_client::Client::connector()
        .with_auth("digest", b"owner:secret".as_slice())
        .connect(&c)
        .await
        .unwrap();
    owner
        .create(
            "/protected",
            b"",
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::creator_all()),
        )
        .await
        .unwrap();
    let paths = |client: zookeeper_client::Client| async move {
        let mut all: Vec<String> = walk(&client, "/")
            .await
            .unwrap()
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        all.sort();
        all
    };
    let before = paths(owner.clone()).await;
    let anonymous = LockManager::builder(&c)
        .namespace("/protected/locks")
        .connect()
        .await
        .unwrap();
    let stranger = LockManager::builder(&c)
        .namespace("/protected/locks")
        .zookeeper(|zk| zk.digest_auth("stranger", "guess"))
        .connect()
        .await
        .unwrap();
    for m in [&anonymous, &stranger] {
        for result in [
            m.lock("k").await.map(drop),
            m.try_lock("k").await.map(drop),
            m.rwlock("k").unwrap().write().await.map(drop),
            m.mutex_at_path("/protected/raw")
                .unwrap()
                .lock()
                .await
                .map(drop),
        ] {
            match result {
                Err(e @ Error::NoAuth { .. }) => {
                    let text = e.to_string();
                    assert!(text.contains("/protected"), "{text}");
                    assert!(text.contains("ACL"), "{text}");
                }
                other => panic!("a protected path must be refused: {other:?}"),
            }
        }
        m.flush().await;
    }
    assert_eq!(paths(owner.clone()).await, before, "nothing was created");
    assert!(owner.list_children("/protected").await.unwrap().is_empty());
}

/// A connect string whose scheme no backend takes is a usage error at once, naming the forms
/// there are (before: it was tried as a ZooKeeper host list, and failed after the connect
/// timeout with a message about an empty node), and it never shows a password.
#[tokio::test]
async fn an_unknown_connect_scheme_is_a_clear_error_at_once() {
    for connect in [
        "foo://x",
        "consul://127.0.0.1:8500",
        "zk://me:secret@host:2181",
    ] {
        let started = std::time::Instant::now();
        let err = zklock::LockManager::builder(connect)
            .connect()
            .await
            .expect_err("no backend takes the scheme");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "{connect}: {:?}",
            started.elapsed()
        );
        let Error::Config(msg) = &err else {
            panic!("{connect}: expected a configuration error, got {err:?}")
        };
        let scheme = connect.split("://").next().unwrap();
        assert!(msg.contains(&format!("{scheme:?}")), "{msg}");
        for form in ["host:port", "redis://", "postgres://", "etcd://"] {
            assert!(msg.contains(form), "{connect}: {msg}");
        }
        assert!(!msg.contains("secret"), "{msg}");
    }
}

/// A ZooKeeper host list whose every port refuses the connection is reported in about a
/// second, not after the whole connection timeout; a list where one server answers connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_that_all_refuse_are_reported_in_about_a_second() {
    let closed = || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        format!("127.0.0.1:{port}")
    };
    let connect = format!("{},{}", closed(), closed());
    let started = std::time::Instant::now();
    let err = LockManager::builder(&connect)
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect_err("nothing listens there");
    let took = started.elapsed();
    assert!(
        matches!(&err, Error::Refused { connect: c } if *c == connect),
        "{err:?}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(err.is_retryable(), "a server may come up: worth a retry");

    // One refusing server beside one that answers: the session opens.
    let zk = server();
    let m = LockManager::builder(format!("{},{}", closed(), zk.connect_string()))
        .connect()
        .await
        .expect("one server answers");
    drop(m.lock("k").await.unwrap());
}

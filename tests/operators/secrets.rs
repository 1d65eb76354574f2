//! Secrets stay secret: a password given in a connect string or an option never appears in what
//! zklock prints — an error's message and `Debug`, the options' and the manager's `Debug`, a
//! guard's `Debug`, inspection, or anything traced at DEBUG — on a connect that fails (nothing
//! listens; credentials refused) and on one that succeeds, on every backend.
//!
//! Each test runs on one thread, so that every task the manager spawns traces into the test's
//! capture.

use std::time::Duration;

use crate::capture::Captured;

use zklock::{LockManager, Tls};
use zklock_testkit::{EtcdServer, RedisServer};

/// The password every connect string here carries.
const SECRET: &str = "hunter2-s3cret";

/// Everything a user may print of `result`, with what was traced.
fn printed(result: &zklock::Result<LockManager>, captured: &Captured) -> String {
    let mut out = captured.text();
    match result {
        Ok(m) => out.push_str(&format!("{m:?}")),
        Err(e) => out.push_str(&format!("{e} {e:?}")),
    }
    out
}

fn assert_secret_kept(what: &str, out: &str) {
    assert!(!out.contains(SECRET), "{what} printed the password:\n{out}");
}

/// A connect string with the password, to a port nothing listens on.
async fn failing(connect: &str, with_options: bool) -> String {
    let (captured, _guard) = Captured::start();
    let builder = LockManager::builder(connect).connect_timeout(Duration::from_secs(2));
    let builder = match (with_options, zklock::BackendKind::of(connect).unwrap()) {
        (true, zklock::BackendKind::Redis) => {
            builder.redis(|r| r.sentinel_password(SECRET).tls(Tls::new()))
        }
        (true, zklock::BackendKind::Etcd) => builder.etcd(|e| e.user("locks", SECRET)),
        (true, zklock::BackendKind::ZooKeeper) => {
            builder.zookeeper(|zk| zk.digest_auth("locks", SECRET))
        }
        _ => builder,
    };
    let result = builder.connect().await;
    assert!(result.is_err(), "nothing listens at {connect}");
    printed(&result, &captured)
}

#[tokio::test(flavor = "current_thread")]
async fn a_failing_connect_never_prints_the_password() {
    for (connect, with_options) in [
        (format!("redis://locks:{SECRET}@127.0.0.1:1/"), false),
        (format!("rediss://locks:{SECRET}@127.0.0.1:1/"), false),
        (
            format!("redis+sentinel://locks:{SECRET}@127.0.0.1:1/zklock"),
            true,
        ),
        (format!("redis+cluster://locks:{SECRET}@127.0.0.1:1"), false),
        (format!("postgres://locks:{SECRET}@127.0.0.1:1/app"), false),
        (
            format!("postgres://locks:{SECRET}@127.0.0.1:1/app?sslmode=verify-full"),
            false,
        ),
        (format!("etcd://locks:{SECRET}@127.0.0.1:1"), false),
        ("etcd://127.0.0.1:1".to_string(), true),
        ("127.0.0.1:1".to_string(), true),
    ] {
        let out = failing(&connect, with_options).await;
        assert_secret_kept(&connect.replace(SECRET, "<password>"), &out);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn redis_with_a_password_prints_it_nowhere_when_refused_or_granted() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap()
        .unwrap();
    let admin = redis::Client::open(server.url()).unwrap();
    let mut admin = admin
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .unwrap();
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locks")
        .arg("on")
        .arg(format!(">{SECRET}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    // Refused: the right user, a wrong password (the message must not echo what was tried).
    let (captured, guard) = Captured::start();
    let wrong = format!("redis://locks:{SECRET}x@127.0.0.1:{}/", server.port());
    let result = LockManager::connect(&wrong).await;
    assert!(result.is_err());
    assert_secret_kept("a refused password", &printed(&result, &captured));
    drop(guard);
    // Granted: a lock held, inspected, released.
    let (captured, _guard) = Captured::start();
    let url = format!("redis://locks:{SECRET}@127.0.0.1:{}/", server.port());
    let result = LockManager::connect(&url).await;
    let m = result.as_ref().expect("connects with the password");
    let guard = m.lock("secret-key").await.unwrap();
    let info = m.inspect("secret-key").await.unwrap();
    let mut out = printed(&result, &captured);
    out.push_str(&format!("{guard:?} {info:?}"));
    guard.release().await.unwrap();
    assert_secret_kept("a granted connect", &out);
}

#[tokio::test(flavor = "current_thread")]
async fn etcd_with_a_password_prints_it_nowhere_when_refused_or_granted() {
    let server = tokio::task::spawn_blocking(EtcdServer::start)
        .await
        .unwrap()
        .unwrap();
    for args in [
        vec!["user", "add", "root", "--new-user-password", "root-pw"],
        vec!["user", "grant-role", "root", "root"],
        vec!["user", "add", "locks", "--new-user-password", SECRET],
        vec!["user", "grant-role", "locks", "root"],
        vec!["auth", "enable"],
    ] {
        server.etcdctl(&args).expect("etcd set-up");
    }
    let (captured, guard) = Captured::start();
    let wrong = format!("etcd://locks:{SECRET}x@{}", server.endpoint());
    let result = LockManager::connect(&wrong).await;
    assert!(result.is_err());
    assert_secret_kept("a refused password", &printed(&result, &captured));
    drop(guard);
    let (captured, _guard) = Captured::start();
    let url = format!("etcd://locks:{SECRET}@{}", server.endpoint());
    let result = LockManager::connect(&url).await;
    let m = result.as_ref().expect("connects with the password");
    let held = m.lock("secret-key").await.unwrap();
    let mut out = printed(&result, &captured);
    out.push_str(&format!("{held:?}"));
    held.release().await.unwrap();
    assert_secret_kept("a granted connect", &out);
}

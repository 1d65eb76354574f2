//! zklock under the narrowest account a backend grants it, and no more.
//!
//! Redis: an ACL user limited to zklock's keys (`~zklock:*`) and channels (`&zklock:*`) and to
//! the commands zklock sends (those its scripts call included: Redis checks them too), as
//! `docs/security.md` gives it. The core recipes work under it (a mutex held and handed over
//! between two managers with increasing tokens, a read/write lock, a semaphore, a job, a
//! leader, inspection); another application's user (`~app:*`) can neither read nor delete
//! zklock's keys; and a user that lacks one command zklock needs fails with an error that names
//! it.
//!
//! PostgreSQL: a role that may only log in, granted what `zklock setup --grant-to` prints after
//! an administrator ran it: the recipes PostgreSQL offers work, a dropped wait in the server's
//! queue is cancelled (a session of the same role), and without the set-up `connect` says what
//! to run.

use std::time::Duration;

use crate::common;

use zklock::{Error, LockManager};
use zklock_testkit::{EtcdServer, PostgresServer, RedisServer};

/// The ACL rules of zklock's Redis user (after `ACL SETUSER <name> on ><password>`), as the
/// guide gives them.
pub const REDIS_RULES: &[&str] = &[
    "resetkeys",
    "~zklock:*",
    "resetchannels",
    "&zklock:*",
    "-@all",
    // Connecting, and what the client sends when it connects.
    "+ping",
    "+info",
    "+role",
    "+select",
    // Scripts, and the commands they call.
    "+evalsha",
    "+eval",
    "+script|load",
    "+get",
    "+set",
    "+del",
    "+hset",
    "+incr",
    "+incrby",
    "+pexpire",
    "+pttl",
    "+rpush",
    "+time",
    "+zadd",
    "+zcard",
    "+zrange",
    "+zrangebyscore",
    "+zrem",
    "+zremrangebyscore",
    "+zscore",
    // Wake-ups, replicas' acknowledgements, inspection.
    "+publish",
    "+subscribe",
    "+unsubscribe",
    "+wait",
    "+scan",
];

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Runs `ACL SETUSER name on >password rules...` as the server's default user.
async fn acl_user(server: &RedisServer, name: &str, password: &str, rules: &[&str]) {
    let client = redis::Client::open(server.url()).unwrap();
    let mut admin = client
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .unwrap();
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(name)
        .arg("reset")
        .arg("on")
        .arg(format!(">{password}"));
    for rule in rules {
        cmd.arg(*rule);
    }
    cmd.query_async::<()>(&mut admin)
        .await
        .expect("ACL SETUSER");
}

fn url_as(server: &RedisServer, user: &str, password: &str) -> String {
    format!("redis://{user}:{password}@127.0.0.1:{}/", server.port())
}

async fn manager(url: &str) -> zklock::Result<LockManager> {
    LockManager::builder(url)
        .connect_timeout(Duration::from_secs(5))
        .redis(|r| r.lease(Duration::from_secs(3)))
        .connect()
        .await
}

/// Read/write locks (two readers share, a writer after them), a semaphore (where the backend
/// has them), a job with an `at_least` window, and a leader, on managers `a` and `b`.
async fn other_recipes_work(a: &LockManager, b: &LockManager, semaphores: bool) {
    let (ra, rb) = (a.rwlock("shelf").unwrap(), b.rwlock("shelf").unwrap());
    let (r1, r2) = (ra.read().await.unwrap(), rb.read().await.unwrap());
    drop((r1, r2));
    ra.write().await.unwrap().release().await.unwrap();
    if semaphores {
        let slots = a.semaphore("slots", 2).unwrap();
        drop(slots.acquire().await.expect("a semaphore lease"));
    }
    let ran = a
        .job("nightly")
        .unwrap()
        .at_least(Duration::from_secs(60))
        .run(async { 7 })
        .await
        .expect("a job");
    assert_eq!(ran.ran(), Some(7));
    let latch = a.leader_latch("scheduler", "a").unwrap();
    latch.lead().await.expect("leads").leave().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_recipes_work_under_the_narrow_acl_user_and_nothing_more() {
    let server = blocking(RedisServer::start).unwrap();
    acl_user(&server, "locks", "locks-pw", REDIS_RULES).await;
    let url = url_as(&server, "locks", "locks-pw");
    let (a, b) = (manager(&url).await.unwrap(), manager(&url).await.unwrap());

    // A mutex held, contended and handed over.
    let held = a.lock("sku_1").await.expect("a lock under the narrow user");
    let first = held.fencing_token();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("sku_1").await })
    };
    common::eventually(
        "b to wait in the queue",
        Duration::from_secs(10),
        || async {
            a.inspect("sku_1")
                .await
                .is_ok_and(|info| info.waiters.len() == 1)
        },
    )
    .await;
    assert!(!waiter.is_finished(), "excluded");
    held.release().await.unwrap();
    let next = waiter.await.unwrap().expect("handed over");
    assert!(next.fencing_token() > first);
    next.release().await.unwrap();
    // Read/write, a semaphore, a job, a leader, inspection.
    other_recipes_work(&a, &b, true).await;
    let lease = a.semaphore("slots", 2).unwrap().acquire().await.unwrap();
    assert!(a.inspect("slots").await.is_ok());
    drop(lease);
    let held = a.lock("sku_2").await.unwrap();
    let info = b
        .inspect("sku_2")
        .await
        .expect("inspection under the narrow user");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert!(!b.list("").await.unwrap().is_empty());

    // Another application's user reaches none of zklock's keys.
    acl_user(&server, "app", "app-pw", &["~app:*", "+@all"]).await;
    let other = redis::Client::open(url_as(&server, "app", "app-pw")).unwrap();
    let mut other = other
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .unwrap();
    let key = held.node_path().to_string();
    for (what, result) in [
        (
            "read",
            redis::cmd("GET")
                .arg(&key)
                .query_async::<Option<String>>(&mut other)
                .await
                .map(|_| ()),
        ),
        (
            "delete",
            redis::cmd("DEL")
                .arg(&key)
                .query_async::<i64>(&mut other)
                .await
                .map(|_| ()),
        ),
    ] {
        let err = result.expect_err(what);
        assert!(
            err.to_string().to_ascii_lowercase().contains("noperm"),
            "{what}: {err}"
        );
    }
    assert!(held.is_held());
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_under_a_user_that_lacks_a_command_fails_naming_it() {
    let server = blocking(RedisServer::start).unwrap();
    let without: Vec<&str> = REDIS_RULES
        .iter()
        .copied()
        .filter(|r| *r != "+evalsha" && *r != "+eval")
        .collect();
    acl_user(&server, "narrower", "pw", &without).await;
    let result = match manager(&url_as(&server, "narrower", "pw")).await {
        Ok(m) => m.lock_timeout("k", Duration::from_secs(3)).await.map(drop),
        Err(e) => Err(e),
    };
    let err = result.expect_err("refused");
    let text = err.to_string().to_ascii_lowercase();
    assert!(text.contains("noperm") && text.contains("eval"), "{err}");
}

/// A PostgreSQL role that may log in and nothing more, as `CREATE ROLE` makes it.
fn pg_role(server: &PostgresServer, role: &str) {
    blocking(|| server.psql(&format!("CREATE ROLE {role} LOGIN"))).expect("create the narrow role");
}

async fn pg_manager(server: &PostgresServer, role: &str) -> zklock::Result<LockManager> {
    LockManager::builder(format!(
        "postgres://{role}@127.0.0.1:{}/postgres",
        server.port()
    ))
    .connect_timeout(Duration::from_secs(5))
    .postgres(|pg| pg.lease(Duration::from_secs(3)))
    .connect()
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_recipes_work_under_a_role_granted_only_what_setup_prints() {
    let server = blocking(common::pg_server);
    pg_role(&server, "locks");
    let sql = LockManager::builder(server.url())
        .setup_sql(Some("locks"))
        .unwrap()
        .expect("PostgreSQL has a set-up");
    blocking(|| server.psql(&sql)).expect("the administrator runs the set-up");
    let (a, b) = (
        pg_manager(&server, "locks").await.unwrap(),
        pg_manager(&server, "locks").await.unwrap(),
    );
    // A mutex held and handed over, with a dropped wait on the server's queue between (its
    // cancel is a pg_cancel_backend of a session of the same role).
    let held = a.lock("sku_1").await.expect("a lock under the narrow role");
    let first = held.fencing_token();
    assert!(matches!(
        b.lock_timeout("sku_1", Duration::from_millis(300)).await,
        Err(Error::Timeout { .. })
    ));
    held.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), b.lock("sku_1"))
        .await
        .expect("the cancelled wait holds nobody up")
        .expect("handed over");
    assert!(next.fencing_token() > first);
    let info = a
        .inspect("sku_1")
        .await
        .expect("inspection under the narrow role");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    next.release().await.unwrap();
    // Read/write, a job, a leader.
    other_recipes_work(&a, &b, false).await;
    // Nothing of the cancelled wait is left in the server's lock table.
    let waiting = blocking(|| {
        server.psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
    })
    .unwrap();
    assert_eq!(waiting.trim(), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_without_the_set_up_says_what_to_run() {
    let server = blocking(common::pg_server);
    pg_role(&server, "locks");
    let err = pg_manager(&server, "locks")
        .await
        .expect_err("the role may not create the table");
    assert!(
        matches!(&err, Error::Config(text) if text.contains("setup --grant-to")),
        "{err}"
    );
}

/// etcd with authentication on: `root`, and `user` with a role of read and write on `prefix`.
fn etcd_user(server: &EtcdServer, user: &str, password: &str, prefix: &str) {
    let role = format!("{user}-role");
    blocking(|| -> std::io::Result<()> {
        for args in [
            vec!["role", "add", &role],
            vec![
                "role",
                "grant-permission",
                &role,
                "readwrite",
                prefix,
                "--prefix=true",
            ],
            vec!["user", "add", user, "--new-user-password", password],
            vec!["user", "grant-role", user, &role],
        ] {
            server.etcdctl(&args)?;
        }
        Ok(())
    })
    .expect("set up the etcd user");
}

async fn etcd_manager(
    server: &EtcdServer,
    user: &str,
    password: &str,
) -> zklock::Result<LockManager> {
    LockManager::builder(format!("etcd://{user}:{password}@{}", server.endpoint()))
        .connect_timeout(Duration::from_secs(5))
        .etcd(|e| e.lease(Duration::from_secs(3)))
        .connect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_recipes_work_under_a_role_limited_to_zklocks_prefix() {
    let server = blocking(EtcdServer::start).unwrap();
    blocking(|| {
        server.etcdctl(&["user", "add", "root", "--new-user-password", "root-pw"])?;
        server.etcdctl(&["user", "grant-role", "root", "root"])
    })
    .expect("etcd's root user");
    etcd_user(&server, "locks", "locks-pw", "/zklock/");
    etcd_user(&server, "app", "app-pw", "/app/");
    blocking(|| server.etcdctl(&["auth", "enable"])).expect("authentication on");

    let (a, b) = (
        etcd_manager(&server, "locks", "locks-pw").await.unwrap(),
        etcd_manager(&server, "locks", "locks-pw").await.unwrap(),
    );
    let held = a.lock("sku_1").await.expect("a lock under the narrow role");
    let first = held.fencing_token();
    assert!(b.try_lock("sku_1").await.unwrap().is_none(), "excluded");
    held.release().await.unwrap();
    let next = b.lock("sku_1").await.expect("handed over");
    assert!(next.fencing_token() > first);
    let info = a
        .inspect("sku_1")
        .await
        .expect("inspection under the narrow role");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    next.release().await.unwrap();
    other_recipes_work(&a, &b, true).await;

    // A user without zklock's prefix is told at its first acquire, within its timeout.
    let started = std::time::Instant::now();
    let refused = match etcd_manager(&server, "app", "app-pw").await {
        Ok(m) => m
            .lock_timeout("sku_1", Duration::from_secs(5))
            .await
            .map(drop),
        Err(e) => Err(e),
    };
    let err = refused.expect_err("no permission on zklock's prefix");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert!(
        err.to_string().to_ascii_lowercase().contains("permission"),
        "{err}"
    );
    common::say(&format!(
        "least_privilege (etcd): a user without the prefix: {err}"
    ));
}

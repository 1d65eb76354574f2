//! The etcd backend against a real etcd from the test kit: connect errors, exclusion with
//! increasing tokens, etcd's own key layout, and what a lost lease or a deleted key does.

use std::time::Duration;

use zklock::{Error, LockManager};
use zklock_testkit::EtcdServer;

fn etcd() -> EtcdServer {
    EtcdServer::start().expect("start etcd (test kit)")
}

async fn manager(etcd: &EtcdServer) -> LockManager {
    LockManager::builder(etcd.url())
        .etcd(|e| e.lease(Duration::from_secs(3)))
        .connect()
        .await
        .expect("connect to etcd")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_managers_exclude_each_other_with_increasing_tokens() {
    let etcd = etcd();
    let (a, b) = (manager(&etcd).await, manager(&etcd).await);
    let first = a.lock("sku_7").await.unwrap();
    assert!(b.try_lock("sku_7").await.unwrap().is_none());
    let waiting = tokio::spawn(async move {
        let g = b.lock("sku_7").await.unwrap();
        let t = g.fencing_token();
        drop(g);
        b.flush().await;
        t
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished());
    let t1 = first.fencing_token();
    drop(first);
    let t2 = waiting.await.unwrap();
    assert!(t2 > t1, "{t2:?} > {t1:?}");
    a.flush().await;
    let left = etcd
        .etcdctl(&["get", "--prefix", "/zklock", "--keys-only"])
        .unwrap();
    assert!(left.trim().is_empty(), "left behind: {left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_member_is_reported_in_about_a_second() {
    let started = std::time::Instant::now();
    let err = LockManager::connect("etcd://127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// etcd's own users: a wrong password is refused at connect with a configuration error that
/// names the user and never the password; the right one connects and locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_checked_at_connect_and_never_shown() {
    let etcd = etcd();
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "add", "locks:lockspw"],
        &["role", "add", "locker"],
        &[
            "role",
            "grant-permission",
            "locker",
            "--prefix=true",
            "readwrite",
            "/zklock/",
        ],
        &["user", "grant-role", "locks", "locker"],
        &["auth", "enable"],
    ] {
        etcd.etcdctl(args)
            .unwrap_or_else(|e| panic!("etcdctl {args:?}: {e}"));
    }
    let port = etcd.port();
    let err = LockManager::connect(&format!("etcd://locks:wrong-secret@127.0.0.1:{port}"))
        .await
        .unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(
        text.contains("locks") && !text.contains("wrong-secret"),
        "{text}"
    );

    // The same user through the options, which win over the URL's.
    let m = LockManager::builder(format!("etcd://nobody:x@127.0.0.1:{port}"))
        .etcd(|e| e.user("locks", "lockspw").lease(Duration::from_secs(3)))
        .connect()
        .await
        .expect("the right password connects");
    let g = m.lock("paid").await.unwrap();
    assert!(g.fencing_token().grant() > 0);
    g.release().await.unwrap();
}

/// The lease is etcd's: whole seconds, at least 2; anything else is a configuration error at
/// connect, as are etcd settings given for another backend's connect string.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_settings_etcd_cannot_keep_are_refused() {
    let etcd = etcd();
    for lease in [Duration::from_millis(1500), Duration::from_secs(1)] {
        let err = LockManager::builder(etcd.url())
            .etcd(|e| e.lease(lease))
            .connect()
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{lease:?}: {err:?}");
    }
    let err = LockManager::builder("127.0.0.1:1")
        .etcd(|e| e.lease(Duration::from_secs(5)))
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(m) if m.contains("etcd")),
        "{err:?}"
    );
}

/// A job's `at_least` window is a lease of the window's length on etcd: within it every other
/// manager skips, after it one runs again; the record is the key `<path>%RUN`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_window_is_kept_by_etcd() {
    let etcd = etcd();
    let (a, b) = (manager(&etcd).await, manager(&etcd).await);
    let window = Duration::from_secs(2);
    let started = std::time::Instant::now();
    let ran = a
        .job("nightly")
        .unwrap()
        .at_least(window)
        .run(async { 1 })
        .await;
    assert_eq!(ran.unwrap().ran(), Some(1));
    let record = format!("{}%RUN", a.path_of("nightly").unwrap());
    let got = etcd
        .etcdctl(&["get", &record, "--print-value-only"])
        .unwrap();
    assert!(got.contains("zklock host="), "{got}");
    // Within the window: skipped, by every manager.
    for m in [&a, &b] {
        let ran = m
            .job("nightly")
            .unwrap()
            .at_least(window)
            .run(async { 2 })
            .await;
        if started.elapsed() < window {
            assert_eq!(ran.unwrap().ran(), None, "ran within the window");
        }
    }
    // After it (etcd lets the lease go by its own clock): runs again.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ran = b
            .job("nightly")
            .unwrap()
            .at_least(window)
            .run(async { 3 })
            .await;
        if ran.unwrap().ran() == Some(3) {
            assert!(
                started.elapsed() >= window,
                "ran again after {:?}",
                started.elapsed()
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never ran again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A job's window counts from its claim, however long the claim took: a claim whose reply is
/// held up after any of its requests (the network down a moment right after etcd acted, then
/// back, as a stalled server does it too) still leaves a record that lasts `at_least` from the
/// body's start. The run lease's TTL starts at its grant; a claim held up between the grant and
/// the record's put used to leave a window short by the hold-up (the soak found a job run
/// 507 ms into a 2 s window after a server pause).
///
/// One victim manager per request boundary k of an uncut run (from the job's start to its
/// body's), each behind a relay that delivers the k-th request and withholds every answer for
/// 1.2 s; all at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_window_counts_from_the_claim_however_long_it_took() {
    use std::time::Instant;
    use zklock_testkit::{After, Relay};

    const WINDOW: Duration = Duration::from_secs(2);
    const HELD_UP: Duration = Duration::from_millis(1_200);
    let etcd = etcd();

    /// A manager behind a relay of its own.
    async fn behind_relay(etcd: &EtcdServer) -> (Relay, LockManager) {
        let relay = Relay::start(&etcd.endpoint()).unwrap();
        let m = LockManager::builder(relay.url(&etcd.url()))
            .etcd(|e| e.lease(Duration::from_secs(3)))
            .connect()
            .await
            .expect("connect to etcd through the relay");
        (relay, m)
    }

    // The requests of one uncut run, up to its body.
    let (relay, m) = behind_relay(&etcd).await;
    let before = relay.requests();
    let at_body = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = at_body.clone();
    let ran = m
        .job("counted")
        .unwrap()
        .at_least(WINDOW)
        .run(async move { seen.store(relay.requests(), std::sync::atomic::Ordering::SeqCst) })
        .await;
    assert!(ran.unwrap().ran().is_some());
    let sent = at_body.load(std::sync::atomic::Ordering::SeqCst) - before;
    assert!(sent >= 2, "a run sent {sent} requests before its body");

    let admin = manager(&etcd).await;
    let runs = (1..=sent).map(|k| {
        let etcd = &etcd;
        let admin = &admin;
        async move {
            let (relay, m) = behind_relay(etcd).await;
            let key = format!("held-up-{k}");
            relay.cut_after_nth_request(k, After::Blackhole);
            let body_at = std::sync::Mutex::new(None::<Instant>);
            let job = m.job(&key).unwrap().at_least(WINDOW);
            let run = job.run(async {
                *body_at.lock().unwrap() = Some(Instant::now());
            });
            let heal = async {
                while relay.cut_pending() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                tokio::time::sleep(HELD_UP).await;
                relay.heal();
            };
            let (outcome, ()) = tokio::join!(run, heal);
            let Some(started) = *body_at.lock().unwrap() else {
                // The claim gave up (its reply too late) or lost its lock: no run, no window
                // owed.
                return (k, None);
            };
            assert!(outcome
                .expect("a run whose body ran ends well")
                .ran()
                .is_some());
            // Well before the window ends, counted from the body's start, another instance
            // skips. A run that came back later than the window's end less the checker's
            // tolerance is not judged (its claim may have come after the window on a busy
            // machine).
            tokio::time::sleep_until((started + WINDOW - Duration::from_millis(400)).into()).await;
            let again = admin
                .job(&key)
                .unwrap()
                .at_least(WINDOW)
                .run(async {})
                .await
                .expect("ask for the job again");
            let judged = started.elapsed() < WINDOW - Duration::from_millis(50);
            (k, judged.then_some(again.ran().is_some()))
        }
    });
    let results = futures::future::join_all(runs).await;
    let too_soon: Vec<u64> = results
        .iter()
        .filter(|(_, again)| *again == Some(true))
        .map(|(k, _)| *k)
        .collect();
    let judged = results.iter().filter(|(_, again)| again.is_some()).count();
    assert!(judged > 0, "no held-up claim ran its body: {results:?}");
    assert!(
        too_soon.is_empty(),
        "a second run came within the window of a claim held up after request {too_soon:?} \
         (of {sent})"
    );
}

/// What operators see on etcd comes from etcd: zklock's holder and waiter with their host and
/// pid, and a key of etcd's own tools (as `etcdctl lock` makes it) as a contender too, in
/// create order, with its lease as its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspection_shows_every_contender_in_create_order() {
    let etcd = etcd();
    let (a, b) = (manager(&etcd).await, manager(&etcd).await);
    let held = a.lock("shown").await.unwrap();
    let path = a.path_of("shown").unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.lock("shown").await.map(drop) }
    });
    // A foreign contender, as etcd's own mutex writes it: a key under the prefix on a lease.
    let lease = etcd.etcdctl(&["lease", "grant", "30"]).unwrap();
    let id = lease
        .split_whitespace()
        .nth(1)
        .expect("lease <id> granted")
        .to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let info = a.inspect("shown").await.unwrap();
        if info.waiters.len() == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{info:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let foreign = format!("{path}/{id}");
    etcd.etcdctl(&["put", &foreign, "", &format!("--lease={id}")])
        .unwrap();
    let info = a.inspect("shown").await.unwrap();
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.holders[0].token, held.fencing_token());
    assert_eq!(info.holders[0].owner.pid, Some(std::process::id()));
    assert_eq!(info.waiters.len(), 2, "{info:?}");
    assert!(info.waiters[0].token < info.waiters[1].token);
    assert_eq!(info.waiters[1].node, id);
    // (etcdctl pads the id to 16 digits; etcd's mutex keys and zklock's do not.)
    assert_eq!(Ok(info.waiters[1].session), i64::from_str_radix(&id, 16));
    assert_eq!(a.list("").await.unwrap().len(), 1);

    // The holder goes; zklock's waiter is next (etcd's key came later).
    drop(held);
    waiting.await.unwrap().unwrap();
    etcd.etcdctl(&["lease", "revoke", &id]).unwrap();
}

/// A lingering mutex on etcd: taken again by its process with one request (the read that
/// confirms the key is still its own) and a larger token, on the same key; another process
/// that wants it gets it at once (the holder's watch sees its key), not after the linger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_key_is_taken_again_cheaply_and_given_up_for_another_process() {
    let etcd = etcd();
    let linger = Duration::from_secs(20);
    let m = LockManager::builder(etcd.url())
        .etcd(|e| e.lease(Duration::from_secs(3)))
        .linger(linger)
        .connect()
        .await
        .unwrap();
    let other = manager(&etcd).await;
    let g = m.lock("again").await.unwrap();
    let node = g.node_path().to_string();
    let mut last = g.fencing_token();
    drop(g);
    // The first taking again waits for the watch of other contenders once.
    let g = m.lock("again").await.unwrap();
    assert!(g.fencing_token() > last);
    last = g.fencing_token();
    drop(g);
    let before = m.stats().requests;
    for _ in 0..50 {
        let g = m.lock("again").await.unwrap();
        assert_eq!(g.node_path(), node, "the lingering key is taken again");
        assert!(g.fencing_token() > last, "tokens must increase");
        assert_eq!(g.fencing_token().grant(), last.grant());
        last = g.fencing_token();
        drop(g);
    }
    let requests = m.stats().requests - before;
    assert!(requests <= 50, "{requests} requests for 50 re-takes");

    let started = std::time::Instant::now();
    let theirs = other
        .lock_timeout("again", Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "waited {:?} for a lingering key (linger {linger:?})",
        started.elapsed()
    );
    assert!(theirs.fencing_token() > last);
    assert!(m.try_lock("again").await.unwrap().is_none(), "two holders");
    drop(theirs);
    other.flush().await;
    m.flush().await;
}

/// A multi-lock on etcd (a mutex, a write lock and a semaphore lease) is all or nothing: while
/// another manager holds one of them it takes none (its timeout leaves no key behind), and once
/// that one is free it takes them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_takes_all_or_nothing() {
    use zklock::LockSpec;
    let etcd = etcd();
    let (a, b) = (manager(&etcd).await, manager(&etcd).await);
    let specs = || {
        [
            LockSpec::mutex("account_1"),
            LockSpec::write("ledger"),
            LockSpec::semaphore("slots", 2),
        ]
    };
    let ledger = b.rwlock("ledger").unwrap().write().await.unwrap();
    let err = a
        .lock_all(specs(), Some(Duration::from_millis(500)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    a.flush().await;
    // Nothing of the failed multi-lock is left: the mutex is free for the other manager.
    let free = b
        .try_lock("account_1")
        .await
        .unwrap()
        .expect("the mutex was given back");
    drop(free);
    drop(ledger);
    b.flush().await;
    let all = a
        .lock_all(specs(), Some(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(all.is_held());
    assert_eq!(all.tokens().len(), 3);
    assert!(b.try_lock("account_1").await.unwrap().is_none());
    drop(all);
    a.flush().await;
    let left = etcd
        .etcdctl(&["get", "--prefix", "/zklock", "--keys-only"])
        .unwrap();
    assert!(left.trim().is_empty(), "left behind: {left}");
}

//! Fault: the server restarted with its data, under contention, with the history checker.
//!
//! A quick restart: sessions resume; a holder with a grace policy keeps its hold (its node is
//! still there, its session the same), a strict holder is told at the disconnection, and nobody
//! else gets either lock meanwhile. A long outage: the client gives its session up, the holder is
//! told, the server expires the session after it comes back, and the waiter gets in with a larger
//! token. Nothing is left behind.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/faults.rs"]
mod faults;

use std::time::Duration;

use common::*;
use faults::*;
use zklock::{zookeeper_client::SessionState, DisconnectPolicy, LockManager};
use zklock_testkit::{History, Mode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_resumes_sessions_and_holds_survive_or_are_reported_lost() {
    let mut zk = server();
    let connect = zk.connect_string();
    let history = History::new();
    let long = Duration::from_secs(20);
    let strict = manager_with(&connect, long).await;
    let lenient = LockManager::builder(&connect)
        .zookeeper(|zk| {
            zk.session_timeout(long)
                .disconnect_policy(DisconnectPolicy::Grace(Duration::from_secs(10)))
        })
        .connect()
        .await
        .unwrap();

    // The two holders, and workers of two other sessions queued behind them.
    let (s_rec, l_rec) = (history.recorder("strict"), history.recorder("lenient"));
    s_rec.acquire_invoked("k1", Mode::Exclusive);
    let s_guard = strict.lock("k1").await.unwrap();
    s_rec.acquire_ok("k1", Mode::Exclusive, s_guard.fencing_token().as_u128());
    l_rec.acquire_invoked("k2", Mode::Exclusive);
    let l_guard = lenient.lock("k2").await.unwrap();
    l_rec.acquire_ok("k2", Mode::Exclusive, l_guard.fencing_token().as_u128());
    let crew = Crew::new();
    // The workers also take part in an election, counted apart (nobody holds it before the
    // restart, so it may change hands during it).
    let electors = Crew::new();
    let mut tasks = Vec::new();
    let mut workers = Vec::new();
    for i in 0..2 {
        let m = manager_with(&connect, long).await;
        for key in ["k1", "k2"] {
            tasks.push(tokio::spawn(mutex_worker(
                m.clone(),
                key.into(),
                history.recorder(&format!("worker-{i}-{key}")),
                crew.clone(),
                Work {
                    wait: Duration::from_secs(30),
                    ..Work::default()
                },
            )));
        }
        tasks.push(tokio::spawn(leader_worker(
            m.clone(),
            "restart-leader".into(),
            format!("worker-{i}"),
            history.recorder(&format!("worker-{i}-leader")),
            electors.clone(),
            Work {
                wait: Duration::from_secs(30),
                ..Work::default()
            },
        )));
        workers.push(m);
    }
    until_children(&strict, &strict.path_of("k1").unwrap(), 3).await;
    until_children(&strict, &strict.path_of("k2").unwrap(), 3).await;
    let grants = crew.grants();

    // A quick restart, with the data.
    history.fault("server stopped and restarted with its data");
    let session = lenient
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .session_id();
    zk.stop().unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), s_guard.lost())
        .await
        .expect("the strict holder is told at the disconnection");
    s_rec.lost("k1", reason);
    zk.restart().unwrap();
    let client = lenient
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager");
    eventually(
        "the lenient holder's session to answer again",
        long,
        || async { client.check_stat(l_guard.node_path()).await.is_ok() },
    )
    .await;
    assert_eq!(
        lenient
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager")
            .session_id(),
        session,
        "the session resumed"
    );
    assert!(
        l_guard.is_held(),
        "a restart within the grace keeps the hold: {:?}",
        l_guard.loss_reason()
    );
    assert!(
        client
            .check_stat(l_guard.node_path())
            .await
            .unwrap()
            .is_some(),
        "the held node survived the restart"
    );
    // The strict holder's node is still there too (its session resumed): nobody got k1 either.
    assert!(children(&strict, &strict.path_of("k1").unwrap())
        .await
        .contains(&s_guard.node_path().rsplit('/').next().unwrap().to_string()));
    assert_eq!(
        crew.grants(),
        grants,
        "nobody got a held lock during the restart"
    );
    for (guard, key, rec) in [(s_guard, "k1", &s_rec), (l_guard, "k2", &l_rec)] {
        rec.release_invoked(key);
        match guard.release().await {
            Ok(()) => rec.release_ok(key),
            Err(e) => rec.release_failed(key, e),
        }
    }
    crew.until_grants(grants, 6, Duration::from_secs(30)).await;

    // A long outage: the client gives its short session up before the server is back.
    let short = LockManager::builder(&connect)
        .zookeeper(|zk| zk.session_timeout(Duration::from_secs(2)))
        .connect()
        .await
        .unwrap();
    let sh_rec = history.recorder("short");
    sh_rec.acquire_invoked("k3", Mode::Exclusive);
    let sh_guard = short.lock("k3").await.unwrap();
    sh_rec.acquire_ok("k3", Mode::Exclusive, sh_guard.fencing_token().as_u128());
    let w_rec = history.recorder("waiter");
    let waiter = tokio::spawn({
        let m = workers[0].clone();
        async move {
            w_rec.acquire_invoked("k3", Mode::Exclusive);
            let guard = m.lock_timeout("k3", Duration::from_secs(60)).await.unwrap();
            let token = guard.fencing_token();
            w_rec.acquire_ok("k3", Mode::Exclusive, token.as_u128());
            w_rec.release_invoked("k3");
            guard.release().await.unwrap();
            w_rec.release_ok("k3");
            token
        }
    });
    until_children(&strict, &strict.path_of("k3").unwrap(), 2).await;
    let old_client = short
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager");
    history.fault("server stopped past the short session's timeout");
    zk.stop().unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), sh_guard.lost())
        .await
        .expect("the holder is told");
    sh_rec.lost("k3", reason);
    eventually(
        "the client to give its session up",
        Duration::from_secs(20),
        || async { old_client.state() == SessionState::Expired },
    )
    .await;
    zk.restart().unwrap();
    let token = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the server expires the old session and the waiter gets in")
        .unwrap();
    assert!(token > sh_guard.fencing_token());
    sh_rec.release_invoked("k3");
    let _ = sh_guard.release().await;
    let again = tokio::time::timeout(Duration::from_secs(20), short.lock("k3"))
        .await
        .expect("a new session locks again")
        .unwrap();
    assert!(again.fencing_token() > token);
    again.release().await.unwrap();

    crew.stop();
    electors.stop();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(40), t)
            .await
            .expect("workers stop")
            .unwrap();
    }
    let report = history.check();
    eprintln!("fault_server_restart: {}", report.summary());
    report.assert_ok();
    assert!(report.losses >= 2, "{report}");
    assert!(
        electors.grants() >= 2,
        "leaders were elected across the restarts"
    );

    for m in workers.iter().chain([&strict, &lenient, &short]) {
        m.flush().await;
    }
    assert_no_contenders(
        &strict
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        ROOT,
        Duration::from_secs(15),
    )
    .await;
    assert_no_watches(
        || zk.four_letter("wchp").into_iter().collect(),
        ROOT,
        Duration::from_secs(10),
    )
    .await;
}

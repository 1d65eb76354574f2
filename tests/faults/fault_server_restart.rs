//! Fault: the server restarted with its data, under contention, with the history checker.
//!
//! A quick restart: sessions resume; a holder with a grace policy keeps its hold (its node is
//! still there, its session the same), a strict holder is told at the disconnection, and nobody
//! else gets either lock meanwhile. A long outage: the client gives its session up, the holder is
//! told, the server expires the session after it comes back, and the waiter gets in with a larger
//! token. Nothing is left behind.

use crate::common;
use crate::faults;

use std::time::Duration;

use common::*;
use faults::*;
use tokio::task::JoinHandle;
use zklock::{
    zookeeper_client::SessionState, DisconnectPolicy, FencingToken, LockGuard, LockManager,
};
use zklock_testkit::{History, Mode, Recorder};

/// The session timeout of the holders and the workers: they outlive the quick restart.
const LONG: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_resumes_sessions_and_holds_survive_or_are_reported_lost() {
    let mut zk = server();
    let connect = zk.connect_string();
    let history = History::new();
    let strict = manager_with(&connect, LONG).await;
    let lenient = LockManager::builder(&connect)
        .zookeeper(|zk| {
            zk.session_timeout(LONG)
                .disconnect_policy(DisconnectPolicy::Grace(Duration::from_secs(10)))
        })
        .connect()
        .await
        .unwrap();

    // The two holders, and workers of two other sessions queued behind them.
    let s_held = hold(&strict, &history, "strict", "k1").await;
    let l_held = hold(&lenient, &history, "lenient", "k2").await;
    let mut workers = Workers::start(&connect, &history).await;
    until_children(&strict, &strict.path_of("k1").unwrap(), 3).await;
    until_children(&strict, &strict.path_of("k2").unwrap(), 3).await;
    let grants = workers.crew.grants();

    quick_restart(
        &mut zk,
        &history,
        (&strict, s_held),
        (&lenient, l_held),
        (&workers.crew, grants),
    )
    .await;
    workers
        .crew
        .until_grants(grants, 6, Duration::from_secs(30))
        .await;

    let short = long_outage(&mut zk, &connect, &history, &workers.managers[0], &strict).await;

    workers.stop().await;
    let report = history.check();
    eprintln!("fault_server_restart: {}", report.summary());
    report.assert_ok();
    assert!(report.losses >= 2, "{report}");
    assert!(
        workers.electors.grants() >= 2,
        "leaders were elected across the restarts"
    );

    for m in workers.managers.iter().chain([&strict, &lenient, &short]) {
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

/// `m` takes `key` for the worker `name`, recorded.
async fn hold(m: &LockManager, history: &History, name: &str, key: &str) -> (LockGuard, Recorder) {
    let rec = history.recorder(name);
    rec.acquire_invoked(key, Mode::Exclusive);
    let guard = m.lock(key).await.unwrap();
    rec.acquire_ok(key, Mode::Exclusive, guard.fencing_token().as_u128());
    (guard, rec)
}

/// Workers of two other sessions: mutex workers on `k1` and `k2`, and electors.
struct Workers {
    crew: Crew,
    /// The workers also take part in an election, counted apart (nobody holds it before the
    /// restart, so it may change hands during it).
    electors: Crew,
    tasks: Vec<JoinHandle<()>>,
    managers: Vec<LockManager>,
}

impl Workers {
    async fn start(connect: &str, history: &History) -> Workers {
        let crew = Crew::new();
        let electors = Crew::new();
        let mut tasks = Vec::new();
        let mut managers = Vec::new();
        let work = Work {
            wait: Duration::from_secs(30),
            ..Work::default()
        };
        for i in 0..2 {
            let m = manager_with(connect, LONG).await;
            for key in ["k1", "k2"] {
                tasks.push(tokio::spawn(mutex_worker(
                    m.clone(),
                    key.into(),
                    history.recorder(&format!("worker-{i}-{key}")),
                    crew.clone(),
                    work,
                )));
            }
            tasks.push(tokio::spawn(leader_worker(
                m.clone(),
                "restart-leader".into(),
                format!("worker-{i}"),
                history.recorder(&format!("worker-{i}-leader")),
                electors.clone(),
                work,
            )));
            managers.push(m);
        }
        Workers {
            crew,
            electors,
            tasks,
            managers,
        }
    }

    async fn stop(&mut self) {
        self.crew.stop();
        self.electors.stop();
        for t in self.tasks.drain(..) {
            tokio::time::timeout(Duration::from_secs(40), t)
                .await
                .expect("workers stop")
                .unwrap();
        }
    }
}

/// A quick restart, with the data: sessions resume; the lenient holder keeps its hold (its
/// node is still there, its session the same), the strict one is told at the disconnection,
/// and nobody else gets either lock meanwhile. Both then let go.
async fn quick_restart(
    zk: &mut ZkServer,
    history: &History,
    (strict, (s_guard, s_rec)): (&LockManager, (LockGuard, Recorder)),
    (lenient, (l_guard, l_rec)): (&LockManager, (LockGuard, Recorder)),
    (crew, grants): (&Crew, u64),
) {
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
        LONG,
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
    assert!(children(strict, &strict.path_of("k1").unwrap())
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
}

/// A long outage: the client gives its short session up before the server is back; the holder
/// is told, the server expires the session after it comes back, and the waiter (on `waiting`)
/// gets in with a larger token; the holder's manager locks again on a new session. Answers
/// that manager.
async fn long_outage(
    zk: &mut ZkServer,
    connect: &str,
    history: &History,
    waiting: &LockManager,
    observer: &LockManager,
) -> LockManager {
    let short = LockManager::builder(connect)
        .zookeeper(|zk| zk.session_timeout(Duration::from_secs(2)))
        .connect()
        .await
        .unwrap();
    let (sh_guard, sh_rec) = hold(&short, history, "short", "k3").await;
    let waiter = tokio::spawn(wait_for_k3(waiting.clone(), history.recorder("waiter")));
    until_children(observer, &observer.path_of("k3").unwrap(), 2).await;
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
    short
}

/// The waiter of the long outage: takes `k3` (waiting up to a minute), lets go, answers its token.
async fn wait_for_k3(m: LockManager, rec: Recorder) -> FencingToken {
    rec.acquire_invoked("k3", Mode::Exclusive);
    let guard = m.lock_timeout("k3", Duration::from_secs(60)).await.unwrap();
    let token = guard.fencing_token();
    rec.acquire_ok("k3", Mode::Exclusive, token.as_u128());
    rec.release_invoked("k3");
    guard.release().await.unwrap();
    rec.release_ok("k3");
    token
}

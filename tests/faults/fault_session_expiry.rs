//! Fault: sessions expired from the server side — a second handle with the same session id and
//! password, then closed, as Curator's old KillSession did — while holding and while waiting,
//! under contention, with the history checker.
//!
//! The expired holder is told its hold is lost, the expired waiter's acquire fails, the next holder
//! always has a larger fencing token, the manager opens a new session and its workers lock again,
//! and no node or watch is left behind. Every manager also takes part in an election throughout:
//! the expired leader is told, and the checker sees no two leaders. An expiry by another handle is a fault the victim cannot
//! notice before the server acts on it, so the checker reports any overlap it causes as an
//! unprotected window (the one fencing tokens close), never as a violation.

use crate::common;
use crate::faults;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use faults::*;
use zklock::LockManager;
use zklock_testkit::History;

/// The manager whose node is `nth` in line (0: the holder) on `path`, if any.
async fn in_line(
    direct: &LockManager,
    path: &str,
    managers: &[LockManager],
    nth: usize,
) -> Option<usize> {
    let mut kids = children(direct, path).await;
    kids.sort_by(|a, b| a.rsplit('-').next().cmp(&b.rsplit('-').next()));
    let node = kids.get(nth)?;
    let stat = direct
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .check_stat(&format!("{path}/{node}"))
        .await
        .ok()??;
    managers.iter().position(|m| {
        m.client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager")
            .session_id()
            .0
            == stat.ephemeral_owner
    })
}

/// Waits (bounded) until some manager's node is `nth` in line on `path`; answers which.
async fn until_in_line(
    direct: &LockManager,
    path: &str,
    managers: &[LockManager],
    nth: usize,
) -> usize {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = in_line(direct, path, managers, nth).await {
            break v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nobody {nth} in line"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Manager `i`'s two mutex workers on `key`, and one participant of an election: its
/// leadership ends with the session.
fn workers(
    m: &LockManager,
    i: usize,
    key: &str,
    history: &History,
    crew: &Crew,
    work: Work,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for j in 0..2 {
        let rec = history.recorder(&format!("m{i}/w{j}"));
        tasks.push(tokio::spawn(mutex_worker(
            m.clone(),
            key.to_string(),
            rec,
            crew.clone(),
            work,
        )));
    }
    tasks.push(tokio::spawn(leader_worker(
        m.clone(),
        format!("{key}-leader"),
        format!("m{i}"),
        history.recorder(&format!("m{i}/leader")),
        crew.clone(),
        work,
    )));
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_expired_while_holding_and_while_waiting_are_reported_and_never_double_granted() {
    let zk = server();
    let connect = zk.connect_string();
    let history = History::new();
    let direct = manager(&connect).await;
    let key = "expiring";
    let path = direct.path_of(key).unwrap();
    let work = Work {
        wait: Duration::from_secs(15),
        hold: Duration::from_millis(40),
        think: Duration::from_millis(5),
    };

    let mut managers = Vec::new();
    let mut crews = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..3 {
        let m = manager(&connect).await;
        let crew = Crew::new();
        tasks.extend(workers(&m, i, key, &history, &crew, work));
        managers.push(m);
        crews.push(crew);
    }
    let all = |crews: &[Crew]| crews.iter().map(Crew::grants).sum::<u64>();
    eventually("the first grants", Duration::from_secs(20), || async {
        all(&crews) >= 6
    })
    .await;

    for round in 0..4 {
        // Even rounds expire the holder's session, odd ones a waiter's.
        let nth = round % 2;
        let victim = until_in_line(&direct, &path, &managers, nth).await;
        let losses = crews[victim].losses.load(Ordering::SeqCst);
        let failures = crews[victim].failures.load(Ordering::SeqCst);
        expire_session_noting(&managers[victim], &connect, || {
            for worker in ["w0", "w1", "leader"] {
                history.silent_fault(
                    &format!("m{victim}/{worker}"),
                    "session expired from another handle",
                );
            }
        })
        .await;
        // Told: a holder's loss is reported, a waiter's acquire fails.
        eventually("the victim to be told", Duration::from_secs(20), || async {
            crews[victim].losses.load(Ordering::SeqCst) > losses
                || crews[victim].failures.load(Ordering::SeqCst) > failures
        })
        .await;
        // The others go on, and so does the victim once its manager has a new session.
        let (now, mine) = (all(&crews), crews[victim].grants());
        crews[victim]
            .until_grants(mine, 1, Duration::from_secs(30))
            .await;
        eventually(
            "progress after the expiry",
            Duration::from_secs(30),
            || async { all(&crews) >= now + 3 },
        )
        .await;
    }

    for crew in &crews {
        crew.stop();
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("workers stop")
            .unwrap();
    }
    let report = history.check();
    eprintln!("fault_session_expiry: {}", report.summary());
    report.assert_ok();
    assert!(report.losses >= 1, "an expired holder is told: {report}");
    assert!(
        report.acquire_failures >= 1,
        "an expired waiter is told: {report}"
    );

    for m in &managers {
        m.flush().await;
    }
    assert_no_contenders(
        &direct
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

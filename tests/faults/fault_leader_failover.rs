//! Fault: the leader of a 3-node ensemble killed, and later isolated (frozen with SIGSTOP, so it
//! answers no one, as in a partition), while locks are held and waiters are queued, under mutex
//! and read/write traffic from four sessions — two treating a disconnection as a loss, two with a
//! grace under the session timeout — with the history checker.
//!
//! Holders keep their hold (the session survives the failover) or are told it is lost; never two
//! holders, tokens always increase, every session goes on locking, and nothing is left behind.

use crate::faults;

use std::time::Duration;

use faults::*;
use zklock::{DisconnectPolicy, LockManager};
use zklock_testkit::{History, ZkCluster};

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_and_isolating_the_leader_never_grants_a_lock_twice() {
    let mut cluster = blocking(|| ZkCluster::start(3)).unwrap();
    let connect = cluster.connect_string();
    let history = History::new();
    let session = Duration::from_secs(8);
    let quorum = Duration::from_secs(60);

    let crew = Crew::new();
    let mut managers = Vec::new();
    let mut disconnections = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..4 {
        let m = session_manager(&connect, session, i).await;
        disconnections.push(count_disconnections(&m));
        tasks.extend(workers(&m, i, &history, &crew));
        managers.push(m);
    }
    crew.until_grants(0, 10, Duration::from_secs(30)).await;

    // Killed, while locks are held and waiters queued.
    let leader = cluster.leader().expect("a leader");
    history.fault(&format!("killed the leader (member {leader})"));
    blocking(|| cluster.stop_member(leader)).unwrap();
    blocking(|| cluster.wait_for_quorum(quorum)).unwrap();
    crew.until_grants(crew.grants(), 10, quorum).await;
    blocking(|| cluster.restart_member(leader)).unwrap();
    blocking(|| cluster.wait_for_quorum(quorum)).unwrap();
    crew.until_grants(crew.grants(), 5, quorum).await;

    // Isolated: frozen, so that neither its followers nor its clients hear from it.
    let leader = cluster.leader().expect("a leader");
    history.fault(&format!("isolated the leader (member {leader})"));
    blocking(|| cluster.pause_member(leader)).unwrap();
    blocking(|| cluster.wait_for_quorum(quorum)).unwrap();
    assert_ne!(cluster.leader(), Some(leader));
    crew.until_grants(crew.grants(), 10, quorum).await;
    blocking(|| cluster.resume_member(leader)).unwrap();
    blocking(|| cluster.wait_for_quorum(quorum)).unwrap();
    crew.until_grants(crew.grants(), 5, quorum).await;

    crew.stop();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("workers stop")
            .unwrap();
    }
    let report = history.check();
    let disconnected: Vec<u64> = disconnections
        .iter()
        .map(|d| d.load(std::sync::atomic::Ordering::SeqCst))
        .collect();
    eprintln!(
        "fault_leader_failover: disconnections per session {disconnected:?}; {}",
        report.summary()
    );
    assert!(
        disconnected.iter().sum::<u64>() > 0,
        "the faults must reach the clients"
    );
    report.assert_ok();
    assert!(report.unprotected.is_empty(), "{report}");

    for m in &managers {
        m.flush().await;
    }
    assert_no_contenders(
        &managers[0]
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        ROOT,
        Duration::from_secs(20),
    )
    .await;
    assert_no_watches(
        || {
            (0..cluster.len())
                .filter_map(|i| cluster.member_four_letter(i, "wchp").ok())
                .collect()
        },
        ROOT,
        Duration::from_secs(20),
    )
    .await;
}

/// Session `i` of four, with the session timeout `session`: the even ones treat a
/// disconnection as a loss, the odd ones have a grace of 3 s.
async fn session_manager(connect: &str, session: Duration, i: usize) -> LockManager {
    let mut builder = LockManager::builder(connect).zookeeper(|zk| zk.session_timeout(session));
    if i % 2 == 1 {
        builder = builder
            .zookeeper(|zk| zk.disconnect_policy(DisconnectPolicy::Grace(Duration::from_secs(3))));
    }
    builder.connect().await.unwrap()
}

/// The mutex, read/write and election workers of session `i`.
fn workers(
    m: &LockManager,
    i: usize,
    history: &History,
    crew: &Crew,
) -> [tokio::task::JoinHandle<()>; 3] {
    let work = Work {
        wait: Duration::from_secs(30),
        hold: Duration::from_millis(30),
        think: Duration::from_millis(10),
    };
    [
        tokio::spawn(mutex_worker(
            m.clone(),
            "failover".into(),
            history.recorder(&format!("m{i}/mutex")),
            crew.clone(),
            work,
        )),
        tokio::spawn(rw_worker(
            m.clone(),
            "failover".into(),
            history.recorder(&format!("m{i}/rw")),
            crew.clone(),
            work,
            3,
        )),
        tokio::spawn(leader_worker(
            m.clone(),
            "failover-leader".into(),
            format!("m{i}"),
            history.recorder(&format!("m{i}/leader")),
            crew.clone(),
            work,
        )),
    ]
}

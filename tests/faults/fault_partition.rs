//! Fault: holders cut off from every server (a partition, through the test kit's proxy) for longer
//! than their session timeout. Each is told its hold is lost no later than the server can expire
//! the session, the waiter gets in only after that, with a larger fencing token, and nothing is
//! left behind once the partition heals.

use crate::common;
use crate::faults;

use std::time::Duration;

use common::*;
use faults::*;
use zklock::{Error, FencingToken, LockManager};
use zklock_testkit::{History, Mode, Recorder};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_cut_off_past_their_session_timeout_are_told_before_anyone_else_gets_in() {
    let zk = server();
    let history = History::new();

    // Two holders behind the proxy: Curator's policy (a disconnection is a loss) and a grace well
    // under the session timeout. The waiters talk to the server directly.
    let holders = CutOff::start(
        &zk.connect_string(),
        Duration::from_secs(3),
        Duration::from_millis(600),
    )
    .await;
    let (session, grace) = (holders.session, holders.grace);
    let waiters = manager(&zk.connect_string()).await;

    let mut holds = Vec::new();
    for (m, key, name) in holders.each(["k1", "k2"]) {
        let rec = history.recorder(name);
        rec.acquire_invoked(key, Mode::Exclusive);
        let guard = m.lock(key).await.unwrap();
        rec.acquire_ok(key, Mode::Exclusive, guard.fencing_token().as_u128());
        holds.push((guard, key, rec));
    }
    let mut queued = Vec::new();
    for key in ["k1", "k2"] {
        let rec = history.recorder(&format!("waiter-{key}"));
        queued.push(waiter(waiters.clone(), key, rec));
        until_children(&waiters, &waiters.path_of(key).unwrap(), 2).await;
    }

    let cut = holders.partition(&history, "partition: the holders' proxy blackholes");
    let mut told_after = Vec::new();
    for (guard, key, rec) in &holds {
        let reason = tokio::time::timeout(Duration::from_secs(10), guard.lost())
            .await
            .expect("lost() must fire while cut off");
        rec.lost(key, reason);
        told_after.push(cut.elapsed());
    }
    holders.assert_told_in_time(&told_after);
    assert!(
        told_after[1] >= grace,
        "the grace policy keeps the hold for {grace:?} after the disconnection: {:?}",
        told_after[1]
    );

    // The server expires the sessions; the waiters get in, with larger tokens.
    let mut waiter_tokens = Vec::new();
    for task in queued {
        let token = tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("the waiter gets in once the session expires")
            .unwrap();
        waiter_tokens.push(token);
    }
    for ((guard, _, _), token) in holds.iter().zip(&waiter_tokens) {
        assert!(*token > guard.fencing_token());
    }

    // Healed: releasing a lost hold says so and deletes nothing of anyone else's; the managers
    // open new sessions and lock again.
    holders.proxy.heal();
    for (guard, key, rec) in holds {
        rec.release_invoked(key);
        match guard.release().await {
            Err(e @ Error::LockLost { .. }) => rec.release_failed(key, e),
            other => panic!("releasing a lost hold must say so: {other:?}"),
        }
    }
    lock_again(&holders, &history).await;

    let report = history.check();
    eprintln!(
        "fault_partition: told after {told_after:?} (session {session:?}); {}",
        report.summary()
    );
    report.assert_ok();
    assert_eq!(report.losses, 2);
    assert!(report.unprotected.is_empty(), "{report}");

    flush_and_assert_no_contenders(
        &[&holders.strict, &holders.lenient, &waiters],
        Duration::from_secs(10),
    )
    .await;
    assert_no_watches(
        || zk.four_letter("wchp").into_iter().collect(),
        ROOT,
        Duration::from_secs(10),
    )
    .await;
    let stats = holders.proxy.stats();
    assert!(stats.connections >= 4, "{stats:?}");
}

/// A waiter of `m` queued on `key`: locks it, releases it at once, and answers its token.
fn waiter(
    m: LockManager,
    key: &'static str,
    rec: Recorder,
) -> tokio::task::JoinHandle<FencingToken> {
    tokio::spawn(async move {
        rec.acquire_invoked(key, Mode::Exclusive);
        let guard = m.lock(key).await.unwrap();
        let token = guard.fencing_token();
        rec.acquire_ok(key, Mode::Exclusive, token.as_u128());
        rec.release_invoked(key);
        guard.release().await.unwrap();
        rec.release_ok(key);
        token
    })
}

/// Healed: each cut-off holder's manager locks its key again (a new session) and releases it.
async fn lock_again(holders: &CutOff, history: &History) {
    for (m, key, name) in holders.each(["k1", "k2"]) {
        let rec = history.recorder(name);
        rec.acquire_invoked(key, Mode::Exclusive);
        let guard = tokio::time::timeout(Duration::from_secs(20), m.lock(key))
            .await
            .expect("the manager recovers")
            .unwrap();
        rec.acquire_ok(key, Mode::Exclusive, guard.fencing_token().as_u128());
        rec.release_invoked(key);
        guard.release().await.unwrap();
        rec.release_ok(key);
    }
}

/// The same partition for leaders: two elections, each led by a manager behind the proxy (one
/// strict, one with a grace), with a participant of another session waiting on the server side.
/// Each cut-off leader is told before its session can expire, the new leader is elected only
/// after that with a larger epoch, and the checker sees no two leaders, not even in an
/// unprotected window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaders_cut_off_past_their_session_timeout_are_told_before_a_new_leader_is_elected() {
    let zk = server();
    let history = History::new();
    let leading = CutOff::start(
        &zk.connect_string(),
        Duration::from_secs(3),
        Duration::from_millis(600),
    )
    .await;
    let session = leading.session;
    let others = manager(&zk.connect_string()).await;

    let mut leaders = Vec::new();
    for (m, election, name) in leading.each(["e1", "e2"]) {
        let key = format!("leader:{election}");
        let rec = history.recorder(name);
        rec.acquire_invoked(&key, Mode::Exclusive);
        let leadership = m
            .leader_latch(election, name)
            .unwrap()
            .lead()
            .await
            .unwrap();
        rec.acquire_ok(&key, Mode::Exclusive, leadership.epoch().as_u128());
        leaders.push((leadership, key, rec));
    }
    let mut next = Vec::new();
    for election in ["e1", "e2"] {
        let rec = history.recorder(&format!("next-{election}"));
        let latch = others.leader_latch(election, "next").unwrap();
        next.push(tokio::spawn(async move {
            let key = format!("leader:{election}");
            rec.acquire_invoked(&key, Mode::Exclusive);
            let leadership = latch.lead().await.unwrap();
            let epoch = leadership.epoch();
            rec.acquire_ok(&key, Mode::Exclusive, epoch.as_u128());
            rec.release_invoked(&key);
            leadership.leave().await.unwrap();
            rec.release_ok(&key);
            epoch
        }));
    }
    // Both followers have joined (two participants per election).
    for election in ["e1", "e2"] {
        let latch = others.leader_latch(election, "probe").unwrap();
        let path = latch.path().to_string();
        until_children(&others, &path, 2).await;
    }

    let cut = leading.partition(&history, "partition: the leaders' proxy blackholes");
    let mut told_after = Vec::new();
    for (leadership, key, rec) in &leaders {
        let reason = tokio::time::timeout(Duration::from_secs(10), leadership.lost())
            .await
            .expect("lost() must fire while cut off");
        rec.lost(key, reason);
        told_after.push(cut.elapsed());
        assert!(!leadership.is_leader());
    }
    leading.assert_told_in_time(&told_after);
    let mut epochs = Vec::new();
    for task in next {
        epochs.push(
            tokio::time::timeout(Duration::from_secs(20), task)
                .await
                .expect("a new leader once the old session expires")
                .unwrap(),
        );
    }
    for ((leadership, _, _), epoch) in leaders.iter().zip(&epochs) {
        assert!(
            *epoch > leadership.epoch(),
            "the epoch increases across leaders"
        );
    }

    leading.proxy.heal();
    for (leadership, key, rec) in leaders {
        rec.release_invoked(&key);
        match leadership.leave().await {
            Ok(()) => rec.release_ok(&key),
            Err(e) => rec.release_failed(&key, e),
        }
    }
    let report = history.check();
    eprintln!(
        "fault_partition (leaders): told after {told_after:?} (session {session:?}); {}",
        report.summary()
    );
    report.assert_ok();
    assert_eq!(report.losses, 2);
    assert!(report.unprotected.is_empty(), "{report}");

    flush_and_assert_no_contenders(
        &[&leading.strict, &leading.lenient, &others],
        Duration::from_secs(10),
    )
    .await;
}

//! Leader election (Curator's LeaderLatch recipe) on a real ZooKeeper: never two leaders, with
//! zklock and Curator participants mixed; epochs that strictly increase across leaders; a
//! leader whose session expires is told and replaced; `run` stops the leader's work on loss and
//! queues again; `participate` reports every change.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use zklock::{FencingToken, LeadershipEvent, LockKind, LossReason};
use zklock_testkit::{now_epoch_ms, CuratorHold};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_and_epochs_increase() {
    let zk = server();
    let leading = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let epochs = Arc::new(std::sync::Mutex::new(Vec::<FencingToken>::new()));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let m = manager(&zk.connect_string()).await;
        let (leading, most, epochs) = (leading.clone(), most.clone(), epochs.clone());
        tasks.push(tokio::spawn(async move {
            let latch = m.leader_latch("election", &format!("p{i}")).unwrap();
            for _ in 0..4 {
                let leadership = latch.lead().await.unwrap();
                let now = leading.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                epochs.lock().unwrap().push(leadership.epoch());
                tokio::time::sleep(Duration::from_millis(20)).await;
                leading.fetch_sub(1, Ordering::SeqCst);
                leadership.leave().await.unwrap();
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("every participant led four times")
            .unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "two leaders at once");
    let epochs = epochs.lock().unwrap().clone();
    assert_eq!(epochs.len(), 12);
    assert!(
        epochs.windows(2).all(|w| w[0] < w[1]),
        "epochs must strictly increase in the order of election: {epochs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zklock_and_curator_participants_elect_one_leader() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let path = "/interop/election";
    let latch = m.leader_latch_at_path(path, "rust-1").unwrap();

    // Curator leads: zklock cannot, then leads after Curator closes its latch.
    let mut curator =
        CuratorHold::spawn(&zk.connect_string(), path, "latch:jvm-1", 1500, 1).unwrap();
    let (event, _) = curator.next_event(Duration::from_secs(300)).unwrap();
    assert_eq!(event, "acquired");
    assert!(
        latch.try_lead().await.unwrap().is_none(),
        "zklock led while Curator's LeaderLatch led"
    );
    let info = m.inspect_path(path).await.unwrap();
    assert_eq!(info.kind, LockKind::Leader);
    assert_eq!(info.holders.len(), 1);
    assert_eq!(
        info.holders[0].owner.data, "jvm-1",
        "Curator's participant id"
    );
    let leadership = latch.lead().await.unwrap();
    let led_at = now_epoch_ms();
    let (event, released_at) = curator.next_event(Duration::from_secs(10)).unwrap();
    assert_eq!(event, "released");
    assert!(
        led_at >= released_at,
        "zklock led at {led_at}, before Curator gave up at {released_at}"
    );
    assert!(curator.wait().unwrap().success());

    // zklock leads: Curator's latch waits until zklock leaves.
    let mut curator = CuratorHold::spawn(&zk.connect_string(), path, "latch:jvm-2", 10, 1).unwrap();
    until_children(&m, path, 2).await;
    let info = m.inspect_path(path).await.unwrap();
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.waiters.len(), 1);
    let left_at = now_epoch_ms();
    leadership.leave().await.unwrap();
    let (event, curator_led_at) = curator.next_event(Duration::from_secs(30)).unwrap();
    assert_eq!(event, "acquired");
    assert!(
        curator_led_at >= left_at,
        "Curator led at {curator_led_at} while zklock led until {left_at}"
    );
    assert!(curator.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_leader_is_told_and_the_next_leads_with_a_larger_epoch() {
    let zk = server();
    let connect = zk.connect_string();
    let a = manager(&connect).await;
    let b = manager(&connect).await;
    let first = a
        .leader_latch("expiring", "a")
        .unwrap()
        .lead()
        .await
        .unwrap();
    let epoch_a = first.epoch();
    let b_latch = b.leader_latch("expiring", "b").unwrap();
    let waiting = tokio::spawn(async move { b_latch.lead().await });
    until_children(&a, &format!("{}/%LATCH/expiring", a.namespace()), 2).await;

    expire_session(&a, &connect).await;
    let reason = tokio::time::timeout(Duration::from_secs(20), first.lost())
        .await
        .expect("the expired leader is told");
    // Seen first as the disconnection (the default policy treats it as a loss), as the expiry
    // itself, or as the node's deletion (when the handle had won its session back in between).
    assert!(
        matches!(
            reason,
            LossReason::SessionExpired | LossReason::Disconnected | LossReason::NodeDeleted
        ),
        "{reason:?}"
    );
    assert!(!first.is_leader());
    let second = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the next participant leads")
        .unwrap()
        .unwrap();
    assert!(
        second.epoch() > epoch_a,
        "epoch {} after {}",
        second.epoch(),
        epoch_a
    );
    // The deposed leader, kept by user code, never leads again on the renewed session.
    assert!(!first.is_leader());
    second.leave().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_stops_the_leaders_work_on_loss_and_queues_again() {
    let zk = server();
    let connect = zk.connect_string();
    let a = manager(&connect).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let stopped = Arc::new(AtomicUsize::new(0));
    struct Stopped(Arc<AtomicUsize>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let latch = a.leader_latch("worker", "a").unwrap();
    let (r, s) = (runs.clone(), stopped.clone());
    let leader = tokio::spawn(async move {
        latch
            .run(move |_info| {
                let (r, s) = (r.clone(), s.clone());
                async move {
                    let n = r.fetch_add(1, Ordering::SeqCst) + 1;
                    let _stopped = Stopped(s);
                    if n == 1 {
                        std::future::pending::<()>().await;
                    }
                    n
                }
            })
            .await
    });
    eventually(|| runs.load(Ordering::SeqCst) == 1).await;
    expire_session(&a, &connect).await;
    // The first run is dropped at the loss; the participant queues again on the renewed
    // session, leads, and its second run returns.
    let result = tokio::time::timeout(Duration::from_secs(30), leader)
        .await
        .expect("the participant led again after its session was renewed")
        .unwrap()
        .unwrap();
    assert_eq!(result, 2);
    assert_eq!(stopped.load(Ordering::SeqCst), 2);
    a.flush().await;
    // Nothing left on the server (seen from another session: `a` may be renewing again).
    let direct = manager(&connect).await;
    until_children(&direct, &format!("{}/%LATCH/worker", a.namespace()), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn participate_reports_elected_and_lost() {
    let zk = server();
    let connect = zk.connect_string();
    let a = manager(&connect).await;
    let mut events = a.leader_latch("events", "a").unwrap().participate();
    let first = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .unwrap();
    let Some(LeadershipEvent::Elected { epoch }) = first else {
        panic!("expected Elected, got {first:?}");
    };
    expire_session(&a, &connect).await;
    let lost = tokio::time::timeout(Duration::from_secs(20), events.next())
        .await
        .unwrap();
    assert!(
        matches!(
            lost,
            Some(LeadershipEvent::Lost {
                reason: LossReason::SessionExpired | LossReason::Disconnected
            })
        ),
        "{lost:?}"
    );
    let again = tokio::time::timeout(Duration::from_secs(30), events.next())
        .await
        .unwrap();
    let Some(LeadershipEvent::Elected { epoch: second }) = again else {
        panic!("expected Elected again, got {again:?}");
    };
    assert!(second > epoch);
    drop(events);
}

/// Waits (bounded) until `cond` holds.
async fn eventually(cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition never held"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

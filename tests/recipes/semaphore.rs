//! Semaphores: at most N leases at once across sessions, all-or-nothing multi-lease acquire,
//! timeouts, cancel safety, and Curator's InterProcessSemaphoreV2 on the same path.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use rand::{Rng, SeedableRng};
use zklock::Error;
use zklock_testkit::{now_epoch_ms, CuratorHold};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_n_leases_at_once() {
    let zk = server();
    let mut managers = vec![];
    for _ in 0..3 {
        managers.push(manager(&zk.connect_string()).await);
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    let mut tasks = vec![];
    for (i, m) in managers.iter().enumerate() {
        for _ in 0..3 {
            let (sem, inside, max) = (
                m.semaphore("slots", 2).unwrap(),
                inside.clone(),
                max.clone(),
            );
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let lease = sem.acquire().await.unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    max.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5 + i as u64)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    lease.release().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        max.load(Ordering::SeqCst),
        2,
        "the semaphore must admit two and never three"
    );
    for m in &managers {
        m.flush().await;
    }
    let path = format!("{}/%SEM/slots", managers[0].namespace());
    assert!(children(&managers[0], &format!("{path}/leases"))
        .await
        .is_empty());
    assert!(children(&managers[0], &format!("{path}/locks"))
        .await
        .is_empty());
}

#[tokio::test]
async fn try_timeout_and_many() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let sa = a.semaphore("s", 3).unwrap();
    let sb = b.semaphore("s", 3).unwrap();
    let two = sa.acquire_many(2).await.unwrap();
    assert_eq!(two.len(), 2);
    let one = sb
        .try_acquire()
        .await
        .unwrap()
        .expect("a third lease is free");
    assert!(sb.try_acquire().await.unwrap().is_none());
    let err = sb
        .acquire_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(matches!(
        sb.acquire_many(4).await,
        Err(Error::InvalidArgument(_))
    ));
    // All or nothing: two leases cannot be had while only one is free.
    drop(one);
    b.flush().await;
    assert!(sb
        .acquire_many_timeout(2, Duration::from_millis(300))
        .await
        .is_err());
    b.flush().await;
    let leases = format!("{}/%SEM/s/leases", a.namespace());
    assert_eq!(
        children(&a, &leases).await.len(),
        2,
        "the failed multi-acquire returned its lease"
    );
    drop(two);
    a.flush().await;
    assert_eq!(sb.acquire_many(3).await.unwrap().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_semaphore_acquires_leave_nothing() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let sem = m.semaphore("c", 1).unwrap();
    let held = sem.acquire().await.unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for _ in 0..60 {
        let after = Duration::from_micros(rng.gen_range(0..5000));
        assert!(tokio::time::timeout(after, sem.acquire()).await.is_err());
    }
    m.flush().await;
    let path = format!("{}/%SEM/c", m.namespace());
    assert_eq!(
        children(&m, &format!("{path}/leases")).await.len(),
        1,
        "only the holder's lease"
    );
    assert!(children(&m, &format!("{path}/locks")).await.is_empty());
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_semaphore_shares_the_count() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let path = "/interop/sem/exports";
    let sem = m.semaphore_at_path(path, 1).unwrap();
    let mut curator =
        CuratorHold::spawn(&zk.connect_string(), path, "semaphore:1", 1500, 1).unwrap();
    assert_eq!(
        curator.next_event(Duration::from_secs(300)).unwrap().0,
        "acquired"
    );
    assert!(
        sem.try_acquire().await.unwrap().is_none(),
        "Curator holds the only lease"
    );
    let lease = sem.acquire().await.unwrap();
    let got_at = now_epoch_ms();
    let (event, released_at) = curator.next_event(Duration::from_secs(10)).unwrap();
    assert_eq!(event, "released");
    assert!(
        got_at >= released_at,
        "zklock got the lease at {got_at} before Curator returned it at {released_at}"
    );
    assert!(curator.wait().unwrap().success());
    assert!(lease.node_path().contains("/leases/_c_") && lease.node_path().contains("-lease-"));

    // zklock holds the only lease: Curator waits for it.
    let mut curator = CuratorHold::spawn(&zk.connect_string(), path, "semaphore:1", 10, 1).unwrap();
    until_children(&m, &format!("{path}/leases"), 2).await;
    let released_at = now_epoch_ms();
    lease.release().await.unwrap();
    let (event, acquired_at) = curator.next_event(Duration::from_secs(30)).unwrap();
    assert_eq!(event, "acquired");
    assert!(acquired_at >= released_at);
    assert!(curator.wait().unwrap().success());
}

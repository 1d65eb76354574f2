//! Cancel safety: acquires dropped at random await points leave no contender node behind.

use crate::common;

use std::time::Duration;

use common::*;
use rand::{Rng, SeedableRng};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_leave_the_lock_path_empty() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let path = a.path_of("cancel").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);

    // Cancelled while waiting behind a holder, and while creating (timeouts of 0..4 ms).
    let held = a.lock("cancel").await.unwrap();
    let mut tasks = vec![];
    for i in 0..120 {
        let m = if i % 2 == 0 { a.clone() } else { b.clone() };
        let after = Duration::from_micros(rng.gen_range(0..4000));
        tasks.push(tokio::spawn(async move {
            let r = tokio::time::timeout(after, m.lock("cancel")).await;
            assert!(r.is_err(), "the lock is held: nobody may get it");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    a.flush().await;
    b.flush().await;
    let left = children(&a, &path).await;
    assert_eq!(
        left,
        vec![held.node_path().rsplit('/').next().unwrap().to_string()],
        "only the holder's node"
    );
    held.release().await.unwrap();

    // Cancelled at random points while the lock is free: acquired guards are dropped.
    for _ in 0..150 {
        let m = if rng.gen_bool(0.5) { &a } else { &b };
        let after = Duration::from_micros(rng.gen_range(0..3000));
        if let Ok(guard) = tokio::time::timeout(after, m.lock("cancel")).await {
            drop(guard.unwrap());
        }
    }
    a.flush().await;
    b.flush().await;
    assert!(
        children(&a, &path).await.is_empty(),
        "contender nodes left behind: {:?}",
        children(&a, &path).await
    );
}

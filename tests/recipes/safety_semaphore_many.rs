//! Regression: `Semaphore::acquire_many(n)` must be all or none, without deadlock.
//!
//! Bug guarded against: `acquire_many(n)` takes its leases one at a time, each through the
//! semaphore's `locks` gate, keeping the leases taken so far. Two processes asking for 2 leases
//! of a 2-lease semaphore each get one; then one of them takes the gate for its second lease,
//! sees 3 leases and waits for one to go, holding the gate, while the other waits for the gate:
//! both wait forever.
//!
//! The test forces that interleaving: a third manager holds the gate (a mutex on the semaphore's
//! `locks` path, as Curator's `InterProcessSemaphoreV2` uses it) while A and then B queue on it,
//! so that A's first lease, B's first lease and A's second one follow in that order. Then each
//! must get both leases (in turn) within a bounded wait, and nothing may be left after.

use crate::common;
use crate::faults;

use std::time::{Duration, Instant};

use common::*;
use faults::*;
use zklock::LockManager;

const KEY: &str = "pair";
const LEASES: u32 = 2;

/// Asks for every lease at once, bounded; on success returns them, and says how many it got.
async fn take_all(m: LockManager, name: &'static str) -> Result<usize, String> {
    let semaphore = m.semaphore(KEY, LEASES).unwrap();
    let started = Instant::now();
    match tokio::time::timeout(Duration::from_secs(15), semaphore.acquire_many(LEASES)).await {
        Ok(Ok(leases)) => {
            let n = leases.len();
            println!("{name}: got {n} leases after {:?}", started.elapsed());
            for lease in leases {
                lease.release().await.unwrap();
            }
            Ok(n)
        }
        Ok(Err(e)) => Err(format!("{name}: failed: {e}")),
        Err(_) => Err(format!(
            "{name}: still waiting for {LEASES} leases after 15 s (deadlock)"
        )),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_asking_for_every_lease_at_once_both_get_them_in_turn() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let c = manager(&zk.connect_string()).await;
    let gate_path = format!("{}/%SEM/{KEY}/locks", c.namespace());
    let leases_path = format!("{}/%SEM/{KEY}/leases", c.namespace());

    // Hold the gate while A, then B, queue on it.
    let gate = c.mutex_at_path(&gate_path).unwrap().lock().await.unwrap();
    let first = tokio::spawn(take_all(a.clone(), "A"));
    until_children(&c, &gate_path, 2).await;
    let second = tokio::spawn(take_all(b.clone(), "B"));
    until_children(&c, &gate_path, 3).await;
    gate.release().await.unwrap();

    let (first, second) = tokio::join!(first, second);
    let (first, second) = (first.unwrap(), second.unwrap());
    let left = children(&c, &leases_path).await;
    assert!(
        first.is_ok() && second.is_ok(),
        "acquire_many({LEASES}) of two processes on a {LEASES}-lease semaphore: {first:?}, \
         {second:?}; leases then: {left:?}"
    );
    assert_eq!((first, second), (Ok(2), Ok(2)));

    for m in [&a, &b, &c] {
        tokio::time::timeout(Duration::from_secs(10), m.flush())
            .await
            .expect("background work ends");
    }
    assert_no_contenders(
        &c.client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        ROOT,
        Duration::from_secs(10),
    )
    .await;
}

//! `#[distributed_lock]` excludes: annotated calls in different sessions never overlap on one
//! key, the key is the template filled with the call's arguments, and every supported fn shape
//! (free, generic, inherent and trait-impl methods, the global manager) locks for real.

use crate::common;

use std::fmt::Display;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use zklock::{distributed_lock, Error, LockManager};

/// Counts the callers inside a critical section and remembers the most seen at once.
#[derive(Default)]
struct Overlap {
    inside: AtomicUsize,
    max: AtomicUsize,
    entries: AtomicUsize,
}

impl Overlap {
    async fn critical_section(&self) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        self.entries.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

#[distributed_lock("sku_{sku}", manager = m)]
async fn sell(m: &LockManager, sku: u32, overlap: &Overlap) -> Result<(), Error> {
    overlap.critical_section().await;
    Ok(())
}

async fn sell_unlocked(sku: u32, overlap: &Overlap) -> Result<(), Error> {
    let _ = sku;
    overlap.critical_section().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotated_calls_in_different_sessions_never_overlap() {
    let zk = server();
    let mut managers = vec![];
    for _ in 0..3 {
        managers.push(manager(&zk.connect_string()).await);
    }
    let overlap = Arc::new(Overlap::default());
    let mut tasks = vec![];
    for m in &managers {
        for _ in 0..3 {
            let (m, overlap) = (m.clone(), overlap.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    sell(&m, 7, &overlap).await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(overlap.entries.load(Ordering::SeqCst), 3 * 3 * 5);
    assert_eq!(
        overlap.max.load(Ordering::SeqCst),
        1,
        "two callers were inside at once"
    );
    for m in &managers {
        m.flush().await;
    }
    let path = managers[0].path_of("sku_7").unwrap();
    assert_eq!(children(&managers[0], &path).await, Vec::<String>::new());
}

/// The detector itself: without the attribute the same calls do overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overlap_detector_sees_unlocked_calls_overlap() {
    let overlap = Arc::new(Overlap::default());
    let mut tasks = vec![];
    for _ in 0..4 {
        let overlap = overlap.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                sell_unlocked(7, &overlap).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(overlap.max.load(Ordering::SeqCst) > 1);
}

pub struct Order {
    pub user_id: u64,
    pub id: u64,
}

/// Lists the lock's node while the body runs: the key is the filled-in template.
#[distributed_lock("order_{order.id}_of_{order.user_id}", manager = m)]
async fn place(m: &LockManager, order: Order) -> Result<Vec<String>, Error> {
    let path = m.path_of(&format!("order_{}_of_{}", order.id, order.user_id))?;
    Ok(children(m, &path).await)
}

#[distributed_lock("user_<id>", manager = m)]
async fn angle(m: &LockManager, id: &str) -> Result<Vec<String>, Error> {
    Ok(children(m, &m.path_of(&format!("user_{id}"))?).await)
}

#[tokio::test]
async fn the_key_is_the_template_filled_with_the_arguments() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let nodes = place(&m, Order { user_id: 9, id: 4 }).await.unwrap();
    assert_eq!(
        nodes.len(),
        1,
        "one contender under order_4_of_9: {nodes:?}"
    );
    assert!(nodes[0].starts_with("_c_") && nodes[0].contains("-lock-"));

    // Untrusted input stays one znode under the namespace: encoded by the core, never a path.
    let nodes = angle(&m, "../../zookeeper").await.unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(
        m.path_of("user_../../zookeeper").unwrap(),
        "/zklock/locks/user_..%2F..%2Fzookeeper"
    );
    let err = angle(&m, "bad\nid").await.unwrap_err();
    assert!(matches!(err, Error::InvalidKey { .. }), "{err:?}");
    m.flush().await;
    // Lock paths are direct children of the namespace (empty containers until the server
    // reaps them), and no contender node is left.
    let nodes = tree(&m, "/").await;
    assert!(
        nodes.iter().all(|n| n == "/zklock"
            || n == "/zklock/locks"
            || n.strip_prefix("/zklock/locks/")
                .is_some_and(|rest| !rest.contains('/'))),
        "{nodes:?}"
    );
    assert!(nodes.contains(&"/zklock/locks/user_..%2F..%2Fzookeeper".to_string()));
}

struct Inventory {
    locks: LockManager,
    overlap: Overlap,
}

impl Inventory {
    #[distributed_lock("sku_{sku}", manager = self.locks)]
    async fn take(&self, sku: u32) -> Result<u32, Error> {
        self.overlap.critical_section().await;
        Ok(sku)
    }
}

trait Seller {
    async fn sell(&self, sku: u32) -> Result<u32, Error>;
}

impl Seller for Inventory {
    #[distributed_lock("sku_{sku}", manager = self.locks)]
    async fn sell(&self, sku: u32) -> Result<u32, Error> {
        self.overlap.critical_section().await;
        Ok(sku)
    }
}

#[distributed_lock("sku_{sku}", manager = inventory.locks)]
async fn generic<S: Display + Send>(inventory: &Inventory, sku: S) -> Result<String, Error> {
    inventory.overlap.critical_section().await;
    Ok(sku.to_string())
}

/// Methods, trait-impl methods and generic fns share one lock when their keys are equal, and
/// exclude a holder of that key in another session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_trait_methods_and_generic_fns_exclude_each_other() {
    let zk = server();
    let a = Arc::new(Inventory {
        locks: manager(&zk.connect_string()).await,
        overlap: Overlap::default(),
    });
    let b = manager(&zk.connect_string()).await;
    let mut tasks = vec![];
    for i in 0..6 {
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                match i % 3 {
                    0 => assert_eq!(a.take(3).await.unwrap(), 3),
                    1 => assert_eq!(Seller::sell(&*a, 3).await.unwrap(), 3),
                    _ => assert_eq!(generic(&a, 3u8).await.unwrap(), "3"),
                }
            }
        }));
    }
    // Meanwhile another session takes the same key again and again.
    let mut other_session_entries = 0;
    for _ in 0..8 {
        b.with_lock("sku_3", async {
            assert_eq!(a.overlap.inside.load(Ordering::SeqCst), 0, "overlap");
            tokio::time::sleep(Duration::from_millis(5)).await;
            assert_eq!(a.overlap.inside.load(Ordering::SeqCst), 0, "overlap");
        })
        .await
        .unwrap();
        other_session_entries += 1;
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(other_session_entries, 8);
    assert_eq!(a.overlap.entries.load(Ordering::SeqCst), 24);
    assert_eq!(a.overlap.max.load(Ordering::SeqCst), 1);
}

#[distributed_lock("global_{n}")]
async fn with_the_global_manager(n: u32) -> Result<Vec<String>, Error> {
    let m = zklock::global().await?;
    Ok(children(&m, &m.path_of(&format!("global_{n}"))?).await)
}

/// Without `manager = ...` the attribute uses the global manager.
#[tokio::test]
async fn the_default_manager_is_the_global_one() {
    let zk = server();
    zklock::set_global(manager(&zk.connect_string()).await).unwrap();
    let nodes = with_the_global_manager(5).await.unwrap();
    assert_eq!(nodes.len(), 1, "{nodes:?}");
}

//! Fault: the reply to the contender's create is lost (the test kit's proxy withholds it and resets
//! the connection after the server committed the create). The contender finds its node by its
//! protected `_c_<uuid>-` prefix instead of creating a second one, the acquire completes, and when
//! the acquire is abandoned while cut off, the node is found and deleted once the connection is back.

use crate::common;
use crate::faults;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use faults::*;
use zklock::LockManager;
use zklock_testkit::{AfterDrop, History, Mode, Proxy, Recorder, CREATE_OPCODES};

async fn lock_recorded(m: &LockManager, key: &str, rec: &Recorder) -> zklock::LockGuard {
    rec.acquire_invoked(key, Mode::Exclusive);
    let guard = tokio::time::timeout(Duration::from_secs(20), m.lock(key))
        .await
        .unwrap_or_else(|_| panic!("the acquire of {key} must complete"))
        .unwrap_or_else(|e| panic!("the acquire of {key} must succeed: {e}"));
    rec.acquire_ok(key, Mode::Exclusive, guard.fencing_token().as_u128());
    guard
}

async fn release_recorded(guard: zklock::LockGuard, key: &str, rec: &Recorder) {
    rec.release_invoked(key);
    guard.release().await.unwrap();
    rec.release_ok(key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_to_the_contenders_create_leaves_one_node_and_the_acquire_completes() {
    let zk = server();
    let proxy = Proxy::start(&zk.connect_string()).unwrap();
    let history = History::new();
    let scene = Scene {
        zk: &zk,
        proxy: &proxy,
        direct: manager(&zk.connect_string()).await,
        m: manager(&proxy.connect_string()).await,
        holder: history.recorder("holder"),
        contender: history.recorder("contender"),
    };
    scene.waits_behind_a_holder_with_one_node().await;
    scene.locks_a_fresh_path_and_a_free_lock().await;
    scene
        .deletes_the_node_of_an_acquire_abandoned_while_cut_off()
        .await;
    let Scene { direct, m, .. } = scene;

    let report = history.check();
    eprintln!("fault_lost_create_reply: {}", report.summary());
    report.assert_ok();
    direct.flush().await;
    m.flush().await;
    assert_no_contenders(
        &direct
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        ROOT,
        Duration::from_secs(10),
    )
    .await;
    assert_no_watches(
        || zk.four_letter("wchp").into_iter().collect(),
        ROOT,
        Duration::from_secs(10),
    )
    .await;
}

/// The lost reply's setting: a manager connected directly, one through the proxy (`m`), and
/// their recorders.
struct Scene<'a> {
    zk: &'a ZkServer,
    proxy: &'a Proxy,
    direct: LockManager,
    m: LockManager,
    holder: Recorder,
    contender: Recorder,
}

impl Scene<'_> {
    /// 1. Behind a holder: the contender waits with the one node it made.
    async fn waits_behind_a_holder_with_one_node(&self) {
        let Scene {
            zk,
            proxy,
            direct,
            m,
            holder,
            contender,
        } = self;
        let key = "busy";
        let path = direct.path_of(key).unwrap();
        let held = lock_recorded(direct, key, holder).await;
        let most = Arc::new(AtomicUsize::new(0));
        let sampler = tokio::spawn({
            let (direct, path, most) = (direct.clone(), path.clone(), most.clone());
            async move {
                loop {
                    most.fetch_max(children(&direct, &path).await.len(), Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        });
        let creates = proxy.stats().creates;
        proxy.drop_reply_to_nth_create(1);
        let waiting = tokio::spawn({
            let (m, rec) = (m.clone(), contender.clone());
            async move { lock_recorded(&m, key, &rec).await }
        });
        eventually(
            "the create's reply to be withheld",
            Duration::from_secs(10),
            || async { proxy.stats().replies_dropped == 1 },
        )
        .await;
        // Waiting on the holder's node again, over a new connection: a watch on it is the proof.
        eventually(
            "the contender to watch the holder's node",
            Duration::from_secs(20),
            || async {
                zk.four_letter("wchp")
                    .is_ok_and(|w| w.lines().any(|l| l == held.node_path()))
                    && proxy.stats().connections >= 2
            },
        )
        .await;
        assert_eq!(
            proxy.stats().creates,
            creates + 1,
            "one create, never a second"
        );
        assert_eq!(children(direct, &path).await.len(), 2);
        let holder_token = held.fencing_token();
        release_recorded(held, key, holder).await;
        let got = tokio::time::timeout(Duration::from_secs(20), waiting)
            .await
            .expect("the contender gets the lock")
            .unwrap();
        assert!(got.fencing_token() > holder_token);
        assert_eq!(children(direct, &path).await.len(), 1);
        sampler.abort();
        assert_eq!(
            most.load(Ordering::SeqCst),
            2,
            "never more than the holder's node and the contender's"
        );
        release_recorded(got, key, contender).await;
    }

    /// 2. The first lock of a fresh path (the create fails for want of the path, but the client
    ///    cannot tell: the reply is lost), and a free lock whose path exists: both complete.
    async fn locks_a_fresh_path_and_a_free_lock(&self) {
        let Scene {
            proxy,
            direct,
            m,
            contender,
            ..
        } = self;
        for (key, replies) in [("fresh", 2), ("fresh", 3)] {
            let before = proxy.stats().creates;
            proxy.drop_reply_to_nth_create(1);
            let guard = lock_recorded(m, key, contender).await;
            assert_eq!(proxy.stats().replies_dropped, replies);
            assert_eq!(
                children(direct, &direct.path_of(key).unwrap()).await.len(),
                1
            );
            assert!(proxy.stats().creates > before);
            release_recorded(guard, key, contender).await;
        }
    }

    /// 3. Abandoned while cut off right after the create: once the connection is back, the node
    ///    is found by its prefix and deleted; nothing is orphaned.
    async fn deletes_the_node_of_an_acquire_abandoned_while_cut_off(&self) {
        let Scene {
            proxy,
            direct,
            m,
            holder,
            contender,
            ..
        } = self;
        let key = "abandoned";
        let path = direct.path_of(key).unwrap();
        let held = lock_recorded(direct, key, holder).await;
        proxy.drop_reply_to_nth_with(&CREATE_OPCODES, 1, AfterDrop::ResetAndBlackhole);
        let rec = contender.clone();
        rec.acquire_invoked(key, Mode::Exclusive);
        let abandoned = tokio::spawn({
            let m = m.clone();
            async move { m.lock(key).await.map(drop) }
        });
        eventually(
            "the create's reply to be withheld",
            Duration::from_secs(10),
            || async { proxy.stats().replies_dropped == 4 },
        )
        .await;
        assert_eq!(
            children(direct, &path).await.len(),
            2,
            "the create happened"
        );
        abandoned.abort();
        assert!(abandoned.await.unwrap_err().is_cancelled());
        rec.acquire_failed(key, Mode::Exclusive, "cancelled while cut off");
        proxy.heal();
        tokio::time::timeout(Duration::from_secs(20), m.flush())
            .await
            .expect("the cleanup finishes once the connection is back");
        assert_eq!(
            children(direct, &path).await,
            vec![held.node_path().rsplit('/').next().unwrap().to_string()],
            "only the holder's node is left"
        );
        release_recorded(held, key, holder).await;
    }
}

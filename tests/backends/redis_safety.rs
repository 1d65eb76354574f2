//! Safety of the Redis backend where a hold's belief and the server's state could part, each
//! against a real `redis-server` (the test kit's, on a free port):
//!
//! - a hand-over between managers with different leases: the waiter's deadline comes from the
//!   expiry the server was told, so it stops believing before a third process can get in;
//! - a local handoff (or a linger's re-take) of a key deleted from outside and granted to
//!   another process: refused, and the waiting task gets in after the other process, with a
//!   larger token;
//! - a server restart that lost the key: the old holder is no longer held (and its loss fired)
//!   by the time another process is granted.
//!
//! Each asserts the thing itself: no two believed holders, tokens strictly increasing in
//! grant order.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{redis_queue, redis_queued};
use futures::FutureExt;
use zklock::{LockGuard, LockManager};
use zklock_testkit::{Proxy, RedisServer};

fn server() -> RedisServer {
    RedisServer::start().expect("start redis-server (see the test kit's error)")
}

async fn manager(url: &str, lease: Duration) -> LockManager {
    LockManager::builder(url)
        .redis(|r| r.lease(lease))
        .connect()
        .await
        .expect("connect to the test Redis")
}

/// The end (server time, ms) of the liveness of the first waiter queued for `key`: its last
/// refused attempt's server time plus its waiter TTL. Every refused attempt moves it on.
async fn liveness(url: &str, key: &str) -> Option<f64> {
    let member = redis_queue(url, key).await.into_iter().next()?;
    let client = redis::Client::open(url).unwrap();
    let mut con = client
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .unwrap();
    redis::cmd("ZSCORE")
        .arg(format!("zklock:alive:/zklock/locks/{key}"))
        .arg(&member)
        .query_async(&mut con)
        .await
        .unwrap()
}

/// Waits until the waiter queued for `key` was refused again after the refusal that made its
/// liveness end at `seen`.
async fn refused_again(url: &str, key: &str, seen: Option<f64>) {
    tokio::time::timeout(Duration::from_secs(5), async {
        while liveness(url, key).await == seen {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the waiter attempts again");
}

/// The key's remaining time to live on the server (`PTTL`; -2: gone).
async fn pttl(url: &str, key: &str) -> i64 {
    let client = redis::Client::open(url).unwrap();
    let mut con = client
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .unwrap();
    redis::cmd("PTTL")
        .arg(format!("zklock:lock:/zklock/locks/{key}"))
        .query_async(&mut con)
        .await
        .unwrap()
}

/// Deletes `key`'s mutex key from outside (an operator's `DEL`, an eviction).
async fn delete_key(url: &str, key: &str) {
    let client = redis::Client::open(url).unwrap();
    let mut con = client
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .unwrap();
    let n: i64 = redis::cmd("DEL")
        .arg(format!("zklock:lock:/zklock/locks/{key}"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(n, 1, "the key was there to delete");
}

/// A release hands the key to a waiter whose manager has a far longer lease (10 s against
/// 300 ms). The waiter is cut off one way before the release (nothing it sends reaches the
/// server, the release's word reaches it), so only what the hand-over told the server keeps
/// the key: when a third process gets the key, the waiter must already report its hold lost,
/// and the third's token must be larger.
///
/// Before the fix the hand-over set the key's expiry from the releaser's lease (100 ms) while
/// the waiter counted on its own (1 s): the third got in with the waiter still held.
///
/// A round is conclusive when the waiter holds the key by the hand-over alone: its first lease
/// (to the end of its liveness in the queue, at most its waiter TTL, 1 s) is all the server
/// gives it, and nothing the waiter sends afterwards (its renewals) gets through. It is
/// not when the waiter took the key by an attempt of its own (which renews it for a whole
/// lease): the release must come while the waiter waits for its word, after a refusal that
/// followed its process's listening. Its first refusal does not do: the waiter then listens
/// and attempts again at once, and a release before that attempt is taken by it. Nor when the
/// waiter sent anything between the cut and its grant (its wait for the word ran out first):
/// the test sees it held at the proxy and lets it through, and the round ends there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_between_managers_with_different_leases_leaves_one_believed_holder() {
    let redis = server();
    let url = redis.url();
    let short = Duration::from_millis(300);
    // The waiter's first lease after a hand-over: its waiter TTL (lease/3, at most 1 s).
    let first_lease = 1000;
    let mut conclusive = 0;
    for round in 0..20 {
        if conclusive == 2 {
            break;
        }
        let key = format!("handover-{round}");
        let proxy = Proxy::start(&format!("127.0.0.1:{}", redis.port())).unwrap();
        let releaser = manager(&url, short).await;
        // The default lease (10 s).
        let waiter = LockManager::builder(format!("redis://{}/", proxy.connect_string()))
            .connect()
            .await
            .unwrap();
        let third = manager(&url, short).await;
        let held = releaser.lock(&key).await.unwrap();
        let first = held.fencing_token();
        let k = key.clone();
        let mut waiting = tokio::spawn(async move {
            let g = waiter.lock(&k).await.unwrap();
            (g, waiter)
        });
        redis_queued(&url, &key, 1).await;
        // A refusal after the first: the waiter's process listens on its channel, and the
        // waiter waits for the release's word.
        refused_again(&url, &key, liveness(&url, &key).await).await;
        // From here nothing the waiter sends reaches the server (its renewals go nowhere);
        // the release's word reaches it.
        proxy.hold_requests();
        held.release().await.unwrap();
        let sent_meanwhile = async {
            while proxy.stats().requests_held == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let handed = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::select! {
                biased;
                got = &mut waiting => Some(got.unwrap()),
                () = sent_meanwhile => None,
            }
        })
        .await
        .expect("the release hands the lock to the waiter");
        let Some((handed, waiter)) = handed else {
            proxy.heal();
            let (handed, waiter) = tokio::time::timeout(Duration::from_secs(5), waiting)
                .await
                .expect("the waiter gets the lock once its request goes through")
                .unwrap();
            eprintln!("round {round}: the waiter sent a request before it was granted");
            drop(handed);
            waiter.flush().await;
            releaser.flush().await;
            third.flush().await;
            continue;
        };
        let handed_token = handed.fencing_token();
        assert!(handed_token > first, "{handed_token} after {first}");
        let left = pttl(&url, &key).await;
        if left > first_lease {
            // An attempt of the waiter's own, sent before the cut, took the handed key for a
            // whole lease, rightly.
            eprintln!("round {round}: the waiter took the key by an attempt ({left} ms left)");
        } else {
            // Nothing can keep the key past the hand-over's first lease: the third gets in.
            let got = third
                .lock_timeout(&key, Duration::from_secs(5))
                .await
                .unwrap_or_else(|e| {
                    panic!("round {round}: the key outlived the hand-over's first lease: {e}")
                });
            let believed = handed.is_held();
            assert!(
                !believed,
                "round {round}: another process got the key while the handed-to waiter still reports it held"
            );
            assert!(got.fencing_token() > handed_token);
            got.release().await.unwrap();
            conclusive += 1;
        }
        proxy.heal();
        drop(handed);
        waiter.flush().await;
        releaser.flush().await;
        third.flush().await;
    }
    assert_eq!(
        conclusive, 2,
        "too few rounds where the waiter held the key by the hand-over alone"
    );
}

/// What a local waiter of the first process saw when it got the lock.
struct LocalGrant {
    token: zklock::FencingToken,
    /// Whether the other process's guard reported the lock held at that moment.
    other_held: bool,
}

/// The other process's guard, shared with the local waiter (which checks it when granted).
type Slot = Arc<Mutex<Option<LockGuard>>>;

fn other_held(slot: &Slot) -> bool {
    slot.lock().unwrap().as_ref().is_some_and(|g| g.is_held())
}

/// A task of `p`'s process that takes `key` (locally, behind the holder) and records, at its
/// grant, its token and whether the other process's guard in `slot` said held.
fn local_grant(
    p: &Arc<LockManager>,
    key: &'static str,
    slot: &Slot,
) -> tokio::task::JoinHandle<LocalGrant> {
    let (p, slot) = (p.clone(), slot.clone());
    tokio::spawn(async move {
        let g = p.lock(key).await.unwrap();
        let seen = LocalGrant {
            token: g.fencing_token(),
            other_held: other_held(&slot),
        };
        g.release().await.unwrap();
        seen
    })
}

/// The key is deleted from outside while a task of process P holds it and another task of P
/// waits; process Q then gets the key. P's release must not hand the lock to its waiting task
/// (the server no longer has P's hold): that task gets the lock only after Q, with a token
/// larger than Q's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_handoff_of_a_key_deleted_from_outside_hands_on_nothing() {
    let redis = server();
    let url = redis.url();
    let lease = Duration::from_secs(6);
    let p = Arc::new(manager(&url, lease).await);
    let q = manager(&url, lease).await;
    let key = "deleted-handoff";
    let first = p.lock(key).await.unwrap();
    let slot: Slot = Arc::default();
    let local = local_grant(&p, key, &slot);
    // Let the second task queue locally behind the first.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!local.is_finished());
    delete_key(&url, key).await;
    let theirs = q
        .lock_timeout(key, Duration::from_secs(2))
        .await
        .expect("the deleted key is free for another process");
    let their_token = theirs.fencing_token();
    assert!(their_token > first.fencing_token());
    *slot.lock().unwrap() = Some(theirs);
    // P's release: no hold on the server to hand on.
    let _ = first.release().await;
    finish(local, &slot, their_token).await;
    p.flush().await;
    q.flush().await;
}

/// Lets the local waiter run while the other process holds the lock (a handoff would land
/// now), then releases the other's guard; the local waiter must have got in only after, with a
/// larger token.
async fn finish(
    mut local: tokio::task::JoinHandle<LocalGrant>,
    slot: &Slot,
    their_token: zklock::FencingToken,
) {
    let early = tokio::time::timeout(Duration::from_millis(300), &mut local).await;
    let seen = match early {
        Ok(seen) => seen.unwrap(),
        Err(_) => {
            let theirs = slot.lock().unwrap().take().expect("still theirs");
            assert!(theirs.is_held());
            theirs.release().await.unwrap();
            tokio::time::timeout(Duration::from_secs(5), &mut local)
                .await
                .expect("the local waiter gets in after the other process")
                .unwrap()
        }
    };
    assert!(
        !seen.other_held,
        "the local waiter was granted while the other process held the lock (token {} after theirs {their_token})",
        seen.token
    );
    assert!(
        seen.token > their_token,
        "a grant after the other process's has token {} <= {their_token}",
        seen.token
    );
}

/// The same with a linger: P's hold lingers after its last release, the key is deleted from
/// outside, Q gets it; P's next acquire must not re-take its lingering hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linger_re_take_of_a_key_deleted_from_outside_takes_nothing() {
    let redis = server();
    let url = redis.url();
    let lease = Duration::from_secs(6);
    let p = Arc::new(
        LockManager::builder(url.as_str())
            .redis(|r| r.lease(lease))
            .linger(Duration::from_secs(30))
            .connect()
            .await
            .unwrap(),
    );
    let q = manager(&url, lease).await;
    let key = "deleted-linger";
    let first = p.lock(key).await.unwrap();
    let first_token = first.fencing_token();
    first.release().await.unwrap();
    delete_key(&url, key).await;
    let theirs = q
        .lock_timeout(key, Duration::from_secs(2))
        .await
        .expect("the deleted key is free for another process");
    let their_token = theirs.fencing_token();
    assert!(their_token > first_token);
    let slot: Slot = Arc::new(Mutex::new(Some(theirs)));
    let local = local_grant(&p, key, &slot);
    finish(local, &slot, their_token).await;
    p.flush().await;
    q.flush().await;
}

/// A restart that kept nothing: the holder's connection broke before the restarted server
/// accepted anyone, so by the time another process is granted the key, the old holder must
/// not report it held, and its loss must have fired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_lost_the_key_is_a_loss_before_anyone_else_is_granted() {
    let mut redis = server();
    let url = redis.url();
    // The default lease (10 s): renewals every 3.3 s, long after the restart.
    let old = LockManager::builder(url.as_str()).connect().await.unwrap();
    let next = LockManager::builder(url.as_str()).connect().await.unwrap();
    for round in 0..3 {
        let key = format!("restart-{round}");
        let held = old.lock(&key).await.unwrap();
        let first = held.fencing_token();
        tokio::task::block_in_place(|| redis.restart()).unwrap();
        let got = next
            .lock_timeout(&key, Duration::from_secs(5))
            .await
            .expect("the restarted server has no key");
        let believed = held.is_held();
        let fired = held.lost().now_or_never();
        assert!(
            !believed,
            "round {round}: another process was granted the key while the old holder reports it held"
        );
        assert!(
            fired.is_some(),
            "round {round}: the old holder's loss has not fired"
        );
        assert!(got.fencing_token() > first);
        got.release().await.unwrap();
        drop(held);
        old.flush().await;
    }
}

//! Regression: the disconnect grace must be checked against the session timeout the server
//! negotiated, not the one asked for.
//!
//! Bug guarded against: `Builder::connect` refuses a `DisconnectPolicy::Grace` that is not well
//! under the *requested* session timeout. Servers clamp that request (to `maxSessionTimeout`,
//! 20 x tickTime by default): asking for 60 s with a 30 s grace passes the check, the server
//! grants 4 s, and a partitioned holder keeps answering `is_held() == true` for some 30 s after
//! the server expired its session and gave the lock to someone else.
//!
//! The test checks the safety property itself: either the configuration is refused at connect
//! with an error that names the negotiated timeout, or a partitioned holder reports its hold
//! lost before another session is granted the lock (no overlap of the holder's "held" with the
//! next holder's grant).

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use zklock::{DisconnectPolicy, Error, LockManager};
use zklock_testkit::Proxy;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grace_fitting_the_asked_timeout_but_not_the_negotiated_one_never_overlaps_the_next_holder(
) {
    // The server grants at most 4 s, whatever is asked.
    let zk = ZkServer::builder()
        .max_session_timeout(4_000)
        .start()
        .unwrap();
    let proxy = Proxy::start(&zk.connect_string()).unwrap();
    let connected = LockManager::builder(proxy.connect_string())
        .zookeeper(|zk| {
            zk.session_timeout(Duration::from_secs(60))
                .disconnect_policy(DisconnectPolicy::Grace(Duration::from_secs(30)))
        })
        .connect()
        .await;
    let holder = match connected {
        Err(Error::Config(message)) => {
            println!("refused at connect: {message}");
            assert!(
                ["4s", "4 s", "4000", "4.0"]
                    .iter()
                    .any(|t| message.contains(t)),
                "the refusal must name the negotiated session timeout (4 s): {message}"
            );
            return;
        }
        Err(other) => panic!("connect failed otherwise than by refusing the grace: {other}"),
        Ok(holder) => holder,
    };
    let negotiated = holder
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .session_timeout();
    println!("accepted; asked 60 s, the server negotiated {negotiated:?}");

    let key = "negotiated";
    let path = holder.path_of(key).unwrap();
    let held = Arc::new(holder.lock(key).await.unwrap());
    let waiters = manager(&zk.connect_string()).await;
    let waiter = tokio::spawn({
        let waiters = waiters.clone();
        async move {
            let guard = waiters.lock(key).await.unwrap();
            (guard, Instant::now())
        }
    });
    until_children(&waiters, &path, 2).await;
    let lost = tokio::spawn({
        let held = held.clone();
        async move {
            let reason = held.lost().await;
            (reason, Instant::now())
        }
    });

    let cut = Instant::now();
    proxy.blackhole();
    let (next, granted_at) = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the server expires the partitioned session and grants the waiter")
        .unwrap();
    let still_held = held.is_held();
    println!(
        "waiter granted {:?} after the cut; the holder's is_held() then: {still_held}",
        granted_at - cut
    );
    assert!(
        !still_held,
        "two holders: the partitioned holder still reports is_held() = true after the server \
         (negotiated session timeout {negotiated:?}) gave the lock to another session {:?} after \
         the cut",
        granted_at - cut
    );
    let (reason, lost_at) = tokio::time::timeout(Duration::from_secs(5), lost)
        .await
        .expect("lost() completes once is_held() is false")
        .unwrap();
    println!("holder told {reason} {:?} after the cut", lost_at - cut);
    assert!(
        lost_at <= granted_at,
        "the holder was told its hold was lost ({reason}) {:?} after the cut, after the waiter \
         was granted at {:?}",
        lost_at - cut,
        granted_at - cut
    );

    next.release().await.unwrap();
    proxy.heal();
    drop(held);
    tokio::time::timeout(Duration::from_secs(20), holder.flush())
        .await
        .expect("the holder's background work ends after the partition");
}

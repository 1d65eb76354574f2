//! Mutual exclusion under contention: many tasks over several sessions, an overlap detector
//! that would catch two holders, and tokens that strictly increase.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_holders_across_sessions_and_tokens_increase() {
    let zk = server();
    let mut managers = vec![];
    for _ in 0..4 {
        managers.push(manager(&zk.connect_string()).await);
    }
    let holders = Arc::new(AtomicUsize::new(0));
    let max_seen = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = vec![];
    for (i, m) in managers.iter().enumerate() {
        for t in 0..6 {
            let (m, holders, max_seen, tokens) =
                (m.clone(), holders.clone(), max_seen.clone(), tokens.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..8 {
                    let guard = m.lock("contended").await.unwrap();
                    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    max_seen.fetch_max(now, Ordering::SeqCst);
                    tokens.lock().unwrap().push((guard.fencing_token(), i, t));
                    tokio::task::yield_now().await;
                    holders.fetch_sub(1, Ordering::SeqCst);
                    if (i + t) % 2 == 0 {
                        guard.release().await.unwrap();
                    } else {
                        drop(guard);
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(max_seen.load(Ordering::SeqCst), 1, "two holders at once");
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), 4 * 6 * 8);
    for w in tokens.windows(2) {
        assert!(
            w[0].0 < w[1].0,
            "token did not increase: {:?} then {:?}",
            w[0],
            w[1]
        );
    }
    for m in &managers {
        m.flush().await;
    }
    let path = managers[0].path_of("contended").unwrap();
    assert_eq!(
        children(&managers[0], &path).await,
        Vec::<String>::new(),
        "contender nodes left behind"
    );
}

#[tokio::test]
async fn try_lock_and_timeout_leave_nothing() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let held = a.lock("job").await.unwrap();
    assert!(
        b.try_lock("job").await.unwrap().is_none(),
        "try_lock got a held lock"
    );
    let err = b
        .lock_timeout("job", std::time::Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, zklock::Error::Timeout { .. }), "{err}");
    b.flush().await;
    let path = a.path_of("job").unwrap();
    assert_eq!(
        children(&a, &path).await.len(),
        1,
        "only the holder's node remains"
    );
    held.release().await.unwrap();
    let got = b.try_lock("job").await.unwrap().expect("free lock");
    assert!(got.is_held());
    drop(got);
    b.flush().await;
    assert!(children(&a, &path).await.is_empty());
}

#[tokio::test]
async fn with_lock_runs_body_under_the_lock_and_releases() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let path = m.path_of("w").unwrap();
    let seen = m
        .with_lock("w", async { children(&m, &path).await.len() })
        .await
        .unwrap();
    assert_eq!(seen, 1, "the body ran while the contender node existed");
    m.flush().await;
    assert!(children(&m, &path).await.is_empty(), "with_lock released");
}

#[tokio::test]
async fn nodes_use_curators_format() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let g = m.lock("fmt").await.unwrap();
    let kids = children(&m, &m.path_of("fmt").unwrap()).await;
    assert_eq!(kids.len(), 1);
    let name = &kids[0];
    // _c_<uuid-v4 lowercase with dashes>-lock-<10 digits>
    let rest = name.strip_prefix("_c_").expect("protected prefix");
    let (uuid, seq) = rest.split_once("-lock-").expect("lock name");
    assert_eq!(uuid.len(), 36);
    assert!(uuid
        .chars()
        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase() || c == '-'));
    assert_eq!(seq.len(), 10);
    assert!(seq.chars().all(|c| c.is_ascii_digit()));
    assert_eq!(
        g.node_path(),
        format!("{}/{}", m.path_of("fmt").unwrap(), name)
    );
    // The lock path's parent chain is made of CONTAINER nodes (ephemeralOwner 0, removed when empty).
    let (_, stat) = m
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .get_data(&m.path_of("fmt").unwrap())
        .await
        .unwrap();
    assert_eq!(stat.ephemeral_owner, 0);
}

//! Re-entry: frames of `with_lock`, counted guards, and frames kept to their own manager.

use super::*;

/// Nested `with_lock` on the same key re-enters (no deadlock, the same token, one node), a
/// guard's `reenter` and `scope` count holds, and concurrent branches of one frame are
/// serialized.
pub(crate) async fn with_lock_frames_reenter(backend: Backend) {
    let env = Env::start(backend);
    for queue in QUEUES {
        let key = format!("reenter_{queue:?}");
        let managers = env.processes(2, queue).await;
        let (m, other) = (&managers[0], &managers[1]);
        let path = m.path_of(&key).unwrap();

        let (outer, inner, nodes) = tokio::time::timeout(
            Duration::from_secs(10),
            m.with_lock(&key, async {
                let outer = current_fencing_token().unwrap();
                let (inner, nodes) = m
                    .with_lock(&key, async {
                        m.with_lock(&key, async {
                            // Another task, with no frame, does not get in.
                            let spawned = tokio::spawn({
                                let (other, key) = (other.clone(), key.clone());
                                async move { other.try_lock(&key).await.unwrap().is_none() }
                            });
                            assert!(spawned.await.unwrap(), "held: no other holder");
                            other.flush().await; // its try's node is gone before we count
                            let nodes = if env.is_zk() {
                                children(m, &path).await.len()
                            } else {
                                1
                            };
                            (current_fencing_token().unwrap(), nodes)
                        })
                        .await
                        .unwrap()
                    })
                    .await
                    .unwrap();
                (outer, inner, nodes)
            }),
        )
        .await
        .expect("re-entry must not deadlock")
        .unwrap();
        assert_eq!(outer, inner, "re-entries share the outer hold");
        assert_eq!(nodes, 1, "one node for all three holds");
        assert_eq!(current_fencing_token(), None);

        // Guards count their holds; the lock goes with the last.
        let first = m.lock(&key).await.unwrap();
        let again = first.reenter();
        assert_eq!(first.hold_count(), 2);
        assert_eq!(again.fencing_token(), first.fencing_token());
        let (count, token) = tokio::time::timeout(
            Duration::from_secs(10),
            first.scope(async {
                let nested = m.lock(&key).await.unwrap();
                (nested.hold_count(), current_fencing_token())
            }),
        )
        .await
        .expect("a lock inside the guard's scope re-enters");
        assert_eq!(count, 3);
        assert_eq!(token, Some(first.fencing_token()));
        assert_eq!(first.hold_count(), 2);
        drop(first);
        assert!(again.is_held());
        assert_eq!(again.hold_count(), 1);
        assert!(
            other.try_lock(&key).await.unwrap().is_none(),
            "still held through the re-entry"
        );
        again.release().await.unwrap();
        other.flush().await;
        assert!(other.try_lock(&key).await.unwrap().is_some());

        // Concurrent branches of one frame re-enter one at a time.
        let overlap = Overlap::default();
        let branch = |n: u64| {
            let (m, key, overlap) = (m, &key, &overlap);
            async move {
                m.with_lock(key, async {
                    overlap.enter(1);
                    tokio::time::sleep(Duration::from_millis(10 + n)).await;
                    overlap.leave(1);
                })
                .await
                .unwrap()
            }
        };
        tokio::time::timeout(
            Duration::from_secs(10),
            m.with_lock(&key, async {
                tokio::join!(branch(0), branch(3), branch(6));
            }),
        )
        .await
        .expect("branches re-enter")
        .unwrap();
        assert_eq!(overlap.entries(), 3);
        assert_eq!(overlap.max(), 1, "two branches were inside at once");
    }
}

/// Frames re-enter holds of the same manager only: inside `a.with_lock("k")`, another
/// manager's acquire of the same key is another lock (another backend, another cluster), not a
/// re-entry of a's hold (regression: frames matched on the path alone).
#[tokio::test]
pub(crate) async fn regression_frames_do_not_reenter_another_managers_hold() {
    let a = zklock::LockManager::in_memory();
    let b = zklock::LockManager::in_memory();
    a.with_lock("k", async {
        let other = b.try_lock("k").await.unwrap().expect("b's lock is free");
        assert_eq!(other.hold_count(), 1, "b's guard is a hold of its own");
    })
    .await
    .unwrap();
}

//! The read/write lock on every backend that has it: sharing, exclusion, deadlock refusal,
//! downgrade; and its refusal where not (MySQL's user locks are exclusive).

use super::*;

/// On a backend without read/write locks, every way to take one fails with
/// `Error::Unsupported` naming the backend, and nothing is left on the server.
pub(crate) async fn rwlocks_are_refused(env: &Env) {
    let m = env.process(Queue::Local).await;
    let rw = m.rwlock("doc").unwrap();
    let errors = [
        rw.read().await.map(drop).unwrap_err(),
        rw.write().await.map(drop).unwrap_err(),
        rw.try_read().await.map(drop).unwrap_err(),
        rw.try_write().await.map(drop).unwrap_err(),
        rw.write_timeout(Duration::from_millis(100))
            .await
            .map(drop)
            .unwrap_err(),
    ];
    for err in &errors {
        assert_unsupported(err, env.backend_name());
    }
    let path = rw.path().to_string();
    assert_eq!(
        env.left_behind(std::slice::from_ref(&m), &path).await,
        Vec::<String>::new()
    );
}

/// Readers of different processes share; a writer excludes readers and writers.
pub(crate) async fn readers_share_writers_exclude(backend: Backend) {
    let env = Env::start(backend);
    if backend == Backend::MySql {
        return rwlocks_are_refused(&env).await;
    }
    for queue in QUEUES {
        let key = format!("rw_{queue:?}");
        let managers = env.processes(2, queue).await;
        let (a, b) = (&managers[0], &managers[1]);
        let (ra, rb) = (a.rwlock(&key).unwrap(), b.rwlock(&key).unwrap());

        let r1 = ra.read().await.unwrap();
        let r2 = rb.try_read().await.unwrap().expect("readers share");
        assert!(rb.try_write().await.unwrap().is_none(), "a writer waits");
        assert!(ra.try_write().await.unwrap().is_none(), "a writer waits");
        r1.release().await.unwrap();
        r2.release().await.unwrap();
        let w = ra.write().await.unwrap();
        assert!(
            rb.try_read().await.unwrap().is_none(),
            "a writer excludes readers"
        );
        assert!(rb.try_write().await.unwrap().is_none(), "and writers");
        w.release().await.unwrap();

        // Both readers are inside at once: only possible if they share.
        let all_in = Barrier::new(2);
        let both = tokio::time::timeout(Duration::from_secs(15), async {
            tokio::join!(ra.with_read(all_in.wait()), rb.with_read(all_in.wait()))
        })
        .await
        .expect("both readers were inside at once");
        both.0.unwrap();
        both.1.unwrap();

        // Mixed load: no writer ever overlaps anyone.
        let readers = Arc::new(AtomicUsize::new(0));
        let writers = Arc::new(AtomicUsize::new(0));
        let bad = Arc::new(AtomicUsize::new(0));
        let mut tasks = vec![];
        for i in 0..4 {
            let rw = managers[i % 2].rwlock(&key).unwrap();
            let (readers, writers, bad) = (readers.clone(), writers.clone(), bad.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    if i < 2 {
                        let w = rw.write().await.unwrap();
                        if writers.fetch_add(1, Ordering::SeqCst) != 0
                            || readers.load(Ordering::SeqCst) != 0
                        {
                            bad.fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        writers.fetch_sub(1, Ordering::SeqCst);
                        drop(w);
                    } else {
                        let r = rw.read().await.unwrap();
                        readers.fetch_add(1, Ordering::SeqCst);
                        if writers.load(Ordering::SeqCst) != 0 {
                            bad.fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        readers.fetch_sub(1, Ordering::SeqCst);
                        drop(r);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(
            bad.load(Ordering::SeqCst),
            0,
            "a writer overlapped ({queue:?})"
        );
        assert_eq!(
            env.left_behind(&managers, ra.path()).await,
            Vec::<String>::new()
        );
    }
}

/// A reader asking for the write lock of its own key gets `Error::WouldDeadlock` at once; a
/// writer taking its own read lock re-enters.
pub(crate) async fn write_inside_read_would_deadlock(backend: Backend) {
    let env = Env::start(backend);
    if backend == Backend::MySql {
        return rwlocks_are_refused(&env).await;
    }
    let m = env.process(Queue::Local).await;
    let rw = m.rwlock("doc").unwrap();

    let started = Instant::now();
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        rw.with_read(async { rw.with_write(async {}).await }),
    )
    .await
    .expect("refused at once, not a silent deadlock")
    .unwrap();
    match refused {
        Err(Error::WouldDeadlock { key, cause }) => {
            assert_eq!(key, "doc");
            assert_eq!(cause, Deadlock::WriteInsideRead);
        }
        other => panic!("expected WouldDeadlock, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(2));

    // The same through a guard's scope and the lock methods.
    let read = rw.read().await.unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(5), read.scope(rw.write()))
        .await
        .expect("refused at once");
    assert!(
        matches!(refused, Err(Error::WouldDeadlock { .. })),
        "{refused:?}"
    );
    let refused = tokio::time::timeout(Duration::from_secs(5), read.scope(rw.try_write()))
        .await
        .expect("refused at once");
    assert!(
        matches!(refused, Err(Error::WouldDeadlock { .. })),
        "{refused:?}"
    );
    read.release().await.unwrap();

    let seven = tokio::time::timeout(
        Duration::from_secs(10),
        rw.with_write(async { rw.with_read(async { 7 }).await }),
    )
    .await
    .expect("a writer taking its own read lock must not deadlock")
    .unwrap()
    .unwrap();
    assert_eq!(seven, 7);
}

/// A downgrade keeps a queued writer out until the read hold ends; its token is above the
/// write token and below the next writer's. With no writer queued, readers share at once.
pub(crate) async fn downgrade_keeps_queued_writer_out(backend: Backend) {
    let env = Env::start(backend);
    if backend == Backend::MySql {
        return rwlocks_are_refused(&env).await;
    }
    for queue in QUEUES {
        let key = format!("dg_{queue:?}");
        let managers = env.processes(3, queue).await;
        let (a, b, c) = (&managers[0], &managers[1], &managers[2]);
        let path = a.rwlock(&key).unwrap().path().to_string();

        // No writer queued: other readers share after the downgrade, writers wait.
        let w = a.rwlock(&key).unwrap().write().await.unwrap();
        let write_token = w.fencing_token();
        let r = w.downgrade().await.unwrap();
        assert!(r.fencing_token() > write_token);
        let shared = c
            .rwlock(&key)
            .unwrap()
            .try_read()
            .await
            .unwrap()
            .expect("after a downgrade other readers share");
        assert!(c.rwlock(&key).unwrap().try_write().await.unwrap().is_none());
        shared.release().await.unwrap();
        r.release().await.unwrap();

        // A writer queued behind the write hold stays out until the read hold ends.
        let w = a.rwlock(&key).unwrap().write().await.unwrap();
        let write_token = w.fencing_token();
        let queued = env
            .spawn_queued(a, &path, 2, {
                let (b, key) = (b.clone(), key.clone());
                async move {
                    let g = b.rwlock(&key).unwrap().write().await.unwrap();
                    let token = g.fencing_token();
                    g.release().await.unwrap();
                    token
                }
            })
            .await;
        let r = w.downgrade().await.unwrap();
        let read_token = r.fencing_token();
        assert!(read_token > write_token, "{read_token} after {write_token}");
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(
            !queued.is_finished(),
            "the queued writer got in during the downgraded hold ({queue:?})"
        );
        assert!(r.is_held());
        env.until_writer_waits(&path).await;
        // A new reader queues behind the queued writer (FIFO), it does not join.
        assert!(c.rwlock(&key).unwrap().try_read().await.unwrap().is_none());
        r.release().await.unwrap();
        let next_token = tokio::time::timeout(Duration::from_secs(10), queued)
            .await
            .expect("the queued writer gets in once the read hold ends")
            .unwrap();
        assert!(
            next_token > read_token,
            "the next writer's token {next_token} is above the downgraded {read_token}"
        );
        assert_eq!(
            env.left_behind(&managers, &path).await,
            Vec::<String>::new()
        );
    }
}

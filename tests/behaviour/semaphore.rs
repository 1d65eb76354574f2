//! Semaphores on every backend that has them, and their refusal where not.

use super::*;

/// A semaphore of N admits at most N at once, across processes, and nothing is left.
pub(crate) async fn semaphore_admits_at_most_n(backend: Backend) {
    let env = Env::start(backend);
    if matches!(backend, Backend::Postgres | Backend::MySql) {
        return semaphores_are_refused(&env).await;
    }
    let managers = env.processes(3, Queue::Local).await;
    let overlap = Arc::new(Overlap::default());
    let mut tasks = vec![];
    for (i, m) in managers.iter().enumerate() {
        for _ in 0..3 {
            let (sem, overlap) = (m.semaphore("slots", 2).unwrap(), overlap.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..4 {
                    let lease = sem.acquire().await.unwrap();
                    assert!(lease.is_held());
                    overlap.enter(1);
                    // Long enough that a second lease is granted while the first is held,
                    // even on a loaded machine where an acquire takes several round trips.
                    tokio::time::sleep(Duration::from_millis(30 + i as u64)).await;
                    overlap.leave(1);
                    lease.release().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(overlap.entries(), 3 * 3 * 4);
    assert!(
        overlap.max() <= 2,
        "the semaphore admitted {}",
        overlap.max()
    );
    assert_eq!(overlap.max(), 2, "the semaphore admits two at once");
    let path = format!("{}/%SEM/slots", managers[0].namespace());
    assert_eq!(
        env.left_behind(&managers, &format!("{path}/leases")).await,
        Vec::<String>::new()
    );
    assert_eq!(
        env.left_behind(&managers, &format!("{path}/locks")).await,
        Vec::<String>::new()
    );
    let all = managers[1].semaphore("slots", 2).unwrap();
    assert_eq!(
        all.acquire_many(2).await.unwrap().len(),
        2,
        "all free again"
    );
}

/// `acquire_many` is all or none: it takes nothing while not all are free, and two acquirers
/// of overlapping counts never deadlock.
pub(crate) async fn acquire_many_is_all_or_none(backend: Backend) {
    let env = Env::start(backend);
    if matches!(backend, Backend::Postgres | Backend::MySql) {
        return semaphores_are_refused(&env).await;
    }
    let managers = env.processes(2, Queue::Local).await;
    let (a, b) = (&managers[0], &managers[1]);
    let (sa, sb) = (a.semaphore("s", 3).unwrap(), b.semaphore("s", 3).unwrap());
    let leases = format!("{}/%SEM/s/leases", a.namespace());

    let two = sa.acquire_many(2).await.unwrap();
    assert_eq!(two.len(), 2);
    let one = sb
        .try_acquire()
        .await
        .unwrap()
        .expect("a third lease is free");
    assert!(sb.try_acquire().await.unwrap().is_none());
    assert!(matches!(
        sb.acquire_timeout(Duration::from_millis(200)).await,
        Err(Error::Timeout { .. })
    ));
    assert!(matches!(
        sb.acquire_many(4).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        sb.acquire_many(0).await,
        Err(Error::InvalidArgument(_))
    ));
    one.release().await.unwrap();
    // One free, two asked: nothing taken.
    let err = sb
        .acquire_many_timeout(2, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    if env.is_zk() {
        assert_eq!(
            env.left_behind(&managers, &leases).await.len(),
            2,
            "the failed multi-acquire returned what it took"
        );
    }
    let free = sb
        .try_acquire()
        .await
        .unwrap()
        .expect("the failed multi-acquire kept no lease");
    assert!(sb.try_acquire().await.unwrap().is_none());
    drop(free);
    drop(two);
    for m in &managers {
        m.flush().await;
    }
    assert_eq!(sb.acquire_many(3).await.unwrap().len(), 3);
    for m in &managers {
        m.flush().await;
    }

    // Two acquirers of two leases each out of three, and one of one lease: never more than
    // three leases out, and no deadlock between them.
    let overlap = Arc::new(Overlap::default());
    let mut tasks = vec![];
    for (i, n) in [(0, 2u32), (1, 2), (0, 1), (1, 1)] {
        let (sem, overlap) = (managers[i].semaphore("s", 3).unwrap(), overlap.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..8 {
                let leases = sem.acquire_many(n).await.unwrap();
                assert_eq!(leases.len(), n as usize);
                overlap.enter(n as usize);
                tokio::time::sleep(Duration::from_millis(2)).await;
                overlap.leave(n as usize);
                drop(leases);
            }
        }));
    }
    tokio::time::timeout(Duration::from_secs(60), async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await
    .expect("multi-lease acquirers deadlocked");
    assert!(overlap.max() <= 3, "{} leases out of 3", overlap.max());
    assert_eq!(
        env.left_behind(&managers, &leases).await,
        Vec::<String>::new()
    );
    assert_eq!(sa.acquire_many(3).await.unwrap().len(), 3);
}

/// Semaphores do not fit advisory locks: on PostgreSQL every way to take leases is refused
/// with `Error::Unsupported` naming the backend, and the refusal takes nothing (a mutex of
/// the same name is free at once).
pub(crate) async fn semaphores_are_refused(env: &Env) {
    let m = env.process(Queue::Local).await;
    let sem = m.semaphore("slots", 2).unwrap();
    let errors = [
        sem.acquire().await.map(drop).unwrap_err(),
        sem.try_acquire().await.map(drop).unwrap_err(),
        sem.acquire_timeout(Duration::from_millis(100))
            .await
            .map(drop)
            .unwrap_err(),
        sem.acquire_many(2).await.map(drop).unwrap_err(),
        sem.acquire_many_timeout(2, Duration::from_millis(100))
            .await
            .map(drop)
            .unwrap_err(),
    ];
    for err in &errors {
        assert_unsupported(err, env.backend_name());
    }
    let path = format!("{}/%SEM/slots", m.namespace());
    for under in ["leases", "locks"] {
        assert_eq!(
            env.left_behind(std::slice::from_ref(&m), &format!("{path}/{under}"))
                .await,
            Vec::<String>::new()
        );
    }
}

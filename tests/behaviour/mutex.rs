//! The mutex on every backend: exclusion, tokens, timeouts and tries, cancel safety, loss,
//! one name one lock, deadlines at re-entry, mixed settings.

use super::*;

/// Mutual exclusion under contention: several processes with several tasks each, an overlap
/// detector that would catch two holders, and nothing left behind.
pub(crate) async fn mutex_excludes(backend: Backend) {
    let env = Env::start(backend);
    for queue in QUEUES {
        let key = format!("excl_{queue:?}");
        let managers = env.processes(3, queue).await;
        let overlap = Arc::new(Overlap::default());
        let mut tasks = vec![];
        for (i, m) in managers.iter().enumerate() {
            for t in 0..3 {
                let (m, overlap, key) = (m.clone(), overlap.clone(), key.clone());
                tasks.push(tokio::spawn(async move {
                    for n in 0..6 {
                        let guard = m.lock(&key).await.unwrap();
                        overlap.enter(1);
                        if n % 2 == 0 {
                            tokio::task::yield_now().await;
                        } else {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        overlap.leave(1);
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
        assert_eq!(overlap.entries(), 3 * 3 * 6, "{queue:?}");
        assert_eq!(overlap.max(), 1, "two holders at once ({queue:?})");
        let path = managers[0].path_of(&key).unwrap();
        assert_eq!(
            env.left_behind(&managers, &path).await,
            Vec::<String>::new(),
            "contender nodes left behind ({queue:?})"
        );
        assert!(
            managers[1].try_lock(&key).await.unwrap().is_some(),
            "free once everyone is done ({queue:?})"
        );
    }
}

/// Fencing tokens strictly increase across successive holders, local handoffs included, and
/// `current_fencing_token()` inside `with_lock` is the hold's token.
pub(crate) async fn fencing_tokens_increase(backend: Backend) {
    let env = Env::start(backend);
    for queue in QUEUES {
        let key = format!("tokens_{queue:?}");
        let managers = env.processes(2, queue).await;
        let tokens = Arc::new(StdMutex::new(Vec::new()));
        let mut tasks = vec![];
        for m in &managers {
            for t in 0..3 {
                let (m, tokens, key) = (m.clone(), tokens.clone(), key.clone());
                tasks.push(tokio::spawn(async move {
                    for _ in 0..5 {
                        if t == 0 {
                            m.with_lock(&key, async {
                                let token = current_fencing_token().expect("inside with_lock");
                                tokens.lock().unwrap().push(token);
                                tokio::task::yield_now().await;
                            })
                            .await
                            .unwrap();
                        } else {
                            let guard = m.lock(&key).await.unwrap();
                            tokens.lock().unwrap().push(guard.fencing_token());
                            tokio::task::yield_now().await;
                            drop(guard);
                        }
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        let tokens = tokens.lock().unwrap().clone();
        assert_eq!(tokens.len(), 2 * 3 * 5);
        assert_increasing(&tokens);
        if queue == Queue::Local && env.backend == Backend::Memory {
            assert!(
                tokens.iter().any(|t| t.local() > 0),
                "six tasks on one local queue: some grants were local handoffs: {tokens:?}"
            );
        }
        if queue == Queue::Strict {
            assert!(
                tokens.iter().all(|t| t.local() == 0),
                "no local handoffs without the local queue: {tokens:?}"
            );
        }
        // The next holder, after all of them, is above all of them.
        let next = managers[1].lock(&key).await.unwrap();
        assert!(next.fencing_token() > *tokens.last().unwrap());
    }
}

/// `lock_timeout` gives `Error::Timeout` with the key and the wait, leaves nothing behind, and
/// does not hold up the waiters queued behind it; a later lock succeeds at once.
pub(crate) async fn lock_timeout_leaves_nothing(backend: Backend) {
    let env = Env::start(backend);
    for queue in QUEUES {
        let key = format!("timeout_{queue:?}");
        let managers = env.processes(3, queue).await;
        let (a, b, c) = (&managers[0], &managers[1], &managers[2]);
        let path = a.path_of(&key).unwrap();
        let held = a.lock(&key).await.unwrap();

        let started = Instant::now();
        let err = b
            .lock_timeout(&key, Duration::from_millis(300))
            .await
            .unwrap_err();
        let took = started.elapsed();
        match &err {
            Error::Timeout { key: k, waited } => {
                assert_eq!(k, &key);
                assert_eq!(*waited, Duration::from_millis(300));
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(
            took >= Duration::from_millis(290) && took < Duration::from_secs(5),
            "{took:?}"
        );
        let holder_node = held.node_path().rsplit('/').next().unwrap().to_string();
        if env.is_zk() {
            assert_eq!(
                env.left_behind(&managers, &path).await,
                vec![holder_node.clone()],
                "only the holder's node ({queue:?})"
            );
        }

        // A timed-out waiter ahead of another does not hold it up.
        let bounded = env
            .spawn_queued(a, &path, 2, {
                let (b, key) = (b.clone(), key.clone());
                async move { b.lock_timeout(&key, Duration::from_secs(1)).await }
            })
            .await;
        let patient = env
            .spawn_queued(a, &path, 3, {
                let (c, key) = (c.clone(), key.clone());
                async move { c.lock(&key).await.unwrap().release().await.unwrap() }
            })
            .await;
        assert!(matches!(bounded.await.unwrap(), Err(Error::Timeout { .. })));
        held.release().await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), patient)
            .await
            .expect("the waiter behind a timed-out one gets the lock")
            .unwrap();

        assert_eq!(
            env.left_behind(&managers, &path).await,
            Vec::<String>::new()
        );
        let started = Instant::now();
        let again = b.lock_timeout(&key, Duration::from_secs(5)).await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "a free lock is taken at once ({queue:?}): {:?}",
            started.elapsed()
        );
        again.release().await.unwrap();
    }
}

/// `try_lock` is `None` while another holds the key (another process, or another task of the
/// same process) and `Some` once it is free.
pub(crate) async fn try_lock_is_none_while_held(backend: Backend) {
    let env = Env::start(backend);
    for queue in QUEUES {
        let key = format!("try_{queue:?}");
        let managers = env.processes(2, queue).await;
        let (a, b) = (&managers[0], &managers[1]);
        let held = a.lock(&key).await.unwrap();
        assert!(b.try_lock(&key).await.unwrap().is_none(), "{queue:?}");
        assert!(
            a.try_lock(&key).await.unwrap().is_none(),
            "another task of the holder's process, with no frame, gets nothing ({queue:?})"
        );
        held.release().await.unwrap();
        let got = b
            .try_lock(&key)
            .await
            .unwrap()
            .expect("a free lock is taken by a try");
        assert!(got.is_held());
        assert!(a.try_lock(&key).await.unwrap().is_none(), "{queue:?}");
        got.release().await.unwrap();
        let path = a.path_of(&key).unwrap();
        assert_eq!(
            env.left_behind(&managers, &path).await,
            Vec::<String>::new(),
            "tries leave no node ({queue:?})"
        );
        assert!(a.try_lock(&key).await.unwrap().is_some());
    }
}

/// A guard dropped (its release sent in the background) frees the key for its own process at
/// once: a try right after the drop, or a job's next run after a run it skipped, is never
/// refused by the process's own release still under way. Other processes may still meet the
/// old hold for a moment, as they would meet any holder.
pub(crate) async fn a_dropped_guard_frees_the_key_for_its_process(backend: Backend) {
    let env = Env::start(backend);
    for queue in QUEUES {
        let key = format!("dropped_{queue:?}");
        let m = env.process(queue).await;
        for round in 0..20 {
            drop(m.lock(&key).await.unwrap());
            let again = m.try_lock(&key).await.unwrap();
            assert!(
                again.is_some(),
                "round {round}: a try after a drop found the process's own hold ({queue:?})"
            );
        }
        let job = m
            .job(&format!("job_{queue:?}"))
            .unwrap()
            .at_least(Duration::from_secs(3600));
        assert!(job.run(async {}).await.unwrap().ran().is_some());
        for round in 0..20 {
            // A skip inside the window drops the job's hold: the next run still finds the
            // lock free and skips for its window, never for "another instance holds it".
            let skipped = job.clone().required(true).run(async {}).await;
            assert!(
                matches!(skipped, Err(Error::JobSkipped { .. })),
                "round {round}: {skipped:?}"
            );
            assert!(
                m.try_lock(&format!("job_{queue:?}"))
                    .await
                    .unwrap()
                    .is_some(),
                "round {round}: the skipped run's hold was still there ({queue:?})"
            );
        }
    }
}

/// A loop of tries while another task of the process holds the lock gives its thread back now
/// and then, as tokio's own locks do. A try that finds the key busy in this process answers
/// without a request; a loop of them that never gave the thread back would keep the holder
/// (and the manager's own work: its releases, its watches) from running on it, and on a
/// runtime of one thread the holder would never let go.
pub(crate) async fn a_loop_of_tries_gives_the_thread_back(backend: Backend) {
    let env = Env::start(backend);
    for queue in QUEUES {
        let key = format!("spin_{queue:?}");
        let managers = env.processes(1, queue).await;
        let (a, k) = (&managers[0], key.as_str());
        let held = a.lock(k).await.unwrap();
        let got = tries_give_the_thread_back(
            &format!("a held lock ({queue:?})"),
            move || async move { a.try_lock(k).await.unwrap() },
            held.release(),
        )
        .await;
        got.release().await.unwrap();
        let path = a.path_of(k).unwrap();
        assert_eq!(
            env.left_behind(&managers, &path).await,
            Vec::<String>::new(),
            "({queue:?})"
        );
    }
    // The same for a semaphore's tries, where the backend has semaphores (in memory a try
    // answers at once).
    if matches!(backend, Backend::Postgres | Backend::MySql) {
        return;
    }
    let managers = env.processes(1, Queue::Local).await;
    let slots = managers[0].semaphore("spin_slots", 1).unwrap();
    let lease = slots.acquire().await.unwrap();
    let slots = &slots;
    let got = tries_give_the_thread_back(
        "a full semaphore",
        move || async move { slots.try_acquire().await.unwrap() },
        lease.release(),
    )
    .await;
    got.release().await.unwrap();
}

/// Polls a loop of up to 10,000 calls of `try_once` on `what`, held by this task, once: it
/// must give the thread back before the loop ends, with nothing taken. Then `let_go` ends the
/// hold, and the loop must get in: returns what it took.
async fn tries_give_the_thread_back<T, Fut>(
    what: &str,
    mut try_once: impl FnMut() -> Fut,
    let_go: impl Future<Output = Result<(), Error>>,
) -> T
where
    Fut: Future<Output = Option<T>>,
{
    const TRIES: usize = 10_000;
    let mut spin = pin!(async {
        for _ in 0..TRIES {
            if let Some(got) = try_once().await {
                return Some(got);
            }
        }
        None
    });
    // Polled with a fresh budget, as a task is each time the runtime polls it: this test runs
    // on `block_on`'s thread, where a `block_in_place` earlier in the same poll (the test
    // kit's blocking calls) leaves the budget unconstrained until the next poll (tokio's
    // `block_in_place` restores it only on a worker thread). With the budget off, the loop ran
    // its 10,000 tries at once, now and then, under load (an injected `block_in_place` here
    // makes it fail every time); one yield gives the next poll a fresh budget.
    tokio::task::yield_now().await;
    match futures::poll!(spin.as_mut()) {
        Poll::Pending => {}
        Poll::Ready(None) => {
            panic!("{TRIES} tries of {what} ran without giving the thread back once")
        }
        Poll::Ready(Some(_)) => panic!("a try took {what}"),
    }
    let_go.await.unwrap();
    tokio::time::timeout(BOUND, spin)
        .await
        .expect("the loop of tries ends")
        .unwrap_or_else(|| panic!("the loop of tries gets {what} once it is let go"))
}

/// Acquires dropped at random points (waiting behind a holder, while the lock is free, while
/// others contend) leave nothing: the lock is still obtainable at once, no waiter stalls, and
/// on ZooKeeper no node is left.
pub(crate) async fn cancelled_acquires_leave_nothing(backend: Backend) {
    let env = Env::start(backend);
    for queue in QUEUES {
        let key = format!("cancel_{queue:?}");
        let managers = env.processes(2, queue).await;
        let (a, b) = (&managers[0], &managers[1]);
        let path = a.path_of(&key).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);

        // Behind a holder: every cancelled acquire times out, nobody gets the lock.
        let held = a.lock(&key).await.unwrap();
        let mut tasks = vec![];
        for i in 0..60 {
            let m = managers[i % 2].clone();
            let key = key.clone();
            let after = Duration::from_micros(rng.gen_range(0..4000));
            tasks.push(tokio::spawn(async move {
                let got = tokio::time::timeout(after, m.lock(&key)).await;
                assert!(got.is_err(), "the lock is held: nobody may get it");
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        if env.is_zk() {
            let holder = held.node_path().rsplit('/').next().unwrap().to_string();
            assert_eq!(env.left_behind(&managers, &path).await, vec![holder]);
        }
        if env.is_redis() {
            // Only the holder's key (what `left_behind` finds is what the backend wrote).
            assert_eq!(
                env.left_behind(&managers, &path).await,
                vec![held.node_path().to_string()]
            );
        }
        held.release().await.unwrap();
        let started = Instant::now();
        b.lock_timeout(&key, Duration::from_secs(5))
            .await
            .expect("obtainable after the cancelled waiters")
            .release()
            .await
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));

        // Cancelled at random points while others contend; a steady task must never stall.
        let steady = tokio::spawn({
            let (a, key) = (a.clone(), key.clone());
            async move {
                for _ in 0..15 {
                    let g = a
                        .lock_timeout(&key, Duration::from_secs(10))
                        .await
                        .expect("cancelled acquires must not stall the others");
                    tokio::task::yield_now().await;
                    drop(g);
                }
            }
        });
        let mut tasks = vec![];
        for i in 0..4 {
            let (m, key) = (managers[i % 2].clone(), key.clone());
            let seed = rng.gen();
            tasks.push(tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                for _ in 0..30 {
                    let after = Duration::from_micros(rng.gen_range(0..3000));
                    if rng.gen_bool(0.5) {
                        if let Ok(guard) = tokio::time::timeout(after, m.lock(&key)).await {
                            let guard = guard.unwrap();
                            tokio::task::yield_now().await;
                            drop(guard);
                        }
                    } else {
                        let _ = tokio::time::timeout(
                            after,
                            m.with_lock(&key, tokio::task::yield_now()),
                        )
                        .await;
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        steady.await.unwrap();

        assert_eq!(
            env.left_behind(&managers, &path).await,
            Vec::<String>::new(),
            "contender nodes left behind ({queue:?})"
        );
        for m in [a, b] {
            let got = m.try_lock(&key).await.unwrap();
            let got = got.unwrap_or_else(|| panic!("nothing holds or waits any more ({queue:?})"));
            got.release().await.unwrap();
        }
    }
}

/// Loss is reported (`lost()`, `is_held`, `release` says so, `with_lock` aborts its body), a
/// lost hold kept by user code holds up nobody, and the next holder gets a larger token.
pub(crate) async fn loss_is_reported(backend: Backend) {
    let env = Env::start(backend);
    for queue in QUEUES {
        let key = format!("loss_{queue:?}");
        let managers = env.processes(2, queue).await;
        let (a, b) = (&managers[0], &managers[1]);
        let path = a.path_of(&key).unwrap();

        let held = a.lock(&key).await.unwrap();
        let old = held.fencing_token();
        let take_and_release = |m: &LockManager| {
            let (m, key) = (m.clone(), key.clone());
            async move {
                let g = m.lock(&key).await?;
                let token = g.fencing_token();
                g.release().await?;
                Ok::<_, Error>(token)
            }
        };
        // A waiter from another process, and (with the local queue) one queued locally behind
        // the hold in the holder's own process. (Without the local queue, the holder's own
        // waiter on ZooKeeper has a node of the expiring session: it gets an error instead.)
        let other = env.spawn_queued(a, &path, 2, take_and_release(b)).await;
        let own = match queue {
            Queue::Local => Some(env.spawn_queued(a, &path, 2, take_and_release(a)).await),
            Queue::Strict => None,
        };
        assert!(held.is_held());

        env.lose(a, &key).await;
        let reason = tokio::time::timeout(Duration::from_secs(20), held.lost())
            .await
            .expect("lost() fires");
        assert!(env.loss_reason_ok(reason), "{reason:?}");
        assert!(!held.is_held());
        assert_eq!(held.loss_reason(), Some(reason));
        // Re-entering the lost hold in its frame protects nothing: an error, not a re-entry.
        let reentry = tokio::time::timeout(Duration::from_secs(5), held.scope(a.lock(&key)))
            .await
            .expect("refused at once");
        assert!(
            matches!(reentry, Err(Error::LockLost { .. })),
            "{reentry:?}"
        );

        // The lost guard is kept meanwhile: it holds up neither waiter.
        let token = tokio::time::timeout(Duration::from_secs(20), other)
            .await
            .expect("a lost hold kept by user code holds up no other process")
            .unwrap()
            .unwrap();
        assert!(token > old, "{token} after the lost {old}");
        if let Some(own) = own {
            let got = tokio::time::timeout(Duration::from_secs(20), own)
                .await
                .expect("a lost hold kept by user code holds up no local waiter")
                .unwrap();
            match got {
                Ok(token) => assert!(token > old, "{token} after the lost {old}"),
                // On ZooKeeper the local waiter may start its acquire on the expiring session
                // (the loss shows as a disconnection first): it then fails, retryably (told by
                // the session's end, or first by its waiting node's deletion with it).
                Err(Error::SessionExpired | Error::Dequeued { .. }) if env.is_zk() => {}
                Err(err) => panic!("the local waiter failed: {err:?}"),
            }
        }
        let released = held.release().await;
        assert!(
            matches!(released, Err(Error::LockLost { .. })),
            "releasing a lost hold says so: {released:?}"
        );
        let next = tokio::time::timeout(Duration::from_secs(20), a.lock(&key))
            .await
            .expect("the holder's process locks again")
            .unwrap();
        assert!(next.is_held() && next.fencing_token() > old);
        next.release().await.unwrap();

        // `with_lock` drops its body at the loss and returns the error.
        let body_key = format!("loss_body_{queue:?}");
        let result = tokio::time::timeout(
            Duration::from_secs(20),
            b.with_lock(&body_key, async {
                env.lose(b, &body_key).await;
                std::future::pending::<()>().await
            }),
        )
        .await
        .expect("the body is aborted");
        match result {
            Err(Error::LockLost { key, reason }) => {
                assert_eq!(key, body_key);
                assert!(env.loss_reason_ok(reason), "{reason:?}");
            }
            other => panic!("expected LockLost, got {other:?}"),
        }
    }
}

/// One name is one lock, whichever API reaches it: a job of key `k` (with or without a wait,
/// with or without an `at_least` window) and the plain lock of `k` exclude each other, in both
/// directions, across processes; a job's run record beside the lock leaves nothing behind in it.
pub(crate) async fn one_name_is_one_lock(backend: Backend) {
    let env = Env::start(backend);
    let managers = env.processes(2, Queue::Local).await;
    let (a, b) = (&managers[0], &managers[1]);
    let key = "one_name";

    // A plain holder: every kind of job run of the same key skips.
    let held = a.lock(key).await.unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let body = |ran: Arc<AtomicUsize>| async move {
        ran.fetch_add(1, Ordering::SeqCst);
    };
    for job in [
        b.job(key).unwrap(),
        b.job(key).unwrap().at_least(Duration::from_secs(60)),
        b.job(key).unwrap().wait(Duration::from_millis(200)),
    ] {
        assert_eq!(
            job.run(body(ran.clone())).await.unwrap(),
            zklock::Ran::Skipped,
            "a job runs while the plain lock of its key is held"
        );
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    held.release().await.unwrap();

    // A running job: the plain lock of its key waits for it.
    let (started, running) = oneshot::channel();
    let (finish, finished) = oneshot::channel::<()>();
    let job = b.job(key).unwrap().at_least(Duration::from_secs(60));
    let run = tokio::spawn(async move {
        job.run(async move {
            started.send(()).unwrap();
            finished.await.unwrap();
        })
        .await
    });
    running.await.unwrap();
    assert!(
        a.try_lock(key).await.unwrap().is_none(),
        "the plain lock of a running job's key is free"
    );
    assert!(matches!(
        a.lock_timeout(key, Duration::from_millis(200)).await,
        Err(Error::Timeout { .. })
    ));
    finish.send(()).unwrap();
    assert!(matches!(run.await.unwrap().unwrap(), zklock::Ran::Ran(())));
    // The window stays, the lock is free, and nothing is left in the lock.
    assert_eq!(
        a.job(key)
            .unwrap()
            .at_least(Duration::from_secs(60))
            .run(body(ran.clone()))
            .await
            .unwrap(),
        zklock::Ran::Skipped,
        "a run inside the window"
    );
    // (A run gives its lock up as a guard's drop does: in the background.)
    a.lock_timeout(key, Duration::from_secs(10))
        .await
        .expect("the plain lock is free once the job ended")
        .release()
        .await
        .unwrap();
    let path = a.path_of(key).unwrap();
    assert_eq!(
        env.left_behind(&managers, &path).await,
        Vec::<String>::new()
    );
}

/// A re-entrant acquire keeps its deadline where it waits: inside `with_lock(k)`, one `join!`
/// branch re-enters `k` and stays inside until the other branch's acquires have answered;
/// those acquires (`lock_timeout`, a job's `wait`, `lock_all` with a timeout) wait at the
/// frame's gate behind it and must give up at their deadline, not when the first branch
/// leaves (before: they waited for it, and answered `Ok` long past their deadline).
pub(crate) async fn reentry_keeps_its_deadline(backend: Backend) {
    let env = Env::start(backend);
    let m = env.process(Queue::Local).await;
    let key = "reentry_deadline";
    let short = Duration::from_millis(100);
    let outcome = m
        .with_lock(key, async {
            let (answered, all_answered) = oneshot::channel::<()>();
            let inside = async {
                let again = m.lock(key).await.unwrap();
                // Stays inside until the other branch has its answers (bounded, so that a
                // wait past the deadline shows as a wrong answer, not a hang).
                let _ = tokio::time::timeout(Duration::from_secs(10), all_answered).await;
                drop(again);
            };
            let behind = async {
                tokio::task::yield_now().await;
                let plain = m.lock_timeout(key, short).await.map(drop);
                let job = m.job(key).unwrap().wait(short).run(async {}).await.unwrap();
                let all = m
                    .lock_all([zklock::LockSpec::mutex(key)], Some(short))
                    .await
                    .map(drop);
                answered.send(()).unwrap();
                (plain, job, all)
            };
            tokio::join!(inside, behind).1
        })
        .await
        .unwrap();
    let (plain, job, all) = outcome;
    assert!(
        matches!(plain, Err(Error::Timeout { .. })),
        "lock_timeout waited past its deadline: {plain:?}"
    );
    assert_eq!(
        job,
        zklock::Ran::Skipped,
        "a job's wait outlived its deadline"
    );
    assert!(
        matches!(all, Err(Error::Timeout { .. })),
        "lock_all waited past its deadline: {all:?}"
    );
}

/// Managers whose settings differ (leases or session timeouts, linger, local queue, local
/// handoffs, fencing tokens on or off) lock the same keys: the history checker finds no two
/// believed holders (a hold counts from its grant to its release or its reported loss) and the
/// tokens of the holds that have one strictly increasing in grant order, every task gets its
/// turns, and nothing is left behind.
pub(crate) async fn mixed_settings_keep_every_promise(backend: Backend) {
    use zklock_testkit::{History, Mode};
    let env = Env::start(backend);
    // In memory the "processes" are clones of one manager, whose settings are one.
    let env_tokens_differ = backend != Backend::Memory;
    let mut managers = vec![];
    for i in 0..4 {
        managers.push(env.mixed_process(i).await);
    }
    let history = History::new();
    let keys = ["mixed_a", "mixed_b"];
    let mut tasks = vec![];
    for (i, m) in managers.iter().enumerate() {
        for t in 0..3 {
            let (m, rec) = (m.clone(), history.recorder(&format!("p{i}t{t}")));
            tasks.push(tokio::spawn(async move {
                for round in 0..12 {
                    let key = keys[(round + t) % keys.len()];
                    rec.acquire_invoked(key, Mode::Exclusive);
                    let guard = match m.lock_timeout(key, Duration::from_secs(30)).await {
                        Ok(guard) => guard,
                        Err(e) => {
                            rec.acquire_failed(key, Mode::Exclusive, &e);
                            panic!("{key}: {e}");
                        }
                    };
                    // A process without tokens (the fourth) holds with none: its holds must
                    // exclude the others' all the same, and leave their tokens increasing.
                    let token = guard.fencing_token();
                    assert_eq!(
                        token.is_none(),
                        i == 3 && env_tokens_differ,
                        "{key}: {token}"
                    );
                    let token = if token.is_none() {
                        zklock_testkit::NO_TOKEN
                    } else {
                        token.as_u128()
                    };
                    rec.acquire_ok(key, Mode::Exclusive, token);
                    tokio::select! {
                        biased;
                        reason = guard.lost() => rec.lost(key, reason),
                        _ = tokio::time::sleep(Duration::from_millis(round as u64 % 3)) => {}
                    }
                    rec.release_invoked(key);
                    match guard.release().await {
                        Ok(()) => rec.release_ok(key),
                        Err(e) => rec.release_failed(key, e),
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let report = history.check();
    assert!(report.is_ok(), "{}", report.summary());
    for key in keys {
        let path = managers[0].path_of(key).unwrap();
        assert_eq!(
            env.left_behind(&managers, &path).await,
            Vec::<String>::new(),
            "{key}"
        );
    }
}

//! One behaviour suite, run against every backend.
//!
//! Each behaviour is written once, as an async fn of the backend it runs on, against managers
//! made by an [`Env`]; the `every_backend!` macro instantiates it for ZooKeeper (a real server
//! from the test kit, one session per "process"), for Redis (a real `redis-server` from the
//! test kit, one manager with its own connections per "process"), for PostgreSQL (a real
//! PostgreSQL from the test kit, one manager with its own connections per "process") and for
//! the in-memory backend (clones of one in-memory manager, which share its lock table), so the
//! tests read `mutex_excludes::zookeeper`, `mutex_excludes::redis`,
//! `mutex_excludes::postgres` and `mutex_excludes::memory`.
//! Behaviours that need distinct contenders at the backend run their scenario twice: with the
//! local queue (tasks of a process queue behind one hold) and without it
//! (`local_queue(false)`: every acquire is a contender of its own).
//!
//! What a backend leaves out on purpose (inspection and revocation off ZooKeeper, the
//! ZooKeeper client, `lose` off memory, semaphores on PostgreSQL) is checked to fail with
//! `Error::Unsupported` naming the backend. Where "a hold is lost" comes from differs: the
//! session expired on ZooKeeper, the lock's key deleted behind the holder's back on Redis (as a
//! failover to a replica that never got it would), the holding session ended by the server on
//! PostgreSQL (`pg_terminate_backend`), `lose` in memory.

mod common;

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use common::*;
use rand::{Rng, SeedableRng};
use tokio::sync::{oneshot, Barrier};
use tokio::task::JoinHandle;
use tokio_postgres::NoTls;
use zklock::{
    current_fencing_token, distributed_lock, Deadlock, Error, FencingToken, LockManager, LossReason,
};
use zklock_testkit::{PostgresServer, RedisServer};

/// How long one behaviour may take on any backend before it counts as a hang.
const BOUND: Duration = Duration::from_secs(120);

/// Instantiates each behaviour for every backend: `name::zookeeper`, `name::redis`,
/// `name::postgres` and `name::memory`.
macro_rules! every_backend {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn zookeeper() {
                tokio::time::timeout(BOUND, super::$name(Backend::Zookeeper))
                    .await
                    .expect(concat!(stringify!($name), " hung on ZooKeeper"));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                tokio::time::timeout(BOUND, super::$name(Backend::Redis))
                    .await
                    .expect(concat!(stringify!($name), " hung on Redis"));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                tokio::time::timeout(BOUND, super::$name(Backend::Postgres))
                    .await
                    .expect(concat!(stringify!($name), " hung on PostgreSQL"));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                tokio::time::timeout(BOUND, super::$name(Backend::Memory))
                    .await
                    .expect(concat!(stringify!($name), " hung in memory"));
            }
        }
    )*};
}

every_backend!(
    mutex_excludes,
    fencing_tokens_increase,
    lock_timeout_leaves_nothing,
    try_lock_is_none_while_held,
    cancelled_acquires_leave_nothing,
    with_lock_frames_reenter,
    readers_share_writers_exclude,
    write_inside_read_would_deadlock,
    downgrade_keeps_queued_writer_out,
    semaphore_admits_at_most_n,
    acquire_many_is_all_or_none,
    loss_is_reported,
    attribute_locks_on_either_manager,
    one_name_is_one_lock,
    reentry_keeps_its_deadline,
    mixed_settings_keep_every_promise,
    backend_specific_features,
);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Zookeeper,
    Redis,
    Postgres,
    Memory,
}

/// The lease of the Redis managers: long enough that a busy 2-core machine never misses a
/// renewal (every lease/3), short enough that a lost hold shows within a second.
const REDIS_LEASE: Duration = Duration::from_secs(3);

/// The lease of the PostgreSQL managers (their sessions' `idle_session_timeout`), for the same
/// reasons.
const PG_LEASE: Duration = Duration::from_secs(3);

/// The classes (first keys) of zklock's advisory locks, as `pg_locks.classid` shows them: the
/// lock itself (`zkLK`) and a waiting writer's intent (`zkIN`).
const PG_LOCK_CLASS: i64 = 0x7A6B_4C4B;
const PG_INTENT_CLASS: i64 = 0x7A6B_494E;

/// Whether tasks of one process queue behind one backend hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queue {
    /// The default: tasks of a process queue locally behind one hold per key.
    Local,
    /// `local_queue(false)`: every acquire contends at the backend with a hold of its own.
    Strict,
}

const QUEUES: [Queue; 2] = [Queue::Local, Queue::Strict];

/// Where a behaviour runs, and how it makes the managers of its "processes".
struct Env {
    backend: Backend,
    zk: Option<ZkServer>,
    redis: Option<RedisServer>,
    pg: Option<PostgresServer>,
    /// Memory: one manager per queue mode; its clones share its lock table.
    local: Option<LockManager>,
    strict: Option<LockManager>,
}

impl Env {
    fn start(backend: Backend) -> Env {
        match backend {
            Backend::Zookeeper => Env {
                backend,
                zk: Some(server()),
                redis: None,
                pg: None,
                local: None,
                strict: None,
            },
            Backend::Redis => Env {
                backend,
                zk: None,
                redis: Some(RedisServer::start().expect("start redis-server (test kit)")),
                pg: None,
                local: None,
                strict: None,
            },
            Backend::Postgres => Env {
                backend,
                zk: None,
                redis: None,
                pg: Some(PostgresServer::start().expect("start postgres (test kit)")),
                local: None,
                strict: None,
            },
            Backend::Memory => Env {
                backend,
                zk: None,
                redis: None,
                pg: None,
                local: Some(LockManager::in_memory()),
                strict: Some(LockManager::in_memory_with(
                    LockManager::builder("memory").local_queue(false),
                )),
            },
        }
    }

    fn is_zk(&self) -> bool {
        self.backend == Backend::Zookeeper
    }

    fn connect(&self) -> String {
        self.zk.as_ref().expect("a ZooKeeper env").connect_string()
    }

    fn redis_url(&self) -> String {
        self.redis.as_ref().expect("a Redis env").url()
    }

    /// A plain Redis connection, to look at and tamper with the backend's keys.
    async fn redis_conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.redis_url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the test Redis")
    }

    fn pg_url(&self) -> String {
        self.pg.as_ref().expect("a PostgreSQL env").url()
    }

    /// A plain PostgreSQL client, to look at the server's locks and end sessions.
    async fn pg_client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.pg_url(), NoTls)
            .await
            .expect("connect to the test PostgreSQL");
        tokio::spawn(connection);
        client
    }

    /// zklock's granted advisory locks (the lock and a writer's intent) of the lock at `path`
    /// on PostgreSQL: `(class, mode, pid)`; none while the path has no id yet.
    async fn pg_locks(
        &self,
        client: &tokio_postgres::Client,
        path: &str,
    ) -> Vec<(i64, String, i32)> {
        client
            .query(
                "SELECT l.classid::bigint, l.mode, l.pid FROM pg_locks l \
                 JOIN zklock_keys k ON l.objid::bigint = k.id \
                 WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted \
                 AND l.classid::bigint IN ($1, $2) AND k.path = $3",
                &[&PG_LOCK_CLASS, &PG_INTENT_CLASS, &path],
            )
            .await
            .expect("query pg_locks")
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    /// The manager of one more process: a session of its own on ZooKeeper, a manager with
    /// connections of its own on Redis and PostgreSQL, a clone of the shared in-memory manager (of that queue
    /// mode) in memory.
    async fn process(&self, queue: Queue) -> LockManager {
        match self.backend {
            Backend::Redis => LockManager::builder(self.redis_url())
                .lease(REDIS_LEASE)
                .local_queue(queue == Queue::Local)
                .connect()
                .await
                .expect("connect to the test Redis"),
            Backend::Postgres => LockManager::builder(self.pg_url())
                .lease(PG_LEASE)
                .local_queue(queue == Queue::Local)
                .connect()
                .await
                .expect("connect to the test PostgreSQL"),
            Backend::Zookeeper => LockManager::builder(self.connect())
                .session_timeout(Duration::from_secs(4))
                .local_queue(queue == Queue::Local)
                .connect()
                .await
                .expect("connect to the test server"),
            Backend::Memory => match queue {
                Queue::Local => self.local.clone().unwrap(),
                Queue::Strict => self.strict.clone().unwrap(),
            },
        }
    }

    /// The manager of one more process with settings of its own, the `i`-th of a mixed fleet:
    /// leases, session timeouts, the linger, the local queue and its handoff bound differ from
    /// one process to the next (as in a rolling deploy, or services tuned apart that lock the
    /// same keys). Memory: a manager with settings of its own would have a lock table of its
    /// own, which no other manager sees, so the in-memory fleet shares one manager's.
    async fn mixed_process(&self, i: usize) -> LockManager {
        // (lease or session timeout, linger, local queue, local handoffs)
        const MIX: [(u64, u64, bool, u32); 3] = [
            (3_000, 0, true, 32),
            (1_000, 300, false, 32),
            (10_000, 50, true, 2),
        ];
        let (lease_ms, linger_ms, local, handoffs) = MIX[i % MIX.len()];
        let configure = |b: zklock::Builder| {
            b.local_queue(local)
                .linger(Duration::from_millis(linger_ms))
                .max_local_handoffs(handoffs)
        };
        let lease = Duration::from_millis(lease_ms);
        match self.backend {
            Backend::Redis => configure(LockManager::builder(self.redis_url()).lease(lease))
                .connect()
                .await
                .expect("connect to the test Redis"),
            Backend::Postgres => configure(LockManager::builder(self.pg_url()).lease(lease))
                .connect()
                .await
                .expect("connect to the test PostgreSQL"),
            Backend::Zookeeper => configure(
                LockManager::builder(self.connect())
                    .session_timeout(lease.max(Duration::from_secs(4))),
            )
            .connect()
            .await
            .expect("connect to the test server"),
            // One lock table is one in-memory "server": its clones, whose settings are one.
            Backend::Memory => self.process(Queue::Local).await,
        }
    }

    async fn processes(&self, n: usize, queue: Queue) -> Vec<LockManager> {
        let mut out = vec![];
        for _ in 0..n {
            out.push(self.process(queue).await);
        }
        out
    }

    /// After every background release of `managers`: the contender nodes left under `path` on
    /// ZooKeeper; on Redis, the holder keys (exclusive key, shared set, writer's intent) of
    /// the lock at `path` that still exist (a semaphore's `.../leases` and `.../locks` are one
    /// lock there; the fencing counter stays by design); on PostgreSQL, the advisory locks (the
    /// lock, a writer's intent) of the path's id that a session still holds (the key table's
    /// row stays by design). Memory has nothing to list (the
    /// behaviours check it with a try that must succeed at once).
    async fn left_behind(&self, managers: &[LockManager], path: &str) -> Vec<String> {
        for m in managers {
            m.flush().await;
        }
        match self.backend {
            Backend::Zookeeper => children(&managers[0], path).await,
            Backend::Redis => {
                let lock = path
                    .strip_suffix("/leases")
                    .or_else(|| path.strip_suffix("/locks"))
                    .unwrap_or(path);
                let mut conn = self.redis_conn().await;
                let mut left = vec![];
                for kind in ["lock", "shared", "intent"] {
                    let name = format!("zklock:{kind}:{lock}");
                    let exists: bool = redis::cmd("EXISTS")
                        .arg(&name)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    if exists {
                        left.push(name);
                    }
                }
                left
            }
            Backend::Postgres => {
                let client = self.pg_client().await;
                self.pg_locks(&client, path)
                    .await
                    .into_iter()
                    .map(|(class, mode, pid)| {
                        format!("advisory lock ({class},id of {path}) {mode} by pid {pid}")
                    })
                    .collect()
            }
            Backend::Memory => vec![],
        }
    }

    /// Makes `m`'s holds of `key` lost: `lose` in memory, the session expired on ZooKeeper,
    /// the lock's key deleted on Redis (the holder's next renewal, within lease/3, finds it
    /// gone), the holding session ended by the server on PostgreSQL (`pg_terminate_backend`:
    /// every hold on that connection is lost with it).
    async fn lose(&self, m: &LockManager, key: &str) {
        match self.backend {
            Backend::Memory => m.lose(key, LossReason::SessionExpired).unwrap(),
            Backend::Zookeeper => expire_session(m, &self.connect()).await,
            Backend::Redis => {
                let name = format!("zklock:lock:{}", m.path_of(key).unwrap());
                let deleted: i64 = redis::cmd("DEL")
                    .arg(&name)
                    .query_async(&mut self.redis_conn().await)
                    .await
                    .unwrap();
                assert_eq!(deleted, 1, "{name} was not held");
            }
            Backend::Postgres => {
                let path = m.path_of(key).unwrap();
                let client = self.pg_client().await;
                let locks = self.pg_locks(&client, &path).await;
                let [(_, _, pid)] = locks.as_slice() else {
                    panic!("{path} is not held by one session: {locks:?}")
                };
                let terminated: bool = client
                    .query_one("SELECT pg_terminate_backend($1)", &[pid])
                    .await
                    .unwrap()
                    .get(0);
                assert!(
                    terminated,
                    "the holding session {pid} of {path} was not ended"
                );
            }
        }
    }

    /// On Redis and PostgreSQL, waits (bounded) until a writer waits for the read/write lock at
    /// `path`: its intent (a key on Redis, an advisory lock of the intent class on PostgreSQL),
    /// or on PostgreSQL its request in the server's queue, which keeps new readers out, exists. Elsewhere a queued writer is visible from its first
    /// poll (memory) or its node (ZooKeeper) already.
    async fn until_writer_waits(&self, path: &str) {
        let name = match self.backend {
            Backend::Redis => format!("zklock:intent:{path}"),
            Backend::Postgres => format!("the intent lock of {path}"),
            Backend::Zookeeper | Backend::Memory => return,
        };
        let mut conn = match self.backend {
            Backend::Redis => Some(self.redis_conn().await),
            _ => None,
        };
        let client = match self.backend {
            Backend::Postgres => Some(self.pg_client().await),
            _ => None,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let exists = match (&mut conn, &client) {
                (Some(conn), _) => redis::cmd("EXISTS")
                    .arg(&name)
                    .query_async::<bool>(conn)
                    .await
                    .unwrap(),
                (None, Some(client)) => {
                    // A writer retrying holds its intent; one waiting in the server's queue
                    // has its exclusive request queued there.
                    self.pg_locks(client, path)
                        .await
                        .iter()
                        .any(|(class, _, _)| *class == PG_INTENT_CLASS)
                        || client
                            .query_one(
                                "SELECT EXISTS (SELECT 1 FROM pg_locks l \
                                 JOIN zklock_keys k ON l.objid::bigint = k.id \
                                 WHERE l.locktype = 'advisory' AND l.objsubid = 2 \
                                 AND NOT l.granted AND l.mode = 'ExclusiveLock' \
                                 AND l.classid::bigint = $1 AND k.path = $2)",
                                &[&PG_LOCK_CLASS, &path],
                            )
                            .await
                            .expect("query pg_locks")
                            .get::<_, bool>(0)
                }
                (None, None) => unreachable!("a Redis or PostgreSQL env"),
            };
            if exists {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no writer's intent at {name}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The reasons a loss made by [`lose`](Self::lose) may be reported with.
    fn loss_reason_ok(&self, reason: LossReason) -> bool {
        match self.backend {
            Backend::Memory => reason == LossReason::SessionExpired,
            Backend::Redis => matches!(
                reason,
                LossReason::NodeDeleted | LossReason::LeaseExpired | LossReason::Disconnected
            ),
            Backend::Postgres => {
                matches!(reason, LossReason::Disconnected | LossReason::LeaseExpired)
            }
            Backend::Zookeeper => matches!(
                reason,
                LossReason::SessionExpired | LossReason::Disconnected | LossReason::NodeDeleted
            ),
        }
    }

    /// Spawns the acquire `fut` and returns once it waits: its first poll queues it on every
    /// backend (in memory the queue entry is made in that poll, on Redis its first attempt is
    /// sent in it, on PostgreSQL its key lookup or first attempt); on ZooKeeper, also once
    /// `path` (as `observer` lists it) has `nodes` contender nodes.
    async fn spawn_queued<F>(
        &self,
        observer: &LockManager,
        path: &str,
        nodes: usize,
        fut: F,
    ) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (polled, first_poll) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut fut = pin!(fut);
            let first = futures::poll!(fut.as_mut());
            let _ = polled.send(());
            match first {
                Poll::Ready(out) => out,
                Poll::Pending => fut.await,
            }
        });
        first_poll.await.expect("the spawned acquire was polled");
        if self.is_zk() {
            until_children(observer, path, nodes).await;
        }
        task
    }
}

/// Counts the holders inside a critical section and remembers the most seen at once.
#[derive(Default)]
struct Overlap {
    inside: AtomicUsize,
    max: AtomicUsize,
    entries: AtomicUsize,
}

impl Overlap {
    fn enter(&self, units: usize) {
        let now = self.inside.fetch_add(units, Ordering::SeqCst) + units;
        self.max.fetch_max(now, Ordering::SeqCst);
        self.entries.fetch_add(1, Ordering::SeqCst);
    }

    fn leave(&self, units: usize) {
        self.inside.fetch_sub(units, Ordering::SeqCst);
    }

    async fn critical_section(&self) {
        self.enter(1);
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.leave(1);
    }

    fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }

    fn entries(&self) -> usize {
        self.entries.load(Ordering::SeqCst)
    }
}

fn assert_increasing(tokens: &[FencingToken]) {
    for w in tokens.windows(2) {
        assert!(
            w[0] < w[1],
            "the token did not increase: {} then {}",
            w[0],
            w[1]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Mutex

/// Mutual exclusion under contention: several processes with several tasks each, an overlap
/// detector that would catch two holders, and nothing left behind.
async fn mutex_excludes(backend: Backend) {
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
async fn fencing_tokens_increase(backend: Backend) {
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
async fn lock_timeout_leaves_nothing(backend: Backend) {
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
async fn try_lock_is_none_while_held(backend: Backend) {
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

/// Acquires dropped at random points (waiting behind a holder, while the lock is free, while
/// others contend) leave nothing: the lock is still obtainable at once, no waiter stalls, and
/// on ZooKeeper no node is left.
async fn cancelled_acquires_leave_nothing(backend: Backend) {
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

// ---------------------------------------------------------------------------------------------
// Reentrancy

/// Nested `with_lock` on the same key re-enters (no deadlock, the same token, one node), a
/// guard's `reenter` and `scope` count holds, and concurrent branches of one frame are
/// serialized.
async fn with_lock_frames_reenter(backend: Backend) {
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

// ---------------------------------------------------------------------------------------------
// Read/write locks

/// Readers of different processes share; a writer excludes readers and writers.
async fn readers_share_writers_exclude(backend: Backend) {
    let env = Env::start(backend);
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
async fn write_inside_read_would_deadlock(backend: Backend) {
    let env = Env::start(backend);
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
async fn downgrade_keeps_queued_writer_out(backend: Backend) {
    let env = Env::start(backend);
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

// ---------------------------------------------------------------------------------------------
// Semaphores

/// A semaphore of N admits at most N at once, across processes, and nothing is left.
async fn semaphore_admits_at_most_n(backend: Backend) {
    let env = Env::start(backend);
    if backend == Backend::Postgres {
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
async fn acquire_many_is_all_or_none(backend: Backend) {
    let env = Env::start(backend);
    if backend == Backend::Postgres {
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

/// `err` is `Error::Unsupported` naming `backend`, in the variant and in the message.
fn assert_unsupported(err: &Error, backend: &str) {
    assert!(
        matches!(err, Error::Unsupported { backend: b, .. } if *b == backend),
        "{err:?}"
    );
    assert!(err.to_string().contains(backend), "{err}");
}

/// Semaphores do not fit advisory locks: on PostgreSQL every way to take leases is refused
/// with `Error::Unsupported` naming the backend, and the refusal takes nothing (a mutex of
/// the same name is free at once).
async fn semaphores_are_refused(env: &Env) {
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
        assert_unsupported(err, "postgres");
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

// ---------------------------------------------------------------------------------------------
// Loss

/// Loss is reported (`lost()`, `is_held`, `release` says so, `with_lock` aborts its body), a
/// lost hold kept by user code holds up nobody, and the next holder gets a larger token.
async fn loss_is_reported(backend: Backend) {
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

// ---------------------------------------------------------------------------------------------
// The attribute

#[distributed_lock("sku_{sku}", manager = m)]
async fn sell(m: &LockManager, sku: u32, overlap: &Overlap) -> Result<FencingToken, Error> {
    overlap.critical_section().await;
    Ok(current_fencing_token().expect("inside the annotated body"))
}

#[distributed_lock("account_{id}", manager = m)]
async fn outer(m: &LockManager, id: u64) -> Result<(FencingToken, FencingToken), Error> {
    let token = current_fencing_token().unwrap();
    let inner = inner(m, id).await?;
    Ok((token, inner))
}

#[distributed_lock("account_{id}", manager = m)]
async fn inner(m: &LockManager, id: u64) -> Result<FencingToken, Error> {
    Ok(current_fencing_token().unwrap())
}

#[distributed_lock("report_{id}", manager = m, timeout = "300ms")]
async fn bounded(m: &LockManager, id: u32) -> Result<u32, Error> {
    Ok(id)
}

#[distributed_lock("catalog_{id}", manager = m, mode = "read")]
async fn read_catalog(m: &LockManager, id: u32, all_in: &Barrier) -> Result<(), Error> {
    all_in.wait().await;
    Ok(())
}

#[distributed_lock("catalog_{id}", manager = m, mode = "write")]
async fn write_catalog(m: &LockManager, id: u32) -> Result<(), Error> {
    Ok(())
}

#[distributed_lock("catalog_{id}", manager = m, mode = "read")]
async fn read_then_write(m: &LockManager, id: u32) -> Result<(), Error> {
    write_catalog(m, id).await
}

#[distributed_lock("job_{id}", manager = m)]
async fn loses_its_hold(m: &LockManager, env: &Env, id: u32) -> Result<u32, Error> {
    env.lose(m, &format!("job_{id}")).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok(id)
}

#[distributed_lock("job_{id}", manager = m, on_lost = "continue")]
async fn carries_on(m: &LockManager, env: &Env, id: u32) -> Result<u32, Error> {
    env.lose(m, &format!("job_{id}")).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(id)
}

struct Shop {
    locks: LockManager,
    overlap: Overlap,
}

impl Shop {
    #[distributed_lock("sku_{sku}", manager = self.locks)]
    async fn take(&self, sku: u32) -> Result<u32, Error> {
        self.overlap.critical_section().await;
        Ok(sku)
    }
}

/// `#[distributed_lock(..., manager = ...)]` locks for real on either backend: exclusion across
/// processes, the key from the arguments, re-entry, modes, timeout and loss.
async fn attribute_locks_on_either_manager(backend: Backend) {
    let env = Env::start(backend);
    let managers = env.processes(3, Queue::Local).await;

    // Exclusion, free fns and methods on one key, tokens increasing per holder.
    let overlap = Arc::new(Overlap::default());
    let shop = Arc::new(Shop {
        locks: managers[2].clone(),
        overlap: Overlap::default(),
    });
    let mut tasks = vec![];
    for m in &managers[..2] {
        for _ in 0..2 {
            let (m, overlap) = (m.clone(), overlap.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..4 {
                    sell(&m, 7, &overlap).await.unwrap();
                }
            }));
        }
    }
    let shopper = tokio::spawn({
        let shop = shop.clone();
        async move {
            for _ in 0..4 {
                assert_eq!(shop.take(8).await.unwrap(), 8);
            }
        }
    });
    for t in tasks {
        t.await.unwrap();
    }
    shopper.await.unwrap();
    assert_eq!(overlap.entries(), 2 * 2 * 4);
    assert_eq!(overlap.max(), 1, "two annotated calls were inside at once");
    assert_eq!(shop.overlap.entries(), 4);
    // The template is filled with the arguments: `sku_7` is the key the calls locked.
    let held = managers[0].lock("sku_7").await.unwrap();
    let err =
        tokio::time::timeout(Duration::from_millis(300), sell(&managers[1], 7, &overlap)).await;
    assert!(err.is_err(), "the annotated call waits for `sku_7`");
    assert!(
        tokio::time::timeout(Duration::from_secs(10), sell(&managers[1], 9, &overlap))
            .await
            .expect("another sku is another key")
            .is_ok()
    );
    drop(held);

    // Nested annotated calls on one key re-enter.
    let (o, i) = tokio::time::timeout(Duration::from_secs(10), outer(&managers[0], 1))
        .await
        .expect("the nested call re-enters instead of waiting for itself")
        .unwrap();
    assert_eq!(o, i);
    let next = managers[1].lock("account_1").await.unwrap();
    assert!(next.fencing_token() > o);
    drop(next);

    // A bounded wait times out and leaves nothing.
    let held = managers[1].lock("report_3").await.unwrap();
    let err = bounded(&managers[0], 3).await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    held.release().await.unwrap();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), bounded(&managers[0], 3))
            .await
            .expect("free at once after the timeout")
            .unwrap(),
        3
    );

    // Read mode shares, write inside read is refused.
    let all_in = Barrier::new(2);
    let (x, y) = tokio::time::timeout(Duration::from_secs(15), async {
        tokio::join!(
            read_catalog(&managers[0], 1, &all_in),
            read_catalog(&managers[1], 1, &all_in)
        )
    })
    .await
    .expect("annotated readers share");
    x.unwrap();
    y.unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(5), read_then_write(&managers[0], 1))
        .await
        .expect("refused at once");
    assert!(
        matches!(refused, Err(Error::WouldDeadlock { .. })),
        "{refused:?}"
    );
    write_catalog(&managers[1], 1).await.unwrap();

    // A lost hold aborts the body by default, or lets it finish with `on_lost = "continue"`.
    let lost = tokio::time::timeout(
        Duration::from_secs(20),
        loses_its_hold(&managers[0], &env, 1),
    )
    .await
    .expect("the body is aborted well before its sleep ends");
    match lost {
        Err(Error::LockLost { key, reason }) => {
            assert_eq!(key, "job_1");
            assert!(env.loss_reason_ok(reason), "{reason:?}");
        }
        other => panic!("expected LockLost, got {other:?}"),
    }
    let kept = tokio::time::timeout(Duration::from_secs(20), carries_on(&managers[1], &env, 2))
        .await
        .expect("the body finishes");
    assert_eq!(kept.unwrap(), 2);
}

// ---------------------------------------------------------------------------------------------
// What differs on purpose

/// One name is one lock, whichever API reaches it: a job of key `k` (with or without a wait,
/// with or without an `at_least` window) and the plain lock of `k` exclude each other, in both
/// directions, across processes; a job's run record beside the lock leaves nothing behind in it.
async fn one_name_is_one_lock(backend: Backend) {
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
async fn reentry_keeps_its_deadline(backend: Backend) {
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
/// handoffs) lock the same keys: the history checker finds no two believed holders (a hold
/// counts from its grant to its release or its reported loss) and tokens strictly increasing
/// in grant order, every task gets its turns, and nothing is left behind.
async fn mixed_settings_keep_every_promise(backend: Backend) {
    use zklock_testkit::{History, Mode};
    let env = Env::start(backend);
    let mut managers = vec![];
    for i in 0..3 {
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
                    rec.acquire_ok(key, Mode::Exclusive, guard.fencing_token().as_u128());
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

/// ZooKeeper-only features fail in memory, on Redis and on PostgreSQL with
/// `Error::Unsupported` naming the backend (and `zk_client()` panics); the memory-only `lose`
/// fails on ZooKeeper, Redis and PostgreSQL the same way, and so does revocation on PostgreSQL.
async fn backend_specific_features(backend: Backend) {
    let env = Env::start(backend);
    let m = env.process(Queue::Local).await;
    let debug = format!("{m:?}");
    match backend {
        Backend::Redis => {
            assert!(debug.contains("redis"), "{debug}");
            let errors = [
                m.inspect("k").await.unwrap_err(),
                m.inspect_path("/some/lock").await.unwrap_err(),
                m.list("k").await.unwrap_err(),
                m.revoke("k").await.unwrap_err(),
                m.revoke_path("/some/lock").await.unwrap_err(),
                m.lose("k", LossReason::SessionExpired).unwrap_err(),
            ];
            for err in errors {
                assert!(
                    matches!(
                        err,
                        Error::Unsupported {
                            backend: "redis",
                            ..
                        }
                    ),
                    "{err:?}"
                );
                assert!(err.to_string().contains("redis"), "{err}");
            }
            let client = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.zk_client()));
            assert!(client.is_err(), "zk_client() panics on Redis");
            assert_eq!(m.negotiated_session_timeout(), Duration::ZERO);

            // What Redis has instead: the hold is a key that names its holder, and the token
            // is the lock's fence counter.
            let held = m.lock("k").await.unwrap();
            let path = m.path_of("k").unwrap();
            assert_eq!(held.node_path(), format!("zklock:lock:{path}"));
            let mut conn = env.redis_conn().await;
            let holder: String = redis::cmd("GET")
                .arg(held.node_path())
                .query_async(&mut conn)
                .await
                .unwrap();
            assert!(holder.contains(" pid="), "{holder}");
            let fence: i64 = redis::cmd("GET")
                .arg(format!("zklock:fence:{path}"))
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(held.fencing_token().zxid(), fence);
            held.release().await.unwrap();
            assert_eq!(
                env.left_behind(std::slice::from_ref(&m), &path).await,
                Vec::<String>::new()
            );
        }
        Backend::Postgres => {
            assert!(debug.contains("postgres"), "{debug}");
            let errors = [
                m.inspect("k").await.unwrap_err(),
                m.inspect_path("/some/lock").await.unwrap_err(),
                m.list("k").await.unwrap_err(),
                m.revoke("k").await.unwrap_err(),
                m.revoke_path("/some/lock").await.unwrap_err(),
                m.lose("k", LossReason::SessionExpired).unwrap_err(),
                LockManager::builder(env.pg_url())
                    .revocable(true)
                    .connect()
                    .await
                    .unwrap_err(),
            ];
            for err in &errors {
                assert_unsupported(err, "postgres");
            }
            let client = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.zk_client()));
            assert!(client.is_err(), "zk_client() panics on PostgreSQL");
            assert_eq!(m.negotiated_session_timeout(), Duration::ZERO);

            // What PostgreSQL has instead: the hold is an advisory lock on a session that names
            // its process, and the token is the key row's fence, which each grant raises.
            let held = m.lock("k").await.unwrap();
            let path = m.path_of("k").unwrap();
            let look = env.pg_client().await;
            let row = look
                .query_one(
                    "SELECT id::bigint, fence FROM zklock_keys WHERE path = $1",
                    &[&path],
                )
                .await
                .unwrap();
            let (id, fence): (i64, i64) = (row.get(0), row.get(1));
            assert_eq!(
                held.node_path(),
                format!("{path} (advisory lock {PG_LOCK_CLASS},{id})")
            );
            assert_eq!(held.fencing_token().zxid(), fence);
            let locks = env.pg_locks(&look, &path).await;
            let [(PG_LOCK_CLASS, mode, pid)] = locks.as_slice() else {
                panic!("one advisory lock of {path}: {locks:?}")
            };
            assert_eq!(mode, "ExclusiveLock");
            let application: String = look
                .query_one(
                    "SELECT application_name FROM pg_stat_activity WHERE pid = $1",
                    &[pid],
                )
                .await
                .unwrap()
                .get(0);
            assert!(application.contains(" pid="), "{application}");
            held.release().await.unwrap();
            assert_eq!(
                env.left_behind(std::slice::from_ref(&m), &path).await,
                Vec::<String>::new()
            );
        }
        Backend::Memory => {
            assert!(debug.contains("memory"), "{debug}");
            let errors = [
                m.inspect("k").await.unwrap_err(),
                m.inspect_path("/some/lock").await.unwrap_err(),
                m.list("k").await.unwrap_err(),
                m.revoke("k").await.unwrap_err(),
                m.revoke_path("/some/lock").await.unwrap_err(),
            ];
            for err in errors {
                assert!(
                    matches!(
                        err,
                        Error::Unsupported {
                            backend: "memory",
                            ..
                        }
                    ),
                    "{err:?}"
                );
                assert!(err.to_string().contains("memory"), "{err}");
            }
            let client = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.zk_client()));
            assert!(client.is_err(), "zk_client() panics in memory");
            assert_eq!(m.negotiated_session_timeout(), Duration::ZERO);
            assert_eq!(m.stats(), Default::default());

            // What memory has instead: `lose`, for every recipe of the key.
            let guard = m.lock("k").await.unwrap();
            let lease = m.semaphore("k", 2).unwrap().acquire().await.unwrap();
            m.lose("k", LossReason::Revoked).unwrap();
            assert_eq!(guard.lost().await, LossReason::Revoked);
            assert_eq!(lease.lost().await, LossReason::Revoked);
            assert!(!guard.is_held() && !lease.is_held());
            assert!(matches!(
                m.lose("bad\nkey", LossReason::Revoked),
                Err(Error::InvalidKey { .. })
            ));
        }
        Backend::Zookeeper => {
            assert!(debug.contains("zookeeper"), "{debug}");
            let err = m.lose("k", LossReason::SessionExpired).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::Unsupported {
                        backend: "zookeeper",
                        ..
                    }
                ),
                "{err:?}"
            );
            assert!(err.to_string().contains("zookeeper"), "{err}");
            let held = m.lock("k").await.unwrap();
            let info = m.inspect("k").await.unwrap();
            assert_eq!(info.holders.len(), 1);
            assert_eq!(info.holders[0].token, held.fencing_token());
            assert_eq!(m.list("k").await.unwrap().len(), 1);
            assert!(m.zk_client().list_children("/").await.is_ok());
            assert!(m.negotiated_session_timeout() > Duration::ZERO);
            assert!(m.stats().requests > 0);
        }
    }
}

/// Frames re-enter holds of the same manager only: inside `a.with_lock("k")`, another
/// manager's acquire of the same key is another lock (another backend, another cluster), not a
/// re-entry of a's hold (regression: frames matched on the path alone).
#[tokio::test]
async fn regression_frames_do_not_reenter_another_managers_hold() {
    let a = zklock::LockManager::in_memory();
    let b = zklock::LockManager::in_memory();
    a.with_lock("k", async {
        let other = b.try_lock("k").await.unwrap().expect("b's lock is free");
        assert_eq!(other.hold_count(), 1, "b's guard is a hold of its own");
    })
    .await
    .unwrap();
}

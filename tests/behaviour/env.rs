//! Where a behaviour runs: the backends, the managers of its "processes", and what it looks at
//! on each server.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    Zookeeper,
    Redis,
    /// Redis under Sentinel (`redis+sentinel://`): the primary of the setup every behaviour
    /// shares ([`shared_sentinel`]), in a namespace of the behaviour's own.
    RedisSentinel,
    /// Redis Cluster (`redis+cluster://<every node>`): the 3 primaries every behaviour shares
    /// ([`shared_cluster`]), in a namespace of the behaviour's own.
    RedisCluster,
    Postgres,
    Etcd,
    /// MySQL / MariaDB: a real MariaDB from the test kit, one manager with its own sessions per
    /// "process".
    MySql,
    Memory,
}

/// The Redis Sentinel setup that every `redis_sentinel` behaviour of this binary shares: a
/// primary, 2 replicas and 3 Sentinels are 6 processes and seconds to settle, and nothing in
/// the suite restarts, flushes or fails over the server. Each behaviour keeps to keys of its
/// own (its env's namespace, [`Env::namespace`]), so behaviours running at once never meet.
///
/// Started on first use ([`shared`]). A static is never dropped, so it is stopped at exit by an
/// `atexit` handler (every process killed, the directory removed); should the test process be
/// killed outright, the kit's watchdogs kill the processes (they notice the test process's pipe
/// close) and the next start of the kit sweeps the directory.
static SENTINEL: StdMutex<Option<Arc<RedisSentinel>>> = StdMutex::new(None);

/// The Redis Cluster that every `redis_cluster` behaviour of this binary shares, as
/// [`SENTINEL`] is shared: 3 primaries without replicas (nothing in the suite fails a node
/// over), each behaviour in a namespace of its own, its locks spread over the primaries by
/// their hash tags.
static CLUSTER: StdMutex<Option<Arc<RedisCluster>>> = StdMutex::new(None);

/// The setup in `slot`, started with `start` on first use, `stop` registered to run at exit.
/// Blocks (the kit is synchronous): called through `block_in_place`, on a multi-threaded
/// runtime.
fn shared<T>(
    slot: &'static StdMutex<Option<Arc<T>>>,
    start: impl FnOnce() -> T,
    stop: extern "C" fn(),
) -> Arc<T> {
    tokio::task::block_in_place(|| {
        // A start that panicked poisons nothing worth keeping: the slot is still empty.
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(setup) = &*slot {
            return setup.clone();
        }
        let setup = Arc::new(start());
        *slot = Some(setup.clone());
        stop_at_exit(stop);
        setup
    })
}

/// The shared Sentinel setup ([`SENTINEL`]), started on first use.
fn shared_sentinel() -> Arc<RedisSentinel> {
    shared(
        &SENTINEL,
        || RedisSentinel::start().expect("start Redis with Sentinels (test kit)"),
        stop_sentinel,
    )
}

/// The shared Cluster ([`CLUSTER`]), started on first use.
fn shared_cluster() -> Arc<RedisCluster> {
    shared(
        &CLUSTER,
        || {
            RedisCluster::builder()
                .replicas(0)
                .start()
                .expect("start a Redis Cluster (test kit)")
        },
        stop_cluster,
    )
}

/// Registers `stop` to run when the test process exits (libtest returns from `main` or calls
/// `exit`; statics are never dropped).
fn stop_at_exit(stop: extern "C" fn()) {
    extern "C" {
        fn atexit(callback: extern "C" fn()) -> std::os::raw::c_int;
    }
    // SAFETY: `atexit` is the C library's; `stop` is an `extern "C" fn()` that never unwinds
    // (a drop that fails does so quietly).
    let registered = unsafe { atexit(stop) };
    assert_eq!(registered, 0, "atexit refused a shared setup's stop");
}

/// Drops the shared setup in `slot`: kills its processes and removes its directory. Every
/// behaviour has ended by then, so the static holds the last reference. (`try_lock`: at exit
/// nothing may wait.)
fn stop_shared<T>(slot: &StdMutex<Option<Arc<T>>>) {
    if let Ok(mut slot) = slot.try_lock() {
        drop(slot.take());
    }
}

extern "C" fn stop_sentinel() {
    stop_shared(&SENTINEL);
}

extern "C" fn stop_cluster() {
    stop_shared(&CLUSTER);
}

/// A namespace of its own for each env on a shared setup (Sentinel's, the Cluster).
fn fresh_namespace() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{}/behaviour_{}",
        zklock::DEFAULT_NAMESPACE,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The lease of the Redis managers: long enough that a busy 2-core machine never misses a
/// renewal (every lease/3), short enough that a lost hold shows within a second.
pub(crate) const REDIS_LEASE: Duration = Duration::from_secs(3);

/// The class of a waiting writer's intent (`zkIN`), as `pg_locks.classid` shows it, beside the
/// lock's own (`common::PG_LOCK_CLASS`); the PostgreSQL managers run with `common::PG_LEASE`.
pub(crate) const PG_INTENT_CLASS: i64 = 0x7A6B_494E;

/// The lease of the etcd managers (whole seconds, as etcd counts them).
pub(crate) const ETCD_LEASE: Duration = Duration::from_secs(3);

/// Whether tasks of one process queue behind one backend hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Queue {
    /// The default: tasks of a process queue locally behind one hold per key.
    Local,
    /// `local_queue(false)`: every acquire contends at the backend with a hold of its own.
    Strict,
}

pub(crate) const QUEUES: [Queue; 2] = [Queue::Local, Queue::Strict];

/// Where a behaviour runs, and how it makes the managers of its "processes".
pub(crate) struct Env {
    pub(crate) backend: Backend,
    pub(crate) zk: Option<ZkServer>,
    pub(crate) redis: Option<RedisServer>,
    /// Redis under Sentinel: the shared setup ([`shared_sentinel`]).
    pub(crate) sentinel: Option<Arc<RedisSentinel>>,
    /// Redis Cluster: the shared Cluster ([`shared_cluster`]).
    pub(crate) cluster: Option<Arc<RedisCluster>>,
    /// The namespace of this env's managers, where it needs one of its own (on the shared
    /// Sentinel setup or Cluster); `None`: the default.
    pub(crate) namespace: Option<String>,
    pub(crate) pg: Option<PostgresServer>,
    pub(crate) etcd: Option<EtcdServer>,
    pub(crate) mysql: Option<MariaDbServer>,
    /// Memory: one manager per queue mode; its clones share its lock table.
    pub(crate) local: Option<LockManager>,
    pub(crate) strict: Option<LockManager>,
}

impl Env {
    pub(crate) fn start(backend: Backend) -> Env {
        let none = Env {
            backend,
            zk: None,
            redis: None,
            sentinel: None,
            cluster: None,
            namespace: None,
            pg: None,
            etcd: None,
            mysql: None,
            local: None,
            strict: None,
        };
        match backend {
            Backend::Zookeeper => Env {
                zk: Some(server()),
                ..none
            },
            Backend::Redis => Env {
                redis: Some(RedisServer::start().expect("start redis-server (test kit)")),
                ..none
            },
            Backend::RedisSentinel => Env {
                sentinel: Some(shared_sentinel()),
                namespace: Some(fresh_namespace()),
                ..none
            },
            Backend::RedisCluster => Env {
                cluster: Some(shared_cluster()),
                namespace: Some(fresh_namespace()),
                ..none
            },
            Backend::Postgres => Env {
                pg: Some(pg_server()),
                ..none
            },
            Backend::Etcd => Env {
                etcd: Some(EtcdServer::start().expect("start etcd (test kit)")),
                ..none
            },
            Backend::MySql => Env {
                mysql: Some(MariaDbServer::start().expect("start MariaDB (test kit)")),
                ..none
            },
            Backend::Memory => Env {
                local: Some(LockManager::in_memory()),
                strict: Some(LockManager::in_memory_with(
                    LockManager::builder("memory").local_queue(false),
                )),
                ..none
            },
        }
    }

    /// The backend's name, as `Error::Unsupported` gives it.
    pub(crate) fn backend_name(&self) -> &'static str {
        match self.backend {
            Backend::Zookeeper => "zookeeper",
            Backend::Redis | Backend::RedisSentinel | Backend::RedisCluster => "redis",
            Backend::Postgres => "postgres",
            Backend::Etcd => "etcd",
            Backend::MySql => "mysql",
            Backend::Memory => "memory",
        }
    }

    pub(crate) fn is_zk(&self) -> bool {
        self.backend == Backend::Zookeeper
    }

    /// Redis: one server, under Sentinel, or the Cluster.
    pub(crate) fn is_redis(&self) -> bool {
        matches!(
            self.backend,
            Backend::Redis | Backend::RedisSentinel | Backend::RedisCluster
        )
    }

    pub(crate) fn connect(&self) -> String {
        self.zk.as_ref().expect("a ZooKeeper env").connect_string()
    }

    /// What the managers connect to: the server's `redis://` URL, under Sentinel
    /// `redis+sentinel://<every Sentinel>/<master name>`, on the Cluster
    /// `redis+cluster://<every node>`.
    pub(crate) fn redis_url(&self) -> String {
        match (&self.sentinel, &self.cluster) {
            (Some(s), _) => format!(
                "redis+sentinel://{}/{}",
                s.sentinel_addrs().join(","),
                s.master_name()
            ),
            (None, Some(c)) => format!("redis+cluster://{}", c.addrs().join(",")),
            (None, None) => self.redis.as_ref().expect("a Redis env").url(),
        }
    }

    /// The name of the Redis key of kind `kind` (`lock`, `shared`, `intent`, `fence`, ...) of
    /// the lock at `path`: `zklock:<kind>:<path>`; on the Cluster with the path's hash tag,
    /// `zklock:<kind>:{<tag>}<path>`, as the backend lays its keys out there.
    pub(crate) fn redis_key(&self, kind: &str, path: &str) -> String {
        match self.backend {
            Backend::RedisCluster => format!("zklock:{kind}:{}{path}", cluster::tag(path)),
            _ => format!("zklock:{kind}:{path}"),
        }
    }

    /// The `redis://` URL of the server that has the key `name`: the one server, the primary
    /// the Sentinels name now, or the Cluster's primary that serves the key's slot now.
    pub(crate) fn redis_data_url(&self, name: &str) -> String {
        match (&self.sentinel, &self.cluster) {
            (Some(s), _) => {
                let primary = tokio::task::block_in_place(|| s.primary())
                    .expect("the Sentinels name the primary");
                format!("redis://{}/", s.node_addr(primary))
            }
            (None, Some(c)) => {
                let owner = tokio::task::block_in_place(|| c.node_for_key(name))
                    .expect("a Cluster primary serves the key's slot");
                format!("redis://{}/", c.addr(owner))
            }
            (None, None) => self.redis.as_ref().expect("a Redis env").url(),
        }
    }

    /// The builder of one more manager of this env: `connect`, in the env's namespace.
    fn builder(&self, connect: String) -> zklock::Builder {
        let builder = LockManager::builder(connect);
        match &self.namespace {
            Some(namespace) => builder.namespace(namespace),
            None => builder,
        }
    }

    /// A plain Redis connection to the server that has the key `name`
    /// ([`redis_data_url`](Self::redis_data_url)), to look at and tamper with the backend's
    /// keys: on the Cluster, the key's and every key of the same lock's (they share its slot).
    pub(crate) async fn redis_conn(&self, name: &str) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.redis_data_url(name))
            .unwrap()
            .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
            .await
            .expect("connect to the test Redis")
    }

    pub(crate) fn etcd_url(&self) -> String {
        self.etcd.as_ref().expect("an etcd env").url()
    }

    /// The keys under `path/` in create order (contenders first in line first).
    pub(crate) async fn etcd_keys(&self, path: &str) -> Vec<String> {
        let endpoint = self.etcd.as_ref().expect("an etcd env").client_url();
        let mut client = etcd_client::Client::connect([endpoint], None)
            .await
            .expect("connect to the test etcd");
        let got = client
            .get(
                format!("{path}/"),
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_sort(
                            etcd_client::SortTarget::Create,
                            etcd_client::SortOrder::Ascend,
                        ),
                ),
            )
            .await
            .expect("read the test etcd");
        got.kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect()
    }

    pub(crate) fn mysql_url(&self) -> String {
        self.mysql.as_ref().expect("a MySQL env").url()
    }

    /// `sql` run as the server's root (the test kit's client), its output trimmed.
    pub(crate) fn mysql_sql(&self, sql: &str) -> String {
        let server = self.mysql.as_ref().expect("a MySQL env");
        tokio::task::block_in_place(|| server.root_sql(sql)).expect("run SQL on the test MariaDB")
    }

    /// The sessions that hold, then wait for, the user lock of the lock at `path`.
    pub(crate) fn mysql_sessions(&self, path: &str) -> (Option<u64>, Vec<u64>) {
        let name = zklock::mysql_lock_name(path);
        let holder = self
            .mysql_sql(&format!("SELECT IS_USED_LOCK('{name}')"))
            .parse()
            .ok();
        let waiters = self
            .mysql_sql(&format!(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND = 'Query' \
                 AND INFO LIKE 'SELECT GET_LOCK(''{name}'',%'"
            ))
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .filter(|id| Some(*id) != holder)
            .collect();
        (holder, waiters)
    }

    pub(crate) fn pg_url(&self) -> String {
        self.pg.as_ref().expect("a PostgreSQL env").url()
    }

    /// A plain PostgreSQL client, to look at the server's locks and end sessions.
    pub(crate) async fn pg_client(&self) -> tokio_postgres::Client {
        pg_client(&self.pg_url()).await
    }

    /// zklock's granted advisory locks (the lock and a writer's intent) of the lock at `path`
    /// on PostgreSQL: `(class, mode, pid)`; none while the path has no id yet.
    pub(crate) async fn pg_locks(
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
    pub(crate) async fn process(&self, queue: Queue) -> LockManager {
        match self.backend {
            Backend::Memory => match queue {
                Queue::Local => self.local.clone().unwrap(),
                Queue::Strict => self.strict.clone().unwrap(),
            },
            _ => self.process_with(queue, |b| b).await,
        }
    }

    /// [`process`](Self::process) with more options. In memory a manager of its own (its own
    /// lock table: it shares no lock with the env's other managers).
    pub(crate) async fn process_with(
        &self,
        queue: Queue,
        configure: impl FnOnce(zklock::Builder) -> zklock::Builder,
    ) -> LockManager {
        let local = queue == Queue::Local;
        match self.backend {
            Backend::Redis | Backend::RedisSentinel | Backend::RedisCluster => configure(
                self.builder(self.redis_url())
                    .redis(|r| r.lease(REDIS_LEASE)),
            )
            .local_queue(local)
            .connect()
            .await
            .expect("connect to the test Redis"),
            Backend::Postgres => {
                configure(LockManager::builder(self.pg_url()).postgres(|pg| pg.lease(PG_LEASE)))
                    .local_queue(local)
                    .connect()
                    .await
                    .expect("connect to the test PostgreSQL")
            }
            Backend::Etcd => {
                configure(LockManager::builder(self.etcd_url()).etcd(|e| e.lease(ETCD_LEASE)))
                    .local_queue(local)
                    .connect()
                    .await
                    .expect("connect to the test etcd")
            }
            Backend::MySql => {
                configure(LockManager::builder(self.mysql_url()).mysql(|my| my.lease(MYSQL_LEASE)))
                    .local_queue(local)
                    .connect()
                    .await
                    .expect("connect to the test MariaDB")
            }
            Backend::Zookeeper => configure(
                LockManager::builder(self.connect())
                    .zookeeper(|zk| zk.session_timeout(Duration::from_secs(4))),
            )
            .local_queue(local)
            .connect()
            .await
            .expect("connect to the test server"),
            Backend::Memory => LockManager::in_memory_with(
                configure(LockManager::builder("memory")).local_queue(local),
            ),
        }
    }

    /// The manager of one more process with settings of its own, the `i`-th of a mixed fleet:
    /// leases, session timeouts, the linger, the local queue and its handoff bound differ from
    /// one process to the next (as in a rolling deploy, or services tuned apart that lock the
    /// same keys). Memory: a manager with settings of its own would have a lock table of its
    /// own, which no other manager sees, so the in-memory fleet shares one manager's.
    pub(crate) async fn mixed_process(&self, i: usize) -> LockManager {
        // (lease or session timeout, linger, local queue, local handoffs, fencing tokens)
        const MIX: [(u64, u64, bool, u32, bool); 4] = [
            (3_000, 0, true, 32, true),
            (1_000, 300, false, 32, true),
            (10_000, 50, true, 2, true),
            (3_000, 100, true, 32, false),
        ];
        let (lease_ms, linger_ms, local, handoffs, tokens) = MIX[i % MIX.len()];
        let configure = |b: zklock::Builder| {
            b.local_queue(local)
                .linger(Duration::from_millis(linger_ms))
                .max_local_handoffs(handoffs)
                .fencing_tokens(tokens)
        };
        let lease = Duration::from_millis(lease_ms);
        match self.backend {
            Backend::Redis | Backend::RedisSentinel | Backend::RedisCluster => {
                configure(self.builder(self.redis_url()).redis(|r| r.lease(lease)))
                    .connect()
                    .await
                    .expect("connect to the test Redis")
            }
            Backend::Postgres => {
                configure(LockManager::builder(self.pg_url()).postgres(|pg| pg.lease(lease)))
                    .connect()
                    .await
                    .expect("connect to the test PostgreSQL")
            }
            // etcd counts leases in whole seconds, 2 at least.
            Backend::Etcd => {
                let lease = Duration::from_secs(lease.as_secs().max(2));
                configure(LockManager::builder(self.etcd_url()).etcd(|e| e.lease(lease)))
                    .connect()
                    .await
                    .expect("connect to the test etcd")
            }
            // MySQL counts wait_timeout in whole seconds.
            Backend::MySql => {
                let lease = Duration::from_secs(lease.as_secs().max(1));
                configure(LockManager::builder(self.mysql_url()).mysql(|my| my.lease(lease)))
                    .connect()
                    .await
                    .expect("connect to the test MariaDB")
            }
            Backend::Zookeeper => configure(
                LockManager::builder(self.connect())
                    .zookeeper(|zk| zk.session_timeout(lease.max(Duration::from_secs(4)))),
            )
            .connect()
            .await
            .expect("connect to the test server"),
            // One lock table is one in-memory "server": its clones, whose settings are one.
            Backend::Memory => self.process(Queue::Local).await,
        }
    }

    pub(crate) async fn processes(&self, n: usize, queue: Queue) -> Vec<LockManager> {
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
    pub(crate) async fn left_behind(&self, managers: &[LockManager], path: &str) -> Vec<String> {
        for m in managers {
            m.flush().await;
        }
        match self.backend {
            Backend::Zookeeper => children(&managers[0], path).await,
            Backend::Redis | Backend::RedisSentinel | Backend::RedisCluster => {
                let lock = path
                    .strip_suffix("/leases")
                    .or_else(|| path.strip_suffix("/locks"))
                    .unwrap_or(path);
                // Every key of one lock is in one slot: one server has them all.
                let mut conn = self.redis_conn(&self.redis_key("lock", lock)).await;
                let mut left = vec![];
                for kind in ["lock", "shared", "intent"] {
                    let name = self.redis_key(kind, lock);
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
            Backend::Etcd => {
                let lock = path
                    .strip_suffix("/leases")
                    .or_else(|| path.strip_suffix("/locks"))
                    .unwrap_or(path);
                self.etcd_keys(lock).await
            }
            Backend::MySql => {
                let (holder, waiters) = self.mysql_sessions(path);
                holder
                    .map(|id| format!("{path} held by session {id}"))
                    .into_iter()
                    .chain(
                        waiters
                            .iter()
                            .map(|id| format!("{path} waited for by session {id}")),
                    )
                    .collect()
            }
            Backend::Memory => vec![],
        }
    }

    /// Makes `m`'s holds of `key` lost: `lose` in memory, the session expired on ZooKeeper,
    /// the holder's key deleted from outside on etcd (its watch tells the holder),
    /// the lock's key deleted on Redis (the holder's next renewal, within lease/3, finds it
    /// gone), the holding session ended by the server on PostgreSQL (`pg_terminate_backend`:
    /// every hold on that connection is lost with it).
    pub(crate) async fn lose(&self, m: &LockManager, key: &str) {
        match self.backend {
            Backend::Memory => m.lose(key, LossReason::SessionExpired).unwrap(),
            Backend::Zookeeper => expire_session(m, &self.connect()).await,
            Backend::Redis | Backend::RedisSentinel | Backend::RedisCluster => {
                let name = self.redis_key("lock", &m.path_of(key).unwrap());
                let deleted: i64 = redis::cmd("DEL")
                    .arg(&name)
                    .query_async(&mut self.redis_conn(&name).await)
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
            Backend::MySql => {
                let path = m.path_of(key).unwrap();
                let (holder, _) = self.mysql_sessions(&path);
                let holder = holder.unwrap_or_else(|| panic!("{path} is not held"));
                let server = self.mysql.as_ref().unwrap();
                tokio::task::block_in_place(|| server.kill_connection(holder))
                    .expect("KILL the holding session");
            }
            Backend::Etcd => {
                let path = m.path_of(key).unwrap();
                let keys = self.etcd_keys(&path).await;
                let holder = keys.first().unwrap_or_else(|| panic!("{path} is not held"));
                let out = self
                    .etcd
                    .as_ref()
                    .unwrap()
                    .etcdctl(&["del", holder])
                    .expect("etcdctl del");
                assert_eq!(out.trim(), "1", "{holder} was not deleted");
            }
        }
    }

    /// On Redis and PostgreSQL, waits (bounded) until a writer waits for the read/write lock at
    /// `path`: its intent (a key on Redis, an advisory lock of the intent class on PostgreSQL),
    /// or on PostgreSQL its request in the server's queue, which keeps new readers out, exists.
    /// Elsewhere a queued writer is visible from its first
    /// poll (memory) or its node (ZooKeeper) already.
    pub(crate) async fn until_writer_waits(&self, path: &str) {
        let name = match self.backend {
            Backend::Redis | Backend::RedisSentinel | Backend::RedisCluster => {
                self.redis_key("intent", path)
            }
            Backend::Postgres => format!("the intent lock of {path}"),
            Backend::Zookeeper | Backend::Etcd | Backend::MySql | Backend::Memory => return,
        };
        let mut conn = match self.backend {
            Backend::Redis | Backend::RedisSentinel | Backend::RedisCluster => {
                Some(self.redis_conn(&name).await)
            }
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
    pub(crate) fn loss_reason_ok(&self, reason: LossReason) -> bool {
        match self.backend {
            Backend::Memory => reason == LossReason::SessionExpired,
            Backend::Redis | Backend::RedisSentinel | Backend::RedisCluster => matches!(
                reason,
                LossReason::NodeDeleted | LossReason::LeaseExpired | LossReason::Disconnected
            ),
            Backend::Postgres => {
                matches!(reason, LossReason::Disconnected | LossReason::LeaseExpired)
            }
            Backend::Etcd => matches!(reason, LossReason::NodeDeleted | LossReason::LeaseExpired),
            Backend::MySql => {
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
    pub(crate) async fn spawn_queued<F>(
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
        if self.backend == Backend::MySql {
            // Its GET_LOCK is sent once it has a session.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                let (holder, waiters) = self.mysql_sessions(path);
                if usize::from(holder.is_some()) + waiters.len() >= nodes {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{path} never had {nodes} contenders"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        if self.backend == Backend::Etcd {
            // Its key is put by a request the first poll only starts.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while self.etcd_keys(path).await.len() < nodes {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{path} never had {nodes} contenders"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        task
    }
}

/// Counts the holders inside a critical section and remembers the most seen at once.
#[derive(Default)]
pub(crate) struct Overlap {
    pub(crate) inside: AtomicUsize,
    pub(crate) max: AtomicUsize,
    pub(crate) entries: AtomicUsize,
}

impl Overlap {
    pub(crate) fn enter(&self, units: usize) {
        let now = self.inside.fetch_add(units, Ordering::SeqCst) + units;
        self.max.fetch_max(now, Ordering::SeqCst);
        self.entries.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn leave(&self, units: usize) {
        self.inside.fetch_sub(units, Ordering::SeqCst);
    }

    pub(crate) async fn critical_section(&self) {
        self.enter(1);
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.leave(1);
    }

    pub(crate) fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }

    pub(crate) fn entries(&self) -> usize {
        self.entries.load(Ordering::SeqCst)
    }
}

pub(crate) fn assert_increasing(tokens: &[FencingToken]) {
    for w in tokens.windows(2) {
        assert!(
            w[0] < w[1],
            "the token did not increase: {} then {}",
            w[0],
            w[1]
        );
    }
}

/// `err` is `Error::Unsupported` naming `backend`, in the variant and in the message.
pub(crate) fn assert_unsupported(err: &Error, backend: &str) {
    assert!(
        matches!(err, Error::Unsupported { backend: b, .. } if *b == backend),
        "{err:?}"
    );
    assert!(err.to_string().contains(backend), "{err}");
}

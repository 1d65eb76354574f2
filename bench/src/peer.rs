//! The lock implementations measured, behind one acquire/release interface.
//!
//! On ZooKeeper: zklock, the floor, zookeeper-client's recipe, the naive herd. On Redis (a
//! `redis://` connect string): zklock, the floor (`SET key id NX PX ttl` and a Lua
//! compare-and-`DEL`, retried at once while the key is taken: no recipe, no waiting), and
//! rslock (Redlock on the one server). Under Sentinel (a `redis+sentinel://` URL) zklock follows
//! the primary the Sentinels name; the floor, rslock and the server's counters use that primary's
//! address, asked of the Sentinels once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use zklock_core::{LockManager, Mutex};
use zookeeper_client::{Acls, Client, CreateMode, CreateOptions, LockOptions, LockPrefix};

use crate::{BenchError, Options, Peer, Result};

static EPHEMERAL_SEQUENTIAL: CreateOptions<'static> =
    CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
static EPHEMERAL: CreateOptions<'static> = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
static PERSISTENT: CreateOptions<'static> = CreateMode::Persistent.with_acls(Acls::anyone_all());
static CONTAINER: CreateOptions<'static> = CreateMode::Container.with_acls(Acls::anyone_all());

/// Counters of the naive (herd) peer, shared by every session of a run.
#[derive(Debug, Default)]
pub(crate) struct NaiveCounters {
    /// Requests sent (creates, exists-watches, deletes).
    pub(crate) requests: AtomicU64,
    /// Watch events delivered to waiters (each wakes a waiter that then retries).
    pub(crate) events: AtomicU64,
    /// Acquires that have registered their first watch (they are queued, in the herd's way).
    pub(crate) watching: AtomicU64,
}

/// The lease (Redis) of zklock's holds and the TTL of the floor's and rslock's keys: zklock's
/// default lease.
pub(crate) const REDIS_TTL: Duration = zklock_core::DEFAULT_LEASE;

/// The floor's release: delete the key only if it still holds our id.
const COMPARE_AND_DELETE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// Whether `connect` names a Redis server (or the Sentinels of one).
pub(crate) fn is_redis(connect: &str) -> bool {
    connect.starts_with("redis://") || connect.starts_with("redis+unix://") || is_sentinel(connect)
}

/// Whether `connect` names Redis Sentinels (`redis+sentinel://host:port[,...]/<master>`).
pub(crate) fn is_sentinel(connect: &str) -> bool {
    connect.starts_with("redis+sentinel://")
}

/// The `redis://` URL of the server `connect` names: itself, or the primary the first
/// Sentinel that answers names (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
pub(crate) async fn redis_data_url(connect: &str) -> Result<String> {
    let Some(rest) = connect.strip_prefix("redis+sentinel://") else {
        return Ok(connect.to_string());
    };
    let bad = || BenchError(format!("not a Sentinel URL: {connect}"));
    let (hosts, master) = rest.split_once('/').ok_or_else(bad)?;
    let master = master
        .split('/')
        .next()
        .filter(|m| !m.is_empty())
        .ok_or_else(bad)?;
    let mut last = None;
    for host in hosts.split(',') {
        let asked = async {
            let client = redis::Client::open(format!("redis://{host}/"))?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(master)
                .query_async::<Option<(String, u16)>>(&mut conn)
                .await
        };
        match asked.await {
            Ok(Some((h, p))) => return Ok(format!("redis://{h}:{p}/")),
            Ok(None) => last = Some(format!("{host} knows no master {master:?}")),
            Err(e) => last = Some(format!("{host}: {e}")),
        }
    }
    Err(BenchError(format!(
        "no Sentinel named the primary: {}",
        last.unwrap_or_default()
    )))
}

/// Opens a plain multiplexed Redis connection (to the primary, for a Sentinel URL).
pub(crate) async fn redis_connection(url: &str) -> Result<MultiplexedConnection> {
    let url = redis_data_url(url).await?;
    let client = redis::Client::open(url).map_err(|e| BenchError(format!("redis: {e}")))?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| BenchError(format!("redis: {e}")))
}

/// Opens a zklock manager with the run's options under `namespace`.
pub(crate) async fn zklock_manager(options: &Options, namespace: &str) -> Result<LockManager> {
    let builder = LockManager::builder(options.connect.clone()).namespace(namespace);
    let builder = match zklock_core::BackendKind::of(&options.connect)? {
        zklock_core::BackendKind::Redis => builder.redis(|r| r.lease(REDIS_TTL)),
        zklock_core::BackendKind::Postgres => builder,
        _ => builder.zookeeper(|zk| zk.session_timeout(options.session_timeout)),
    };
    Ok(builder
        .local_queue(options.local_queue)
        .fencing_tokens(options.fencing_tokens)
        .linger(options.linger)
        .connect()
        .await?)
}

/// Opens a bare zookeeper-client session.
pub(crate) async fn raw_client(options: &Options) -> Result<Client> {
    Ok(Client::connector()
        .with_session_timeout(options.session_timeout)
        .connect(&options.connect)
        .await?)
}

/// Creates `path` and its ancestors as persistent nodes (existing ones are fine).
pub(crate) async fn mkdir_persistent(client: &Client, path: &str) -> Result<()> {
    Ok(client.mkdir(path, &PERSISTENT).await?)
}

/// Deletes `root`'s tree, best effort (the paths of peers other than zklock are persistent).
pub(crate) async fn remove_tree(client: &Client, root: &str) {
    let mut stack = vec![root.to_string()];
    let mut order = vec![];
    while let Some(path) = stack.pop() {
        if let Ok(children) = client.list_children(&path).await {
            for c in children {
                stack.push(format!("{path}/{c}"));
            }
        }
        order.push(path);
    }
    for path in order.iter().rev() {
        let _ = client.delete(path, None).await;
    }
}

/// One session (or one manager) of a peer, with a handle per key.
pub(crate) enum Contender {
    Zklock {
        manager: LockManager,
        mutexes: Vec<Mutex>,
    },
    Floor {
        client: Client,
        /// `<root>/k<i>/_c_<uuid>-lock-`: the same node names as Curator's, made once.
        prefixes: Vec<String>,
    },
    Zkclient {
        client: Client,
        dirs: Vec<String>,
    },
    Naive {
        client: Client,
        nodes: Vec<String>,
        counters: Arc<NaiveCounters>,
    },
    /// The floor on Redis: one connection, its own holder id.
    RedisFloor {
        conn: MultiplexedConnection,
        keys: Vec<String>,
        id: String,
        release: redis::Script,
        /// `SET NX` sent (one per acquire when uncontended).
        attempts: Arc<AtomicU64>,
    },
    /// rslock's manager on the one Redis server.
    Rslock {
        manager: rslock::LockManager,
        keys: Vec<String>,
    },
}

/// What a peer's run shares between its sessions: where its keys live.
pub(crate) struct Setup {
    pub(crate) peer: Peer,
    pub(crate) root: String,
    pub(crate) naive: Arc<NaiveCounters>,
    /// A session to prepare and clean up the paths (not the zklock peer's).
    admin: Option<Client>,
    /// Redis: the floor's `SET NX` attempts, over every connection.
    pub(crate) attempts: Arc<AtomicU64>,
}

impl Setup {
    /// Prepares the paths of `keys` keys (plus the warm-up key, index `keys`).
    pub(crate) async fn new(options: &Options, keys: usize) -> Result<Setup> {
        let peer = options.peer;
        let root = crate::run_root(peer);
        let admin = match peer {
            _ if is_redis(&options.connect) => None,
            Peer::Zklock => None,
            _ => Some(raw_client(options).await?),
        };
        if let (Some(admin), Peer::Floor | Peer::Naive) = (&admin, peer) {
            for k in 0..=keys {
                mkdir_persistent(admin, &format!("{root}/k{k}")).await?;
            }
        }
        Ok(Setup {
            peer,
            root,
            naive: Arc::default(),
            admin,
            attempts: Arc::default(),
        })
    }

    /// Opens one session with handles for `keys` keys (plus the warm-up key).
    pub(crate) async fn contender(&self, options: &Options, keys: usize) -> Result<Contender> {
        let all = 0..=keys;
        if is_redis(&options.connect) {
            let keys: Vec<String> = all.map(|k| format!("bench:{}:k{k}", self.root)).collect();
            return Ok(match self.peer {
                Peer::Zklock => {
                    let manager = zklock_manager(options, &self.root).await?;
                    let mutexes = (0..keys.len())
                        .map(|k| manager.mutex(&format!("k{k}")))
                        .collect::<zklock_core::Result<_>>()?;
                    Contender::Zklock { manager, mutexes }
                }
                Peer::Floor => Contender::RedisFloor {
                    conn: redis_connection(&options.connect).await?,
                    keys,
                    id: uuid::Uuid::new_v4().to_string(),
                    release: redis::Script::new(COMPARE_AND_DELETE),
                    attempts: self.attempts.clone(),
                },
                Peer::Rslock => Contender::Rslock {
                    manager: rslock::LockManager::new(vec![
                        redis_data_url(&options.connect).await?,
                    ]),
                    keys,
                },
                other => {
                    return Err(BenchError(format!(
                        "{other} runs on ZooKeeper only; on Redis: zklock, floor, rslock"
                    )))
                }
            });
        }
        Ok(match self.peer {
            Peer::Zklock => {
                let manager = zklock_manager(options, &self.root).await?;
                let mutexes = all
                    .map(|k| manager.mutex(&format!("k{k}")))
                    .collect::<zklock_core::Result<_>>()?;
                Contender::Zklock { manager, mutexes }
            }
            Peer::Floor => {
                let protect = format!("_c_{}-lock-", uuid::Uuid::new_v4());
                Contender::Floor {
                    client: raw_client(options).await?,
                    prefixes: all
                        .map(|k| format!("{}/k{k}/{protect}", self.root))
                        .collect(),
                }
            }
            Peer::Zkclient => Contender::Zkclient {
                client: raw_client(options).await?,
                dirs: all.map(|k| format!("{}/k{k}", self.root)).collect(),
            },
            Peer::Naive => Contender::Naive {
                client: raw_client(options).await?,
                nodes: all.map(|k| format!("{}/k{k}/lock", self.root)).collect(),
                counters: self.naive.clone(),
            },
            Peer::Rslock => {
                return Err(BenchError(
                    "rslock runs on Redis only: give a redis:// URL".into(),
                ))
            }
            Peer::LockService => {
                return Err(BenchError(
                    "lockservice runs on etcd only: give an etcd:// URL".into(),
                ))
            }
        })
    }

    /// Removes the run's persistent paths (zklock's and zookeeper-client's parents are
    /// containers, which the server removes itself).
    pub(crate) async fn cleanup(&self) {
        if let (Some(admin), Peer::Floor | Peer::Naive) = (&self.admin, self.peer) {
            remove_tree(admin, &self.root).await;
        }
    }
}

/// A granted acquire, to be released.
pub(crate) enum Held<'a> {
    Zklock(zklock_core::LockGuard),
    Node(&'a Client, String),
    /// The floor's key on Redis, with the id it holds.
    RedisKey {
        conn: MultiplexedConnection,
        script: &'a redis::Script,
        key: &'a str,
        id: &'a str,
    },
    Rslock(&'a rslock::LockManager, rslock::Lock),
}

impl Held<'_> {
    /// Releases and waits for the server's answer (as Curator's `release()` does).
    pub(crate) async fn release(self) -> Result<()> {
        match self {
            Held::Zklock(guard) => Ok(guard.release().await?),
            Held::Node(client, path) => Ok(client.delete(&path, None).await?),
            Held::RedisKey {
                mut conn,
                script,
                key,
                id,
            } => {
                let deleted: i64 = script
                    .key(key)
                    .arg(id)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| BenchError(format!("redis: {e}")))?;
                if deleted == 1 {
                    Ok(())
                } else {
                    Err(BenchError(format!("the floor's key {key} was gone")))
                }
            }
            Held::Rslock(manager, lock) => {
                manager.unlock(&lock).await;
                Ok(())
            }
        }
    }
}

impl Contender {
    /// Takes key `k` (for the floor: creates a node, and excludes nobody).
    pub(crate) async fn acquire(&self, k: usize) -> Result<Held<'_>> {
        match self {
            Contender::Zklock { mutexes, .. } => Ok(Held::Zklock(mutexes[k].lock().await?)),
            Contender::Floor { client, prefixes } => {
                let (_, seq) = client
                    .create(&prefixes[k], &[], &EPHEMERAL_SEQUENTIAL)
                    .await?;
                Ok(Held::Node(client, format!("{}{seq}", prefixes[k])))
            }
            Contender::Zkclient { client, dirs } => {
                let options = LockOptions::new(Acls::anyone_all())
                    .with_ancestor_options(CONTAINER.clone())?;
                let lock = client
                    .lock(LockPrefix::new_curator(&dirs[k], "lock-")?, &[], options)
                    .await?;
                let path = lock.lock_path().to_string();
                // zookeeper-client releases only by dropping the guard, in a spawned task; the
                // bench deletes the node itself to wait for the answer. Forgetting the guard
                // leaks its path string only (it borrows the client).
                std::mem::forget(lock);
                Ok(Held::Node(client, path))
            }
            Contender::RedisFloor {
                conn,
                keys,
                id,
                release,
                attempts,
            } => {
                let mut conn = conn.clone();
                loop {
                    attempts.fetch_add(1, Ordering::Relaxed);
                    let set: Option<String> = redis::cmd("SET")
                        .arg(&keys[k])
                        .arg(id)
                        .arg("NX")
                        .arg("PX")
                        .arg(REDIS_TTL.as_millis() as u64)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| BenchError(format!("redis: {e}")))?;
                    if set.is_some() {
                        return Ok(Held::RedisKey {
                            conn,
                            script: release,
                            key: &keys[k],
                            id,
                        });
                    }
                    // Taken: ask again at once (the least a client can do; no recipe).
                    tokio::task::yield_now().await;
                }
            }
            Contender::Rslock { manager, keys } => {
                let lock = manager
                    .acquire_no_guard(keys[k].as_bytes(), REDIS_TTL)
                    .await
                    .map_err(|e| BenchError(format!("rslock: {e}")))?;
                Ok(Held::Rslock(manager, lock))
            }
            Contender::Naive {
                client,
                nodes,
                counters,
            } => {
                let node = &nodes[k];
                let mut watched = false;
                loop {
                    counters.requests.fetch_add(1, Ordering::Relaxed);
                    match client.create(node, &[], &EPHEMERAL).await {
                        Ok(_) => return Ok(Held::Node(client, node.clone())),
                        Err(zookeeper_client::Error::NodeExists) => {}
                        Err(err) => return Err(err.into()),
                    }
                    counters.requests.fetch_add(1, Ordering::Relaxed);
                    match client.check_and_watch_stat(node).await? {
                        (None, _) => continue,
                        (Some(_), watcher) => {
                            if !watched {
                                watched = true;
                                counters.watching.fetch_add(1, Ordering::Relaxed);
                            }
                            watcher.changed().await;
                            counters.events.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
    }

    /// The zklock manager of this session, if the peer is zklock.
    pub(crate) fn manager(&self) -> Option<&LockManager> {
        match self {
            Contender::Zklock { manager, .. } => Some(manager),
            _ => None,
        }
    }

    /// The bare client of this session, if the peer is not zklock.
    pub(crate) fn client(&self) -> Option<&Client> {
        match self {
            Contender::Zklock { .. } => None,
            Contender::Floor { client, .. }
            | Contender::Zkclient { client, .. }
            | Contender::Naive { client, .. } => Some(client),
            Contender::RedisFloor { .. } | Contender::Rslock { .. } => None,
        }
    }

    /// The znode path of key `k`'s lock (whose children are the contenders).
    pub(crate) fn lock_dir(&self, k: usize) -> Result<String> {
        match self {
            Contender::Zklock { mutexes, .. } => Ok(mutexes[k].path().to_string()),
            Contender::Floor { prefixes, .. } => Ok(parent(&prefixes[k]).to_string()),
            Contender::Zkclient { dirs, .. } => Ok(dirs[k].clone()),
            Contender::Naive { nodes, .. } => Ok(parent(&nodes[k]).to_string()),
            Contender::RedisFloor { .. } | Contender::Rslock { .. } => {
                Err(BenchError("no lock path on Redis".into()))
            }
        }
    }

    /// The children of key `k`'s lock path (empty when it does not exist).
    pub(crate) async fn children(&self, k: usize) -> Result<Vec<String>> {
        let dir = self.lock_dir(k)?;
        let client = match self {
            Contender::Zklock { manager, .. } => manager
                .client::<zookeeper_client::Client>()
                .expect("a ZooKeeper manager"),
            other => other.client().expect("a bare peer has a client").clone(),
        };
        match client.list_children(&dir).await {
            Ok(children) => Ok(children),
            Err(zookeeper_client::Error::NoNode) => Ok(vec![]),
            Err(err) => Err(BenchError(format!("list {dir}: {err}"))),
        }
    }

    /// Waits until every background release of this session is done.
    pub(crate) async fn flush(&self) {
        if let Contender::Zklock { manager, .. } = self {
            manager.flush().await;
        }
    }
}

fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(p, _)| p)
}

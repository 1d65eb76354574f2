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

/// Whether `connect` names a PostgreSQL server.
pub(crate) fn is_postgres(connect: &str) -> bool {
    connect.starts_with("postgres://") || connect.starts_with("postgresql://")
}

/// Whether `connect` names a MySQL / MariaDB server.
pub(crate) fn is_mysql(connect: &str) -> bool {
    connect.starts_with("mysql://") || connect.starts_with("mariadb://")
}

/// Whether `connect` names a Redis server (or the Sentinels of one, or a Redis Cluster).
pub(crate) fn is_redis(connect: &str) -> bool {
    connect.starts_with("redis://")
        || connect.starts_with("rediss://")
        || connect.starts_with("redis+unix://")
        || is_sentinel(connect)
        || is_cluster(connect)
}

/// Whether `connect` names a Redis Cluster (`redis+cluster://host:port[,...]`).
pub(crate) fn is_cluster(connect: &str) -> bool {
    connect.starts_with("redis+cluster://")
}

/// (first slot, last slot, index of the primary that owns them).
type SlotRanges = Vec<(i64, i64, usize)>;

/// A Redis Cluster's primaries and the slots each owns (`CLUSTER SLOTS`, asked once of the
/// first node of the URL that answers), with a connection to that node to ask a key's slot
/// (`CLUSTER KEYSLOT`). Made before the timed window; rslock's keys are routed by it, and the
/// server's counters are read on every primary.
#[derive(Clone)]
pub(crate) struct ClusterMap {
    /// The primaries' `redis://host:port/` URLs, in the order of their addresses.
    pub(crate) primaries: Vec<String>,
    ranges: SlotRanges,
    conn: MultiplexedConnection,
}

impl ClusterMap {
    /// Asks the nodes of `connect` (`redis+cluster://host:port[,...]`) in turn.
    pub(crate) async fn ask(connect: &str) -> Result<ClusterMap> {
        let hosts = connect
            .strip_prefix("redis+cluster://")
            .map(|r| r.trim_end_matches('/'))
            .ok_or_else(|| BenchError(format!("not a Cluster URL: {connect}")))?;
        let mut last = String::from("no node given");
        for host in hosts.split(',').filter(|h| !h.is_empty()) {
            let asked = async {
                let client = redis::Client::open(format!("redis://{host}/"))?;
                let mut conn = client.get_multiplexed_async_connection().await?;
                let slots: redis::Value = redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut conn)
                    .await?;
                Ok::<_, redis::RedisError>((conn, slots))
            };
            match asked.await {
                Ok((conn, slots)) => match parse_slots(&slots, host) {
                    Some((primaries, ranges)) => {
                        return Ok(ClusterMap {
                            primaries,
                            ranges,
                            conn,
                        })
                    }
                    None => last = format!("{host}: CLUSTER SLOTS: {slots:?}"),
                },
                Err(e) => last = format!("{host}: {e}"),
            }
        }
        Err(BenchError(format!(
            "no Cluster node gave its slots: {last}"
        )))
    }

    /// The index in [`primaries`](Self::primaries) of the primary that owns `key`'s slot.
    pub(crate) async fn owner(&self, key: &str) -> Result<usize> {
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| BenchError(format!("CLUSTER KEYSLOT: {e}")))?;
        self.ranges
            .iter()
            .find(|&&(a, b, _)| (a..=b).contains(&slot))
            .map(|&(_, _, i)| i)
            .ok_or_else(|| BenchError(format!("no primary owns slot {slot}")))
    }

    /// How many of `keys` each primary owns, `a/b/c` in the order of
    /// [`primaries`](Self::primaries).
    pub(crate) async fn spread(&self, keys: &[String]) -> Result<String> {
        let mut counts = vec![0usize; self.primaries.len()];
        for key in keys {
            counts[self.owner(key).await?] += 1;
        }
        Ok(counts
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join("/"))
    }

    /// A key name starting with `prefix` whose slot primary `i` owns.
    async fn key_on(&self, prefix: &str, i: usize) -> Result<String> {
        for j in 0..10_000 {
            let key = format!("{prefix}{j}");
            if self.owner(&key).await? == i {
                return Ok(key);
            }
        }
        Err(BenchError(format!("no key of {prefix:?} on primary {i}")))
    }

    /// Connections to every primary, for their counters (`INFO stats`).
    pub(crate) async fn connections(&self) -> Result<Vec<MultiplexedConnection>> {
        let mut conns = Vec::with_capacity(self.primaries.len());
        for url in &self.primaries {
            conns.push(redis_connection(url).await?);
        }
        Ok(conns)
    }
}

/// The primaries and slot ranges of a `CLUSTER SLOTS` reply (`[[start, end, [host, port, ...],
/// replicas...], ...]`); an empty host is `asked`'s.
fn parse_slots(reply: &redis::Value, asked: &str) -> Option<(Vec<String>, SlotRanges)> {
    let int = |v: &redis::Value| match v {
        redis::Value::Int(i) => Some(*i),
        _ => None,
    };
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let redis::Value::Array(ranges) = reply else {
        return None;
    };
    let asked_host = asked.rsplit_once(':').map_or(asked, |(h, _)| h);
    let mut found = Vec::new();
    for range in ranges {
        let redis::Value::Array(fields) = range else {
            return None;
        };
        let (start, end) = (int(fields.first()?)?, int(fields.get(1)?)?);
        let redis::Value::Array(primary) = fields.get(2)? else {
            return None;
        };
        let host = text(primary.first()?)?;
        let host = if host.is_empty() {
            asked_host.to_string()
        } else {
            host
        };
        let port = int(primary.get(1)?)?;
        found.push((start, end, format!("redis://{host}:{port}/")));
    }
    let mut primaries: Vec<String> = found.iter().map(|(_, _, u)| u.clone()).collect();
    primaries.sort_by_key(|u| {
        let addr = u.trim_start_matches("redis://").trim_end_matches('/');
        let (h, p) = addr.rsplit_once(':').unwrap_or((addr, "0"));
        (h.to_string(), p.parse::<u16>().unwrap_or(0))
    });
    primaries.dedup();
    let ranges = found
        .into_iter()
        .map(|(a, b, u)| (a, b, primaries.iter().position(|p| *p == u).unwrap_or(0)))
        .collect();
    Some((primaries, ranges))
}

/// The name of zklock's exclusive key of lock path `path` on a Redis Cluster,
/// `zklock:lock:{<tag>}<path>`, the tag being the FNV-1a 64-bit hash of the path in 16
/// lowercase hex digits (zklock-core's `keys::Layout::Tagged`, a wire format that does not
/// change): every key of the lock shares its slot.
pub(crate) fn zklock_cluster_key(path: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("zklock:lock:{{{h:016x}}}{path}")
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
    let tls = options.tls.clone();
    let builder = match zklock_core::BackendKind::of(&options.connect)? {
        zklock_core::BackendKind::Redis => builder.redis(|r| {
            let r = r.lease(REDIS_TTL);
            let r = match tls {
                Some(tls) => r.tls(tls),
                None => r,
            };
            match options.replica_acks {
                0 => r,
                n => r.replica_acks(n, crate::REPLICA_ACK_TIMEOUT),
            }
        }),
        zklock_core::BackendKind::Postgres => builder,
        zklock_core::BackendKind::MySql => builder.mysql(|my| {
            let my = my.lease(MYSQL_LEASE);
            match tls {
                Some(tls) => my.tls(tls),
                None => my,
            }
        }),
        _ => builder.zookeeper(|zk| {
            let zk = zk.session_timeout(options.session_timeout);
            match tls {
                Some(tls) => zk.tls_settings(tls),
                None => zk,
            }
        }),
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
    /// rslock's manager on the one Redis server; on a Redis Cluster, one manager per primary,
    /// each key going to the manager of its slot's primary.
    Rslock {
        managers: Vec<rslock::LockManager>,
        /// Per key, the index of its manager in `managers`.
        route: Vec<usize>,
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
    /// Redis Cluster: its primaries and slots, asked before the timed window.
    pub(crate) cluster: Option<ClusterMap>,
    /// Redis Cluster: per rslock key, the index of the primary that owns its slot.
    rslock_route: Vec<usize>,
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
        let cluster = match is_cluster(&options.connect) {
            true => Some(ClusterMap::ask(&options.connect).await?),
            false => None,
        };
        let mut rslock_route = vec![0; keys + 1];
        if let (Some(map), Peer::Rslock) = (&cluster, peer) {
            for (k, owner) in rslock_route.iter_mut().enumerate() {
                *owner = map.owner(&redis_key(&root, k)).await?;
            }
        }
        Ok(Setup {
            peer,
            root,
            naive: Arc::default(),
            admin,
            attempts: Arc::default(),
            cluster,
            rslock_route,
        })
    }

    /// Opens one session with handles for `keys` keys (plus the warm-up key).
    pub(crate) async fn contender(&self, options: &Options, keys: usize) -> Result<Contender> {
        let all = 0..=keys;
        if is_redis(&options.connect) {
            let keys: Vec<String> = all.map(|k| redis_key(&self.root, k)).collect();
            return Ok(match self.peer {
                Peer::Zklock => {
                    let manager = zklock_manager(options, &self.root).await?;
                    let mutexes = (0..keys.len())
                        .map(|k| manager.mutex(&format!("k{k}")))
                        .collect::<zklock_core::Result<_>>()?;
                    Contender::Zklock { manager, mutexes }
                }
                Peer::Floor if self.cluster.is_some() => {
                    return Err(BenchError(
                        "on a Redis Cluster: zklock and rslock (the floor runs on one server)"
                            .into(),
                    ))
                }
                Peer::Floor => Contender::RedisFloor {
                    conn: redis_connection(&options.connect).await?,
                    keys,
                    id: uuid::Uuid::new_v4().to_string(),
                    release: redis::Script::new(COMPARE_AND_DELETE),
                    attempts: self.attempts.clone(),
                },
                Peer::Rslock => match &self.cluster {
                    // rslock on a Cluster, routed by hand: a plain manager per primary, each
                    // key sent to its slot's (the map asked before the window).
                    Some(map) => Contender::Rslock {
                        managers: map
                            .primaries
                            .iter()
                            .map(|url| rslock::LockManager::new(vec![url.clone()]))
                            .collect(),
                        route: self.rslock_route.clone(),
                        keys,
                    },
                    None => Contender::Rslock {
                        managers: vec![rslock::LockManager::new(vec![
                            redis_data_url(&options.connect).await?,
                        ])],
                        route: vec![0; keys.len()],
                        keys,
                    },
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

/// The Redis key of the floor's and rslock's key `k` in the run under `root`.
fn redis_key(root: &str, k: usize) -> String {
    format!("bench:{root}:k{k}")
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
            Contender::Rslock {
                managers,
                route,
                keys,
            } => {
                let manager = &managers[route[k]];
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

    /// The names of the keys this session's handles take, for their slots on a Redis Cluster
    /// (zklock: each lock's exclusive key; every key of a lock shares its slot).
    pub(crate) fn cluster_keys(&self) -> Vec<String> {
        match self {
            Contender::Zklock { mutexes, .. } => mutexes
                .iter()
                .map(|m| zklock_cluster_key(m.path()))
                .collect(),
            Contender::Rslock { keys, .. } | Contender::RedisFloor { keys, .. } => keys.clone(),
            _ => vec![],
        }
    }

    /// On a Redis Cluster, one untimed acquire and release on a key of each primary, so that
    /// the session's connection to every primary is open before the timed window (zklock and
    /// rslock connect to a node on its first request).
    pub(crate) async fn reach_every_primary(&self, map: &ClusterMap) -> Result<()> {
        let own = uuid::Uuid::new_v4().simple().to_string();
        for i in 0..map.primaries.len() {
            match self {
                Contender::Zklock { manager, .. } => {
                    let mut name = None;
                    for j in 0..10_000 {
                        let candidate = format!("reach-{own}-{j}");
                        let key = zklock_cluster_key(&manager.path_of(&candidate)?);
                        if map.owner(&key).await? == i {
                            name = Some(candidate);
                            break;
                        }
                    }
                    let name = name.ok_or_else(|| BenchError(format!("no key on primary {i}")))?;
                    manager.mutex(&name)?.lock().await?.release().await?;
                }
                Contender::Rslock { managers, .. } => {
                    let key = map.key_on(&format!("bench:reach:{own}:"), i).await?;
                    let lock = managers[i]
                        .acquire_no_guard(key.as_bytes(), REDIS_TTL)
                        .await
                        .map_err(|e| BenchError(format!("rslock: {e}")))?;
                    managers[i].unlock(&lock).await;
                }
                _ => {}
            }
        }
        Ok(())
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

/// The lease of zklock's holds (here and in the memory probes): long enough that the bench's
/// load never makes a liveness check late.
pub(crate) const MYSQL_LEASE: std::time::Duration = std::time::Duration::from_secs(10);

/// A plain session on `url` (`mariadb://` read as `mysql://`), over TCP as zklock's sessions
/// are: `TCP_NODELAY` on, and no switch to the server's Unix socket (which `mysql_async` makes
/// by default on a loopback address).
pub(crate) async fn mysql_session(url: &str) -> Result<mysql_async::Conn> {
    let url = match url.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("mariadb") => {
            format!("mysql://{rest}")
        }
        _ => url.to_string(),
    };
    let opts = mysql_async::Opts::from_url(&url)
        .map_err(|e| BenchError(format!("mysql: the URL: {e}")))?;
    let opts = mysql_async::OptsBuilder::from_opts(opts)
        .prefer_socket(false)
        .tcp_nodelay(true);
    mysql_async::Conn::new(opts)
        .await
        .map_err(|e| BenchError(format!("mysql: {e}")))
}

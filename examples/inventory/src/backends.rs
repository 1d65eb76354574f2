//! The lock services the demo compares, and how it starts each one.
//!
//! The service itself knows none of them: it hands its `--lock` connect string to
//! [`LockManager::builder`](zklock::LockManager::builder), which picks the backend from it (a
//! ZooKeeper connect string, `redis://...`, `redis+sentinel://...`, `postgres://...`,
//! `etcd://...`, `mysql://...`). Adding a backend to the demo is this file only:
//! a variant of [`LockBackend`], its entries in [`LockBackend::ALL`] (or
//! [`LockBackend::OPT_IN`]) and the `match`es below (its name, its title, what its holds
//! expire by), and how [`LockService::start`] starts a throwaway server for it through the
//! test kit.

use std::fmt;
use std::io;
use std::str::FromStr;
use std::sync::Arc;

use zklock_testkit::{
    EtcdServer, MariaDbServer, PostgresServer, RedisSentinel, RedisServer, ZkServer,
};

/// A lock service the demo runs the inventory service on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LockBackend {
    /// Apache ZooKeeper: a hold lives as long as the instance's session.
    Zookeeper,
    /// Redis: a hold is a lease that the instance's watchdog renews.
    Redis,
    /// PostgreSQL: a hold is a session-level advisory lock on a connection the instance owns,
    /// ended by the server when the session stays idle past the lease
    /// (`idle_session_timeout`).
    Postgres,
    /// etcd: a hold is a key on the instance's lease, in etcd's own lock format, which the
    /// instance keeps alive.
    Etcd,
    /// MySQL / MariaDB: a hold is a user lock (`GET_LOCK`) of a session the instance owns,
    /// ended by the server when the session stays idle past the lease (`wait_timeout`).
    MySql,
    /// Redis under Sentinel (a primary, 2 replicas, 3 Sentinels): a lease on the primary the
    /// Sentinels name, as on Redis; the demo fails the primary over in the middle of the
    /// orders (`SENTINEL FAILOVER`), which makes every hold lost. Run only when asked
    /// (`--modes redis-sentinel`): not part of `lock`.
    RedisSentinel,
}

impl LockBackend {
    /// Every backend, in the order the demo runs them (and the table shows them).
    pub const ALL: [LockBackend; 5] = [
        LockBackend::Zookeeper,
        LockBackend::Redis,
        LockBackend::Postgres,
        LockBackend::Etcd,
        LockBackend::MySql,
    ];

    /// The backends run only when `--modes` names them (`lock` does not include them).
    pub const OPT_IN: [LockBackend; 1] = [LockBackend::RedisSentinel];

    /// Whether the demo fails this backend's primary over in the middle of the orders.
    pub fn fails_over(self) -> bool {
        self == LockBackend::RedisSentinel
    }

    /// The name in `--modes` and in the machine-readable lines (`backend=zk`).
    pub fn name(self) -> &'static str {
        match self {
            LockBackend::Zookeeper => "zk",
            LockBackend::Redis => "redis",
            LockBackend::Postgres => "postgres",
            LockBackend::Etcd => "etcd",
            LockBackend::MySql => "mysql",
            LockBackend::RedisSentinel => "redis-sentinel",
        }
    }

    /// The title in the table.
    pub fn title(self) -> &'static str {
        match self {
            LockBackend::Zookeeper => "ZooKeeper",
            LockBackend::Redis => "Redis",
            LockBackend::Postgres => "PostgreSQL",
            LockBackend::Etcd => "etcd",
            LockBackend::MySql => "MySQL",
            LockBackend::RedisSentinel => "Redis Sentinel",
        }
    }

    /// What a frozen holder's hold runs out by; the pause scenario freezes it past this.
    pub fn expiry(self) -> &'static str {
        match self {
            LockBackend::Zookeeper => "session timeout",
            LockBackend::Redis => "lease",
            LockBackend::Postgres => "lease (idle_session_timeout)",
            LockBackend::Etcd => "lease (TTL)",
            LockBackend::MySql => "lease (wait_timeout)",
            LockBackend::RedisSentinel => "lease",
        }
    }

    /// The backend a connect string names (`redis://...`, `redis+sentinel://...`,
    /// `postgres://...` or a ZooKeeper `host:port,...`), as
    /// [`LockManager::builder`](zklock::LockManager::builder) reads it.
    pub fn of_connect_string(connect: &str) -> LockBackend {
        let lower = connect.trim().to_ascii_lowercase();
        if lower.starts_with("redis+sentinel://") {
            LockBackend::RedisSentinel
        } else if ["postgres://", "postgresql://"]
            .iter()
            .any(|scheme| lower.starts_with(scheme))
        {
            LockBackend::Postgres
        } else if lower.starts_with("etcd://") {
            LockBackend::Etcd
        } else if ["mysql://", "mariadb://"]
            .iter()
            .any(|scheme| lower.starts_with(scheme))
        {
            LockBackend::MySql
        } else if ["redis://", "rediss://", "redis+unix://", "unix://"]
            .iter()
            .any(|scheme| lower.starts_with(scheme))
        {
            LockBackend::Redis
        } else {
            LockBackend::Zookeeper
        }
    }
}

impl fmt::Display for LockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.title())
    }
}

impl FromStr for LockBackend {
    type Err = String;

    fn from_str(s: &str) -> Result<LockBackend, String> {
        LockBackend::ALL
            .into_iter()
            .chain(LockBackend::OPT_IN)
            .find(|b| {
                b.name() == s
                    || (s == "zookeeper" && *b == LockBackend::Zookeeper)
                    || (s == "postgresql" && *b == LockBackend::Postgres)
            })
            .ok_or_else(|| {
                let names: Vec<_> = LockBackend::ALL
                    .iter()
                    .chain(&LockBackend::OPT_IN)
                    .map(|b| b.name())
                    .collect();
                format!("unknown lock backend {s:?}: {}", names.join(", "))
            })
    }
}

/// A server of one lock service, started by the test kit (stopped on drop), or one given.
pub enum Server {
    /// A throwaway ZooKeeper.
    Zookeeper(ZkServer),
    /// A throwaway redis-server (a server of its own, not the one holding the stock).
    Redis(RedisServer),
    /// A throwaway PostgreSQL (its own data directory, run as an unprivileged user).
    Postgres(PostgresServer),
    /// A throwaway etcd (one member, its own data directory).
    Etcd(EtcdServer),
    /// A throwaway MariaDB (its own data directory, run as an unprivileged user).
    MySql(MariaDbServer),
    /// A throwaway Redis primary with 2 replicas and 3 Sentinels (shared with the driver,
    /// which fails it over).
    RedisSentinel(Arc<RedisSentinel>),
    /// A running service the user named (`ZKLOCK_CONNECT`).
    External,
}

/// A lock service the demo runs on: its backend and the connect string the instances get.
pub struct LockService {
    /// Which backend.
    pub backend: LockBackend,
    /// What the instances pass to `LockManager::builder`.
    pub connect: String,
    /// Where it came from; the server stops when this is dropped.
    pub server: Server,
}

impl LockService {
    /// Starts a throwaway server of `backend` on a free loopback port.
    ///
    /// # Errors
    /// When the server cannot be started (the error names it).
    pub fn start(backend: LockBackend) -> io::Result<LockService> {
        let (connect, server) = match backend {
            LockBackend::Zookeeper => {
                let server = ZkServer::start()
                    .map_err(|e| io::Error::other(format!("starting ZooKeeper: {e}")))?;
                (server.connect_string(), Server::Zookeeper(server))
            }
            LockBackend::Redis => {
                let server = RedisServer::start()
                    .map_err(|e| io::Error::other(format!("starting redis-server: {e}")))?;
                (server.url(), Server::Redis(server))
            }
            LockBackend::Postgres => {
                let server = PostgresServer::start()
                    .map_err(|e| io::Error::other(format!("starting PostgreSQL: {e}")))?;
                (server.url(), Server::Postgres(server))
            }
            LockBackend::Etcd => {
                let server = EtcdServer::start()
                    .map_err(|e| io::Error::other(format!("starting etcd: {e}")))?;
                (server.url(), Server::Etcd(server))
            }
            LockBackend::MySql => {
                let server = MariaDbServer::start()
                    .map_err(|e| io::Error::other(format!("starting MariaDB: {e}")))?;
                (server.url(), Server::MySql(server))
            }
            LockBackend::RedisSentinel => {
                let server = RedisSentinel::start()
                    .map_err(|e| io::Error::other(format!("starting Redis with Sentinels: {e}")))?;
                let connect = format!(
                    "redis+sentinel://{}/{}",
                    server.sentinel_addrs().join(","),
                    server.master_name()
                );
                (connect, Server::RedisSentinel(Arc::new(server)))
            }
        };
        Ok(LockService {
            backend,
            connect,
            server,
        })
    }

    /// The Sentinel deployment, if the demo started one (to fail it over).
    pub fn sentinel(&self) -> Option<Arc<RedisSentinel>> {
        match &self.server {
            Server::RedisSentinel(s) => Some(s.clone()),
            _ => None,
        }
    }

    /// A running service at `connect` (its backend read from the string).
    pub fn external(connect: String) -> LockService {
        LockService {
            backend: LockBackend::of_connect_string(&connect),
            connect,
            server: Server::External,
        }
    }
}

impl fmt::Debug for LockService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockService")
            .field("backend", &self.backend)
            .field("connect", &self.connect)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_connect_strings_name_their_backend() {
        for b in LockBackend::ALL.into_iter().chain(LockBackend::OPT_IN) {
            assert_eq!(b.name().parse::<LockBackend>(), Ok(b));
        }
        assert!(!LockBackend::ALL.contains(&LockBackend::RedisSentinel));
        assert_eq!(
            LockBackend::of_connect_string("redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/m"),
            LockBackend::RedisSentinel
        );
        assert_eq!(
            LockBackend::of_connect_string("redis://127.0.0.1:6379/"),
            LockBackend::Redis
        );
        assert_eq!(
            LockBackend::of_connect_string("127.0.0.1:2181,127.0.0.1:2182/app"),
            LockBackend::Zookeeper
        );
        assert_eq!(
            LockBackend::of_connect_string("postgres://zklock@127.0.0.1:5432/zklock"),
            LockBackend::Postgres
        );
        assert_eq!(
            "postgresql".parse::<LockBackend>(),
            Ok(LockBackend::Postgres)
        );
        assert_eq!(
            LockBackend::of_connect_string("etcd://127.0.0.1:2379,127.0.0.1:2381"),
            LockBackend::Etcd
        );
        assert_eq!("etcd".parse::<LockBackend>(), Ok(LockBackend::Etcd));
        assert_eq!(
            LockBackend::of_connect_string("mariadb://zklock:zklock@127.0.0.1:3306/zklock"),
            LockBackend::MySql
        );
        assert_eq!("mysql".parse::<LockBackend>(), Ok(LockBackend::MySql));
        assert!("mongodb".parse::<LockBackend>().is_err());
    }
}

/// Whether the instances lock, and on which lock service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Started with `--no-lock`: read, check and write with nothing around them.
    NoLock,
    /// Each order under the lock `sku_{sku}` on this backend, its write fenced in the store.
    Lock(LockBackend),
}

impl Mode {
    /// The name in the machine-readable line: `nolock` or `lock`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::NoLock => "nolock",
            Mode::Lock(_) => "lock",
        }
    }

    /// The lock backend, if the mode locks.
    pub fn backend(self) -> Option<LockBackend> {
        match self {
            Mode::NoLock => None,
            Mode::Lock(b) => Some(b),
        }
    }

    /// The title in the table and in progress lines.
    pub fn title(self) -> String {
        match self {
            Mode::NoLock => "without lock".into(),
            Mode::Lock(b) => format!("lock on {}", b.title()),
        }
    }

    /// Where its instances' logs go (under the demo's log directory).
    pub(crate) fn log_dir(self) -> String {
        match self {
            Mode::NoLock => "nolock".into(),
            Mode::Lock(b) => format!("lock-{}", b.name()),
        }
    }
}

//! Connecting: the connect string's scheme picks the backend (the one scheme parser,
//! [`BackendKind::of`]), the settings are checked against that backend, and the backend is
//! opened. With the builder, the only place above the seam that names a backend's types.

use std::sync::Arc;
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "etcd",
    feature = "mysql"
))]
use std::time::Duration;

use super::builder::Builder;
use super::LockManager;
#[cfg(feature = "etcd")]
use crate::backend::etcd::{self, EtcdBackend, EtcdConfig};
use crate::backend::memory::MemoryBackend;
#[cfg(feature = "mysql")]
use crate::backend::mysql::{self, MySqlBackend, MySqlConfig};
#[cfg(feature = "postgres")]
use crate::backend::postgres::{self, PostgresBackend, PostgresConfig};
#[cfg(feature = "redis")]
use crate::backend::redis::{RedisBackend, RedisConfig, MIN_LEASE};
#[cfg(feature = "zookeeper")]
use crate::backend::zk::{SessionConfig, SessionOwner, ZkBackend, ZkConfig};
use crate::backend::Backend;
use crate::types::backend_kind::BackendKind;
use crate::types::error::{redacted, Error, Result};
use crate::types::key::validate_path;

/// How long opening a Redis connection may take unless
/// [`connect_timeout`](Builder::connect_timeout) says otherwise.
#[cfg(feature = "redis")]
const DEFAULT_REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long opening a PostgreSQL connection may take unless
/// [`connect_timeout`](Builder::connect_timeout) says otherwise.
#[cfg(feature = "postgres")]
const DEFAULT_POSTGRES_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long opening a MySQL session may take unless
/// [`connect_timeout`](Builder::connect_timeout) says otherwise.
#[cfg(feature = "mysql")]
const DEFAULT_MYSQL_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long connecting to etcd may take unless [`connect_timeout`](Builder::connect_timeout)
/// says otherwise: a cluster with no member up is reported in about this long.
#[cfg(feature = "etcd")]
const DEFAULT_ETCD_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

impl Builder {
    /// Opens the backend the connect string names (a ZooKeeper session; Redis, PostgreSQL or
    /// etcd connections) and returns the manager.
    ///
    /// Must run inside a tokio runtime, which then serves the backend's background work.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad namespace or setting: a connect string whose scheme no
    /// backend takes, a URL whose backend's feature is off, settings of a backend the connect
    /// string does not name, a lease too short; [`Error::Unreachable`] or [`Error::Refused`]
    /// when no ZooKeeper server answers in time, [`Error::Server`] when a Redis, PostgreSQL or
    /// etcd server does not; [`Error::Tls`] when a TLS handshake fails.
    pub async fn connect(self) -> Result<LockManager> {
        // A namespace is configuration, not an argument of a call.
        validate_path(&self.namespace, "namespace").map_err(|e| match e {
            Error::InvalidArgument(msg) => Error::Config(msg),
            e => e,
        })?;
        // It goes into every contender node: oversized node data makes the server drop the
        // connection (and every hold of the session) on each create.
        const MAX_IDENTITY_LEN: usize = 1024;
        if let Some(id) = self
            .identity
            .as_deref()
            .filter(|id| id.len() > MAX_IDENTITY_LEN)
        {
            return Err(Error::Config(format!(
                "the identity is {} bytes long; keep it under {MAX_IDENTITY_LEN} bytes",
                id.len()
            )));
        }
        let kind = BackendKind::of(&self.connect)?;
        self.refuse_other_backends(kind)?;
        match kind {
            BackendKind::ZooKeeper => self.connect_zookeeper().await,
            BackendKind::Redis => self.connect_redis().await,
            BackendKind::Postgres => self.connect_postgres().await,
            BackendKind::Etcd => self.connect_etcd().await,
            BackendKind::MySql => self.connect_mysql().await,
            // No connect string names it (`LockManager::in_memory` makes it).
            BackendKind::Memory => unreachable!("BackendKind::of never gives Memory"),
        }
    }

    /// What an administrator runs once so that a narrow account can use the backend the
    /// connect string names, if it needs anything: on PostgreSQL and MySQL, the SQL that
    /// creates zklock's table and, with `grant_to`, gives that role (on MySQL, that
    /// `'user'@'host'` account) exactly what zklock uses (`zklock setup` prints it). No
    /// connection is made. The other backends need no set-up (`None`); their accounts are in
    /// the security guide.
    ///
    /// # Errors
    /// [`Error::Config`] for a connect string whose scheme no backend takes (or PostgreSQL
    /// without the `postgres` feature); [`Error::InvalidArgument`] for a role name with a NUL
    /// byte.
    ///
    /// ```
    /// use zklock_core::LockManager;
    ///
    /// let sql = LockManager::builder("postgres://admin@db/app")
    ///     .setup_sql(Some("locks"))?
    ///     .expect("PostgreSQL needs its table");
    /// assert!(sql.contains("CREATE TABLE IF NOT EXISTS zklock_keys"));
    /// assert!(sql.contains(r#"TO "locks""#));
    /// assert!(LockManager::builder("redis://cache:6379").setup_sql(None)?.is_none());
    /// # Ok::<(), zklock_core::Error>(())
    /// ```
    pub fn setup_sql(&self, grant_to: Option<&str>) -> Result<Option<String>> {
        #[cfg(not(any(feature = "postgres", feature = "mysql")))]
        let _ = grant_to;
        match BackendKind::of(&self.connect)? {
            #[cfg(feature = "postgres")]
            BackendKind::Postgres => postgres::setup_sql(grant_to).map(Some),
            #[cfg(not(feature = "postgres"))]
            BackendKind::Postgres => Err(Error::Config(
                "zklock was built without its `postgres` feature".into(),
            )),
            #[cfg(feature = "mysql")]
            BackendKind::MySql => mysql::setup_sql(grant_to).map(Some),
            #[cfg(not(feature = "mysql"))]
            BackendKind::MySql => Err(Error::Config(
                "zklock was built without its `mysql` feature".into(),
            )),
            _ => Ok(None),
        }
    }

    /// Refuses the settings of a backend other than `kind`: they would be silently ignored.
    /// The builder's method for each backend's settings is named by its label.
    fn refuse_other_backends(&self, kind: BackendKind) -> Result<()> {
        let given: &[(BackendKind, bool)] = &[
            #[cfg(feature = "zookeeper")]
            (BackendKind::ZooKeeper, self.zookeeper.is_some()),
            #[cfg(feature = "redis")]
            (BackendKind::Redis, self.redis.is_some()),
            #[cfg(feature = "postgres")]
            (BackendKind::Postgres, self.postgres.is_some()),
            #[cfg(feature = "etcd")]
            (BackendKind::Etcd, self.etcd.is_some()),
            #[cfg(feature = "mysql")]
            (BackendKind::MySql, self.mysql.is_some()),
        ];
        for &(other, set) in given {
            if set && other != kind {
                return Err(Error::Config(format!(
                    "{} settings were given (Builder::{}), but the connect string {} names \
                     {}: they would have no effect; give {} settings through Builder::{}",
                    other.name(),
                    other.label(),
                    redacted(&self.connect),
                    kind.name(),
                    kind.name(),
                    kind.label(),
                )));
            }
        }
        Ok(())
    }

    /// Connects the ZooKeeper backend.
    #[cfg(feature = "zookeeper")]
    async fn connect_zookeeper(self) -> Result<LockManager> {
        let zk = self.zookeeper.clone().unwrap_or_default();
        let session = SessionOwner::connect(SessionConfig {
            connect: self.connect.clone(),
            session_timeout: zk.session_timeout,
            connect_timeout: self.connect_timeout,
            disconnect_policy: zk.disconnect_policy,
            renew_session: zk.renew_session,
            digest: zk.digest.clone(),
            #[cfg(feature = "tls")]
            tls: zk.tls_options(&self.connect)?,
        })
        .await?;
        let backend = Arc::new(ZkBackend::new(
            session,
            ZkConfig {
                revocable: zk.revocable,
                watch_held_nodes: zk.watch_held_nodes,
                identity: self.identity.clone(),
                protected: zk.digest.is_some(),
                owner: zk.digest.as_deref().map(crate::backend::zk::digest_id),
            },
        ));
        Ok(LockManager::assemble(backend as Arc<dyn Backend>, &self))
    }

    /// Connects the Redis backend.
    #[cfg(feature = "redis")]
    async fn connect_redis(self) -> Result<LockManager> {
        let options = self.redis.clone().unwrap_or_default();
        let lease = options.lease;
        check_lease(BackendKind::Redis, lease, MIN_LEASE, "renewals")?;
        if let Some(acks) = options.acks {
            if acks.timeout.is_zero() || acks.timeout >= lease / 3 || acks.replicas == 0 {
                return Err(Error::Config(format!(
                    "replica_acks({}, {:?}) is not usable with a lease of {lease:?}: give at least \
                     one replica and a timeout above zero and below a third of the lease (a \
                     renewal goes out every lease/3, and Redis's WAIT with timeout 0 waits for \
                     ever)",
                    acks.replicas, acks.timeout
                )));
            }
        }
        let backend = RedisBackend::connect(RedisConfig {
            url: self.connect.clone(),
            lease,
            acks: options.acks,
            sentinel_auth: options.sentinel_auth.clone(),
            tls: options.tls.clone(),
            connect_timeout: self
                .connect_timeout
                .unwrap_or(DEFAULT_REDIS_CONNECT_TIMEOUT),
            identity: self.identity.clone(),
            tokens: self.fencing_tokens,
        })
        .await?;
        Ok(LockManager::assemble(Arc::new(backend), &self))
    }

    /// Connects the PostgreSQL backend.
    #[cfg(feature = "postgres")]
    async fn connect_postgres(self) -> Result<LockManager> {
        let options = self.postgres.clone().unwrap_or_default();
        let lease = options.lease;
        check_lease(
            BackendKind::Postgres,
            lease,
            postgres::MIN_LEASE,
            "liveness checks",
        )?;
        let backend = PostgresBackend::connect(PostgresConfig {
            url: self.connect.clone(),
            tls: options.tls,
            lease,
            connect_timeout: self
                .connect_timeout
                .unwrap_or(DEFAULT_POSTGRES_CONNECT_TIMEOUT),
            identity: self.identity.clone(),
            tokens: self.fencing_tokens,
        })
        .await?;
        Ok(LockManager::assemble(Arc::new(backend), &self))
    }

    /// Connects the MySQL / MariaDB backend.
    #[cfg(feature = "mysql")]
    async fn connect_mysql(self) -> Result<LockManager> {
        let options = self.mysql.clone().unwrap_or_default();
        check_lease(
            BackendKind::MySql,
            options.lease,
            mysql::MIN_LEASE,
            "liveness checks",
        )?;
        let backend = MySqlBackend::connect(MySqlConfig {
            url: self.connect.clone(),
            options,
            connect_timeout: self
                .connect_timeout
                .unwrap_or(DEFAULT_MYSQL_CONNECT_TIMEOUT),
            identity: self.identity.clone(),
            tokens: self.fencing_tokens,
        })
        .await?;
        Ok(LockManager::assemble(Arc::new(backend), &self))
    }

    /// A MySQL URL without the `mysql` feature.
    #[cfg(not(feature = "mysql"))]
    async fn connect_mysql(self) -> Result<LockManager> {
        Err(Error::Config(
            "the connect string is a MySQL URL, but zklock was built without its `mysql` \
             feature; enable it (zklock = { version = \"...\", features = [\"mysql\"] })"
                .into(),
        ))
    }

    /// Connects the etcd backend.
    #[cfg(feature = "etcd")]
    async fn connect_etcd(self) -> Result<LockManager> {
        let options = self.etcd.clone().unwrap_or_default();
        check_lease(
            BackendKind::Etcd,
            options.lease,
            etcd::MIN_LEASE,
            "keep-alives",
        )?;
        if options.lease.subsec_nanos() != 0 {
            return Err(Error::Config(format!(
                "the etcd lease is {:?}; give whole seconds (etcd counts leases in seconds)",
                options.lease
            )));
        }
        let backend = EtcdBackend::connect(EtcdConfig {
            url: self.connect.clone(),
            options,
            connect_timeout: self.connect_timeout.unwrap_or(DEFAULT_ETCD_CONNECT_TIMEOUT),
            identity: self.identity.clone(),
            tokens: self.fencing_tokens,
        })
        .await?;
        Ok(LockManager::assemble(Arc::new(backend), &self))
    }

    /// An etcd URL without the `etcd` feature.
    #[cfg(not(feature = "etcd"))]
    async fn connect_etcd(self) -> Result<LockManager> {
        Err(Error::Config(
            "the connect string is an etcd URL, but zklock was built without its `etcd` \
             feature; enable it (zklock = { version = \"...\", features = [\"etcd\"] })"
                .into(),
        ))
    }

    /// A PostgreSQL URL without the `postgres` feature.
    #[cfg(not(feature = "postgres"))]
    async fn connect_postgres(self) -> Result<LockManager> {
        Err(Error::Config(
            "the connect string is a PostgreSQL URL, but zklock was built without its \
             `postgres` feature; enable it (zklock = { version = \"...\", features = [\"postgres\"] })"
                .into(),
        ))
    }

    /// A ZooKeeper connect string without the `zookeeper` feature.
    #[cfg(not(feature = "zookeeper"))]
    async fn connect_zookeeper(self) -> Result<LockManager> {
        Err(Error::Config(format!(
            "the connect string {} names ZooKeeper servers (it has no scheme), but zklock was \
             built without its `zookeeper` feature; enable it (zklock = {{ version = \"...\", \
             features = [\"zookeeper\"] }}), or give a redis://, postgres:// or etcd:// URL",
            redacted(&self.connect)
        )))
    }

    /// A Redis URL without the `redis` feature.
    #[cfg(not(feature = "redis"))]
    async fn connect_redis(self) -> Result<LockManager> {
        Err(Error::Config(
            "the connect string is a Redis URL, but zklock was built without its `redis` \
             feature; enable it (zklock = { version = \"...\", features = [\"redis\"] })"
                .into(),
        ))
    }
}

/// Refuses a lease too short for what goes out every lease/3 to keep a hold (`renewals`).
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "etcd",
    feature = "mysql"
))]
fn check_lease(backend: BackendKind, lease: Duration, min: Duration, renewals: &str) -> Result<()> {
    if lease < min {
        return Err(Error::Config(format!(
            "the {backend} lease is {lease:?}; give at least {min:?} ({renewals} go out every \
             lease/3)"
        )));
    }
    Ok(())
}

/// A new in-memory backend (one lock table).
pub(super) fn memory() -> Arc<dyn Backend> {
    Arc::new(MemoryBackend::new())
}

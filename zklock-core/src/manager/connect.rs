//! Connecting: the connect string's scheme picks the backend (the one scheme parser), the
//! options are checked against what that backend can do, and the backend is opened. The only
//! place above the seam that names a backend's constructor.

use std::sync::Arc;
#[cfg(any(feature = "redis", feature = "postgres"))]
use std::time::Duration;

use super::builder::Builder;
use super::LockManager;
use crate::backend::memory::MemoryBackend;
#[cfg(feature = "postgres")]
use crate::backend::postgres::{self, PostgresBackend, PostgresConfig};
#[cfg(feature = "redis")]
use crate::backend::redis::{RedisBackend, RedisConfig, MIN_LEASE};
use crate::backend::zk::{SessionConfig, SessionOwner, ZkBackend, ZkConfig};
use crate::backend::Backend;
use crate::types::error::{Error, Result};
use crate::types::key::validate_path;

/// How long opening a Redis connection may take unless
/// [`connect_timeout`](Builder::connect_timeout) says otherwise.
#[cfg(feature = "redis")]
const DEFAULT_REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long opening a PostgreSQL connection may take unless
/// [`connect_timeout`](Builder::connect_timeout) says otherwise.
#[cfg(feature = "postgres")]
const DEFAULT_POSTGRES_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What [`Builder::check_lease_backend`](crate::Builder::check_lease_backend) says of one lease backend.
#[cfg(any(feature = "redis", feature = "postgres"))]
struct LeaseBackend {
    /// As messages name it.
    name: &'static str,
    /// As [`Error::Unsupported`] names it.
    id: &'static str,
    /// A URL that carries credentials.
    credentials: &'static str,
    /// What to do instead of `Builder::tls`.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    tls: &'static str,
    min_lease: Duration,
    /// What goes out every lease/3 to keep a hold.
    renewals: &'static str,
}

/// Whether `connect` names a PostgreSQL server (`postgres://`, `postgresql://`).
fn is_postgres_url(connect: &str) -> bool {
    let lower = connect.trim_start().to_ascii_lowercase();
    ["postgres://", "postgresql://"]
        .iter()
        .any(|scheme| lower.starts_with(scheme))
}

/// Whether `connect` names a Redis server rather than ZooKeeper servers.
fn is_redis_url(connect: &str) -> bool {
    let lower = connect.trim_start().to_ascii_lowercase();
    ["redis://", "rediss://", "redis+unix://", "unix://"]
        .iter()
        .any(|scheme| lower.starts_with(scheme))
}

/// The scheme of `connect` when it names one (`foo://…`) that no backend takes: a ZooKeeper
/// connect string is `host:port[,host:port…][/chroot]` with no scheme.
fn unknown_scheme(connect: &str) -> Option<&str> {
    let (scheme, _) = connect.trim_start().split_once("://")?;
    let known = is_redis_url(connect) || is_postgres_url(connect);
    (!known).then_some(scheme)
}

/// `connect` without the password a URL may carry.
pub(crate) fn redacted(connect: &str) -> String {
    // Any URL's user part (`scheme://user:password@host`); a ZooKeeper connect string has none.
    match (connect.find("://"), connect.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &connect[..scheme], &connect[at + 1..])
        }
        _ => connect.to_string(),
    }
}

impl Builder {
    /// Opens the session (ZooKeeper) or the connection (Redis) and returns the manager.
    ///
    /// Must run inside a tokio runtime, which then serves the session.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad namespace or option (a connect string whose scheme no
    /// backend takes, a Redis URL without the `redis` feature, a ZooKeeper-only option on
    /// Redis), [`Error::Unreachable`] when no ZooKeeper
    /// server answers in time, [`Error::Redis`](Error) when the Redis server does not.
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
        if let Some(scheme) = unknown_scheme(&self.connect) {
            return Err(Error::Config(format!(
                "no backend takes the scheme {scheme:?} of the connect string {}; give ZooKeeper \
                 servers as host:port[,host:port...][/chroot], Redis as redis://host:port (or \
                 rediss://, redis+unix://, unix://), PostgreSQL as postgres://user@host/db",
                redacted(&self.connect)
            )));
        }
        if is_redis_url(&self.connect) {
            return self.connect_redis().await;
        }
        if is_postgres_url(&self.connect) {
            return self.connect_postgres().await;
        }
        let session = SessionOwner::connect(SessionConfig {
            connect: self.connect.clone(),
            session_timeout: self.session_timeout,
            connect_timeout: self.connect_timeout,
            disconnect_policy: self.disconnect_policy,
            renew_session: self.renew_session,
            digest: self.digest.clone(),
            #[cfg(feature = "tls")]
            tls: self.tls.clone(),
        })
        .await?;
        let zk = Arc::new(ZkBackend::new(
            session,
            ZkConfig {
                revocable: self.revocable,
                watch_held_nodes: self.watch_held_nodes,
                identity: self.identity.clone(),
                protected: self.digest.is_some(),
                owner: self.digest.as_deref().map(crate::backend::zk::digest_id),
            },
        ));
        Ok(LockManager::assemble(zk as Arc<dyn Backend>, &self))
    }

    /// Refuses what a lease backend (Redis, PostgreSQL) cannot do: ZooKeeper's options, and a
    /// lease too short for its renewals.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    fn check_lease_backend(&self, b: &LeaseBackend) -> Result<()> {
        let zookeeper_only = |option: &str, instead: &str| {
            Error::Config(format!(
                "{option} is a ZooKeeper option and has no effect on {}; {instead}",
                b.name
            ))
        };
        if self.digest.is_some() {
            return Err(zookeeper_only(
                "digest_auth",
                &format!("put {} credentials in the URL ({})", b.name, b.credentials),
            ));
        }
        #[cfg(feature = "tls")]
        if self.tls.is_some() {
            return Err(zookeeper_only("tls", b.tls));
        }
        if self.revocable {
            return Err(Error::Unsupported {
                backend: b.id,
                feature: "revocation (Builder::revocable)",
            });
        }
        if self.lease < b.min_lease {
            return Err(Error::Config(format!(
                "the lease is {:?}; give at least {:?} ({} go out every lease/3)",
                self.lease, b.min_lease, b.renewals
            )));
        }
        Ok(())
    }

    /// Connects the Redis backend.
    #[cfg(feature = "redis")]
    async fn connect_redis(self) -> Result<LockManager> {
        self.check_lease_backend(&LeaseBackend {
            name: "Redis",
            id: "redis",
            credentials: "redis://user:password@host:6379",
            tls: "TLS to Redis (rediss://) is not built in; use a TLS tunnel",
            min_lease: MIN_LEASE,
            renewals: "renewals",
        })?;
        let backend = RedisBackend::connect(RedisConfig {
            url: self.connect.clone(),
            lease: self.lease,
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
        self.check_lease_backend(&LeaseBackend {
            name: "PostgreSQL",
            id: "postgres",
            credentials: "postgres://user:password@host/db",
            tls: "TLS to PostgreSQL is not built in; use a TLS tunnel",
            min_lease: postgres::MIN_LEASE,
            renewals: "liveness checks",
        })?;
        let backend = PostgresBackend::connect(PostgresConfig {
            url: self.connect.clone(),
            lease: self.lease,
            connect_timeout: self
                .connect_timeout
                .unwrap_or(DEFAULT_POSTGRES_CONNECT_TIMEOUT),
            identity: self.identity.clone(),
            tokens: self.fencing_tokens,
        })
        .await?;
        Ok(LockManager::assemble(Arc::new(backend), &self))
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

/// A new in-memory backend (one lock table).
pub(super) fn memory() -> Arc<dyn Backend> {
    Arc::new(MemoryBackend::new())
}

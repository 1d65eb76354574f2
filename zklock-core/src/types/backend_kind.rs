//! [`BackendKind`]: the one word for a backend. Its name in messages, its label in metrics,
//! tracing and [`Error::Unsupported`], and the schemes of its connect strings all derive from
//! it; nothing parses a backend back from a string.

use super::error::{redacted, Error, Result};

/// Which backend a connect string names, or a manager runs on.
///
/// [`of`](Self::of) reads it from a connect string (the in-memory backend has none: it is
/// made with [`LockManager::in_memory`](crate::LockManager::in_memory));
/// [`name`](Self::name) is how messages call it and [`label`](Self::label) how metrics,
/// tracing and [`Error::Unsupported`] do.
///
/// # Examples
///
/// ```
/// use zklock_core::BackendKind;
///
/// assert_eq!(BackendKind::of("zk1:2181,zk2:2181/app")?, BackendKind::ZooKeeper);
/// assert_eq!(BackendKind::of("redis://127.0.0.1:6379")?, BackendKind::Redis);
/// assert_eq!(BackendKind::of("postgresql://app@db/app")?, BackendKind::Postgres);
/// assert_eq!(BackendKind::of("etcd://10.0.0.1:2379,10.0.0.2:2379")?, BackendKind::Etcd);
/// assert_eq!(BackendKind::of("mariadb://app@db/app")?, BackendKind::MySql);
/// assert!(BackendKind::of("mongodb://db").is_err());
/// // One backend, two spellings, never confused: PostgreSQL in prose, postgres in labels.
/// assert_eq!(BackendKind::Postgres.name(), "PostgreSQL");
/// assert_eq!(BackendKind::Postgres.label(), "postgres");
/// # Ok::<(), zklock_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendKind {
    /// `host:port[,host:port…][/chroot]`.
    ZooKeeper,
    /// `redis://`, `rediss://`, `redis+unix://`, `unix://`, `redis+sentinel://` (the
    /// primary a set of Sentinels names) and `redis+cluster://` (a Redis Cluster).
    Redis,
    /// `postgres://`, `postgresql://`.
    Postgres,
    /// `etcd://`, `etcds://`.
    Etcd,
    /// `mysql://`, `mariadb://`.
    MySql,
    /// The in-memory backend of one process, for tests: no connect string.
    Memory,
}

impl BackendKind {
    /// Every backend, in the order of their metric labels.
    ///
    /// ```
    /// use zklock_core::BackendKind;
    ///
    /// let labels: Vec<_> = BackendKind::ALL.iter().map(|k| k.label()).collect();
    /// assert_eq!(labels, ["zookeeper", "redis", "postgres", "etcd", "mysql", "memory"]);
    /// ```
    pub const ALL: [BackendKind; 6] = [
        BackendKind::ZooKeeper,
        BackendKind::Redis,
        BackendKind::Postgres,
        BackendKind::Etcd,
        BackendKind::MySql,
        BackendKind::Memory,
    ];

    /// The backend `connect` names, by its scheme (a ZooKeeper connect string has none).
    ///
    /// # Errors
    /// [`Error::Config`] for a scheme that no backend takes.
    ///
    /// ```
    /// use zklock_core::BackendKind;
    ///
    /// assert_eq!(BackendKind::of("rediss+cluster://a:7000,b:7000")?, BackendKind::Redis);
    /// let err = BackendKind::of("memcached://cache:11211").unwrap_err();
    /// assert!(err.to_string().contains("memcached"));
    /// # Ok::<(), zklock_core::Error>(())
    /// ```
    pub fn of(connect: &str) -> Result<BackendKind> {
        let lower = connect.trim_start().to_ascii_lowercase();
        let has = |schemes: &[&str]| schemes.iter().any(|s| lower.starts_with(s));
        if has(&[
            "redis://",
            "rediss://",
            "redis+unix://",
            "unix://",
            "redis+sentinel://",
            "rediss+sentinel://",
            "redis+cluster://",
            "rediss+cluster://",
        ]) {
            return Ok(BackendKind::Redis);
        }
        if has(&["postgres://", "postgresql://"]) {
            return Ok(BackendKind::Postgres);
        }
        if has(&["etcd://", "etcds://"]) {
            return Ok(BackendKind::Etcd);
        }
        if has(&["mysql://", "mariadb://"]) {
            return Ok(BackendKind::MySql);
        }
        match connect.trim_start().split_once("://") {
            None => Ok(BackendKind::ZooKeeper),
            Some((scheme, _)) => Err(Error::Config(format!(
                "no backend takes the scheme {scheme:?} of the connect string {}; give ZooKeeper \
                 servers as host:port[,host:port...][/chroot], Redis as redis://host:port (or \
                 rediss://, redis+unix://, unix://, redis+sentinel://host:26379/<master>, \
                 redis+cluster://host:port,..., rediss+sentinel://, rediss+cluster://), \
                 PostgreSQL as postgres://user@host/db, etcd as etcd://host:2379[,host:2379...] \
                 (or etcds://), MySQL or MariaDB as mysql://user:password@host/db (or \
                 mariadb://)",
                redacted(connect)
            ))),
        }
    }

    /// The backend's name as messages give it: `ZooKeeper`, `Redis`, `PostgreSQL`, `etcd`,
    /// `MySQL`, `memory`.
    ///
    /// ```
    /// assert_eq!(zklock_core::BackendKind::Postgres.name(), "PostgreSQL");
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::ZooKeeper => "ZooKeeper",
            BackendKind::Redis => "Redis",
            BackendKind::Postgres => "PostgreSQL",
            BackendKind::Etcd => "etcd",
            BackendKind::MySql => "MySQL",
            BackendKind::Memory => "memory",
        }
    }

    /// The backend's label: the `backend` label of zklock's metrics, the `backend` field of
    /// its tracing, and [`Error::Unsupported`]'s `backend`: `zookeeper`, `redis`, `postgres`,
    /// `etcd`, `mysql`, `memory`. Stable: dashboards and alerts may match it.
    ///
    /// ```
    /// use zklock_core::{BackendKind, Error};
    ///
    /// let err = Error::Unsupported { backend: BackendKind::Postgres.label(), feature: "semaphores" };
    /// assert!(matches!(err, Error::Unsupported { backend: "postgres", .. }));
    /// ```
    pub const fn label(self) -> &'static str {
        match self {
            BackendKind::ZooKeeper => "zookeeper",
            BackendKind::Redis => "redis",
            BackendKind::Postgres => "postgres",
            BackendKind::Etcd => "etcd",
            BackendKind::MySql => "mysql",
            BackendKind::Memory => "memory",
        }
    }
}

impl std::fmt::Display for BackendKind {
    /// The backend's [`name`](Self::name).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ALL` lists every variant once, in the order of the discriminants (metrics index by
    /// them).
    #[test]
    fn all_lists_every_backend_in_order() {
        for (i, kind) in BackendKind::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, i, "{kind:?}");
        }
    }
}

//! [`RedisOptions`]: the settings that only the Redis backend has.

use std::time::Duration;

use crate::backend::DEFAULT_LEASE;
use crate::types::tls::Tls;

/// The Redis backend's own settings, given to [`Builder::redis`](crate::Builder::redis). A
/// manager whose connect string names another backend refuses them at
/// [`connect`](crate::Builder::connect) with [`Error::Config`](crate::Error::Config).
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> zklock_core::Result<()> {
/// use std::time::Duration;
/// use zklock_core::LockManager;
///
/// // A holder that cannot renew its 5 s lease reports the lock lost before Redis frees it.
/// let manager = LockManager::builder("redis://127.0.0.1:6379")
///     .redis(|r| r.lease(Duration::from_secs(5)))
///     .connect()
///     .await?;
/// # let _ = manager; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisOptions {
    pub(crate) lease: Duration,
    pub(crate) acks: Option<Acks>,
    pub(crate) sentinel_auth: Option<SentinelAuth>,
    pub(crate) tls: Option<Tls>,
}

/// The credentials the Sentinels themselves ask for (see
/// [`RedisOptions::sentinel_password`]). Its `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelAuth {
    pub(crate) username: Option<String>,
    pub(crate) password: String,
}

impl std::fmt::Debug for SentinelAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelAuth")
            .field("username", &self.username)
            .field("password", &"<hidden>")
            .finish()
    }
}

/// How many replicas must acknowledge a write before it counts (see
/// [`RedisOptions::replica_acks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acks {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> RedisOptions {
        RedisOptions {
            lease: DEFAULT_LEASE,
            acks: None,
            sentinel_auth: None,
            tls: None,
        }
    }
}

impl RedisOptions {
    /// Connects over TLS with these settings (a private CA, a client certificate for
    /// `tls-auth-clients yes`, the name to check): to the server, or to the Sentinels and the
    /// primary, or to every Cluster node. A `rediss://` (`rediss+sentinel://`,
    /// `rediss+cluster://`) URL uses TLS with the system's roots when no settings are given.
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("rediss://redis.internal:6380")
    ///     .redis(|r| {
    ///         r.tls(
    ///             zklock_core::Tls::new()
    ///                 .ca_file("/etc/zklock/ca.pem")
    ///                 .client_cert_files("/etc/zklock/app.pem", "/etc/zklock/app.key"),
    ///         )
    ///     });
    /// # let _ = b;
    /// ```
    pub fn tls(mut self, tls: Tls) -> RedisOptions {
        self.tls = Some(tls);
        self
    }

    /// How long a hold lives without a renewal (default [`DEFAULT_LEASE`], 10 s; at least
    /// 100 ms): the `PX` of its key.
    ///
    /// A watchdog renews every hold every lease/3 while it lives. The hold is reported lost
    /// ([`LockGuard::lost`](crate::LockGuard::lost)) the moment a renewal fails, or when the
    /// lease could have run out without a confirmed renewal: at 94% of the lease (less 2 ms)
    /// after the last confirmed renewal was sent, leaving 1% + 2 ms for clock drift and 5% for
    /// the process to notice and stop before the server lets another holder in. A shorter
    /// lease hands a crashed holder's lock on sooner; a longer one survives longer server or
    /// network stalls.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = zklock_core::LockManager::builder("redis://127.0.0.1:6379")
    ///     .redis(|r| r.lease(Duration::from_secs(3)));
    /// # let _ = b;
    /// ```
    pub fn lease(mut self, lease: Duration) -> RedisOptions {
        self.lease = lease;
        self
    }

    /// Counts a grant, a renewal and a job's run record only once `replicas` replicas have
    /// acknowledged it (Redis's `WAIT replicas timeout`, sent on the same connection right
    /// after the write), waiting at most `timeout` for them. Off by default.
    ///
    /// What it promises: a hold granted (or a renewal counted) was on at least `replicas`
    /// replicas when the acquire returned, so a failover to one of them keeps it, and a new
    /// primary's token counter is at least as far. A grant that too few replicas acknowledged
    /// in time is undone and the acquire fails with [`Error::Server`](crate::Error::Server)
    /// saying how many did; a renewal that too few acknowledged does not move the hold's
    /// deadline, so the hold is reported lost when the acknowledged lease could run out.
    ///
    /// What it does not promise: Redis replication stays asynchronous. `WAIT` does not stop
    /// Sentinel from promoting a replica that had not acknowledged (with 2 replicas and
    /// `replicas = 1`, the other one may win the election), and a write acknowledged by
    /// replicas is not durable on their disks. It narrows the window in which a failover
    /// loses a hold; the fencing token still guards the data. Each grant and renewal costs one
    /// more round trip plus the replicas' delay (see BENCHMARKS.md). Hand-overs between
    /// waiting processes take one more request, since the waiter's own grant is the write
    /// that is acknowledged.
    ///
    /// ```
    /// # use std::time::Duration;
    /// // A grant counts once both replicas have it, within 100 ms.
    /// let b = zklock_core::LockManager::builder("redis+sentinel://127.0.0.1:26379/mymaster")
    ///     .redis(|r| r.replica_acks(2, Duration::from_millis(100)));
    /// # let _ = b;
    /// ```
    pub fn replica_acks(mut self, replicas: u32, timeout: Duration) -> RedisOptions {
        self.acks = Some(Acks { replicas, timeout });
        self
    }

    /// The password the Sentinels of a `redis+sentinel://` URL ask for (their own
    /// `requirepass` or the `default` user's ACL password), sent with `AUTH` on every
    /// connection to a Sentinel. The URL's `user:password@` are the data nodes'; Sentinels are
    /// often set up with none, or with another one. Only for `redis+sentinel://` URLs: others
    /// refuse it at connect.
    ///
    /// A Sentinel that asks for a password the manager does not have, or refuses the one it
    /// has, is a [`Error::Config`](crate::Error::Config) at connect naming the Sentinel and
    /// this setting.
    ///
    /// ```
    /// // The data nodes take "app:pw1"; the Sentinels their own password.
    /// let b = zklock_core::LockManager::builder(
    ///     "redis+sentinel://app:pw1@10.0.0.1:26379,10.0.0.2:26379/orders",
    /// )
    /// .redis(|r| r.sentinel_password("sentinel-secret"));
    /// # let _ = b;
    /// ```
    pub fn sentinel_password(mut self, password: impl Into<String>) -> RedisOptions {
        let username = self.sentinel_auth.take().and_then(|a| a.username);
        self.sentinel_auth = Some(SentinelAuth {
            username,
            password: password.into(),
        });
        self
    }

    /// The ACL user the Sentinels are asked to authenticate (with
    /// [`sentinel_password`](Self::sentinel_password)); without it, `AUTH` names none (the
    /// `default` user).
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("redis+sentinel://10.0.0.1:26379/orders")
    ///     .redis(|r| r.sentinel_user("locks").sentinel_password("sentinel-secret"));
    /// # let _ = b;
    /// ```
    pub fn sentinel_user(mut self, username: impl Into<String>) -> RedisOptions {
        let password = self
            .sentinel_auth
            .take()
            .map(|a| a.password)
            .unwrap_or_default();
        self.sentinel_auth = Some(SentinelAuth {
            username: Some(username.into()),
            password,
        });
        self
    }
}

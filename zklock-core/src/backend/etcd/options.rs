//! [`EtcdOptions`]: the settings that only the etcd backend has.

use std::time::Duration;

use crate::backend::DEFAULT_LEASE;
use crate::types::tls::Tls;

/// The etcd backend's own settings, given to [`Builder::etcd`](crate::Builder::etcd). A
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
/// // Holds live on an etcd lease of 5 s, kept alive every 5/3 s; a process that stops (crash,
/// // pause, partition) lets its locks go 5 s after its last keep-alive reached etcd.
/// let manager = LockManager::builder("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379")
///     .etcd(|e| e.lease(Duration::from_secs(5)).user("locks", "s3cret"))
///     .connect()
///     .await?;
/// # let _ = manager; Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdOptions {
    pub(crate) lease: Duration,
    pub(crate) user: Option<(String, String)>,
    pub(crate) tls: Option<Tls>,
}

impl std::fmt::Debug for EtcdOptions {
    // Never the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("lease", &self.lease)
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .field("tls", &self.tls)
            .finish()
    }
}

impl Default for EtcdOptions {
    fn default() -> EtcdOptions {
        EtcdOptions {
            lease: DEFAULT_LEASE,
            user: None,
            tls: None,
        }
    }
}

impl EtcdOptions {
    /// Connects to every member over TLS with these settings (a private CA, a client
    /// certificate for etcd's `--client-cert-auth`, the name to check). An `etcds://` connect
    /// string uses TLS with the system's roots when no settings are given. The files are read
    /// when the manager connects.
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("etcds://10.0.0.1:2379,10.0.0.2:2379")
    ///     .etcd(|e| {
    ///         e.tls(
    ///             zklock_core::Tls::new()
    ///                 .ca_file("/etc/etcd/ca.pem")
    ///                 .client_cert_files("/etc/zklock/etcd.pem", "/etc/zklock/etcd.key"),
    ///         )
    ///     });
    /// # let _ = b;
    /// ```
    pub fn tls(mut self, tls: Tls) -> EtcdOptions {
        self.tls = Some(tls);
        self
    }

    /// The TTL of the etcd lease every hold of the manager is attached to (default
    /// [`DEFAULT_LEASE`], 10 s; whole seconds, at least 2 s, since etcd counts leases in
    /// seconds and grants no lease shorter than its own minimum).
    ///
    /// The manager keeps the lease alive every lease/3. A hold is reported lost
    /// ([`LockGuard::lost`](crate::LockGuard::lost)) when etcd says the lease is gone (it
    /// expired or was revoked), or when the lease could have run out without a confirmed
    /// keep-alive: at 94% of the TTL (less 2 ms) after the last confirmed keep-alive was sent,
    /// leaving 1% + 2 ms for clock drift and 5% for the process to notice and stop before etcd
    /// lets another holder in. A shorter lease hands a crashed holder's lock on sooner; a
    /// longer one survives longer stalls of the cluster or the network.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = zklock_core::LockManager::builder("etcd://127.0.0.1:2379")
    ///     .etcd(|e| e.lease(Duration::from_secs(3)));
    /// # let _ = b;
    /// ```
    pub fn lease(mut self, lease: Duration) -> EtcdOptions {
        self.lease = lease;
        self
    }

    /// Authenticates as `name` with `password` (etcd's own users, `etcdctl user add`). The
    /// same can be given in the connect string, `etcd://name:password@host:2379`; these
    /// settings win. Errors never show the password.
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("etcd://127.0.0.1:2379")
    ///     .etcd(|e| e.user("locks", "s3cret"));
    /// # let _ = b;
    /// ```
    pub fn user(mut self, name: impl Into<String>, password: impl Into<String>) -> EtcdOptions {
        self.user = Some((name.into(), password.into()));
        self
    }
}

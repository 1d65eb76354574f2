//! [`ZooKeeperOptions`]: the settings that only the ZooKeeper backend has.

use std::time::Duration;

#[cfg(feature = "tls")]
use crate::types::tls::Tls;

use crate::types::disconnect::DisconnectPolicy;

/// The ZooKeeper backend's own settings, given to
/// [`Builder::zookeeper`](crate::Builder::zookeeper): the session, its credentials and TLS,
/// and what a holder watches. A manager whose connect string names another backend refuses
/// them at [`connect`](crate::Builder::connect) with [`Error::Config`](crate::Error::Config).
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> zklock_core::Result<()> {
/// use std::time::Duration;
/// use zklock_core::{DisconnectPolicy, LockManager};
///
/// // A holder that cannot reach ZooKeeper for 1 s reports its locks lost, well before its
/// // 6 s session could expire and let another process in.
/// let manager = LockManager::builder("zk1:2181,zk2:2181,zk3:2181")
///     .zookeeper(|zk| {
///         zk.session_timeout(Duration::from_secs(6))
///             .disconnect_policy(DisconnectPolicy::Grace(Duration::from_secs(1)))
///     })
///     .connect()
///     .await?;
/// # let _ = manager; Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZooKeeperOptions {
    pub(crate) session_timeout: Duration,
    pub(crate) disconnect_policy: DisconnectPolicy,
    pub(crate) renew_session: bool,
    /// `user:password` for ZooKeeper's digest scheme; lock nodes are then protected by ACLs.
    pub(crate) digest: Option<String>,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<zookeeper_client::TlsOptions>,
    /// zklock's own TLS settings, turned into zookeeper-client's at connect.
    #[cfg(feature = "tls")]
    pub(crate) tls_settings: Option<Tls>,
    pub(crate) revocable: bool,
    pub(crate) watch_held_nodes: bool,
}

impl std::fmt::Debug for ZooKeeperOptions {
    // Never the digest's password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("ZooKeeperOptions");
        d.field("session_timeout", &self.session_timeout)
            .field("disconnect_policy", &self.disconnect_policy)
            .field("renew_session", &self.renew_session)
            .field(
                "digest_user",
                &self
                    .digest
                    .as_ref()
                    .map(|d| d.split_once(':').map_or(d.as_str(), |(user, _)| user)),
            );
        #[cfg(feature = "tls")]
        d.field("tls", &(self.tls.is_some() || self.tls_settings.is_some()));
        d.field("revocable", &self.revocable)
            .field("watch_held_nodes", &self.watch_held_nodes)
            .finish()
    }
}

impl Default for ZooKeeperOptions {
    fn default() -> ZooKeeperOptions {
        ZooKeeperOptions {
            session_timeout: Duration::from_secs(10),
            disconnect_policy: DisconnectPolicy::Immediate,
            renew_session: true,
            digest: None,
            #[cfg(feature = "tls")]
            tls: None,
            #[cfg(feature = "tls")]
            tls_settings: None,
            revocable: false,
            watch_held_nodes: true,
        }
    }
}

impl ZooKeeperOptions {
    /// The session timeout asked of the server (default 10 s; the server clamps it to
    /// `[2, 20] x tickTime` unless configured otherwise). A process that stops talking to
    /// ZooKeeper for this long loses its locks; it is also how long
    /// [`connect`](crate::Builder::connect) tries unless
    /// [`connect_timeout`](crate::Builder::connect_timeout) says otherwise.
    ///
    /// ```
    /// # use std::time::Duration;
    /// // Another process takes over a crashed holder's locks within about 4 s.
    /// let b = zklock_core::LockManager::builder("h:2181")
    ///     .zookeeper(|zk| zk.session_timeout(Duration::from_secs(4)));
    /// # let _ = b;
    /// ```
    pub fn session_timeout(mut self, timeout: Duration) -> ZooKeeperOptions {
        self.session_timeout = timeout;
        self
    }

    /// What a disconnection means for held locks (default [`DisconnectPolicy::Immediate`]:
    /// every hold is reported lost the moment the connection drops, as Curator's advice to
    /// treat SUSPENDED as lost says).
    ///
    /// ```
    /// # use std::time::Duration;
    /// use zklock_core::DisconnectPolicy;
    /// // A blip shorter than 1 s keeps the holds; a longer one loses them.
    /// let b = zklock_core::LockManager::builder("h:2181")
    ///     .zookeeper(|zk| zk.disconnect_policy(DisconnectPolicy::Grace(Duration::from_secs(1))));
    /// # let _ = b;
    /// ```
    pub fn disconnect_policy(mut self, policy: DisconnectPolicy) -> ZooKeeperOptions {
        self.disconnect_policy = policy;
        self
    }

    /// Whether the manager opens a new session after its session expires (default `true`).
    /// Locks held by the expired session are reported lost either way.
    ///
    /// ```
    /// // After an expiry every acquire fails: the process restarts itself instead.
    /// let b = zklock_core::LockManager::builder("h:2181").zookeeper(|zk| zk.renew_session(false));
    /// # let _ = b;
    /// ```
    pub fn renew_session(mut self, renew: bool) -> ZooKeeperOptions {
        self.renew_session = renew;
        self
    }

    /// Authenticates the session with ZooKeeper's `digest` scheme. Lock paths and contender
    /// nodes are then created with the `creator_all` ACL: only sessions with the same
    /// credentials can delete, revoke or queue on them, so another tenant cannot take your
    /// locks away. (Redis, PostgreSQL and etcd take credentials in their URLs.)
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("h:2181")
    ///     .zookeeper(|zk| zk.digest_auth("billing", "s3cret"));
    /// # let _ = b;
    /// ```
    pub fn digest_auth(mut self, user: &str, password: &str) -> ZooKeeperOptions {
        self.digest = Some(format!("{user}:{password}"));
        self
    }

    /// Connects over TLS (the servers' `secureClientPort`), with zookeeper-client's options
    /// (CA and client identity). Needs the `tls` feature.
    ///
    /// ```no_run
    /// # fn run(ca_pem: &str) -> Result<(), zookeeper_client::Error> {
    /// let tls = zookeeper_client::TlsOptions::default().with_pem_ca_certs(ca_pem)?;
    /// let b = zklock_core::LockManager::builder("zk1:2281").zookeeper(|zk| zk.tls(tls));
    /// # let _ = b; Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls(mut self, options: zookeeper_client::TlsOptions) -> ZooKeeperOptions {
        self.tls = Some(options);
        self
    }

    /// Connects over TLS with zklock's [`Tls`] settings, as every other backend takes them: a
    /// private CA (or the system's roots) and a client certificate for servers with
    /// `ssl.clientAuth=need`; the files are read when the manager connects. (The name checked is
    /// the connect string's host: zookeeper-client takes no other.) Needs the `tls` feature.
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("zk1:2281,zk2:2281").zookeeper(|zk| {
    ///     zk.tls_settings(
    ///         zklock_core::Tls::new()
    ///             .ca_file("/etc/zookeeper/ca.pem")
    ///             .client_cert_files("/etc/zklock/zk.pem", "/etc/zklock/zk.key"),
    ///     )
    /// });
    /// # let _ = b;
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_settings(mut self, tls: Tls) -> ZooKeeperOptions {
        self.tls_settings = Some(tls);
        self
    }

    /// zookeeper-client's TLS options: those given with [`tls`](Self::tls), or made from the
    /// [`Tls`] settings now (their files read), naming `connect` in an error.
    #[cfg(feature = "tls")]
    pub(crate) fn tls_options(
        &self,
        connect: &str,
    ) -> crate::types::error::Result<Option<zookeeper_client::TlsOptions>> {
        if let Some(options) = &self.tls {
            return Ok(Some(options.clone()));
        }
        let Some(tls) = &self.tls_settings else {
            return Ok(None);
        };
        let pem = tls.pem_now(connect)?;
        let bad = |what: &str, e: zookeeper_client::Error| crate::types::error::Error::Tls {
            host: connect.to_string(),
            reason: format!("the {what} is not usable: {e}"),
        };
        let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
        let ca = match pem.ca {
            Some(ca) => text(ca),
            None => crate::types::tls::system_roots_pem(),
        };
        let mut options = zookeeper_client::TlsOptions::new()
            .with_pem_ca(&ca)
            .map_err(|e| bad("CA", e))?;
        if let Some((cert, key)) = pem.client {
            options = options
                .with_pem_identity(&text(cert), &text(key))
                .map_err(|e| bad("client certificate and key", e))?;
        }
        Ok(Some(options))
    }

    /// Makes every hold of this manager revocable (see
    /// [`LockGuard::make_revocable`](crate::LockGuard::make_revocable)): Curator's
    /// revocation, a `__REVOKE__` written to the holder's node.
    ///
    /// ```
    /// // `zklock revoke KEY` (or a Curator client) can then ask these holders to let go.
    /// let b = zklock_core::LockManager::builder("h:2181").zookeeper(|zk| zk.revocable(true));
    /// # let _ = b;
    /// ```
    pub fn revocable(mut self, on: bool) -> ZooKeeperOptions {
        self.revocable = on;
        self
    }

    /// Whether every held node is watched from the moment it is granted (default `true`).
    ///
    /// The watch is what tells a holder that someone else deleted its node (an operator, a
    /// revocation): with it, [`is_held`](crate::LockGuard::is_held) turns false as soon as
    /// this process has heard of the deletion. A hold granted on the listing that followed its
    /// create, with no other node in the lock path, is watched through that listing's children
    /// watch at no cost, and costs one read request (the node's data watch) only once the lock
    /// path's children change (so its own deletion shows after that read); a hold granted
    /// after waiting takes over the data watch its waiter set on its own node, also at no
    /// cost. Either way each grant starts a task that waits for the watch. Turned off, a grant
    /// starts no task and sends no watch request until first interest (`lost()`, `is_held()`,
    /// `make_revocable()`, a `with_lock` body that aborts on loss, a local handoff of the
    /// node), so the first `is_held()` after a deletion may still answer `true`. Session loss
    /// is noticed either way. (Measured on an uncontended cycle, turning it off saved no
    /// time: see BENCHMARKS.md.)
    ///
    /// ```
    /// // No watch task per grant, at the price of a later notice of a deleted node.
    /// let b = zklock_core::LockManager::builder("h:2181").zookeeper(|zk| zk.watch_held_nodes(false));
    /// # let _ = b;
    /// ```
    pub fn watch_held_nodes(mut self, on: bool) -> ZooKeeperOptions {
        self.watch_held_nodes = on;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_the_digest_user_but_never_its_password() {
        let options = ZooKeeperOptions::default().digest_auth("locks", "s3cret");
        let shown = format!("{options:?}");
        assert!(shown.contains("locks"), "{shown}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}

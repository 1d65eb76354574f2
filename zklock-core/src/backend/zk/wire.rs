//! Curator's node protocol as the server sees it: the create modes and ACLs of contender nodes,
//! lock paths and run records, the data a contender node carries, the contender nodes' names
//! (Curator's and kazoo's) and their protected prefix, a semaphore's children, the revoke request,
//! and the digest id of credentials.

use once_cell::sync::Lazy;
use zookeeper_client::{Acls, CreateMode, CreateOptions};

use super::Inner;

pub(super) static EPHEMERAL_SEQUENTIAL: CreateOptions<'static> =
    CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
/// Contender nodes of a manager with credentials: only the same credentials may touch them.
pub(super) static EPHEMERAL_SEQUENTIAL_PROTECTED: CreateOptions<'static> =
    CreateMode::EphemeralSequential.with_acls(Acls::creator_all());
/// Jobs' run records: they must outlive the process that ran the job.
pub(super) static PERSISTENT: CreateOptions<'static> =
    CreateMode::Persistent.with_acls(Acls::anyone_all());
pub(super) static PERSISTENT_PROTECTED: CreateOptions<'static> =
    CreateMode::Persistent.with_acls(Acls::creator_all());
pub(super) static CONTAINER: CreateOptions<'static> =
    CreateMode::Container.with_acls(Acls::anyone_all());
pub(super) static CONTAINER_PROTECTED: CreateOptions<'static> =
    CreateMode::Container.with_acls(Acls::creator_all());

/// The create options of contender nodes for `inner`'s manager.
pub(super) fn contender_options(inner: &Inner) -> &'static CreateOptions<'static> {
    if inner.config.protected {
        &EPHEMERAL_SEQUENTIAL_PROTECTED
    } else {
        &EPHEMERAL_SEQUENTIAL
    }
}

/// The data each contender node carries: who created it (Curator writes the client's address).
/// `zklock host=<host> pid=<pid>[ id=<identity>]`; see [`Owner`](crate::Owner).
pub(super) fn node_data(identity: Option<&str>) -> Vec<u8> {
    static HOST: Lazy<String> = Lazy::new(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| "unknown".into())
    });
    let mut data = format!("zklock host={} pid={}", *HOST, std::process::id());
    if let Some(id) = identity {
        data.push_str(" id=");
        data.push_str(id);
    }
    data.into_bytes()
}

/// The digest scheme's id of `user:password`, as ZooKeeper computes it for a session that
/// authenticated with it: `user:base64(sha1(user:password))`.
pub(crate) fn digest_id(credentials: &str) -> String {
    use base64::Engine;
    let user = credentials.split_once(':').map_or(credentials, |(u, _)| u);
    let hash = sha1_smol::Sha1::from(credentials).digest().bytes();
    format!(
        "{user}:{}",
        base64::engine::general_purpose::STANDARD.encode(hash)
    )
}

pub(super) const READ_NAME: &str = "__READ__";
pub(super) const WRITE_NAME: &str = "__WRIT__";
pub(super) const MUTEX_NAME: &str = "lock-";
pub(super) const LEASE_NAME: &str = "lease-";
pub(super) const LATCH_NAME: &str = "latch-";
/// kazoo's `Lock` and `WriteLock` node (`<uuid hex>__lock__<seq>`): excludes every later one.
pub(super) const KAZOO_LOCK_NAME: &str = "__lock__";
/// kazoo's `ReadLock` node (`<uuid hex>__rlock__<seq>`): waits only for lower exclusive ones.
pub(super) const KAZOO_READ_NAME: &str = "__rlock__";

/// A semaphore's gate: the child of its path where one acquirer at a time holds a mutex
/// (Curator's `InterProcessSemaphoreV2`).
pub(super) const SEMAPHORE_LOCKS: &str = "locks";
/// A semaphore's leases: the child of its path where the leases are made.
pub(super) const SEMAPHORE_LEASES: &str = "leases";

/// The protected prefix of a new contender node, fresh for each create: `_c_<uuid>-`
/// (Curator's protected mode), by which a node whose create reply was lost is found.
pub(super) fn protected_prefix() -> String {
    format!("_c_{}-", uuid::Uuid::new_v4())
}

/// The data Curator's `Revoker` writes into a holder's node to ask it to let go.
pub(super) const REVOKE_MESSAGE: &[u8] = b"__REVOKE__";

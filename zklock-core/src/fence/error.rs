//! What can go wrong with a fenced write, apart from being refused (which is an
//! [`Outcome`](super::Outcome), not an error).

/// A fenced write that could not be carried out: the store failed, or what was asked or found
/// makes no sense. A stale token is not an error: it is [`Outcome::Stale`](super::Outcome::Stale).
///
/// When this comes back, the write may or may not have been applied only where the store's own
/// error says so (a connection lost mid-request); a refused argument never reached the store.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use zklock_core::fence::{Fence, FenceError, MemoryFence};
/// use zklock_core::FencingToken;
///
/// let store = MemoryFence::new();
/// let err = store.fenced_write("", FencingToken::new(1, 0), 5).await.unwrap_err();
/// assert!(matches!(err, FenceError::Invalid(_)));
/// assert!(err.to_string().contains("empty"));
/// # }
/// ```
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// An argument the fence refuses before talking to the store (an empty resource name, a
    /// table name that is no SQL identifier, a statement that ignores the fence).
    #[error("{0}")]
    Invalid(String),

    /// The write carries no token: its hold's manager was built with
    /// [`fencing_tokens(false)`](crate::Builder::fencing_tokens). Nothing reached the store.
    #[error("the fenced write on {resource} carries no fencing token: its lock's manager was built with fencing_tokens(false); build it with fencing_tokens(true) to write through a fence")]
    NoToken {
        /// The resource.
        resource: String,
    },

    /// A stored or given token is not in the expected encoding: the fence's key, row or node
    /// was written by something else.
    #[error("not a fencing token: found {found}, expected {expected}; keep the fence's keys, rows and nodes for the fence alone")]
    Encoding {
        /// What was found (escaped).
        found: String,
        /// What a token looks like there.
        expected: &'static str,
    },

    /// The compare-and-write kept losing races to other writers (ZooKeeper's version check).
    #[error("the fenced write on {resource} lost the race for its token node {attempts} times in a row; retry it (many writers are writing the same resource at once)")]
    Contended {
        /// The resource.
        resource: String,
        /// How many times it tried.
        attempts: u32,
    },

    /// Redis failed the command or the script.
    #[cfg(feature = "redis")]
    #[error("fenced write on Redis failed: {0}; check the server, and the script if you gave one")]
    Redis(#[from] redis::RedisError),

    /// MySQL or MariaDB failed a statement (the fenced write's transaction is then rolled
    /// back, or never committed).
    #[cfg(feature = "mysql")]
    #[error("fenced write on MySQL failed: {0}; check the server and the statement")]
    MySql(#[from] mysql_async::Error),

    /// PostgreSQL failed the statement.
    #[cfg(feature = "postgres")]
    #[error("fenced write on PostgreSQL failed: {0}; check the server and the statement")]
    Postgres(#[from] tokio_postgres::Error),

    /// etcd failed the read or the transaction (the server unreachable, the transaction
    /// refused: e.g. your operations write a key twice or write the fence's token key). A
    /// refused transaction applied nothing; after a connection lost mid-request the write may
    /// or may not have been applied.
    #[cfg(feature = "etcd")]
    #[error("fenced write on etcd failed: {0}; check the server, and your operations (no key written twice, not the fence's token key)")]
    Etcd(#[from] etcd_client::Error),

    /// ZooKeeper failed the read or the multi; `op` is the index of your operation that failed,
    /// if it was one of yours (none of them was applied then).
    #[cfg(feature = "zookeeper")]
    #[error("fenced write on ZooKeeper failed{}: {source}", op.map(|i| format!(" at your operation {i}")).unwrap_or_default())]
    ZooKeeper {
        /// The index among your operations of the one that failed, if it was yours.
        op: Option<usize>,
        /// What the client reported.
        #[source]
        source: zookeeper_client::Error,
    },
}

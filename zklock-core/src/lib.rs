//! # zklock-core
//!
//! The library behind the `zklock` crate: distributed locks for Rust services that run as
//! several instances, on Apache ZooKeeper (in Apache Curator's wire format, so that JVM services
//! locking the same paths exclude each other), on Redis (feature `redis`: one server, under
//! Sentinel, or a Redis Cluster), on PostgreSQL (feature `postgres`), on etcd (feature `etcd`),
//! or in memory for unit tests ([`LockManager::in_memory`]). RAII guards,
//! reentrancy scoped to holder frames, read/write locks, semaphores, multi-locks, leader
//! election, scheduled jobs, fencing tokens, timeouts, cancel safety and a signal when a hold is
//! lost.
//!
//! Most users depend on the `zklock` crate, which re-exports this one with the
//! `#[distributed_lock]` attribute.
//!
//! ```no_run
//! # async fn run() -> zklock_core::Result<()> {
//! use zklock_core::LockManager;
//!
//! let manager = LockManager::connect("127.0.0.1:2181").await?;
//! let sold = manager
//!     .with_lock("sku_100", async {
//!         // read stock, check it, write it: no other instance runs this for sku_100 now
//!         true
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! The connect string of [`LockManager::connect`] picks the backend ([`BackendKind::of`]):
//! `host:port[,host:port...]` is ZooKeeper, `redis://host:6379` is Redis (leases renewed while
//! held; `redis+sentinel://` and `redis+cluster://` for its replicated deployments),
//! `postgres://user@host/db` is PostgreSQL (session-level advisory locks) and
//! `etcd://host:2379[,host:2379...]` is etcd (keys on a lease, in the format of etcd's own
//! `concurrency` package); `rediss://`, `etcds://` and libpq's `sslmode` ask for TLS. The same guards,
//! frames, tokens and loss signal run on each; what differs is speed and what each promises
//! when things go wrong.
//!
//! A fencing token is only safe if the store refuses stale ones: [`fence`] does that check in
//! PostgreSQL, Redis, etcd, ZooKeeper or memory, in the same atomic step as the write
//! (`guard.fenced(&store).write(..)`). [`metrics`] lists what zklock emits.
//!
//! The user guide is in the repository's `docs/` folder (`docs/README.md` is its index:
//! recipes, fencing, each backend and what it promises under each fault, operating,
//! performance), and `ARCHITECTURE.md` maps this crate's layers and its backend seam for
//! maintainers.
#![warn(missing_docs)]

// The modules are layered: types, metrics, background, backend, local, fence, guard, recipe,
// then the top (manager, inspect, multi, private). Each uses only the layers below it, and
// nothing outside `backend` names a backend's insides; `tests/layers.rs` checks both.
mod backend;
mod background;
pub mod fence;
mod guard;
mod inspect;
mod local;
mod manager;
pub mod metrics;
mod multi;
#[doc(hidden)]
pub mod private;
mod recipe;
mod types;

#[cfg(feature = "mysql")]
pub use backend::mysql::lock_name as mysql_lock_name;
/// The etcd client the etcd backend runs on (feature `etcd`): what `LockManager::client`
/// returns on etcd, and what the etcd fence store takes.
#[cfg(feature = "etcd")]
pub use etcd_client;
pub use guard::LockGuard;
pub use local::frame::current_fencing_token;
#[cfg(feature = "etcd")]
pub use manager::EtcdOptions;
#[cfg(feature = "mysql")]
pub use manager::MySqlOptions;
#[cfg(feature = "postgres")]
pub use manager::PostgresOptions;
#[cfg(feature = "redis")]
pub use manager::RedisOptions;
#[cfg(feature = "zookeeper")]
pub use manager::ZooKeeperOptions;
pub use manager::{
    global, set_global, Builder, LockManager, StatsSnapshot, DEFAULT_LEASE, DEFAULT_NAMESPACE,
};
pub use metrics::KeyLabel;
pub use multi::{LockSpec, MultiGuard};
/// The MySQL client the MySQL fence store takes (feature `mysql`).
#[cfg(feature = "mysql")]
pub use mysql_async;
pub use recipe::job::{Job, Ran};
pub use recipe::leader::{
    LeaderLatch, Leadership, LeadershipEvent, LeadershipEvents, LeadershipInfo,
};
pub use recipe::mutex::Mutex;
pub use recipe::rwlock::RwLock;
pub use recipe::semaphore::{Lease, Semaphore};
#[cfg(feature = "redis")]
pub use redis;
#[cfg(feature = "postgres")]
pub use tokio_postgres;
pub use types::backend_kind::BackendKind;
pub use types::disconnect::DisconnectPolicy;
pub use types::error::{Deadlock, Error, Result, ServerError};
pub use types::inspect::{Contender, LockInfo, LockKind, Owner};
pub use types::key::{Key, MAX_KEY_LEN};
pub use types::loss::LossReason;
pub use types::tls::Tls;
pub use types::token::FencingToken;
#[cfg(feature = "zookeeper")]
pub use zookeeper_client;

#[doc(hidden)]
pub use private as __private;

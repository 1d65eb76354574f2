//! # zklock-core
//!
//! Distributed locks on Apache ZooKeeper for Rust services that run as several instances:
//! RAII guards, fencing tokens, a signal when a hold is lost, timeouts and cancel safety, in
//! Apache Curator's wire format so that JVM services locking the same paths exclude each other.
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
#![warn(missing_docs)]

mod error;
mod frame;
mod guard;
mod inspect;
mod key;
mod local;
mod manager;
mod multi;
#[doc(hidden)]
pub mod private;
mod recipe;

pub use error::{Error, Result};
pub use frame::current_fencing_token;
pub use guard::{FencingToken, LockGuard, LossReason, OwnedLockGuard};
pub use inspect::{Contender, LockInfo, LockKind, Owner};
pub use key::{Key, MAX_KEY_LEN};
pub use manager::{
    global, set_global, Builder, DisconnectPolicy, LockManager, StatsSnapshot, DEFAULT_NAMESPACE,
};
pub use multi::{LockSpec, MultiGuard};
pub use recipe::mutex::Mutex;
pub use recipe::rwlock::RwLock;
pub use recipe::semaphore::{Lease, Semaphore};
pub use zookeeper_client;

#[doc(hidden)]
pub use private as __private;

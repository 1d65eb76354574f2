//! # zklock
//!
//! Distributed locks on Apache ZooKeeper. See [`zklock_core`] for the library and the README
//! for a tour.
//!
//! ```no_run
//! # async fn run() -> zklock::Result<()> {
//! let manager = zklock::LockManager::connect("127.0.0.1:2181").await?;
//! let guard = manager.lock("user_42").await?;
//! # drop(guard); Ok(()) }
//! ```
pub use zklock_core::*;
pub use zklock_macros::distributed_lock;
